#!/usr/bin/env bash
# Builds llama.cpp's own benchmark binary, llama-bench, against the very llama.cpp
# source troupe links (the copy vendored in the llama-cpp-sys-2 crate of
# Cargo.lock), with the same CPU options as .cargo/config.toml, into a cache folder
# outside the clone; prints its path. Used by `cargo bench --bench local_model` as
# the reference.
#
# The crate ships llama.cpp without its tools, so llama-bench's two source files
# come from llama.cpp as vendored in the llama-cpp-python sdist (PyPI, pinned and
# checked by SHA-256); only they are taken, and they are compiled against the
# crate's llama.cpp, so both sides run the same kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
sdist_version=0.3.36
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
sdist_url=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$sdist_version.tar.gz

version=$(awk '/^name = "llama-cpp-sys-2"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
find_source() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$version"/llama.cpp 2>/dev/null | head -n 1; }
source=$(find_source)
if [ -z "$source" ]; then
  cargo fetch --locked >/dev/null
  source=$(find_source)
fi
cache="${HOME:-/root}/.cache/troupe-bench"
tree="$cache/llama.cpp-$version-src"
build="$cache/llama.cpp-$version-build"
if [ ! -x "$build/bin/llama-bench" ]; then
  mkdir -p "$cache"
  sdist="$cache/llama_cpp_python-$sdist_version.tar.gz"
  if ! echo "$sdist_sha256  $sdist" | sha256sum -c --status 2>/dev/null; then
    curl -fsSL -o "$sdist" "$sdist_url"
    echo "$sdist_sha256  $sdist" | sha256sum -c --status
  fi
  rm -rf "$tree" && cp -r "$source" "$tree" && chmod -R u+w "$tree"
  mkdir -p "$tree/tools/llama-bench"
  tar -xzf "$sdist" -C "$tree/tools/llama-bench" --strip-components=5 \
    "llama_cpp_python-$sdist_version/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp" \
    "llama_cpp_python-$sdist_version/vendor/llama.cpp/tools/llama-bench/main.cpp" \
    "llama_cpp_python-$sdist_version/vendor/llama.cpp/tools/llama-bench/CMakeLists.txt"
  printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' > "$tree/tools/CMakeLists.txt"
  cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >&2
  cmake --build "$build" --target llama-bench -j "$(nproc)" >&2
fi
echo "$build/bin/llama-bench"
