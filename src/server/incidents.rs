//! What the server tells its operator about requests it refused (413, 429, 503),
//! connections it dropped (a client too slow to send its request head or to read
//! its response) and event streams it cut short. Each leaves one line, with the
//! tenant and run where known: WARN for what an operator must act on (capacity,
//! timeouts, a failing store), INFO or DEBUG for a client's own trouble. A client
//! can cause every one of them, so each kind goes through the [`LogThrottle`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, Uri, header};
use axum::response::Response;
use tracing::Level;
use troupe_actors::protocol::RunId;

use super::error::ApiError;
use super::state::AppState;
use super::throttle::LogThrottle;

/// Writes one tracing event at a level chosen at run time.
macro_rules! event_at {
    ($level:expr, $($rest:tt)+) => {
        match $level {
            Level::ERROR => tracing::error!($($rest)+),
            Level::WARN => tracing::warn!($($rest)+),
            Level::INFO => tracing::info!($($rest)+),
            Level::DEBUG => tracing::debug!($($rest)+),
            _ => tracing::trace!($($rest)+),
        }
    };
}

/// What a request said about itself, kept for the line written if it is refused.
pub struct RequestSeen {
    method: Method,
    route: Option<MatchedPath>,
    uri: Uri,
    authorization: Option<HeaderValue>,
}

impl RequestSeen {
    /// Notes `request`'s method, route, path and credentials (cheap clones).
    pub fn of(request: &Request) -> Self {
        Self {
            method: request.method().clone(),
            route: request.extensions().get::<MatchedPath>().cloned(),
            uri: request.uri().clone(),
            authorization: request.headers().get(header::AUTHORIZATION).cloned(),
        }
    }

    /// The run the path names, if it names one.
    fn run_id(&self) -> Option<RunId> {
        let rest = self.uri.path().strip_prefix("/v1/runs/")?;
        rest.split('/').next()?.parse().ok()
    }
}

/// Logs `response` if it refuses the request: 413, 429 and the 503 of a request
/// that took too long. The level says who must act: the operator for capacity
/// and time-outs, nobody for a client's oversized body or its own tenant limit.
pub fn log_refusal(state: &AppState, seen: &RequestSeen, response: &Response) {
    let Some(error) = response.extensions().get::<ApiError>() else { return };
    let Some(level) = refusal_level(error.code) else { return };
    let Some(suppressed) = state.inner.throttle.admit(error.code) else { return };
    // Only for a line that is written: hashing the token is not free.
    let authorization = seen.authorization.as_ref().and_then(|value| value.to_str().ok());
    let tenant = state.inner.auth.tenant(authorization);
    let route = seen.route.as_ref().map_or("unmatched", MatchedPath::as_str);
    event_at!(
        level,
        status = error.status.as_u16(),
        code = error.code,
        tenant = tenant.as_deref(),
        run_id = seen.run_id().map(tracing::field::display),
        method = %seen.method,
        route,
        reason = %error.message,
        suppressed,
        "request refused"
    );
}

/// The level of a refusal's line, `None` for errors that are no refusal (or are
/// logged where they happen, like a store failure).
fn refusal_level(code: &str) -> Option<Level> {
    match code {
        // The daemon is at its capacity, or too slow: an operator must act.
        "overloaded" | "too_many_streams" | "timeout" => Some(Level::WARN),
        // A client's own limit or mistake.
        "tenant_overloaded" | "payload_too_large" => Some(Level::INFO),
        // Shutting down: expected.
        "unavailable" => Some(Level::DEBUG),
        _ => None,
    }
}

/// What one connection did, for the line written when it is dropped. Shared by
/// its socket (see `stall.rs`), its requests (the event stream it serves) and
/// the task that serves it.
pub struct ConnectionNote {
    peer: SocketAddr,
    /// Bytes of a request came in since the last response bytes went out: a
    /// header timeout now drops a client mid-request, not an idle keep-alive.
    reading: AtomicBool,
    /// The write timeout fired.
    stalled: AtomicBool,
    /// The run whose events the connection streams, and its tenant.
    stream: Mutex<Option<(String, RunId)>>,
}

impl ConnectionNote {
    /// A note for a connection from `peer`.
    pub fn new(peer: SocketAddr) -> Self {
        Self { peer, reading: AtomicBool::new(false), stalled: AtomicBool::new(false), stream: Mutex::new(None) }
    }

    /// Bytes of a request were read.
    pub fn read(&self) {
        self.reading.store(true, Ordering::Relaxed);
    }

    /// Bytes of a response were written.
    pub fn wrote(&self) {
        self.reading.store(false, Ordering::Relaxed);
    }

    /// A write made no progress for the write timeout.
    pub fn stalled(&self) {
        self.stalled.store(true, Ordering::Relaxed);
    }

    /// The connection streams `run_id`'s events to `tenant`.
    pub fn streams(&self, tenant: &str, run_id: RunId) {
        *self.stream.lock().unwrap_or_else(PoisonError::into_inner) = Some((tenant.to_owned(), run_id));
    }
}

/// Logs a connection that ended with `error`: a client dropped for being too slow
/// (INFO: its own trouble, the server is protected), anything else at DEBUG (a
/// client that went away, an idle keep-alive closed).
pub fn log_connection_end(
    throttle: &LogThrottle,
    note: &ConnectionNote,
    error: &hyper::Error,
    header_read: Duration,
    write: Duration,
) {
    let peer = note.peer;
    let stream = note.stream.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let (tenant, run_id) = stream.map_or((None, None), |(tenant, run_id)| (Some(tenant), Some(run_id)));
    let run_id = run_id.map(tracing::field::display);
    if note.stalled.load(Ordering::Relaxed) {
        if let Some(suppressed) = throttle.admit("write_timeout") {
            tracing::info!(
                %peer,
                tenant = tenant.as_deref(),
                run_id,
                timeout_s = write.as_secs_f64(),
                suppressed,
                "dropped a client that read nothing for server.write_timeout"
            );
        }
    } else if error.is_timeout() && note.reading.load(Ordering::Relaxed) {
        if let Some(suppressed) = throttle.admit("header_read_timeout") {
            tracing::info!(
                %peer,
                timeout_s = header_read.as_secs_f64(),
                suppressed,
                "dropped a client that did not finish its request head within server.header_read_timeout"
            );
        }
    } else if error.is_timeout() {
        tracing::debug!(%peer, "closed an idle connection");
    } else {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

/// Why an event stream ended before its run did.
#[derive(Debug, Clone, Copy)]
pub enum StreamCut {
    /// Reading the run's events from the store failed.
    StoreFailed,
    /// The server is shutting down.
    Shutdown,
    /// The run's session stopped before the run ended (the runtime stopping).
    SessionStopped,
}

/// Logs an event stream the server ended before its run's `run_end`.
pub fn log_stream_cut(state: &AppState, tenant: &str, run_id: RunId, cut: StreamCut, detail: Option<&str>) {
    let (kind, level, message) = match cut {
        StreamCut::StoreFailed => {
            ("stream_store_failed", Level::WARN, "event stream cut: reading the run's events from the store failed")
        }
        StreamCut::Shutdown => ("stream_shutdown", Level::INFO, "event stream closed: the server is shutting down"),
        StreamCut::SessionStopped => {
            ("stream_session_stopped", Level::INFO, "event stream ended before its run: the run's session stopped")
        }
    };
    let Some(suppressed) = state.inner.throttle.admit(kind) else { return };
    event_at!(level, tenant, %run_id, error = detail, suppressed, "{message}");
}
