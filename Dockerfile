# troupe in a container: the daemon on its embedded defaults (SQLite in
# /var/lib/troupe, the local model), built from this repository.
#
#   docker build -t troupe .
#   docker run -p 7878:7878 -v troupe-data:/var/lib/troupe \
#     -e TROUPE_API_TOKENS="me=change-me" troupe
#   docker run --rm -v troupe-data:/var/lib/troupe troupe model pull   # once
#
# Build stage: the toolchain, cmake and libclang (llama.cpp and its bindings), as
# the README's quick start installs them.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin troupe \
 && cp target/release/troupe /usr/local/bin/troupe

# Final stage: the binary and the libraries it links (libgomp for llama.cpp's
# threads, libstdc++), nothing of the build.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/troupe --create-home --shell /usr/sbin/nologin troupe
COPY --from=build /usr/local/bin/troupe /usr/local/bin/troupe
USER troupe
WORKDIR /var/lib/troupe
ENV TROUPE_DATA_DIR=/var/lib/troupe \
    TROUPE_BIND=0.0.0.0:7878
VOLUME /var/lib/troupe
EXPOSE 7878
HEALTHCHECK --interval=30s --timeout=3s CMD ["/bin/sh", "-c", "exec 3<>/dev/tcp/127.0.0.1/7878 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q ' 200 ' <&3"]
ENTRYPOINT ["troupe"]
CMD ["serve"]
