//! Planner: owns one run's plan and answers `todo_write`. Never calls the model or a
//! tool. `todo_write` has task-list semantics: every call carries the whole list,
//! ids are unique, at most one task is `in_progress`, and malformed input is
//! rejected with a reason the model sees (the plan is then left unchanged).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::BuiltinTool;
use crate::llm::ToolDefinition;
use crate::protocol::{Plan, TaskStatus, TodoItem};

/// The name of the planning tool.
pub const TODO_WRITE: &str = BuiltinTool::TodoWrite.name();

/// Messages the planner takes.
pub enum PlannerMsg {
    /// Replace the task list with the model's `todo_write` arguments; replies with
    /// the new plan or why it was rejected.
    Write {
        /// The call's arguments.
        args: Value,
        /// The new plan or the rejection.
        reply: RpcReplyPort<Result<Plan, PlanError>>,
    },
    /// Replace the task list with a reviewer's `updated_plan`.
    Replace {
        /// The tasks.
        items: Vec<TodoItem>,
        /// The new plan or the rejection.
        reply: RpcReplyPort<Result<Plan, PlanError>>,
    },
    /// The current plan.
    Current {
        /// The plan.
        reply: RpcReplyPort<Plan>,
    },
}

/// Why a task list was rejected. The text is what the model sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The arguments are not `{"todos": [...]}`.
    #[error("todo_write takes {{\"todos\": [{{\"id\", \"content\", \"status\"}}, ...]}}: {0}")]
    Malformed(String),
    /// Two tasks share an id.
    #[error("task id {0:?} is used twice; ids must be unique")]
    DuplicateId(String),
    /// More than one task is in progress.
    #[error("tasks {0:?} are all in_progress; at most one task may be in_progress")]
    SeveralInProgress(Vec<String>),
    /// Too many tasks.
    #[error("{count} tasks is more than the limit of {max}; merge some")]
    TooMany {
        /// Tasks given.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// Planner settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    /// Most tasks in a plan.
    pub max_items: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self { max_items: 50 }
    }
}

/// The planner; read-only.
pub struct Planner {
    /// Limits.
    pub config: PlannerConfig,
}

/// The planner's state: the plan.
pub struct PlannerState {
    plan: Plan,
}

impl Actor for Planner {
    type Msg = PlannerMsg;
    type State = PlannerState;
    /// The plan restored from the store (empty for a new run).
    type Arguments = Plan;

    async fn pre_start(&self, _myself: ActorRef<PlannerMsg>, plan: Plan) -> Result<PlannerState, ActorProcessingErr> {
        Ok(PlannerState { plan })
    }

    async fn handle(
        &self,
        _myself: ActorRef<PlannerMsg>,
        message: PlannerMsg,
        state: &mut PlannerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PlannerMsg::Write { args, reply } => {
                let result = parse_todos(&args).and_then(|items| self.accept(state, items));
                let _ = reply.send(result);
            }
            PlannerMsg::Replace { items, reply } => {
                let _ = reply.send(self.accept(state, items));
            }
            PlannerMsg::Current { reply } => {
                let _ = reply.send(state.plan.clone());
            }
        }
        Ok(())
    }
}

impl Planner {
    fn accept(&self, state: &mut PlannerState, items: Vec<TodoItem>) -> Result<Plan, PlanError> {
        validate(&items, self.config.max_items)?;
        state.plan = Plan { version: state.plan.version + 1, items };
        Ok(state.plan.clone())
    }
}

/// Checks the task-list rules.
pub fn validate(items: &[TodoItem], max_items: usize) -> Result<(), PlanError> {
    if items.len() > max_items {
        return Err(PlanError::TooMany { count: items.len(), max: max_items });
    }
    let mut ids = HashSet::new();
    for item in items {
        if !ids.insert(item.id.as_str()) {
            return Err(PlanError::DuplicateId(item.id.clone()));
        }
    }
    let in_progress: Vec<String> =
        items.iter().filter(|item| item.status == TaskStatus::InProgress).map(|item| item.id.clone()).collect();
    if in_progress.len() > 1 {
        return Err(PlanError::SeveralInProgress(in_progress));
    }
    Ok(())
}

/// Reads `{"todos": [...]}`. Ids may be strings or numbers; content must not be empty.
pub fn parse_todos(args: &Value) -> Result<Vec<TodoItem>, PlanError> {
    let args = match args {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|error| PlanError::Malformed(format!("arguments are not valid JSON: {error}")))?,
        other => other.clone(),
    };
    let Some(todos) = args.get("todos").and_then(Value::as_array) else {
        return Err(PlanError::Malformed("missing the \"todos\" array".to_owned()));
    };
    let mut items = Vec::with_capacity(todos.len());
    for (index, todo) in todos.iter().enumerate() {
        let mut todo = todo.clone();
        if let Some(id) = todo.get("id").filter(|id| id.is_number()).map(Value::to_string) {
            todo["id"] = Value::String(id);
        }
        let item: TodoItem = serde_json::from_value(todo)
            .map_err(|error| PlanError::Malformed(format!("task {}: {error}", index + 1)))?;
        if item.content.trim().is_empty() {
            return Err(PlanError::Malformed(format!("task {}: content is empty", index + 1)));
        }
        items.push(item);
    }
    Ok(items)
}

