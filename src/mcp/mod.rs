//! The MCP client: tools of MCP servers offered to agents like built-in tools.
//!
//! - `config.rs`: the `[mcp]` section and its checks.
//! - `supervisor.rs`: one task per server keeps it connected (stdio child or
//!   streamable HTTP), reconnects with backoff and refreshes its tool list.
//! - `listing.rs`: a server's tool list: naming (`server__tool`), definitions,
//!   compiled schemas.
//! - `tool.rs`: [`McpTool`], one server tool as a troupe `Tool`: argument
//!   validation, the call, results.
//!
//! rmcp (pinned `~3.9`, whose majors churn) is used only inside this module.
//! [`McpHub`] is what the binary sees: start the servers, register their tools,
//! report their state, shut them down. A server that cannot be reached never
//! stops the daemon: its tools fail with `mcp_unavailable` (and so are blocked by
//! the failure hook like any failing tool) until the supervisor reconnects.

mod config;
mod listing;
mod supervisor;
mod tool;

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use troupe_actors::config::AgentConfig;
use troupe_actors::tool::{RegistryError, ToolRegistry};

pub use config::{McpConfig, McpConfigError, McpServerConfig, TransportKind};
pub use listing::{SEPARATOR, exposed_name};
pub use supervisor::ServerStatus;
pub use tool::McpTool;

use crate::mcp::supervisor::ServerShared;

/// The configured MCP servers, each kept connected by its own task.
pub struct McpHub {
    servers: Vec<Arc<ServerShared>>,
    shutdown: CancellationToken,
    /// The supervisors, joined by [`McpHub::shutdown`]. A std mutex: it is only
    /// taken to move the handles out, never across an await.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl McpHub {
    /// A hub with no servers.
    pub fn empty() -> Self {
        Self { servers: Vec::new(), shutdown: CancellationToken::new(), tasks: Mutex::new(Vec::new()) }
    }

    /// Checks the config, starts a supervisor per server and waits until each has
    /// made its first connection attempt (at most its `connect_timeout`). Only a
    /// config error fails; an unreachable server is logged and retried. `env`
    /// looks up the variables stdio servers inherit.
    pub async fn start(config: &McpConfig, env: impl Fn(&str) -> Option<String>) -> Result<Self, McpConfigError> {
        let specs = config.servers(env)?;
        let shutdown = CancellationToken::new();
        // Should this future be dropped before it returns, the servers stop.
        let guard = shutdown.clone().drop_guard();
        let mut tasks = Vec::new();
        let mut servers = Vec::new();
        for spec in specs {
            let shared = Arc::new(ServerShared::new(&spec));
            tasks.push(tokio::spawn(supervisor::supervise(shared.clone(), spec, shutdown.child_token())));
            servers.push(shared);
        }
        futures::future::join_all(servers.iter().map(|server| server.started())).await;
        for status in servers.iter().map(|server| server.status()) {
            match &status.error {
                None => info!(server = %status.name, tools = %status.tools.join(", "), "mcp server ready"),
                Some(error) => warn!(
                    server = %status.name, %error,
                    "mcp server unreachable at startup; the daemon starts without it and keeps retrying"
                ),
            }
        }
        guard.disarm();
        Ok(Self { servers, shutdown, tasks: Mutex::new(tasks) })
    }

    /// Registers the servers' tools in `registry`: every tool a server listed at
    /// startup, and every `server__tool` an agent names for a configured server
    /// that has not listed it (unreachable at startup, or a tool it offers later):
    /// such a tool fails with `mcp_tool_unavailable` or `mcp_unavailable` until
    /// the server offers it. A listed tool whose name is taken is left out with a
    /// warning.
    pub fn register(&self, registry: &mut ToolRegistry, agents: &[AgentConfig]) -> Result<(), RegistryError> {
        for server in &self.servers {
            let mut listed: Vec<String> = server.tools().keys().cloned().collect();
            listed.sort();
            for name in listed {
                if registry.get(&name).is_some() {
                    warn!(server = %server.name, tool = %name, "mcp tool left out: a tool of that name is registered");
                    continue;
                }
                registry.register(Arc::new(McpTool::new(name, server.clone())))?;
            }
            let prefix = format!("{}{SEPARATOR}", server.name);
            for name in agents.iter().flat_map(|agent| &agent.tools) {
                if name.starts_with(&prefix) && registry.get(name).is_none() {
                    warn!(server = %server.name, tool = %name, "an agent names an mcp tool the server has not listed; it fails until the server offers it");
                    registry.register(Arc::new(McpTool::new(name.clone(), server.clone())))?;
                }
            }
        }
        Ok(())
    }

    /// Every server's state, in config order.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers.iter().map(|server| server.status()).collect()
    }

    /// Waits until `server` is connected; false if there is no such server.
    pub async fn connected(&self, server: &str) -> bool {
        match self.servers.iter().find(|shared| shared.name == server) {
            Some(shared) => {
                shared.connected().await;
                true
            }
            None => false,
        }
    }

    /// Closes every connection (a stdio server gets its stdin closed, then
    /// SIGTERM, then SIGKILL, to its whole process group) and waits for the
    /// supervisors to end.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for McpHub {
    /// Dropped without [`McpHub::shutdown`] (an early error), the supervisors still
    /// close their servers; children are killed when their handles drop.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
