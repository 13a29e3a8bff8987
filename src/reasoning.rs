//! The reasoning block: what a person sees of an answer's making, as one state
//! machine read from a run's events, shared by the terminal view and the web page
//! (which receives it as `block` frames of the event stream, see `sse`).
//!
//! idle → reasoning (a timer and the last two steps) → collapsed ("Thought for
//! N s", once the answer starts) → complete (after `run_end`; expandable to every
//! step). An answer the run goes on from (the reviewer sent it back, or the model
//! wrote text before its tool calls) becomes a draft and the block reasons again.
//! Every duration comes from the events' timestamps, so a replay reads as the live
//! run did.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use troupe_actors::planner;
use troupe_actors::protocol::{
    EventKind, Plan, Recommendation, ReviewStatus, RunEvent, RunStatus, TaskStatus, ThoughtStage,
};

/// Where the block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Nothing has happened yet.
    Idle,
    /// The agent works: a live timer and its latest steps.
    Reasoning,
    /// The answer is arriving: "Thought for N s".
    Collapsed,
    /// The run ended: every step can be shown.
    Complete,
}

/// What a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// What the agent is doing, in words (a tool's start or result, a retry).
    Progress,
    /// A tool call: its arguments, then its status and latency.
    Tool,
    /// The reviewer's verdict on a turn.
    Review,
    /// The plan changed.
    Plan,
    /// The agent's reasoning: the model's reasoning text or a reflection.
    Thought,
    /// An answer the run went on from.
    Draft,
    /// A call waits for a person, or a person decided.
    Approval,
    /// The run asks the user, or the user answered.
    Question,
    /// Something went wrong.
    Problem,
}

/// One step of the block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// The event that made it (the first, for a step several events fill).
    pub seq: u64,
    /// When.
    pub at: DateTime<Utc>,
    /// What kind.
    pub kind: StepKind,
    /// One line a person reads.
    pub summary: String,
    /// More, shown when the block is expanded (arguments, a verdict's notes, the
    /// reasoning text, the plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whether it is one of the steps the live block shows (the others are
    /// bookkeeping, shown only expanded).
    pub headline: bool,
    /// A tool step's call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// A tool step's status once it ended (`completed`, `failed`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// A tool step's latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// The block of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    /// Where it is.
    pub phase: Phase,
    /// Reasoning time before the answer, over every stretch of reasoning.
    pub thought_ms: u64,
    /// When the current stretch of reasoning began (`reasoning` only): a live
    /// timer shows `thought_ms` plus the time since. `None` while the run waits
    /// for a person (`waiting`): that time is not reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_since: Option<DateTime<Utc>>,
    /// The run waits for a person (an answer or an approval); the timer stands.
    pub waiting: bool,
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// The answer so far (the final answer once `final_output` came).
    pub answer: String,
    /// Answers the run went on from, oldest first.
    pub drafts: Vec<String>,
    /// The latest plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// When the run started and ended (its first and `run_end` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// See `started_at`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// How the run ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// The seq of the last event applied.
    pub seq: u64,
    /// Whether `final_output` came: the answer is final, never a draft.
    #[serde(skip)]
    final_seen: bool,
}

/// What an event changed, for a renderer that redraws only what it must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing the block shows.
    None,
    /// Only the answer's text grew.
    Answer,
    /// Steps, phase or anything else.
    Block,
}

/// Longest step summary, in characters.
const SUMMARY_CHARS: usize = 160;
/// Longest detail, in characters.
const DETAIL_CHARS: usize = 2000;

impl Default for Block {
    fn default() -> Self {
        Self::new()
    }
}

impl Block {
    /// A block before any event.
    pub fn new() -> Self {
        Self {
            phase: Phase::Idle,
            thought_ms: 0,
            reasoning_since: None,
            waiting: false,
            steps: Vec::new(),
            answer: String::new(),
            drafts: Vec::new(),
            plan: None,
            started_at: None,
            ended_at: None,
            status: None,
            seq: 0,
            final_seen: false,
        }
    }

