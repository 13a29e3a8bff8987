//! Black-box tests of the `troupe` binary: real processes, real output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod crash;
mod daemon;
mod demo;
mod email;
mod http_fetch;
mod local_model;
mod mcp;
mod model;
mod server;
mod store;
