//! A task file: requests to agents and what a right result looks like (see
//! the format in the [`crate::eval`] docs), read and checked before anything runs.

use std::path::Path;
use std::time::Duration;

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use troupe_actors::protocol::RunStatus;

/// A task file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskFile {
    /// Its tasks, in order.
    #[serde(rename = "task", default)]
    pub tasks: Vec<Task>,
}

/// One request and what a right result looks like.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within the file.
    pub name: String,
    /// The agent that gets the request.
    #[serde(default = "default_agent")]
    pub agent: String,
    /// The request.
    pub input: String,
    /// Labels to select tasks by (`--tag`).
    #[serde(default)]
    pub tags: Vec<String>,
    /// What a right result looks like.
    #[serde(default)]
    pub expect: Expect,
    /// Wall-time limit of this task in seconds (default: `--timeout`).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

fn default_agent() -> String {
    "default".to_owned()
}

/// The checks of a task; every one given must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The status the run ends (or parks) in: `succeeded` by default.
    #[serde(default)]
    pub status: Option<String>,
    /// Regexes the final answer must match, case-insensitive.
    #[serde(default)]
    pub answer_matches: Vec<String>,
    /// Substrings the final answer must contain, case-insensitive.
    #[serde(default)]
    pub answer_contains: Vec<String>,
    /// Substrings the final answer must not contain, case-insensitive.
    #[serde(default)]
    pub answer_excludes: Vec<String>,
    /// Tools that must have been called (and, unless the run parks on them,
    /// completed).
    #[serde(default)]
    pub tools: Vec<ToolExpect>,
    /// Tools that must not have been called.
    #[serde(default)]
    pub forbid_tools: Vec<String>,
    /// The run ends parked on an approval request for this tool (or one of
    /// several, separated by `|`).
    #[serde(default)]
    pub approval: Option<String>,
    /// The run ends parked on a question to the user (`ask_user`).
    #[serde(default)]
    pub question: bool,
}

/// A tool that must be called.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolExpect {
    /// The tool.
    pub name: String,
    /// A substring (case-insensitive) of the call's arguments as JSON.
    #[serde(default)]
    pub args_contain: Option<String>,
}

/// Why a task file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TaskFileError {
    /// It cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a valid task file.
    #[error("{path} is not a valid task file: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl TaskFile {
    /// Reads and checks a task file: names unique, regexes valid, statuses known.
    pub fn load(path: &Path) -> Result<Self, TaskFileError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| TaskFileError::Read { path: shown.clone(), source })?;
        Self::parse(&text).map_err(|message| TaskFileError::Invalid { path: shown, message })
    }

    /// Parses and checks the text of a task file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TaskFile = toml::from_str(text).map_err(|error| error.to_string())?;
        let mut names = std::collections::HashSet::new();
        for task in &file.tasks {
            if !names.insert(task.name.as_str()) {
                return Err(format!("task {:?} is named twice", task.name));
            }
            if task.input.trim().is_empty() {
                return Err(format!("task {:?} has an empty input", task.name));
            }
            check_expect(&task.expect).map_err(|why| format!("task {:?}: {why}", task.name))?;
        }
        Ok(file)
    }

    /// The tasks to run: those with `tag` (all when `None`) and, when `names` is
    /// not empty, only those named.
    pub fn select(self, tag: Option<&str>, names: &[String]) -> Vec<Task> {
        self.tasks
            .into_iter()
            .filter(|task| tag.is_none_or(|tag| task.tags.iter().any(|t| t == tag)))
            .filter(|task| names.is_empty() || names.contains(&task.name))
            .collect()
    }
}

impl Task {
    /// This task's wall-time limit.
    pub fn timeout(&self, default: Duration) -> Duration {
        self.timeout_secs.map_or(default, Duration::from_secs)
    }
}

/// Checks the expectations themselves: regexes compile, the status is a known one.
pub fn check_expect(expect: &Expect) -> Result<(), String> {
    for pattern in &expect.answer_matches {
        case_insensitive(pattern).map_err(|error| format!("answer_matches {pattern:?}: {error}"))?;
    }
    if let Some(status) = &expect.status {
        parse_status(status)?;
    }
    Ok(())
}

pub(crate) fn parse_status(status: &str) -> Result<RunStatus, String> {
    match status {
        "succeeded" => Ok(RunStatus::Succeeded),
        "waiting_input" => Ok(RunStatus::WaitingInput),
        "failed" => Ok(RunStatus::Failed),
        "cancelled" => Ok(RunStatus::Cancelled),
        other => Err(format!("unknown status {other:?} (succeeded, waiting_input, failed or cancelled)")),
    }
}

pub(crate) fn case_insensitive(pattern: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern).case_insensitive(true).build()
}
