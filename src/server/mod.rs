//! `troupe serve`: the HTTP API of DESIGN §8 over a [`Runtime`].
//!
//! - `api.rs`: the JSON routes and the OpenAPI document.
//! - `sse.rs`: `GET /v1/runs/{id}/events`, resumable with `Last-Event-ID`.
//! - `auth.rs`: bearer tokens → tenants.
//! - `error.rs`: [`ApiError`], the one error type every route answers with.
//! - `telemetry.rs`: the Prometheus recorder and per-request metrics.
//!
//! Connections are served by hyper directly rather than `axum::serve`, for the
//! header-read timeout: a client that sends half a request is dropped within
//! `header_read_timeout` instead of holding a connection forever.

mod api;
mod auth;
mod error;
mod sse;
mod stall;
mod telemetry;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use troupe_actors::Runtime;

pub use api::openapi;
pub use sse::STREAM_ERROR;

/// The API's JSON bodies, for clients.
pub mod api_types {
    pub use super::api::{AgentView, CreateRun, InputBody, LimitsBody, RunList, RunView, ToolView, UsageView};
    pub use super::error::{ErrorBody, ErrorDetail};
}
pub use auth::{Auth, AuthConfig, AuthError, TokenConfig, hash_token};
pub use error::ApiError;
pub use telemetry::install_prometheus;

/// Settings of the HTTP server (`[server]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on; `TROUPE_BIND` or `--bind` override it.
    pub bind: String,
    /// Largest request body accepted, in bytes; a larger one gets 413.
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request's headers once it starts one (and
    /// to start one on an idle connection) before the connection is dropped.
    pub header_read_timeout: f64,
    /// Seconds a write to a client may stay stuck (the client reads nothing, e.g.
    /// an event stream nobody consumes) before the connection is closed.
    pub write_timeout: f64,
    /// Seconds a request may take to get its response head (event streams are not
    /// cut by it: their head comes at once).
    pub request_timeout: f64,
    /// Seconds graceful shutdown waits for requests in flight and for runs to stop.
    pub shutdown_timeout: f64,
    /// Seconds between keep-alive comments on an idle event stream.
    pub sse_keep_alive: f64,
    /// Event streams open at once, in all.
    pub max_sse_clients: usize,
    /// Event streams open at once per tenant.
    pub max_sse_clients_per_tenant: usize,
    /// The `Retry-After` (seconds) sent with 429 and 503 answers.
    pub retry_after: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:7878".to_owned(),
            max_body_bytes: 1024 * 1024,
            header_read_timeout: 5.0,
            write_timeout: 60.0,
            request_timeout: 30.0,
            shutdown_timeout: 10.0,
            sse_keep_alive: 15.0,
            max_sse_clients: 1024,
            max_sse_clients_per_tenant: 16,
            retry_after: 5,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is out of range.
    #[error("invalid [server] setting: {0}")]
    Config(String),
    /// The listener failed.
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Checked durations of a [`ServerConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    pub header_read_timeout: Duration,
    pub write_timeout: Duration,
    pub request_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub sse_keep_alive: Duration,
}

impl ServerConfig {
    pub(crate) fn timing(&self) -> Result<Timing, ServeError> {
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|duration| !duration.is_zero())
                .ok_or_else(|| ServeError::Config(format!("server.{name} must be a positive number of seconds")))
        };
        Ok(Timing {
            header_read_timeout: seconds("header_read_timeout", self.header_read_timeout)?,
            write_timeout: seconds("write_timeout", self.write_timeout)?,
            request_timeout: seconds("request_timeout", self.request_timeout)?,
            shutdown_timeout: seconds("shutdown_timeout", self.shutdown_timeout)?,
            sse_keep_alive: seconds("sse_keep_alive", self.sse_keep_alive)?,
        })
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<Runtime>,
    auth: Auth,
    config: ServerConfig,
    timing: Timing,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    streams: sse::StreamSlots,
    shutdown: CancellationToken,
}

impl AppState {
    /// The state of a server over `runtime`. `prometheus` renders `/metrics` (404
    /// without it); cancelling `shutdown` ends every event stream.
    pub fn new(
        runtime: Arc<Runtime>,
        auth: Auth,
        config: ServerConfig,
        prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
        shutdown: CancellationToken,
    ) -> Result<Self, ServeError> {
        let timing = config.timing()?;
        let streams = sse::StreamSlots::new(config.max_sse_clients, config.max_sse_clients_per_tenant);
        Ok(Self { inner: Arc::new(Inner { runtime, auth, config, timing, prometheus, streams, shutdown }) })
    }
}

/// How long a connection may stall.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionTimeouts {
    /// To send a request's headers (and to start the next one when idle).
    pub header_read: Duration,
    /// For a stuck write to make progress.
    pub write: Duration,
}

impl ServerConfig {
    /// The connection timeouts of this config.
    pub fn connection_timeouts(&self) -> Result<ConnectionTimeouts, ServeError> {
        let timing = self.timing()?;
        Ok(ConnectionTimeouts { header_read: timing.header_read_timeout, write: timing.write_timeout })
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops taking
/// connections and waits up to `drain` for the open ones to finish their requests
/// (event streams end at once on `shutdown`).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    timeouts: ConnectionTimeouts,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    let service = TowerToHyperService::new(router);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(timeouts.header_read).keep_alive(true);
        let io = TokioIo::new(stall::StallGuard::new(stream, timeouts.write));
        let connection = builder.serve_connection(io, service.clone());
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        warn!("connections still open after the shutdown deadline; closing them");
    }
}

/// Binds `addr`.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    info!(%local, "listening");
    Ok((listener, local))
}

/// The whole router: the API, the event stream, health, metrics, OpenAPI.
pub fn router(state: AppState) -> axum::Router {
    api::router(state)
}
