//! The terminal view of a run's events, shared by `troupe demo`, `troupe run
//! --follow` and `troupe chat`: the plan as a checklist, each tool call with its
//! latency and status, the reasoning block (`crate::reasoning`: "Reasoning · 9s"
//! with the last two steps, collapsing to "▸ Thought for 12s" when the answer
//! starts), then the answer with its citations. On a terminal the block redraws
//! in place, every line cut to the terminal's width so that a redraw never leaves
//! a line behind; elsewhere (a pipe, a log) its steps are printed as plain lines
//! and nothing redraws. Durations come from the events' timestamps: a replay shows
//! what the live run showed.

use std::io::Write;
use std::time::Duration;

use chrono::Utc;
use troupe_actors::planner;
use troupe_actors::protocol::{CallStatus, EventKind, RunEvent, RunStatus};

use crate::reasoning::{Block, Phase, StepKind};

const SPINNER: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// How often [`View::tick`] should be called on a terminal.
pub const TICK: Duration = Duration::from_millis(100);

/// Columns assumed when the width cannot be read.
const DEFAULT_WIDTH: usize = 80;

/// What the view has shown so far.
pub struct View {
    live: bool,
    width: usize,
    /// Re-read the terminal's width at each redraw (it may be resized).
    follow_width: bool,
    block: Block,
    frame: usize,
    /// Rows of the live block on screen (0: none); the cursor is on its last row.
    live_rows: usize,
    /// The answer text written so far.
    written: String,
    /// Rows from the "Thought for" line (or the answer's first row) to the
    /// cursor's, and the cursor's column (live view only: to erase an answer that
    /// becomes a draft).
    answer_rows: usize,
    answer_column: usize,
    /// Whether the first of `answer_rows` is the "Thought for" line.
    header_row: bool,
    /// The cursor is after streamed answer text, mid-line.
    mid_line: bool,
    /// Steps already printed (piped view).
    steps_printed: usize,
}

impl View {
    /// A view; `live` redraws the reasoning block in place (a terminal), cut to
    /// the terminal's width.
    pub fn new(live: bool) -> Self {
        let mut view = Self::with_width(live, terminal_width().unwrap_or(DEFAULT_WIDTH));
        view.follow_width = live;
        view
    }

    /// A view for a terminal of `width` columns.
    pub fn with_width(live: bool, width: usize) -> Self {
        Self {
            live,
            width: width.max(20),
            follow_width: false,
            block: Block::new(),
            frame: 0,
            live_rows: 0,
            written: String::new(),
            answer_rows: 0,
            answer_column: 0,
            header_row: false,
            mid_line: false,
            steps_printed: 0,
        }
    }