/// The plan as the prompt shows it: ✓ completed, → in progress, ✗ failed or
/// blocked, ○ pending.
pub fn render(plan: &Plan) -> String {
    if plan.items.is_empty() {
        return "<plan>\n(no plan yet: use todo_write to write one)\n</plan>".to_owned();
    }
    let mut text = format!("<plan version=\"{}\">\n", plan.version);
    for item in &plan.items {
        let marker = marker(item.status);
        text.push_str(&format!("{marker} [{}] {}", item.id, item.content));
        match (&item.status, &item.error, &item.result) {
            (TaskStatus::Blocked, error, _) => {
                text.push_str(&format!(" (blocked{})", error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()))
            }
            (_, Some(error), _) => text.push_str(&format!(" (error: {error})")),
            (_, None, Some(result)) => text.push_str(&format!(" (result: {result})")),
            _ => {}
        }
        text.push('\n');
    }
    text.push_str("</plan>");
    text
}

/// The checklist marker of a status: ✓ completed, → in progress, ✗ failed or
/// blocked, ○ pending.
pub fn marker(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Completed => "✓",
        TaskStatus::InProgress => "→",
        TaskStatus::Failed | TaskStatus::Blocked => "✗",
        TaskStatus::Pending => "○",
    }
}

/// What `todo_write` takes (the schema the model sees; `parse_todos` reads it
/// leniently: ids may also be numbers).
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct TodoWriteArgs {
    /// The whole task list, in order; it replaces the previous one.
    todos: Vec<TodoItem>,
}

/// The `todo_write` tool as offered to the model (built once).
pub fn todo_write_definition() -> Arc<ToolDefinition> {
    static DEFINITION: LazyLock<Arc<ToolDefinition>> = LazyLock::new(|| Arc::new(build_todo_write_definition()));
    DEFINITION.clone()
}

fn build_todo_write_definition() -> ToolDefinition {
    ToolDefinition {
        name: TODO_WRITE.to_owned(),
        description: "Write the whole task list of this run (it replaces the previous one). \
            Use it first to plan multi-step work, then again to mark progress. \
            At most one task is in_progress."
            .to_owned(),
        parameters: crate::tool::schema_of::<TodoWriteArgs>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_todo_write_schema_is_derived_from_the_task_type() {
        let schema = todo_write_definition().parameters.clone();
        let item = &schema["properties"]["todos"]["items"];
        assert_eq!(schema["required"], json!(["todos"]));
        let mut required: Vec<&str> = item["required"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        required.sort_unstable();
        assert_eq!(required, vec!["content", "id", "status"]);
        let statuses = item["properties"]["status"].to_string();
        for status in ["pending", "in_progress", "completed", "blocked", "failed"] {
            assert!(statuses.contains(status), "{statuses}");
        }
        assert!(!schema.to_string().contains("$ref"), "sub-schemas are inlined: {schema}");
    }
    use serde_json::json;

    async fn planner() -> ActorRef<PlannerMsg> {
        let (planner, _) =
            Actor::spawn(None, Planner { config: PlannerConfig::default() }, Plan::default()).await.unwrap();
        planner
    }

    #[tokio::test]
    async fn write_replaces_the_list_and_bumps_the_version() {
        let planner = planner().await;
        let args = json!({"todos": [
            {"id": 1, "content": "find", "status": "in_progress"},
            {"id": "2", "content": "answer", "status": "pending"}
        ]});
        let plan = ractor::call!(planner, |reply| PlannerMsg::Write { args, reply }).unwrap().unwrap();
        assert_eq!(plan.version, 1);
        assert_eq!(plan.items[0].id, "1");
        let rendered = render(&plan);
        assert!(rendered.contains("→ [1] find") && rendered.contains("○ [2] answer"), "{rendered}");
    }

    #[tokio::test]
    async fn malformed_lists_are_rejected_with_a_reason_and_change_nothing() {
        let planner = planner().await;
        for (args, needle) in [
            (json!({"tasks": []}), "missing the \"todos\" array"),
            (
                json!({"todos": [{"id": "a", "content": "x", "status": "pending"}, {"id": "a", "content": "y", "status": "pending"}]}),
                "used twice",
            ),
            (
                json!({"todos": [{"id": "a", "content": "x", "status": "in_progress"}, {"id": "b", "content": "y", "status": "in_progress"}]}),
                "at most one",
            ),
            (json!({"todos": [{"id": "a", "content": "x", "status": "doing"}]}), "task 1"),
            (json!("{not json"), "not valid JSON"),
        ] {
            let error = ractor::call!(planner, |reply| PlannerMsg::Write { args, reply }).unwrap().unwrap_err();
            assert!(error.to_string().contains(needle), "{error} should mention {needle}");
        }
        let plan = ractor::call!(planner, |reply| PlannerMsg::Current { reply }).unwrap();
        assert_eq!(plan, Plan::default());
    }
}
