//! `troupe eval`: answer quality, measured. A task file names requests to agents
//! and what a right result looks like (the answer's content, the tools called, the
//! status the run ends in); [`run`] drives each task through the real runtime and
//! judges the outcome with [`judge`]. Users evaluate their own agents and models
//! with it; the repository's own set is `eval/tasks.toml`.
//!
//! A task file is TOML, one `[[task]]` table per task:
//!
//! ```toml
//! [[task]]
//! name = "count-words"
//! agent = "default"                  # default: "default"
//! input = "Count the words of this sentence: the cat saw the dog"
//! tags = ["ci"]                      # select with --tag
//! [task.expect]
//! status = "succeeded"               # or "waiting_input", "failed", "cancelled"
//! answer_matches = ['\b(5|five)\b']  # regexes, each must match (case-insensitive)
//! answer_contains = ["cat"]          # substrings, each must appear (case-insensitive)
//! answer_excludes = ["6 words"]      # substrings that must not appear
//! tools = [{ name = "text_stats", args_contain = "the cat" }]  # must be called
//! forbid_tools = ["journal"]         # must not be called
//! approval = "create_draft|send_email"  # ends parked on an approval of one of these
//! question = true                    # ends parked on an ask_user question
//! ```
//!
//! Every task also fails when its answer is runtime text (the plan note, a
//! review) or a tool-call object written as text, or when it succeeded with an
//! empty answer: those are never right answers.

mod judge;
mod report;
mod runner;
mod task;

pub use judge::{CallSeen, Outcome, judge, not_an_answer};
pub use report::{Report, TaskResult};
pub use runner::{EvalOptions, run};
pub use task::{Expect, Task, TaskFile, TaskFileError, ToolExpect};
