//! Built-in tools of the `troupe` binary.

mod text_stats;

use std::sync::Arc;

use troupe_actors::tool::{RegistryError, ToolRegistry};

pub use text_stats::TextStats;

/// The registry of built-in tools.
pub fn builtin_registry() -> Result<ToolRegistry, RegistryError> {
    ToolRegistry::new().with(Arc::new(TextStats))
}
