//! What a run did, as seen in its events ([`Outcome`]), and whether that is the
//! right result for a task ([`judge`]).

use std::sync::LazyLock;

use regex::Regex;
use troupe_actors::protocol::{EventKind, RunEvent, RunStatus};

use crate::eval::task::{Expect, case_insensitive, parse_status};

/// What a run did, gathered from its events.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// Where it ended or parked (`None`: it never got there in time).
    pub status: Option<RunStatus>,
    /// Why it ended, for anything but success.
    pub reason: Option<String>,
    /// The final answer.
    pub answer: Option<String>,
    /// Every tool call the model asked for, built-ins included, in order.
    pub calls: Vec<CallSeen>,
    /// Tools whose calls wait for a human's approval.
    pub approvals: Vec<String>,
    /// The question the run parked on, when it asked one.
    pub question: Option<String>,
    /// Turns started.
    pub turns: u32,
    /// Tokens spent (input and output).
    pub tokens: u64,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CallSeen {
    /// Its id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, as JSON text.
    pub args: String,
    /// How it ended: `completed`, `failed`, `interrupted`, `skipped`, or
    /// `requested` while it has not.
    pub status: String,
}

impl Outcome {
    /// Takes one event of the run into account.
    pub fn observe(&mut self, event: &RunEvent) {
        match &event.kind {
            EventKind::TurnStart { turn } => self.turns = self.turns.max(*turn),
            EventKind::ToolRequests { calls, .. } => self.calls.extend(calls.iter().map(|call| CallSeen {
                call_id: call.call_id.clone(),
                tool: call.name.clone(),
                args: call.args.to_string(),
                status: "requested".to_owned(),
            })),
            EventKind::ToolCallEnd { call_id, status, .. } => self.set_status(call_id, status.as_str()),
            EventKind::ToolSkipped { call_id, .. } => self.set_status(call_id, "skipped"),
            EventKind::TokenUsage { total, .. } => self.tokens = total.total_tokens(),
            EventKind::ApprovalRequested { tool, .. } => self.approvals.push(tool.clone()),
            EventKind::ApprovalDecided { .. } => {}
            EventKind::WaitingInput { prompt, .. } => {
                self.status = Some(RunStatus::WaitingInput);
                if self.approvals.is_empty() {
                    self.question = Some(prompt.clone());
                }
            }
            EventKind::InputReceived { .. } => self.status = None,
            EventKind::FinalOutput { text, .. } => self.answer = Some(text.clone()),
            EventKind::RunEnd { status, reason } => {
                self.status = Some(*status);
                self.reason = reason.clone();
            }
            _ => {}
        }
    }

    fn set_status(&mut self, call_id: &str, status: &str) {
        if let Some(call) = self.calls.iter_mut().rev().find(|call| call.call_id == call_id) {
            call.status = status.to_owned();
        }
    }
}

/// Whether `outcome` is a right result for `expect`: `Ok`, or every reason it is not.
pub fn judge(expect: &Expect, outcome: &Outcome) -> Result<(), Vec<String>> {
    let mut failures = Vec::new();
    let wanted = expected_status(expect);
    match outcome.status {
        None => failures.push("the run did not end in time".to_owned()),
        Some(status) if status != wanted => failures.push(match &outcome.reason {
            Some(reason) => format!("ended {} ({reason}), expected {}", status.as_str(), wanted.as_str()),
            None => format!("ended {}, expected {}", status.as_str(), wanted.as_str()),
        }),
        Some(_) => {}
    }
    check_answer(expect, outcome, &mut failures);
    check_tools(expect, outcome, &mut failures);
    if let Some(tools) = &expect.approval
        && !outcome.approvals.iter().any(|tool| tools.split('|').any(|wanted| wanted == tool))
    {
        failures.push(format!("no approval was requested for {tools}"));
    }
    if expect.question && outcome.question.is_none() {
        failures.push("the run asked no question".to_owned());
    }
    if !expect.question
        && wanted != RunStatus::WaitingInput
        && let Some(question) = &outcome.question
    {
        failures.push(format!("asked the user instead of answering: {}", clip(question)));
    }
    if failures.is_empty() { Ok(()) } else { Err(failures) }
}

fn expected_status(expect: &Expect) -> RunStatus {
    match &expect.status {
        Some(status) => parse_status(status).unwrap_or(RunStatus::Succeeded),
        None if expect.approval.is_some() || expect.question => RunStatus::WaitingInput,
        None => RunStatus::Succeeded,
    }
}

fn check_answer(expect: &Expect, outcome: &Outcome, failures: &mut Vec<String>) {
    let answer = outcome.answer.as_deref().unwrap_or("");
    if outcome.status == Some(RunStatus::Succeeded) {
        if answer.trim().is_empty() {
            failures.push("succeeded with an empty answer".to_owned());
        }
        if let Some(why) = not_an_answer(answer) {
            failures.push(format!("the answer is {why}: {}", clip(answer)));
        }
    }
    let lower = answer.to_lowercase();
    for pattern in &expect.answer_matches {
        if case_insensitive(pattern).is_ok_and(|regex| !regex.is_match(answer)) {
            failures.push(format!("the answer does not match {pattern:?}: {}", clip(answer)));
        }
    }
    for needle in &expect.answer_contains {
        if !lower.contains(&needle.to_lowercase()) {
            failures.push(format!("the answer lacks {needle:?}: {}", clip(answer)));
        }
    }
    for needle in &expect.answer_excludes {
        if lower.contains(&needle.to_lowercase()) {
            failures.push(format!("the answer contains {needle:?}: {}", clip(answer)));
        }
    }
}

