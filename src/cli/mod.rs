//! The command line's side of the library, what `main.rs` dispatches to: the
//! client of a running daemon and its terminal view, the in-process commands and
//! the file commands.
//!
//! - `client.rs`, `view.rs`: talking to a daemon, showing a run's events.
//! - `remote.rs`: `troupe run`, `runs …`, `agents`, `tools` (a running daemon);
//!   `chat.rs`: `troupe chat`, `threads …` (conversations on a running daemon).
//! - `local.rs`: `troupe serve`, `demo`, `resume`, `gc` (the runtime in-process,
//!   on an [`App`](crate::app::App)); `demo.rs`: the demo's run.
//! - `eval.rs`: `troupe eval` (a task file through the runtime in-process).
//! - `mailbox.rs`, `model.rs`: `troupe mailbox …`, `troupe model …` (files only).
//! - `setup.rs`: the configuration of a command from its flags and files.

pub mod chat;
pub mod client;
pub mod demo;
pub mod eval;
pub mod local;
pub mod mailbox;
pub mod model;
pub mod remote;
pub mod setup;
pub mod view;