    /// Shows one event. Returns the run's status when the event ends the run.
    pub fn event(&mut self, out: &mut impl Write, event: &RunEvent) -> std::io::Result<Option<RunStatus>> {
        let phase = self.block.phase;
        let drafts = self.block.drafts.len();
        self.block.apply(event);
        if self.block.drafts.len() > drafts {
            self.retract_answer(out)?;
        }
        self.permanent(out, event)?;
        if !self.live {
            self.print_steps(out)?;
        }
        if phase != Phase::Collapsed && self.block.phase == Phase::Collapsed
            || phase == Phase::Reasoning && self.block.phase == Phase::Complete
        {
            self.clear(out)?;
            self.end_line(out)?;
            writeln!(out, "▸ Thought for {}", seconds(self.block.thought_ms))?;
            // The line goes with the answer it opens: a draft takes both back.
            self.answer_rows = 2;
            self.answer_column = 0;
            self.header_row = true;
        }
        match &event.kind {
            EventKind::AssistantDelta { reasoning: false, .. } if self.live => self.write_answer(out)?,
            EventKind::FinalOutput { citations, .. } => {
                self.write_answer(out)?;
                self.end_line(out)?;
                self.answer_rows = 0;
                for citation in citations {
                    let fragment = &citation.fragment;
                    let title = if fragment.title.is_empty() { &fragment.id } else { &fragment.title };
                    writeln!(out, "  [{}] {title} — {}", citation.marker, fragment.source)?;
                }
            }
            EventKind::RunEnd { status, reason } => {
                self.clear(out)?;
                self.end_line(out)?;
                let mark = if *status == RunStatus::Succeeded { "■" } else { "✘" };
                let reason = reason.as_ref().map(|reason| format!(": {reason}")).unwrap_or_default();
                let elapsed = self.block.elapsed_ms(Utc::now()) as f64 / 1000.0;
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

    /// The block as the events so far made it.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// Advances the spinner and redraws the reasoning block (terminals only).
    pub fn tick(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.live && self.block.phase == Phase::Reasoning && !self.block.waiting {
            self.frame = (self.frame + 1) % SPINNER.len();
            self.redraw(out)?;
            out.flush()?;
        }
        Ok(())
    }

    /// Clears the live block before the caller prints something of its own.
    pub fn clear(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.live_rows > 0 {
            erase_rows(out, self.live_rows)?;
            self.live_rows = 0;
        }
        Ok(())
    }

    /// Lines that stay: the run's start, tool calls, the plan, questions,
    /// approvals and problems.
    fn permanent(&mut self, out: &mut impl Write, event: &RunEvent) -> std::io::Result<()> {
        let text = match &event.kind {
            EventKind::RunStarted { agent, input } => format!("▶ run {} · agent {agent}\n  {input}", event.run_id),
            EventKind::ToolCallEnd { tool, status, duration_ms, summary, .. } => {
                let mark = if *status == CallStatus::Completed { "✓" } else { "✗" };
                let state =
                    if *status == CallStatus::Completed { String::new() } else { format!(" {}", status.as_str()) };
                // The plan is shown by `plan_updated`; other results get one short line.
                let shown = if tool == "todo_write" {
                    String::new()
                } else {
                    crate::reasoning::clip(summary.lines().next().unwrap_or_default(), 100)
                };
                format!("  {mark} {tool}{state} · {duration_ms} ms  {shown}").trim_end().to_owned()
            }
            EventKind::ToolSkipped { tool, reason, detail, .. } => {
                format!("  ⊘ {tool} skipped ({}): {detail}", reason.as_str())
            }
            EventKind::PlanUpdated { plan } => {
                let mut text = format!("  plan v{}:", plan.version);
                for item in &plan.items {
                    text.push_str(&format!("\n    {} {}", planner::marker(item.status), item.content));
                }
                text
            }
            EventKind::WaitingInput { prompt, .. } => {
                format!("  ? {prompt}\n  (answer with: troupe runs input {} \"…\")", event.run_id)
            }
            EventKind::InputReceived { text } => format!("  ↳ {text}"),
            EventKind::ApprovalRequested { tool, call_id, reason, .. } => format!(
                "  ⏸ {tool} waits for approval: {reason}\n  (troupe runs approve {} --call {call_id} [--reject --reason …])",
                event.run_id
            ),
            EventKind::ApprovalDecided { tool, approved, reason, .. } => {
                let verdict = if *approved { "approved" } else { "rejected" };
                let reason = reason.as_ref().map(|reason| format!(": {reason}")).unwrap_or_default();
                format!("  ↳ {tool} {verdict}{reason}")
            }
            EventKind::DecodeError { detail, .. } => format!("  ! could not decode a tool call: {detail}"),
            EventKind::Error { code, message } => format!("  ! {code}: {message}"),
            EventKind::ModelRetry { attempt, message, retry_in_ms, .. } => {
                let seconds = *retry_in_ms as f64 / 1000.0;
                format!("  … the model failed ({message}); asking again in {seconds:.0} s (try {attempt})")
            }
            _ => return Ok(()),
        };
        self.lines(out, &text)
    }

    /// The piped view's steps: each headline step the permanent lines do not
    /// already say, once (the model's reasoning text once it is whole).
    fn print_steps(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        // Approvals, questions, problems and skipped calls have lines of their own.
        let said = |kind: StepKind| {
            matches!(kind, StepKind::Approval | StepKind::Question | StepKind::Problem | StepKind::Tool)
        };
        while let Some(step) = self.block.steps.get(self.steps_printed) {
            let open = self.steps_printed + 1 == self.block.steps.len()
                && step.call_id.as_deref() == Some("reasoning")
                && self.block.phase == Phase::Reasoning;
            if open {
                break;
            }
            self.steps_printed += 1;
            if step.headline && !said(step.kind) {
                let line = format!("  · {}", step.summary);
                self.end_line(out)?;
                writeln!(out, "{line}")?;
            }
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

    /// Permanent lines, printed above the live block.
    fn lines(&mut self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        self.clear(out)?;
        self.end_line(out)?;
        self.answer_rows = 0;
        self.header_row = false;
        writeln!(out, "{text}")
    }

    /// Writes the part of the block's answer not written yet (all of it, over
    /// what was written, if the answer is not what was written followed by more).
    fn write_answer(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.clear(out)?;
        let new = match self.block.answer.strip_prefix(self.written.as_str()) {
            Some(new) => new.to_owned(),
            None => {
                self.erase_answer(out, true)?;
                self.block.answer.clone()
            }
        };
        if new.is_empty() {
            return Ok(());
        }
        if self.answer_rows == 0 {
            self.answer_rows = 1;
            self.answer_column = 0;
        }
        for character in new.chars() {
            if character == '\n' {
                self.answer_rows += 1;
                self.answer_column = 0;
                continue;
            }
            let width = if character == '\t' { 8 - self.answer_column % 8 } else { char_width(character) };
            if self.answer_column + width > self.width {
                self.answer_rows += 1;
                self.answer_column = 0;
            }
            self.answer_column += width;
        }
        write!(out, "{new}")?;
        self.written.push_str(&new);
        self.mid_line = !new.ends_with('\n');
        Ok(())
    }

    /// The answer written so far was a draft: a live view erases it and says so in
    /// one line (a piped view wrote no draft: its step says so).
    fn retract_answer(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let Some(draft) = self.block.drafts.last() else { return Ok(()) };
        if self.written.is_empty() {
            return Ok(());
        }
        let line = format!("  ✎ draft (the run went on): {}", draft.split_whitespace().collect::<Vec<_>>().join(" "));
        let line = fit(&line, self.width - 1);
        self.erase_answer(out, false)?;
        writeln!(out, "{line}")
    }

    /// Takes back the answer text written so far, with the "Thought for" line
    /// above it unless `keep_header`: erased on a terminal.
    fn erase_answer(&mut self, out: &mut impl Write, keep_header: bool) -> std::io::Result<()> {
        self.clear(out)?;
        let header = usize::from(keep_header && self.header_row);
        if self.live && self.answer_rows > header {
            // The cursor is on the answer's last row: a full row wraps the cursor
            // only when more is written.
            erase_rows(out, self.answer_rows - header)?;
            self.mid_line = false;
            self.answer_rows = header * 2;
        } else {
            self.end_line(out)?;
            self.answer_rows = 0;
        }
        self.header_row = header == 1;
        self.answer_column = 0;
        self.written.clear();
        Ok(())
    }

    /// Redraws the live block: "⠋ Reasoning · 9s" and the last two steps, each
    /// row cut to fit the terminal.
    fn redraw(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.live || self.block.phase != Phase::Reasoning || self.block.waiting {
            // A run that waits for a person shows its question, not a timer.
            return self.clear(out);
        }
        if self.follow_width {
            self.width = terminal_width().unwrap_or(self.width).max(20);
        }
        self.end_line(out)?;
        let seconds = self.block.reasoning_ms(Utc::now()) / 1000;
        let mut rows = vec![format!("{} Reasoning · {seconds}s", SPINNER[self.frame])];
        rows.extend(self.block.latest(2).iter().map(|step| format!("  › {}", step.summary)));
        let rows: Vec<String> = rows.iter().map(|row| fit(row, self.width - 1)).collect();
        if self.live_rows > 0 {
            erase_rows(out, self.live_rows)?;
        }
        write!(out, "{}", rows.join("\n"))?;
        self.live_rows = rows.len();
        Ok(())
    }
}

/// Erases the `rows` rows ending with the cursor's, leaving the cursor at the
/// start of the first.
fn erase_rows(out: &mut impl Write, rows: usize) -> std::io::Result<()> {
    write!(out, "\r\x1b[2K")?;
    for _ in 1..rows {
        write!(out, "\x1b[1A\x1b[2K")?;
    }
    Ok(())
}

/// "12s", or "1m 05s" from a minute on.
fn seconds(millis: u64) -> String {
    let seconds = millis / 1000;
    if seconds < 60 { format!("{seconds}s") } else { format!("{}m {:02}s", seconds / 60, seconds % 60) }
}

/// `text` on one row of at most `columns` columns, "…" where cut; control
/// characters (a newline in a step) become spaces.
fn fit(text: &str, columns: usize) -> String {
    let visible = || text.chars().map(|character| if character.is_control() { ' ' } else { character });
    let mut fitted = String::new();
    let mut used = 0;
    let total: usize = visible().map(char_width).sum();
    for character in visible() {
        let width = char_width(character);
        if total > columns && used + width > columns.saturating_sub(1) {
            fitted.push('…');
            break;
        }
        used += width;
        fitted.push(character);
    }
    fitted
}

/// Columns a character takes on a terminal (2 for wide characters and most
/// emoji, 0 for combining marks).
fn char_width(character: char) -> usize {
    unicode_width::UnicodeWidthChar::width(character).unwrap_or(0)
}

/// The terminal's width in columns, if standard output is a terminal.
pub fn terminal_width() -> Option<usize> {
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, which
    // lives on this stack frame for the call.
    #[allow(unsafe_code)]
    let read = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (read == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// Every step of a finished (or so far) run, for `troupe runs show --reasoning`.
pub fn expanded(out: &mut impl Write, block: &Block) -> std::io::Result<()> {
    let start = block.started_at;
    let thought = seconds(block.thought_ms);
    let status = block.status.map(|status| status.as_str()).unwrap_or("running");
    let elapsed = block.elapsed_ms(Utc::now()) as f64 / 1000.0;
    writeln!(out, "▾ Thought for {thought} · {} steps · {status} after {elapsed:.1}s", block.steps.len())?;
    for step in &block.steps {
        let offset = start.map(|start| (step.at - start).num_milliseconds() as f64 / 1000.0).unwrap_or(0.0);
        let mut head = format!("  {offset:>6.1}s  {:<8} {}", kind_name(step.kind), step.summary);
        if let Some(status) = &step.status {
            head.push_str(&format!(" · {status}"));
        }
        if let Some(duration) = step.duration_ms {
            head.push_str(&format!(" · {duration} ms"));
        }
        writeln!(out, "{head}")?;
        if let Some(detail) = &step.detail {
            for line in detail.lines() {
                writeln!(out, "            {line}")?;
            }
        }
    }
    if !block.answer.is_empty() {
        writeln!(out, "\n{}", block.answer)?;
    }
    Ok(())
}

fn kind_name(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Progress => "step",
        StepKind::Tool => "tool",
        StepKind::Review => "review",
        StepKind::Plan => "plan",
        StepKind::Thought => "thought",
        StepKind::Draft => "draft",
        StepKind::Approval => "approval",
        StepKind::Question => "question",
        StepKind::Problem => "problem",
    }
}

#[cfg(test)]
mod tests;
