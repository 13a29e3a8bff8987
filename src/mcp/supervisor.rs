//! One task per MCP server keeps it connected: connect (spawn the child, or open
//! the HTTP session), list its tools, then wait for the connection to end; then
//! reconnect after a backoff that doubles per failed attempt up to `backoff_max`.
//! The tool list is listed again on every connection and on
//! `notifications/tools/list_changed`. The task publishes the current connection
//! and the last listed tools in [`ServerShared`], where tool calls read them; it
//! never runs a tool call itself.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::model::{ClientConfig, Implementation};
use rmcp::service::{NotificationContext, Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::mcp::config::{ServerSpec, Transport};
use crate::mcp::listing::{ToolSet, tool_set};

/// How long a closing connection may take (rmcp gives a child 3 s after closing
/// its stdin, then 3 s after SIGTERM, then kills it) before it is dropped, which
/// kills the child's process group at once.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(8);

/// What the supervisor publishes and tool calls read.
pub struct ServerShared {
    /// The server's configured name.
    pub name: String,
    /// Limit on one of its tool calls.
    pub call_timeout: Duration,
    link: watch::Sender<Link>,
    /// The last listed tools; kept while the server is down, so the model is still
    /// shown their schemas (and calls fail with `mcp_unavailable`).
    tools: watch::Sender<Arc<ToolSet>>,
}

/// The state of a server's connection.
#[derive(Clone)]
pub enum Link {
    /// The first attempt has not ended yet.
    Starting,
    /// Connected.
    Up(Arc<Connection>),
    /// Not connected; the supervisor retries.
    Down {
        /// Why the last attempt or connection failed.
        error: String,
    },
    /// Shut down.
    Stopped,
}

/// A live connection.
pub struct Connection {
    /// Sends requests to the server.
    pub peer: Peer<RoleClient>,
    /// Cancelled by a call that saw the transport fail: the supervisor then drops
    /// this connection and reconnects. One token per connection, so a late report
    /// about an old connection cannot cut a new one.
    pub lost: CancellationToken,
}

/// A server's state as reported to people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    /// Its name.
    pub name: String,
    /// Whether it is connected now.
    pub connected: bool,
    /// Tools it listed last.
    pub tools: Vec<String>,
    /// Why it is not connected, if it is not.
    pub error: Option<String>,
}

impl ServerShared {
    /// A server not yet started.
    pub fn new(spec: &ServerSpec) -> Self {
        Self {
            name: spec.name.clone(),
            call_timeout: spec.call_timeout,
            link: watch::Sender::new(Link::Starting),
            tools: watch::Sender::new(Arc::new(ToolSet::new())),
        }
    }

    /// The live connection, or why there is none.
    pub fn connection(&self) -> Result<Arc<Connection>, String> {
        match &*self.link.borrow() {
            Link::Up(connection) if !connection.lost.is_cancelled() => Ok(connection.clone()),
            Link::Up(_) => Err("connection lost".to_owned()),
            Link::Starting => Err("still connecting".to_owned()),
            Link::Down { error } => Err(error.clone()),
            Link::Stopped => Err("the daemon is shutting down".to_owned()),
        }
    }

    /// Lists the server's tools now (a call names a tool the last list lacks: a
    /// `list_changed` may be on its way) and publishes them; the last list when
    /// the server cannot answer.
    pub async fn relist(&self, connection: &Connection) -> Arc<ToolSet> {
        match tokio::time::timeout(self.call_timeout, connection.peer.list_all_tools()).await {
            Ok(Ok(tools)) => {
                let tools = Arc::new(tool_set(&self.name, tools));
                self.tools.send_replace(tools.clone());
                tools
            }
            _ => self.tools(),
        }
    }

    /// The tools it listed last.
    pub fn tools(&self) -> Arc<ToolSet> {
        self.tools.borrow().clone()
    }

