//! `troupe serve`: the HTTP API of DESIGN §8 over a [`Runtime`](troupe_actors::Runtime).
//!
//! - `routes.rs`: the router and the OpenAPI document.
//! - `api.rs`: the JSON routes of runs, agents, tools and health.
//! - `threads.rs`: the thread routes (conversations: runs that follow each other).
//! - `sse.rs`: `GET /v1/runs/{id}/events` and `GET /v1/threads/{id}/events`,
//!   resumable with `Last-Event-ID`.
//! - `auth.rs`: bearer tokens → tenants.
//! - `state.rs`: [`AppState`], what every handler shares; the tenant middleware
//!   and the lookup of a tenant's run.
//! - `slots.rs`: the limits on open event streams.
//! - `config.rs`: [`ServerConfig`] (`[server]`), checked into durations.
//! - `error.rs`: [`ApiError`], the one error type every route answers with.
//! - `telemetry.rs`: the Prometheus recorder and per-request metrics.
//! - `stall.rs`: the write timeout of a connection.
//! - `incidents.rs`: the log lines about refused requests, dropped connections
//!   and cut event streams; `throttle.rs` keeps a client from flooding the log
//!   with them.
//!
//! Connections are served by hyper directly rather than `axum::serve`, for the
//! header-read timeout: a client that sends half a request is dropped within
//! `header_read_timeout` instead of holding a connection forever.

mod api;
mod auth;
mod body;
mod config;
mod error;
mod event_stream;
mod forward;
mod incidents;
mod quota;
mod routes;
mod slots;
mod sse;
mod stall;
mod state;
mod telemetry;
mod threads;
mod throttle;
mod web;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use incidents::ConnectionNote;
use throttle::LogThrottle;

pub use routes::openapi;
pub use sse::STREAM_ERROR;

/// The API's JSON bodies, for clients.
pub mod api_types {
    pub use super::api::{AgentView, CreateRun, InputBody, LimitsBody, RunList, RunView, ToolView, UsageView};
    pub use super::error::{ErrorBody, ErrorDetail};
    pub use super::threads::{CreateThread, CreateThreadRun, ThreadDetail, ThreadList, ThreadMessageView, ThreadView};
}
pub use auth::{Auth, AuthConfig, AuthError, TokenConfig, hash_token};
pub use config::{ConnectionTimeouts, ServeError, ServerConfig};
pub use error::ApiError;
pub use forward::{COMMAND_CHANNEL, apply_commands};
pub use quota::{QuotaConfig, TenantQuota};
pub use state::{AppState, check_config};
pub use telemetry::install_prometheus;

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
    // Dropped connections are logged through it: a client can cause them.
    let throttle = Arc::new(LogThrottle::default());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    if let Some(suppressed) = throttle.admit("accept_failed") {
                        warn!(%error, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(error) = without_delay(&stream) {
            debug!(%error, %peer, "could not set TCP_NODELAY");
        }
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(timeouts.header_read).keep_alive(true);
        let note = Arc::new(ConnectionNote::new(peer));
        let io = TokioIo::new(stall::StallGuard::new(stream, timeouts.write, note.clone()));
        let noted = Noted { inner: service.clone(), note: note.clone() };
        let connection = graceful.watch(builder.serve_connection(io, noted));
        let throttle = throttle.clone();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                incidents::log_connection_end(&throttle, &note, &error, timeouts.header_read, timeouts.write);
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        warn!("connections still open after the shutdown deadline; closing them");
    }
}

/// The router as a hyper service.
type RouterService = TowerToHyperService<axum::Router>;

/// The router as a hyper service that hands each request its connection's note
/// (an event stream names its run in it).
struct Noted {
    inner: RouterService,
    note: Arc<ConnectionNote>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Noted {
    type Response = <RouterService as hyper::service::Service<hyper::Request<Incoming>>>::Response;
    type Error = <RouterService as hyper::service::Service<hyper::Request<Incoming>>>::Error;
    type Future = <RouterService as hyper::service::Service<hyper::Request<Incoming>>>::Future;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.note.clone());
        self.inner.call(request)
    }
}

/// Turns Nagle's algorithm off on an accepted connection: responses and events
/// are small writes that must go out at once. With it on, a client that reads an
/// event stream to its end waits for a delayed ACK (about 40 ms) on the chunked
/// terminator.
fn without_delay(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)
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
    routes::router(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_send_without_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let client = tokio::spawn(async move { TcpStream::connect(address).await });
        let (stream, _) = listener.accept().await.unwrap();
        assert!(!stream.nodelay().unwrap(), "an accepted socket starts with Nagle's algorithm on");
        without_delay(&stream).unwrap();
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY is set");
        drop(client.await.unwrap().unwrap());
    }
}
