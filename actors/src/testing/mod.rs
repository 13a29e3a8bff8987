//! Test support (feature `testing`): a scripted model, tools that echo, fail,
//! panic, hang or write to a ledger, a store that panics on demand, and a metrics
//! recorder. They stand in for the network and the world in tests and benches;
//! none of them is used by the product. [`eventually`] waits for a condition.
//!
//! One file per kind: `model.rs`, `tools.rs`, `store.rs`, `metrics.rs`,
//! `eventually.rs`, and `bench.rs` (the benchmark workload).

pub mod bench;
mod eventually;
mod metrics;
mod model;
mod store;
mod tools;

pub use eventually::{Holds, eventually};
pub use metrics::{capture_metrics, counter, series_name};
pub use model::{ScriptedModel, Step, StreamHold, calls, text, todo, usage};
pub use store::FaultyStore;
pub use tools::{
    ClassifierTool, EchoTool, FailingTool, GatedTool, LedgerTool, PanickingTool, SearchTool, SlowTool, tool_context,
};
