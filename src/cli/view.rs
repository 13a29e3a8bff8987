//! The terminal view of a run's events, shared by `troupe demo` and
//! `troupe run --follow`: the plan as a checklist, each tool call with its latency
//! and status, a live reasoning line (a spinner, "Reasoning · 9s" and the last two
//! steps) that collapses to "Thought for 12s" when the answer arrives, then the
//! answer with its citations. On a terminal the reasoning line redraws in place;
//! elsewhere (a pipe, a log) steps are printed as plain lines and nothing redraws.

use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

use troupe_actors::planner;
use troupe_actors::protocol::{CallStatus, EventKind, ReviewStatus, RunEvent, RunStatus, ThoughtStage};

const SPINNER: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// How often [`View::tick`] should be called on a terminal.
pub const TICK: Duration = Duration::from_millis(100);

/// What the view has shown so far.
pub struct View {
    live: bool,
    thinking_since: Option<Instant>,
    steps: VecDeque<String>,
    line_shown: bool,
    frame: usize,
    answer_streamed: bool,
    /// The cursor is after streamed answer text, mid-line.
    mid_line: bool,
    started: Instant,
}

impl View {
    /// A view; `live` redraws the reasoning line in place (a terminal).
    pub fn new(live: bool) -> Self {
        Self {
            live,
            thinking_since: None,
            steps: VecDeque::new(),
            line_shown: false,
            frame: 0,
            answer_streamed: false,
            mid_line: false,
            started: Instant::now(),
        }
    }

    /// Shows one event. Returns the run's status when the event ends the run.
    pub fn event(&mut self, out: &mut impl Write, event: &RunEvent) -> std::io::Result<Option<RunStatus>> {
        match &event.kind {
            EventKind::RunStarted { agent, input } => {
                self.lines(out, &format!("▶ run {} · agent {agent}\n  {input}", event.run_id))?;
            }
            EventKind::TurnStart { turn } => {
                self.thinking_since.get_or_insert_with(Instant::now);
                self.step(out, format!("turn {turn}"))?;
            }
            EventKind::ReasoningStep { summary, .. } => self.step(out, summary.clone())?,
            EventKind::Thought { stage, thought, .. } => {
                let text = match stage {
                    ThoughtStage::BeforeActing => format!("thought: {}", thought.understanding),
                    ThoughtStage::AfterResponse if thought.complete => {
                        format!("reflection: complete · {}", thought.why)
                    }
                    ThoughtStage::AfterResponse => format!("reflection: not complete · {}", thought.why),
                };
                self.step(out, text)?;
            }
            EventKind::ToolCallEnd { tool, status, duration_ms, summary, .. } => {
                let mark = if *status == CallStatus::Completed { "✓" } else { "✗" };
                let state =
                    if *status == CallStatus::Completed { String::new() } else { format!(" {}", status.as_str()) };
                // The plan is shown by `plan_updated`; other results get one short line.
                let shown: String = if tool == "todo_write" {
                    String::new()
                } else {
                    summary.lines().next().unwrap_or_default().chars().take(100).collect()
                };
                self.lines(out, format!("  {mark} {tool}{state} · {duration_ms} ms  {shown}").trim_end())?;
            }
            EventKind::ToolSkipped { tool, reason, detail, .. } => {
                self.lines(out, &format!("  ⊘ {tool} skipped ({}): {detail}", reason.as_str()))?;
            }
            EventKind::PlanUpdated { plan } => {
                let mut text = format!("  plan v{}:", plan.version);
                for item in &plan.items {
                    text.push_str(&format!("\n    {} {}", planner::marker(item.status), item.content));
                }
                self.lines(out, &text)?;
            }
            EventKind::Review { review, .. } => {
                let degraded = if review.status == ReviewStatus::Degraded { " (degraded)" } else { "" };
                let summary = format!(
                    "review: {} · quality {:.2} · completeness {:.2}{degraded}",
                    review.recommendation.as_str(),
                    review.quality_score,
                    review.completeness
                );
                self.step(out, summary)?;
            }
            EventKind::AssistantDelta { text, reasoning: false, .. } => {
                self.collapse(out)?;
                self.answer_streamed = true;
                self.mid_line = true;
                write!(out, "{text}")?;
            }
            EventKind::WaitingInput { prompt, .. } => {
                self.lines(out, &format!("  ? {prompt}\n  (answer with: troupe runs input {} \"…\")", event.run_id))?;
            }
            EventKind::InputReceived { text } => self.lines(out, &format!("  ↳ {text}"))?,
            EventKind::ApprovalRequested { tool, call_id, reason, .. } => {
                let text = format!(
                    "  ⏸ {tool} waits for approval: {reason}\n  (troupe runs approve {} --call {call_id} [--reject --reason …])",
                    event.run_id
                );
                self.lines(out, &text)?;
            }
            EventKind::ApprovalDecided { tool, approved, reason, .. } => {
                let verdict = if *approved { "approved" } else { "rejected" };
                let reason = reason.as_ref().map(|reason| format!(": {reason}")).unwrap_or_default();
                self.lines(out, &format!("  ↳ {tool} {verdict}{reason}"))?;
            }
            EventKind::DecodeError { detail, .. } => {
                self.lines(out, &format!("  ! could not decode a tool call: {detail}"))?;
            }
            EventKind::Error { code, message } => self.lines(out, &format!("  ! {code}: {message}"))?,
            EventKind::ModelRetry { attempt, message, retry_in_ms, .. } => {
                let seconds = *retry_in_ms as f64 / 1000.0;
                self.lines(
                    out,
                    &format!("  … the model failed ({message}); asking again in {seconds:.0} s (try {attempt})"),
                )?;
            }
            EventKind::FinalOutput { text, citations } => {
                self.collapse(out)?;
                if !self.answer_streamed {
                    writeln!(out, "{text}")?;
                }
                self.end_line(out)?;
                for citation in citations {
                    let fragment = &citation.fragment;
                    let title = if fragment.title.is_empty() { &fragment.id } else { &fragment.title };
                    writeln!(out, "  [{}] {title} — {}", citation.marker, fragment.source)?;
                }
                self.answer_streamed = false;
            }
            EventKind::RunEnd { status, reason } => {
                self.clear(out)?;
                self.end_line(out)?;
                let mark = if *status == RunStatus::Succeeded { "■" } else { "✘" };
                let reason = reason.as_ref().map(|reason| format!(": {reason}")).unwrap_or_default();
                let elapsed = self.started.elapsed().as_secs_f64();
                writeln!(out, "{mark} {}{reason} · {elapsed:.1}s", status.as_str())?;
                out.flush()?;
                return Ok(Some(*status));
            }
            _ => {}
        }
        self.redraw(out)?;
        out.flush()?;
        Ok(None)
    }