    /// Its state for people.
    pub fn status(&self) -> ServerStatus {
        let mut tools: Vec<String> = self.tools().keys().cloned().collect();
        tools.sort();
        let error = self.connection().err();
        ServerStatus { name: self.name.clone(), connected: error.is_none(), tools, error }
    }

    /// Waits until the first connection attempt has ended (either way).
    pub async fn started(&self) {
        let mut link = self.link.subscribe();
        let _ = link.wait_for(|link| !matches!(link, Link::Starting)).await;
    }

    /// Waits until a connection is up. For tests and tools that want to wait.
    pub async fn connected(&self) {
        let mut link = self.link.subscribe();
        let _ = link.wait_for(|link| matches!(link, Link::Up(connection) if !connection.lost.is_cancelled())).await;
    }
}

/// The client side of the protocol: answers the server with defaults and passes
/// `notifications/tools/list_changed` on to the supervisor.
#[derive(Clone)]
struct Handler {
    tools_changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) -> impl Future<Output = ()> + Send + '_ {
        self.tools_changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info = Implementation::new("troupe", env!("CARGO_PKG_VERSION"));
        info
    }
}

type Service = RunningService<RoleClient, Handler>;

/// Why a connection ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// Keeps `spec`'s server connected until `shutdown`, publishing into `shared`.
pub async fn supervise(shared: Arc<ServerShared>, spec: ServerSpec, shutdown: CancellationToken) {
    let server = spec.name.as_str();
    let mut failures: u32 = 0;
    loop {
        let tools_changed = Arc::new(Notify::new());
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => break,
            attempt = tokio::time::timeout(spec.connect_timeout, connect(&spec, tools_changed.clone())) => attempt,
        };
        let error = match attempt {
            Ok(Ok((service, tools))) => {
                info!(server, tools = tools.len(), "mcp server connected");
                let connected_at = tokio::time::Instant::now();
                shared.tools.send_replace(Arc::new(tools));
                let connection = Arc::new(Connection { peer: service.peer().clone(), lost: CancellationToken::new() });
                shared.link.send_replace(Link::Up(connection.clone()));
                let ended = stay_connected(&shared, &spec, service, &connection, &tools_changed, &shutdown).await;
                // Only a connection that stayed up a while resets the backoff: a
                // server that dies right after its handshake must not be
                // restarted at the shortest delay forever.
                if connected_at.elapsed() >= STABLE_AFTER {
                    failures = 0;
                }
                match ended {
                    Ended::Shutdown => break,
                    Ended::Lost(error) => error,
                }
            }
            Ok(Err(error)) => error,
            Err(_) => format!("no connection within {:?}", spec.connect_timeout),
        };
        failures = failures.saturating_add(1);
        let delay = backoff(&spec, failures);
        warn!(server, %error, retry_in_ms = delay.as_millis() as u64, "mcp server unavailable; its tools fail until it is back");
        shared.link.send_replace(Link::Down { error });
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    shared.link.send_replace(Link::Stopped);
    debug!(server, "mcp supervisor stopped");
}

/// How long a connection must last for the backoff to start over.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// `backoff_initial` doubled per failure after the first, at most `backoff_max`.
fn backoff(spec: &ServerSpec, failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    spec.backoff_initial.saturating_mul(factor).min(spec.backoff_max)
}