fn check_tools(expect: &Expect, outcome: &Outcome, failures: &mut Vec<String>) {
    for wanted in &expect.tools {
        let calls: Vec<_> = outcome.calls.iter().filter(|call| call.tool == wanted.name).collect();
        if calls.is_empty() {
            failures.push(format!("{} was not called", wanted.name));
            continue;
        }
        if let Some(needle) = &wanted.args_contain {
            let needle = needle.to_lowercase();
            if !calls.iter().any(|call| call.args.to_lowercase().contains(&needle)) {
                failures.push(format!("no call of {} had {needle:?} in its arguments", wanted.name));
            }
        }
        let parked = expect.approval.as_deref().is_some_and(|tools| tools.split('|').any(|tool| tool == wanted.name));
        if !parked && !calls.iter().any(|call| call.status == "completed") {
            failures.push(format!("no call of {} completed", wanted.name));
        }
    }
    for tool in &expect.forbid_tools {
        if outcome.calls.iter().any(|call| &call.tool == tool) {
            failures.push(format!("{tool} was called"));
        }
    }
}

/// Why `answer` is not an answer at all: the runtime's own text, or a tool call
/// written as text. Independent of the runtime's own guard, on purpose: the eval
/// judges the runtime.
#[allow(clippy::expect_used)] // constant patterns, checked by the tests
pub fn not_an_answer(answer: &str) -> Option<&'static str> {
    static RUNTIME_TEXT: LazyLock<Regex> = LazyLock::new(|| {
        case_insensitive(
            r"the run so far|updated every turn|todo_write changes the plan|review of turn \d+|by the runtime \(not the user\)|</?plan>|</?available_tools>|skipped \(duplicate\)|identical call already succeeded|go on: call a tool if more is needed",
        )
        .expect("a valid pattern")
    });
    static CALL_TEXT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r#"(?s)<tool_call>|\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"(arguments|parameters)"\s*:|^\s*\{\s*"todos"\s*:"#,
        )
        .expect("a valid pattern")
    });
    if RUNTIME_TEXT.is_match(answer) {
        Some("runtime text")
    } else if CALL_TEXT.is_match(answer) {
        Some("a tool call written as text")
    } else {
        None
    }
}

fn clip(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(160) {
        Some((at, _)) => format!("{:?}…", &flat[..at]),
        None => format!("{flat:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn succeeded(answer: &str) -> Outcome {
        Outcome { status: Some(RunStatus::Succeeded), answer: Some(answer.to_owned()), ..Outcome::default() }
    }

    #[test]
    fn a_right_answer_passes_and_a_wrong_one_says_why() {
        let expect = Expect { answer_matches: vec![r"\b(5|five)\b".into()], ..Expect::default() };
        assert!(judge(&expect, &succeeded("The sentence has 5 words.")).is_ok());
        let failures = judge(&expect, &succeeded("It has six words.")).unwrap_err();
        assert!(failures[0].contains("does not match"), "{failures:?}");
    }

    #[test]
    fn runtime_text_and_call_objects_are_never_answers() {
        let expect = Expect::default();
        let note = "The run so far (updated every turn; todo_write changes the plan):\n<plan>…</plan>";
        assert!(judge(&expect, &succeeded(note)).unwrap_err()[0].contains("runtime text"));
        let call = r#"{"name": "todo_write", "arguments": {"todos": []}}"#;
        assert!(judge(&expect, &succeeded(call)).unwrap_err()[0].contains("tool call"));
        assert!(judge(&expect, &succeeded("  ")).is_err());
    }

    #[test]
    fn a_parked_approval_is_checked_by_tool() {
        let expect = Expect { approval: Some("send_email".into()), ..Expect::default() };
        let mut outcome = Outcome::default();
        outcome.approvals.push("create_draft".into());
        outcome.status = Some(RunStatus::WaitingInput);
        assert!(judge(&expect, &outcome).is_err());
        outcome.approvals.push("send_email".into());
        assert!(judge(&expect, &outcome).is_ok());
    }

    #[test]
    fn tools_are_checked_by_name_arguments_and_completion() {
        let expect = Expect {
            tools: vec![crate::eval::ToolExpect { name: "text_stats".into(), args_contain: Some("Cat".into()) }],
            forbid_tools: vec!["journal".into()],
            ..Expect::default()
        };
        let mut outcome = succeeded("5 words");
        let call = |status: &str| CallSeen {
            call_id: "c1".into(),
            tool: "text_stats".into(),
            args: r#"{"text":"the cat"}"#.into(),
            status: status.into(),
        };
        outcome.calls.push(call("failed"));
        assert!(judge(&expect, &outcome).unwrap_err()[0].contains("completed"));
        outcome.calls[0] = call("completed");
        assert!(judge(&expect, &outcome).is_ok());
        outcome.calls.push(CallSeen { tool: "journal".into(), ..call("completed") });
        assert!(judge(&expect, &outcome).unwrap_err()[0].contains("journal was called"));
    }

    #[test]
    fn task_files_are_checked_when_loaded() {
        let bad = "[[task]]\nname = \"a\"\ninput = \"x\"\n[task.expect]\nanswer_matches = [\"(\"]\n";
        assert!(crate::eval::TaskFile::parse(bad).unwrap_err().contains("answer_matches"));
        let twice = "[[task]]\nname = \"a\"\ninput = \"x\"\n[[task]]\nname = \"a\"\ninput = \"y\"\n";
        assert!(crate::eval::TaskFile::parse(twice).unwrap_err().contains("twice"));
        let status = "[[task]]\nname = \"a\"\ninput = \"x\"\n[task.expect]\nstatus = \"done\"\n";
        assert!(crate::eval::TaskFile::parse(status).is_err());
    }
}