    /// Advances the spinner and redraws the reasoning line (terminals only).
    pub fn tick(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.live && self.thinking_since.is_some() {
            self.frame = (self.frame + 1) % SPINNER.len();
            self.redraw(out)?;
            out.flush()?;
        }
        Ok(())
    }

    /// Clears the live line before the caller prints something of its own.
    pub fn clear(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.line_shown {
            write!(out, "\r\x1b[2K")?;
            self.line_shown = false;
        }
        Ok(())
    }

    /// Ends a line of streamed answer text, if one is open.
    fn end_line(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if std::mem::take(&mut self.mid_line) {
            writeln!(out)?;
        }
        Ok(())
    }

    /// A reasoning step: kept for the live line, or printed where nothing redraws.
    fn step(&mut self, out: &mut impl Write, step: String) -> std::io::Result<()> {
        if !self.live {
            self.end_line(out)?;
            writeln!(out, "  · {step}")?;
        }
        self.steps.push_back(step);
        while self.steps.len() > 2 {
            self.steps.pop_front();
        }
        Ok(())
    }

    /// Permanent lines, printed above the live line.
    fn lines(&mut self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        self.clear(out)?;
        self.end_line(out)?;
        writeln!(out, "{text}")
    }

    /// The answer begins: the reasoning line becomes "Thought for Ns".
    fn collapse(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.clear(out)?;
        if let Some(since) = self.thinking_since.take() {
            writeln!(out, "Thought for {}s", since.elapsed().as_secs())?;
            self.steps.clear();
        }
        Ok(())
    }

    fn redraw(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let Some(since) = self.thinking_since.filter(|_| self.live) else { return Ok(()) };
        self.end_line(out)?;
        let steps: Vec<&str> = self.steps.iter().map(String::as_str).collect();
        let line = format!("{} Reasoning · {}s  {}", SPINNER[self.frame], since.elapsed().as_secs(), steps.join(" › "));
        let line: String = line.chars().take(LINE_WIDTH).collect();
        write!(out, "\r\x1b[2K{line}")?;
        self.line_shown = true;
        Ok(())
    }
}

/// Longest live line, in characters: it must fit one terminal row to redraw.
const LINE_WIDTH: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use troupe_actors::protocol::RunId;

    fn event(seq: u64, kind: EventKind) -> RunEvent {
        RunEvent { run_id: RunId::new(), seq, ts: Utc::now(), parent_run_id: None, kind }
    }

    #[test]
    fn a_piped_view_prints_steps_tool_lines_the_answer_and_the_end() {
        let mut view = View::new(false);
        let mut out = Vec::new();
        view.event(&mut out, &event(2, EventKind::TurnStart { turn: 1 })).unwrap();
        let end = EventKind::ToolCallEnd {
            turn: 1,
            call_id: "c1".into(),
            tool: "text_stats".into(),
            status: CallStatus::Completed,
            duration_ms: 12,
            summary: "5 words".into(),
        };
        view.event(&mut out, &event(3, end)).unwrap();
        view.event(&mut out, &event(4, EventKind::FinalOutput { text: "Five words.".into(), citations: vec![] }))
            .unwrap();
        let status = view.event(&mut out, &event(5, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None }));
        assert_eq!(status.unwrap(), Some(RunStatus::Succeeded));
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("  · turn 1\n"), "{text}");
        assert!(text.contains("✓ text_stats · 12 ms  5 words"), "{text}");
        assert!(text.contains("Thought for 0s\nFive words.\n"), "{text}");
        assert!(text.contains("■ succeeded"), "{text}");
        assert!(!text.contains('\r'), "nothing redraws outside a terminal: {text:?}");
    }

    #[test]
    fn a_live_view_redraws_one_reasoning_line_and_collapses_it() {
        let mut view = View::new(true);
        let mut out = Vec::new();
        view.event(&mut out, &event(2, EventKind::TurnStart { turn: 1 })).unwrap();
        view.event(&mut out, &event(3, EventKind::ReasoningStep { turn: 1, summary: "read the text".into() })).unwrap();
        view.tick(&mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.contains("Reasoning · 0s  turn 1 › read the text"), "{text:?}");
        view.event(&mut out, &event(4, EventKind::AssistantDelta { turn: 1, text: "Hi".into(), reasoning: false }))
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("\r\x1b[2KThought for 0s\nHi"), "{text:?}");
    }
}
