//! `troupe`: the binary's library side: the composition root, configuration,
//! model clients, built-in tools, the store, the HTTP server, the command line's
//! commands, and test support (a fake OpenAI-compatible server). The runtime core
//! is the `troupe-actors` crate.
//!
//! # Layout
//!
//! - `app.rs`: [`app::App::build`], the composition root: config + environment → adapters.
//! - `env.rs`: the process environment, read once (the only module that reads it).
//! - `config.rs`: the configuration (`config/default.toml`, overlays, `TROUPE_*`).
//! - `cli/`: the commands `main.rs` dispatches to, the daemon's client and view.
//! - `daemon.rs`: `troupe serve`'s runtime behind the HTTP API.
//! - `server/`, `store/`, `llm/`, `tools/`, `email/`, `mcp/`: the adapters.

pub mod app;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod email;
pub mod env;
pub mod eval;
pub mod llm;
pub mod mcp;
pub mod node;
pub mod otel;
pub mod reasoning;
pub mod server;
pub mod store;
pub mod testing;
pub mod tools;