/// Waits for the connection to end: shutdown, the transport closing, or a call
/// reporting it lost. Lists the tools again on `list_changed`.
async fn stay_connected(
    shared: &ServerShared,
    spec: &ServerSpec,
    service: Service,
    connection: &Connection,
    tools_changed: &Notify,
    shutdown: &CancellationToken,
) -> Ended {
    let server = spec.name.as_str();
    let cancel = service.cancellation_token();
    let finished = service.waiting();
    tokio::pin!(finished);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                cancel.cancel();
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, finished).await;
                return Ended::Shutdown;
            }
            quit = &mut finished => {
                connection.lost.cancel();
                return Ended::Lost(format!("the connection closed ({})", quit.map(|reason| format!("{reason:?}")).unwrap_or_else(|error| error.to_string())));
            }
            _ = connection.lost.cancelled() => {
                cancel.cancel();
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, finished).await;
                return Ended::Lost("a call found the connection broken".to_owned());
            }
            _ = tools_changed.notified() => {
                match tokio::time::timeout(spec.connect_timeout, connection.peer.list_all_tools()).await {
                    Ok(Ok(tools)) => {
                        let tools = tool_set(server, tools);
                        info!(server, tools = tools.len(), "mcp tool list changed");
                        shared.tools.send_replace(Arc::new(tools));
                    }
                    Ok(Err(error)) => warn!(server, %error, "mcp tool list could not be refreshed"),
                    Err(_) => warn!(server, "mcp tool list could not be refreshed in time"),
                }
            }
        }
    }
}

/// Connects and lists the tools.
async fn connect(spec: &ServerSpec, tools_changed: Arc<Notify>) -> Result<(Service, ToolSet), String> {
    let handler = Handler { tools_changed };
    let service = match &spec.transport {
        Transport::Stdio { command, args, env } => {
            let mut child = tokio::process::Command::new(command);
            child.args(args).env_clear().envs(env);
            let mut wrapped = CommandWrap::from(child);
            // Its own process group: a server started through a launcher (npx, uvx)
            // is killed with its children, and a Ctrl-C at the terminal reaches the
            // daemon only, which then closes the servers itself.
            wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            let (transport, stderr) = TokioChildProcess::builder(wrapped)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|error| format!("cannot start {command:?}: {error}"))?;
            let tail = stderr.map(|stderr| forward_stderr(spec.name.clone(), stderr));
            match handler.serve(transport).await {
                Ok(service) => service,
                // The server's own words say why (a missing module, a bad flag): they
                // go with the failure, which is logged at warn.
                Err(error) => match tail {
                    Some(tail) => return Err(format!("handshake failed: {error}{}", tail.last_words().await)),
                    None => return Err(format!("handshake failed: {error}")),
                },
            }
        }
        Transport::Http { url, headers } => {
            let custom_headers = headers.iter().map(|(name, value)| (name.clone(), value.clone())).collect();
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom_headers);
            let transport = StreamableHttpClientTransport::from_config(config);
            handler.serve(transport).await.map_err(|error| format!("cannot connect to {url}: {error}"))?
        }
    };
    let tools = service.peer().list_all_tools().await.map_err(|error| format!("cannot list tools: {error}"))?;
    Ok((service, tool_set(&spec.name, tools)))
}

/// Lines of a server's stderr kept to explain a failed start.
const STDERR_TAIL: usize = 8;

/// How long a failed start waits for the rest of a server's stderr.
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// The last lines a server wrote to stderr, while its forwarding task runs.
struct StderrTail {
    lines: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StderrTail {
    /// "; its stderr: …" with the last lines, once the server closed its stderr
    /// (it exited) or after [`STDERR_DRAIN`]; empty if it wrote nothing.
    async fn last_words(self) -> String {
        let _ = tokio::time::timeout(STDERR_DRAIN, self.task).await;
        let lines = self.lines.lock().map(|lines| lines.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
        if lines.is_empty() { String::new() } else { format!("; its stderr: {}", lines.join(" | ")) }
    }
}

/// The server's stderr, line by line, into our log (at debug: servers are chatty),
/// keeping the last lines. Offloaded I/O: the task ends when the child closes its
/// stderr.
fn forward_stderr(server: String, stderr: tokio::process::ChildStderr) -> StderrTail {
    let lines = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::with_capacity(STDERR_TAIL)));
    let kept = lines.clone();
    let task = tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            debug!(server, "{line}");
            if let Ok(mut kept) = kept.lock() {
                if kept.len() == STDERR_TAIL {
                    kept.pop_front();
                }
                kept.push_back(line.chars().take(300).collect());
            }
        }
    });
    StderrTail { lines, task }
}
