//! OpenTelemetry traces over OTLP, configured by the standard `OTEL_*` variables
//! and off unless an endpoint is set. What is traced: each API request (a server
//! span, the child of the client's W3C `traceparent` when it sends one), each
//! run (`invoke_agent AGENT`, the child of the request that created it), its
//! turns, model calls (`chat MODEL`), tool calls (`execute_tool TOOL`) and
//! reviews (`troupe_actors::spans`). Model requests carry the `traceparent` of
//! their `chat` span, MCP HTTP requests that of their tool call.
//!
//! Variables read: `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER` (`otlp` or
//! `none`), `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL` / `..._TRACES_PROTOCOL` (`http/protobuf`, the
//! default, or `grpc`), and through the SDK `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`.

use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::registry::LookupSpan;

/// Whether traces are exported (set once, at start).
static ENABLED: OnceLock<bool> = OnceLock::new();

/// Whether this process exports traces: the server makes a span per request only then.
pub fn enabled() -> bool {
    ENABLED.get().copied().unwrap_or(false)
}

/// The exporter of a process that traces; [`Otel::shutdown`] flushes it.
pub struct Otel {
    provider: SdkTracerProvider,
    /// The gRPC exporter's background tasks run here (the exporter is called from
    /// the SDK's own thread, outside the daemon's runtime).
    _runtime: tokio::runtime::Runtime,
}

/// How spans leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, port 4318).
    HttpProtobuf,
    /// OTLP/gRPC (`grpc`, port 4317).
    Grpc,
}

/// What the environment asks for: `None` when tracing is off.
pub fn protocol_from(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Protocol>> {
    let set = |name: &str| env(name).map(|value| value.trim().to_owned()).filter(|value| !value.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match set("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => bail!("OTEL_TRACES_EXPORTER={other} is not supported: use otlp or none"),
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none() && set("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL")).as_deref() {
        None | Some("http/protobuf") => Ok(Some(Protocol::HttpProtobuf)),
        Some("grpc") => Ok(Some(Protocol::Grpc)),
        Some(other) => bail!("OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported: use http/protobuf or grpc"),
    }
}

impl Otel {
    /// The exporter the environment asks for, if any, with the tracing layer that
    /// feeds it. Also installs the W3C trace-context propagator and the core's
    /// hooks for it.
    pub fn from_env<S>(
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<(Self, impl tracing_subscriber::Layer<S> + use<S>)>>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let Some(protocol) = protocol_from(env)? else {
            let _ = ENABLED.set(false);
            return Ok(None);
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp")
            .enable_all()
            .build()
            .context("cannot start the OTLP exporter's runtime")?;
        let exporter = runtime.block_on(async {
            match protocol {
                Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build(),
                Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder().with_tonic().build(),
            }
        });
        let exporter = exporter.context("cannot set up the OTLP trace exporter")?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none_or(|name| name.trim().is_empty()) {
            resource = resource.with_service_name("troupe");
        }
        let resource =
            resource.with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))).build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("troupe"));
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        troupe_actors::spans::set_remote_parents(RemoteParents { adopt, traceparent: traceparent_of, trace_id });
        let _ = ENABLED.set(true);
        Ok(Some((Self { provider, _runtime: runtime }, layer)))
    }

    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the OTLP exporter did not flush every span");
        }
    }
}

use troupe_actors::spans::RemoteParents;

/// Makes `span` the child of the span a W3C `traceparent` names.
fn adopt(span: &Span, traceparent: &str) {
    let carrier = Carrier(vec![("traceparent".to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The W3C `traceparent` of `span`, if it is traced.
pub fn traceparent_of(span: &Span) -> Option<String> {
    let mut carrier = Carrier(Vec::new());
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.0.into_iter().find(|(name, _)| name == "traceparent").map(|(_, value)| value)
}

/// The trace id of `span` (32 hex digits), if it is traced.
pub fn trace_id(span: &Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// Makes `span` (a request's server span) the child of the request's
/// `traceparent`, if it sends a valid one.
pub fn adopt_request(span: &Span, headers: &axum::http::HeaderMap) {
    if let Some(value) = headers.get("traceparent").and_then(|value| value.to_str().ok()) {
        adopt(span, value);
    }
}

/// A header list for the propagator.
struct Carrier(Vec<(String, String)>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(name, _)| name.eq_ignore_ascii_case(key)).map(|(_, value)| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_owned())
    }

    #[test]
    fn traces_are_off_without_an_endpoint_and_the_protocol_follows_the_standard_variables() {
        assert_eq!(protocol_from(env(&[])).unwrap(), None);
        let http = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert_eq!(protocol_from(env(http)).unwrap(), Some(Protocol::HttpProtobuf));
        let grpc = &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        assert_eq!(protocol_from(env(grpc)).unwrap(), Some(Protocol::Grpc));
        let traces_first = &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ];
        assert_eq!(protocol_from(env(traces_first)).unwrap(), Some(Protocol::Grpc));
        let disabled = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_SDK_DISABLED", "true")];
        assert_eq!(protocol_from(env(disabled)).unwrap(), None);
        let none = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_TRACES_EXPORTER", "none")];
        assert_eq!(protocol_from(env(none)).unwrap(), None);
    }

    #[test]
    fn an_unsupported_protocol_or_exporter_is_an_error_that_names_it() {
        let json = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
        assert!(protocol_from(env(json)).unwrap_err().to_string().contains("http/json"));
        let zipkin = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_TRACES_EXPORTER", "zipkin")];
        assert!(protocol_from(env(zipkin)).unwrap_err().to_string().contains("zipkin"));
    }
}