    /// The block of a whole list of events.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a RunEvent>) -> Self {
        let mut block = Self::new();
        for event in events {
            block.apply(event);
        }
        block
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &RunEvent) -> Change {
        if event.seq != 0 && event.seq <= self.seq {
            return Change::None;
        }
        self.seq = event.seq;
        self.started_at.get_or_insert(event.ts);
        let at = event.ts;
        let mut change = Change::None;
        // The run works on after text it streamed (a new turn, tool calls, the
        // reviewer sent it back, the model failed mid-reply): that text was a draft.
        let works_on = matches!(
            event.kind,
            EventKind::TurnStart { .. }
                | EventKind::ToolRequests { .. }
                | EventKind::ToolCallStart { .. }
                | EventKind::ApprovalRequested { .. }
                | EventKind::WaitingInput { .. }
                | EventKind::ReasoningStep { .. }
                | EventKind::ModelRetry { .. }
        );
        if works_on && self.phase == Phase::Collapsed && !self.final_seen {
            self.draft(event.seq, at, "The run went on after this draft");
            self.reason_from(at);
            change = Change::Block;
        }
        // A person answered, or the run went on without them: the timer runs again.
        let waits = matches!(event.kind, EventKind::WaitingInput { .. } | EventKind::ApprovalRequested { .. });
        if self.waiting && !waits && !matches!(event.kind, EventKind::RunEnd { .. }) {
            self.waiting = false;
            if self.phase == Phase::Reasoning {
                self.reasoning_since = Some(at);
            }
            change = Change::Block;
        }
        let applied = self.apply_kind(event, at);
        if waits && self.phase == Phase::Reasoning && !self.waiting {
            self.pause(at);
        }
        if applied == Change::None { change } else { applied }
    }

    fn apply_kind(&mut self, event: &RunEvent, at: DateTime<Utc>) -> Change {
        match &event.kind {
            EventKind::TurnStart { .. } => {
                if self.phase != Phase::Idle {
                    return Change::None;
                }
                self.reason_from(at);
                Change::Block
            }
            EventKind::AssistantDelta { text, reasoning: true, .. } => {
                self.ensure_reasoning(at);
                match self.steps.last_mut() {
                    Some(step) if step.kind == StepKind::Thought && step.call_id.as_deref() == Some("reasoning") => {
                        let detail = step.detail.get_or_insert_with(String::new);
                        detail.push_str(text);
                        step.summary = thinking_line(detail);
                        // A long reasoning keeps its latest part.
                        if detail.len() > 4 * DETAIL_CHARS {
                            let skip = detail.chars().count().saturating_sub(DETAIL_CHARS);
                            *detail = format!("…{}", detail.chars().skip(skip).collect::<String>());
                        }
                    }
                    _ => {
                        let mut step = Step::new(event.seq, at, StepKind::Thought, thinking_line(text), true);
                        step.detail = Some(text.clone());
                        step.call_id = Some("reasoning".to_owned());
                        self.steps.push(step);
                    }
                }
                Change::Block
            }
            EventKind::AssistantDelta { text, reasoning: false, .. } => {
                self.answer.push_str(text);
                // Blank text (often before tool calls) does not start an answer.
                let reasoning = self.phase == Phase::Reasoning || self.phase == Phase::Idle;
                if reasoning && !self.answer.trim().is_empty() {
                    self.collapse(at);
                    return Change::Block;
                }
                if reasoning { Change::None } else { Change::Answer }
            }
            EventKind::ReasoningStep { summary, .. } => {
                self.ensure_reasoning(at);
                self.push(Step::new(event.seq, at, StepKind::Progress, clip(summary, SUMMARY_CHARS), true))
            }
            EventKind::Thought { stage, thought, .. } => {
                let summary = match stage {
                    ThoughtStage::BeforeActing => format!("Understood the request: {}", thought.understanding),
                    ThoughtStage::AfterResponse if thought.complete => format!("Checked the answer: {}", thought.why),
                    ThoughtStage::AfterResponse => format!("The answer is not complete: {}", thought.why),
                };
                let mut step = Step::new(event.seq, at, StepKind::Thought, clip(&summary, SUMMARY_CHARS), true);
                let mut detail = format!("Why: {}", thought.why);
                if !thought.needs.is_empty() {
                    detail.push_str(&format!("\nNeeds: {}", thought.needs.join("; ")));
                }
                if !thought.tools.is_empty() {
                    detail.push_str(&format!("\nTools: {}", thought.tools.join(", ")));
                }
                step.detail = Some(detail);
                self.push(step)
            }
            EventKind::ToolCallStart { call_id, tool, args, .. } => {
                self.ensure_reasoning(at);
                let mut step = Step::new(event.seq, at, StepKind::Tool, format!("{tool} {}", args_line(args)), false);
                step.detail = Some(clip(&pretty(args), DETAIL_CHARS));
                step.call_id = Some(call_id.clone());
                self.push(step)
            }
            EventKind::ToolCallEnd { call_id, tool, status, duration_ms, summary, .. } => {
                let found = self
                    .steps
                    .iter_mut()
                    .rev()
                    .find(|step| step.kind == StepKind::Tool && step.call_id.as_deref() == Some(call_id.as_str()));
                let step = match found {
                    Some(step) => step,
                    None => {
                        let mut step = Step::new(event.seq, at, StepKind::Tool, tool.clone(), false);
                        step.call_id = Some(call_id.clone());
                        self.steps.push(step);
                        let Some(step) = self.steps.last_mut() else { return Change::None };
                        step
                    }
                };
                step.status = Some(status.as_str().to_owned());
                step.duration_ms = Some(*duration_ms);
                if !summary.is_empty() {
                    let result = clip(summary, DETAIL_CHARS);
                    step.detail = Some(match step.detail.take() {
                        Some(args) => format!("{args}\n→ {result}"),
                        None => format!("→ {result}"),
                    });
                }
                Change::Block
            }
            EventKind::ToolSkipped { tool, reason, detail, call_id, .. } => {
                let mut step =
                    Step::new(event.seq, at, StepKind::Tool, format!("{tool} was not run ({})", reason.as_str()), true);
                step.detail = Some(clip(detail, DETAIL_CHARS));
                step.call_id = Some(call_id.clone());
                step.status = Some("skipped".to_owned());
                self.push(step)
            }
            EventKind::PlanUpdated { plan } => {
                let done = plan.items.iter().filter(|item| item.status == TaskStatus::Completed).count();
                let summary = format!("Plan updated: {done} of {} done", plan.items.len());
                let detail = plan
                    .items
                    .iter()
                    .map(|item| format!("{} {}", planner::marker(item.status), item.content))
                    .collect::<Vec<_>>()
                    .join("\n");
                self.plan = Some(plan.clone());
                let mut step = Step::new(event.seq, at, StepKind::Plan, summary, false);
                step.detail = Some(detail);
                self.push(step)
            }
            EventKind::Review { review, .. } => {
                let degraded = if review.status == ReviewStatus::Degraded { " (rule-based fallback)" } else { "" };
                let (summary, headline) = match review.recommendation {
                    Recommendation::Proceed => (format!("Review: carry on{degraded}"), false),
                    Recommendation::GatherMore => {
                        let gaps = if review.gaps.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", review.gaps.join("; "))
                        };
                        (format!("Review: more is needed{gaps}"), true)
                    }
                    Recommendation::ClarifyQuery => ("Review: the request needs clarifying".to_owned(), true),
                    Recommendation::Replan => ("Review: the plan needs revising".to_owned(), true),
                };
                let mut step = Step::new(event.seq, at, StepKind::Review, clip(&summary, SUMMARY_CHARS), headline);
                step.status = Some(review.recommendation.as_str().to_owned());
                let mut detail = format!(
                    "quality {:.2} · completeness {:.2} · relevance {:.2}",
                    review.quality_score, review.completeness, review.relevance
                );
                if !review.notes.is_empty() {
                    detail.push('\n');
                    detail.push_str(&review.notes);
                }
                step.detail = Some(clip(&detail, DETAIL_CHARS));
                self.push(step)
            }
            EventKind::DecodeError { detail, .. } => {
                let mut step = Step::new(
                    event.seq,
                    at,
                    StepKind::Problem,
                    "The model wrote a call that could not be read".into(),
                    true,
                );
                step.detail = Some(clip(detail, DETAIL_CHARS));
                self.push(step)
            }
            EventKind::WaitingInput { prompt, .. } => self.push(Step::new(
                event.seq,
                at,
                StepKind::Question,
                clip(&format!("Asks you: {prompt}"), SUMMARY_CHARS),
                true,
            )),
            EventKind::InputReceived { text } => self.push(Step::new(
                event.seq,
                at,
                StepKind::Question,
                clip(&format!("You answered: {text}"), SUMMARY_CHARS),
                true,
            )),
            EventKind::ApprovalRequested { tool, args, reason, call_id, .. } => {
                let mut step = Step::new(
                    event.seq,
                    at,
                    StepKind::Approval,
                    clip(&format!("Waits for your approval to run {tool}: {reason}"), SUMMARY_CHARS),
                    true,
                );
                step.detail = Some(clip(&pretty(args), DETAIL_CHARS));
                step.call_id = Some(call_id.clone());
                self.push(step)
            }
            EventKind::ApprovalDecided { tool, approved, reason, call_id, .. } => {
                let verdict = if *approved { "approved" } else { "rejected" };
                let why = reason.as_ref().map(|reason| format!(": {reason}")).unwrap_or_default();
                let mut step = Step::new(
                    event.seq,
                    at,
                    StepKind::Approval,
                    clip(&format!("{tool} {verdict}{why}"), SUMMARY_CHARS),
                    true,
                );
                step.call_id = Some(call_id.clone());
                step.status = Some(verdict.to_owned());
                self.push(step)
            }
            EventKind::ModelRetry { message, retry_in_ms, attempt, .. } => {
                let summary = format!(
                    "The model failed ({message}); asking again in {:.0} s (try {attempt})",
                    *retry_in_ms as f64 / 1000.0
                );
                self.push(Step::new(event.seq, at, StepKind::Problem, clip(&summary, SUMMARY_CHARS), true))
            }
            EventKind::Error { code, message } => self.push(Step::new(
                event.seq,
                at,
                StepKind::Problem,
                clip(&format!("{code}: {message}"), SUMMARY_CHARS),
                true,
            )),
            EventKind::FinalOutput { text, .. } => {
                if self.phase == Phase::Reasoning || self.phase == Phase::Idle {
                    self.collapse(at);
                }
                self.answer = text.clone();
                self.final_seen = true;
                Change::Block
            }
            EventKind::RunEnd { status, .. } => {
                if *status != RunStatus::Succeeded && !self.final_seen {
                    // Text streamed before the run failed or was cancelled is not its answer.
                    self.draft(event.seq, at, "The run ended without an answer after this text");
                }
                if self.phase == Phase::Reasoning {
                    self.collapse(at);
                }
                self.waiting = false;
                self.phase = Phase::Complete;
                self.ended_at = Some(at);
                self.status = Some(*status);
                Change::Block
            }
            EventKind::RunStarted { .. }
            | EventKind::StepEnd { .. }
            | EventKind::ToolRequests { .. }
            | EventKind::ToolMetric { .. }
            | EventKind::TokenUsage { .. }
            | EventKind::TurnEnd { .. } => Change::None,
        }
    }

    /// The last `n` headline steps, oldest first: what the live block shows.
    pub fn latest(&self, n: usize) -> Vec<&Step> {
        let mut latest: Vec<&Step> = self.steps.iter().rev().filter(|step| step.headline).take(n).collect();
        latest.reverse();
        latest
    }

    /// Milliseconds of reasoning up to `now`: the stretches that ended, and the
    /// current one if the block is reasoning.
    pub fn reasoning_ms(&self, now: DateTime<Utc>) -> u64 {
        let current = self.reasoning_since.map_or(0, |since| millis_between(since, now));
        self.thought_ms + current
    }

    /// The run's wall time, from its first event to `run_end` (or to `now`).
    pub fn elapsed_ms(&self, now: DateTime<Utc>) -> u64 {
        match self.started_at {
            Some(start) => millis_between(start, self.ended_at.unwrap_or(now)),
            None => 0,
        }
    }

    fn push(&mut self, step: Step) -> Change {
        self.steps.push(step);
        Change::Block
    }

    fn reason_from(&mut self, at: DateTime<Utc>) {
        self.phase = Phase::Reasoning;
        self.reasoning_since = Some(at);
    }

    /// A step arrived before any turn (a resumed run, a sub-run): the block reasons.
    fn ensure_reasoning(&mut self, at: DateTime<Utc>) {
        if self.phase == Phase::Idle {
            self.reason_from(at);
        }
    }

    /// The run waits for a person: the stretch of reasoning ends here.
    fn pause(&mut self, at: DateTime<Utc>) {
        if let Some(since) = self.reasoning_since.take() {
            self.thought_ms += millis_between(since, at);
        }
        self.waiting = true;
    }

    fn collapse(&mut self, at: DateTime<Utc>) {
        if let Some(since) = self.reasoning_since.take() {
            self.thought_ms += millis_between(since, at);
        }
        self.phase = Phase::Collapsed;
    }

    /// The answer so far becomes a draft.
    fn draft(&mut self, seq: u64, at: DateTime<Utc>, why: &str) {
        let text = std::mem::take(&mut self.answer);
        if text.trim().is_empty() {
            return;
        }
        let mut step = Step::new(seq, at, StepKind::Draft, format!("{why}: {}", clip(text.trim(), 80)), true);
        step.detail = Some(clip(&text, DETAIL_CHARS));
        self.steps.push(step);
        self.drafts.push(text);
    }
}

