//! troupe's runtime core: one agent run is a supervised tree of ractor actors
//! exchanging typed messages.
//!
//! # Layout
//!
//! - [`runtime`]: the API boundary ([`Runtime`]): start, submit, subscribe, input,
//!   cancel, shutdown. Callers never hold a ref to an internal actor.
//! - [`protocol`]: the shared vocabulary (runs, plans, tool calls and outcomes,
//!   reviews, events, usage), plain serde data.
//! - [`shared`]: what every actor shares ([`shared::RuntimeShared`]);
//!   [`run_input`]: what a client sends a parked run; [`builtin`]: the tools the
//!   runtime answers itself.
//! - [`supervisor`]: the root actor: restarts, the registry of live runs.
//! - [`session`]: one actor per run: the turn loop.
//! - [`planner`]: one actor per run: the plan (`todo_write`).
//! - [`tool_pool`]: the shared executor: a bounded queue and linked workers.
//! - [`hooks`]: the hook chain every tool call goes through, and its built-ins.
//! - [`reviewer`]: judges every turn.
//! - [`steps`]: the tool calls an agent's runs open with, before the model
//!   takes over.
//! - [`events`]: live fan-out of committed events, with replay from the store.
//! - Ports: [`llm`] (the model), [`tool`] (tools), [`store`] (runs, events and the
//!   in-memory store).
//! - [`metrics`]: every metric name; [`config`]: settings as serde data;
//!   [`rfc3339`]: times as text, written by hand; [`duration_secs`]: durations
//!   as seconds.
//! - `testing` (feature `testing`): scripted model, test tools, faulty store,
//!   `eventually` (waiting in tests).
//!
//! # Layers
//!
//! No file imports from a file that imports it, directly or not (checked by
//! `python3 .ci/cycles.py`). The run's machinery goes one way: [`protocol`] →
//! the shared state ([`shared`], [`run_input`], [`builtin`]) → [`session`] →
//! [`supervisor`] → [`runtime`]. One message goes up: a session's `input.rs`
//! and `sub_runs.rs` send [`supervisor::SupervisorMsg`] to their supervisor
//! (a parked run frees its slot; a sub-run is started), while `supervisor.rs`
//! imports only the session's `mod.rs`, which imports none of its role files.
//!
//! This crate depends on no HTTP server, SQL driver, HTTP client or metrics
//! exporter: those are adapters in the `troupe` package.

#![warn(missing_docs)]

pub mod admission;
pub mod answer;
pub mod approvals;
pub mod builtin;
pub mod config;
pub mod duration_secs;
pub mod events;
pub mod hooks;
pub mod llm;
pub mod metrics;
pub mod planner;
pub mod protocol;
pub mod reviewer;
pub mod rfc3339;
pub mod run_input;
pub mod runtime;
pub mod session;
pub mod shared;
pub mod spans;
pub mod steps;
pub mod store;
pub mod supervisor;
pub mod threads;
pub mod tool;
pub mod tool_pool;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use run_input::{InputError, RunInput};
pub use runtime::{CancelError, Deps, Runtime, RuntimeError, SubmitError, SubmitRequest};
