//! The server's settings (`[server]`), checked into durations, and why the
//! server could not start.

use std::time::Duration;

use serde::Deserialize;

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
    /// The SHA-256 (64 hex digits) of the token `/metrics` asks for as
    /// `Authorization: Bearer …`; `None`: `/metrics` is open.
    pub metrics_token_sha256: Option<String>,
    /// Origins (`https://app.example.com`) whose pages may call the API from a
    /// browser (CORS); empty: none but the daemon's own page. `"*"` allows any.
    pub cors_origins: Vec<String>,
    /// Serve the web page at `/`.
    pub web: bool,
    /// Threads that run the daemon's own work (HTTP, the actors, the store's
    /// writer); 0: one per core. The local model and SQLite's checkpoints have
    /// threads of their own.
    pub worker_threads: usize,
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
            max_sse_clients_per_tenant: 256,
            retry_after: 5,
            metrics_token_sha256: None,
            cors_origins: Vec::new(),
            web: true,
            worker_threads: 1,
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
    /// The number of worker threads [`Self::worker_threads`] asks for.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        }
    }

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
