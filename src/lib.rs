//! `troupe`: the binary's library side: configuration, model clients, built-in
//! tools, the demo, and test support (a fake OpenAI-compatible server). The
//! runtime core is the `troupe-actors` crate.

pub mod client;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod email;
pub mod llm;
pub mod mcp;
pub mod server;
pub mod store;
pub mod testing;
pub mod tools;
pub mod view;
