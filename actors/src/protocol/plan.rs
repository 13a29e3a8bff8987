//! Plans: the task list a run keeps (`todo_write`).

use serde::{Deserialize, Serialize};

/// The status of one task of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Not started.
    Pending,
    /// Being worked on; at most one task is.
    InProgress,
    /// Done.
    Completed,
    /// Cannot proceed (a blocked tool, missing input).
    Blocked,
    /// Tried and failed.
    Failed,
}

/// One task of a plan, as written by the model's `todo_write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TodoItem {
    /// Unique within the plan.
    pub id: String,
    /// What the task is.
    pub content: String,
    /// Where it stands.
    pub status: TaskStatus,
    /// Tools the task expects to use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// What the task produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why it failed or is blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's task list. `version` grows by one on every accepted write.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Plan {
    /// 0 for the empty plan of a new run.
    pub version: u64,
    /// The tasks, in the model's order.
    pub items: Vec<TodoItem>,
}

impl Plan {
    /// How many tasks have `status`.
    pub fn count(&self, status: TaskStatus) -> usize {
        self.items.iter().filter(|item| item.status == status).count()
    }
}
