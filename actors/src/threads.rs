//! Threads: conversations whose runs follow each other. A thread's history is
//! read from its runs (the store holds no second copy): each run adds the user's
//! message (its input) and its answer (its final output). A run sees the history
//! of the runs before it; their tool calls and results stay in those runs, which
//! keeps a follow-up's prompt to what was said.
//!
//! A run cancelled by a newer message (`interrupt`) stays in the history, its
//! answer marked as interrupted; one cancelled and removed (`rollback`) is left
//! out, as if it had not been asked.

use serde::{Deserialize, Serialize};

use crate::llm::{Message, Role};
use crate::protocol::{RunId, RunStatus};
use crate::store::{RunRecord, ThreadSummary};

/// The end reason of a run cancelled by a newer message of its thread.
pub const INTERRUPTED: &str = "interrupted by a newer message in its thread";

/// The end reason of a run cancelled and removed from its thread's history.
pub const ROLLED_BACK: &str = "rolled back by a newer message in its thread";

/// What a message arriving while its thread has an active run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MultitaskStrategy {
    /// Refused (409, naming the active run).
    #[default]
    Reject,
    /// Runs after the runs before it, in order.
    Enqueue,
    /// This one runs next: the active run and the runs waiting are cancelled
    /// (they stay in the history, marked).
    Interrupt,
    /// This one runs next: the active run and the runs waiting are cancelled and
    /// removed from the history.
    Rollback,
}

/// One message of a thread, as a client reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadMessage {
    /// The run it belongs to.
    pub run_id: RunId,
    /// `user` or `assistant`.
    pub role: Role,
    /// What was said.
    pub content: String,
    /// For an answer: whether the run was interrupted before it answered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// Whether `run` was removed from its thread's history (`rollback`).
pub fn rolled_back(run: &RunRecord) -> bool {
    run.status == RunStatus::Cancelled && run.reason.as_deref() == Some(ROLLED_BACK)
}

/// The thread's messages, from its runs oldest first: each run's input, then its
/// answer once it has ended (a note for a run that ended without one). Rolled
/// back runs are left out.
pub fn messages(runs: &[RunRecord]) -> Vec<ThreadMessage> {
    let mut messages = Vec::with_capacity(runs.len() * 2);
    for run in runs.iter().filter(|run| !rolled_back(run)) {
        messages.push(ThreadMessage {
            run_id: run.run_id,
            role: Role::User,
            content: run.input.clone(),
            interrupted: false,
        });
        if let Some((content, interrupted)) = answer(run) {
            messages.push(ThreadMessage { run_id: run.run_id, role: Role::Assistant, content, interrupted });
        }
    }
    messages
}

/// What a run that has ended answered, as its thread remembers it, and whether it
/// was interrupted; `None` while it has not ended.
fn answer(run: &RunRecord) -> Option<(String, bool)> {
    if !run.status.is_terminal() {
        return None;
    }
    if let Some(text) = run.final_output.as_ref().filter(|text| !text.trim().is_empty()) {
        return Some((text.clone(), false));
    }
    let interrupted = run.reason.as_deref() == Some(INTERRUPTED);
    let note = match (run.status, run.reason.as_deref()) {
        _ if interrupted => "(interrupted by the next message before answering)".to_owned(),
        (RunStatus::Cancelled, _) => "(cancelled before answering)".to_owned(),
        (_, Some(reason)) => format!("(no answer: {reason})"),
        _ => "(no answer)".to_owned(),
    };
    Some((note, interrupted))
}

/// How a thread's summary opens in the history.
pub const SUMMARY_LEAD: &str = "Summary of the conversation so far: ";

/// The conversation a run of a thread starts from: the messages of the runs
/// before it (`earlier`, oldest first, all ended) as the model reads them; the
/// runs a `summary` covers are read as the summary.
pub fn history(earlier: &[RunRecord], summary: Option<&ThreadSummary>) -> Vec<Message> {
    let mut history = Vec::new();
    let mut covered = 0;
    if let Some(summary) = summary {
        history.push(Message::text(Role::User, format!("{SUMMARY_LEAD}{}", summary.text)));
        covered = earlier.iter().take_while(|run| run.run_id <= summary.through).count();
    }
    let rest = messages(&earlier[covered..]);
    history.extend(rest.into_iter().map(|message| Message::text(message.role, message.content)));
    history
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::protocol::Limits;

    fn run(input: &str, status: RunStatus, reason: Option<&str>, output: Option<&str>) -> RunRecord {
        let mut run =
            RunRecord::accepted(RunId::new(), "t".into(), "a".into(), input.into(), Limits::default(), Utc::now());
        run.status = status;
        run.reason = reason.map(str::to_owned);
        run.final_output = output.map(str::to_owned);
        run
    }

    #[test]
    fn each_run_gives_its_question_and_answer_in_order_and_a_rollback_gives_nothing() {
        let runs = [
            run("How many parcels?", RunStatus::Succeeded, None, Some("Two parcels [1].")),
            run("Which carrier?", RunStatus::Cancelled, Some(INTERRUPTED), None),
            run("Never mind", RunStatus::Cancelled, Some(ROLLED_BACK), None),
            run("And tomorrow?", RunStatus::Failed, Some("model_error"), None),
            run("Still there?", RunStatus::Running, None, None),
        ];
        let said: Vec<(Role, String, bool)> =
            messages(&runs).into_iter().map(|m| (m.role, m.content, m.interrupted)).collect();
        assert_eq!(
            said,
            vec![
                (Role::User, "How many parcels?".into(), false),
                (Role::Assistant, "Two parcels [1].".into(), false),
                (Role::User, "Which carrier?".into(), false),
                (Role::Assistant, "(interrupted by the next message before answering)".into(), true),
                (Role::User, "And tomorrow?".into(), false),
                (Role::Assistant, "(no answer: model_error)".into(), false),
                (Role::User, "Still there?".into(), false),
            ]
        );
        let prompt = history(&runs[..1], None);
        assert_eq!(prompt.len(), 2);
        assert_eq!((prompt[0].role, prompt[1].content.as_str()), (Role::User, "Two parcels [1]."));
        let summary = ThreadSummary { text: "Two parcels come today.".into(), through: runs[1].run_id };
        let summarised = history(&runs[..4], Some(&summary));
        assert_eq!(summarised[0].content, format!("{SUMMARY_LEAD}Two parcels come today."));
        assert_eq!(summarised[1].content, "And tomorrow?", "the runs after it follow (a rollback left out)");
    }
}
