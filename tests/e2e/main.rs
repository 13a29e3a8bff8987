//! Black-box tests of the `troupe` binary: real processes, real output.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests read their settings (a PostgreSQL URL, a model, a seed) from the environment.
#![allow(clippy::disallowed_methods)]

mod cluster;
mod cost;
mod crash;
mod daemon;
mod default_agent;
mod demo;
mod email;
mod http_fetch;
mod local_model;
mod mcp;
mod model;
mod server;
mod store;
mod store_upgrade;
mod threads;
mod traces;
mod web;
