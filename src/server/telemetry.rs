//! Prometheus exposition and per-request metrics. Metric names live in
//! `troupe_actors::metrics`; this module only installs the recorder and measures
//! requests.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::Instrument;
use troupe_actors::metrics;

/// Installs the process-wide Prometheus recorder, with explicit buckets for every
/// histogram (so none renders as a summary), and starts its upkeep task (which
/// `install_recorder` does not); a node of a cluster labels every series with its
/// name (`node`). Call once, inside a Tokio runtime.
pub fn install_prometheus(node: Option<&str>) -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new();
    if let Some(node) = node {
        builder = builder.add_global_label("node", node);
    }
    let handle = builder
        .set_buckets(metrics::DURATION_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(metrics::REVIEW_SCORE.to_owned()), metrics::SCORE_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(metrics::GEN_AI_CLIENT_TOKEN_USAGE.to_owned()), metrics::TOKEN_BUCKETS)?
        .install_recorder()?;
    metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Middleware: counts every request by method, route template (never the raw
/// path, which holds run ids) and status, and times it to the response head.
/// Where traces are exported, the request is a server span (`POST /v1/runs`),
/// the child of the client's `traceparent` if it sends one; a run it creates
/// joins that trace.
pub async fn measure(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = known_method(request.method());
    // A route template is shared (an `Arc`): kept across the handler without a copy.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let in_flight = InFlight::enter();
    let response = if crate::otel::enabled() {
        let span = tracing::info_span!(
            "http_request",
            otel.name = format!("{method} {route}"),
            otel.kind = "server",
            http.request.method = %method,
            http.route = %route,
            http.response.status_code = tracing::field::Empty,
        );
        crate::otel::adopt_request(&span, request.headers());
        let response = next.run(request).instrument(span.clone()).await;
        span.record("http.response.status_code", response.status().as_u16());
        response
    } else {
        next.run(request).await
    };
    drop(in_flight);
    metrics::http_request(method, route, response.status().as_str(), started.elapsed());
    response
}

/// The method as a label: the standard ones by name, anything else as `other`
/// (a client must not be able to mint label values).
fn known_method(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// One request in flight; leaving counts even when the client went away and the
/// request was dropped.
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        metrics::http_in_flight(1.0);
        Self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::http_in_flight(-1.0);
    }
}