impl Step {
    fn new(seq: u64, at: DateTime<Utc>, kind: StepKind, summary: String, headline: bool) -> Self {
        Self { seq, at, kind, summary, detail: None, headline, call_id: None, status: None, duration_ms: None }
    }
}

/// The time now as the block's timestamps are written, for a client to measure
/// its clock against (a live timer runs from `reasoning_since`).
pub fn now_text() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn millis_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}

/// "Thinking: …" with the latest words of the model's reasoning.
fn thinking_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = line.chars().collect();
    let start = chars.len().saturating_sub(SUMMARY_CHARS - 12);
    let tail: String = chars[start..].iter().collect();
    if start > 0 { format!("Thinking: …{tail}") } else { format!("Thinking: {tail}") }
}

/// A call's arguments on one line: `(key: value, …)`.
fn args_line(args: &Value) -> String {
    let text = match args {
        Value::Object(map) if map.is_empty() => return String::new(),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| match value {
                Value::String(text) => format!("{key}: \"{text}\""),
                other => format!("{key}: {other}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Value::Null => return String::new(),
        other => other.to_string(),
    };
    format!("({})", clip(&text, 100))
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// At most `max` characters, with "…" when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use troupe_actors::protocol::RunId;

    use super::*;

    fn events(kinds: Vec<(i64, EventKind)>) -> Vec<RunEvent> {
        let start = DateTime::parse_from_rfc3339("2026-11-27T10:00:00Z").unwrap().with_timezone(&Utc);
        let run_id = RunId::new();
        kinds
            .into_iter()
            .enumerate()
            .map(|(index, (ms, kind))| RunEvent {
                run_id,
                seq: index as u64 + 1,
                ts: start + TimeDelta::milliseconds(ms),
                parent_run_id: None,
                kind,
            })
            .collect()
    }

    fn step(summary: &str) -> EventKind {
        EventKind::ReasoningStep { turn: 1, summary: summary.to_owned() }
    }

    #[test]
    fn the_phases_follow_the_run_and_durations_come_from_the_events() {
        let run = events(vec![
            (0, EventKind::RunStarted { agent: "a".into(), input: "q".into() }),
            (100, EventKind::TurnStart { turn: 1 }),
            (200, step("one")),
            (300, step("two")),
            (400, step("three")),
            (12_100, EventKind::AssistantDelta { turn: 2, text: "Hi".into(), reasoning: false }),
            (12_200, EventKind::FinalOutput { text: "Hi.".into(), citations: vec![] }),
            (13_000, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None }),
        ]);
        let mut block = Block::new();
        let mut phases = Vec::new();
        for event in &run {
            block.apply(event);
            phases.push(block.phase);
        }
        use Phase::*;
        assert_eq!(phases, [Idle, Reasoning, Reasoning, Reasoning, Reasoning, Collapsed, Collapsed, Complete]);
        assert_eq!(block.thought_ms, 12_000);
        assert_eq!(block.elapsed_ms(Utc::now()), 13_000, "a replay's duration is the run's");
        assert_eq!(block.answer, "Hi.", "the final answer wins over the streamed text");
        let latest: Vec<&str> = block.latest(2).iter().map(|step| step.summary.as_str()).collect();
        assert_eq!(latest, ["two", "three"]);
        assert_eq!(Block::of(&run), block, "built at once or event by event, the same");
    }

    #[test]
    fn an_answer_the_run_goes_on_from_is_a_draft_and_reasoning_time_adds_up() {
        let run = events(vec![
            (0, EventKind::TurnStart { turn: 1 }),
            (2_000, EventKind::AssistantDelta { turn: 1, text: "Maybe none.".into(), reasoning: false }),
            (3_000, EventKind::TurnStart { turn: 2 }),
            (7_000, EventKind::AssistantDelta { turn: 2, text: "Two parcels.".into(), reasoning: false }),
        ]);
        let block = Block::of(&run);
        assert_eq!(block.phase, Phase::Collapsed);
        assert_eq!(block.drafts, ["Maybe none."]);
        assert_eq!(block.answer, "Two parcels.");
        assert_eq!(block.thought_ms, 6_000);
        assert!(block.steps.iter().any(|step| step.kind == StepKind::Draft && step.summary.contains("Maybe none.")));
    }

    #[test]
    fn the_timer_stands_while_the_run_waits_for_a_person() {
        let run = events(vec![
            (0, EventKind::TurnStart { turn: 1 }),
            (1_000, EventKind::WaitingInput { prompt: "Which one?".into(), sub_run: None }),
            (3_600_000, EventKind::InputReceived { text: "Acme".into() }),
            (3_602_000, EventKind::AssistantDelta { turn: 2, text: "Acme.".into(), reasoning: false }),
        ]);
        let mut block = Block::new();
        block.apply(&run[0]);
        block.apply(&run[1]);
        assert!(block.waiting && block.reasoning_since.is_none());
        assert_eq!(block.reasoning_ms(run[1].ts + TimeDelta::hours(5)), 1_000, "a night of waiting is not reasoning");
        block.apply(&run[2]);
        assert!(!block.waiting && block.reasoning_since == Some(run[2].ts));
        block.apply(&run[3]);
        assert_eq!(block.thought_ms, 3_000);
    }

    #[test]
    fn text_before_tool_calls_blank_text_and_a_failed_reply_are_not_the_answer() {
        let preamble = events(vec![
            (0, EventKind::TurnStart { turn: 1 }),
            (10, EventKind::AssistantDelta { turn: 1, text: "\n\n".into(), reasoning: false }),
            (20, EventKind::AssistantDelta { turn: 1, text: "Let me look.".into(), reasoning: false }),
            (30, EventKind::ToolRequests { turn: 1, calls: vec![] }),
        ]);
        let block = Block::of(&preamble);
        assert_eq!(block.phase, Phase::Reasoning, "the tool calls reopen the reasoning");
        assert_eq!(block.drafts.len(), 1);
        assert_eq!(block.drafts[0].trim(), "Let me look.");
        assert!(block.answer.is_empty());

        let blank = Block::of(&preamble[..2]);
        assert_eq!(blank.phase, Phase::Reasoning, "blank text starts no answer");

        let retried = events(vec![
            (0, EventKind::TurnStart { turn: 1 }),
            (10, EventKind::AssistantDelta { turn: 1, text: "Hel".into(), reasoning: false }),
            (
                20,
                EventKind::ModelRetry {
                    turn: 1,
                    attempt: 1,
                    code: "model_transport".into(),
                    message: "reset".into(),
                    retry_in_ms: 500,
                },
            ),
            (900, EventKind::AssistantDelta { turn: 1, text: "Hello".into(), reasoning: false }),
        ]);
        assert_eq!(Block::of(&retried).answer, "Hello", "the failed attempt's text is not kept");

        let failed = events(vec![
            (0, EventKind::TurnStart { turn: 1 }),
            (10, EventKind::AssistantDelta { turn: 1, text: "Partial".into(), reasoning: false }),
            (20, EventKind::RunEnd { status: RunStatus::Failed, reason: Some("no_answer".into()) }),
        ]);
        let block = Block::of(&failed);
        assert_eq!(block.phase, Phase::Complete);
        assert!(block.answer.is_empty(), "a failed run has no answer");
        assert_eq!(block.drafts, ["Partial"]);
    }

    #[test]
    fn an_event_seen_twice_changes_nothing() {
        let run = events(vec![(0, EventKind::TurnStart { turn: 1 }), (10, step("one"))]);
        let mut block = Block::of(&run);
        assert_eq!(block.apply(&run[1]), Change::None);
        assert_eq!(block.steps.len(), 1);
    }
}
