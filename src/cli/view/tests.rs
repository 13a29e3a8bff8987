//! The terminal view on a virtual terminal (vt100) at 60, 80 and 120 columns,
//! and piped.

use chrono::{DateTime, TimeDelta, Utc};
use troupe_actors::protocol::{
    CallStatus, EventKind, Recommendation, Review, ReviewStatus, RunEvent, RunId, RunStatus,
};

use super::*;

/// A run's events, `ms` after the start each.
struct Script {
    run_id: RunId,
    start: DateTime<Utc>,
    events: Vec<RunEvent>,
}

impl Script {
    fn new() -> Self {
        let start = DateTime::parse_from_rfc3339("2026-11-27T10:00:00Z").unwrap().with_timezone(&Utc);
        Self { run_id: RunId::new(), start, events: Vec::new() }
    }

    fn at(mut self, ms: i64, kind: EventKind) -> Self {
        let seq = self.events.len() as u64 + 1;
        let ts = self.start + TimeDelta::milliseconds(ms);
        self.events.push(RunEvent { run_id: self.run_id, seq, ts, parent_run_id: None, kind });
        self
    }
}

fn step(summary: &str) -> EventKind {
    EventKind::ReasoningStep { turn: 1, summary: summary.to_owned() }
}

fn answer(text: &str) -> EventKind {
    EventKind::AssistantDelta { turn: 2, text: text.to_owned(), reasoning: false }
}

fn review(recommendation: Recommendation) -> EventKind {
    EventKind::Review {
        turn: 1,
        review: Box::new(Review {
            status: ReviewStatus::Ok,
            quality_score: 1.0,
            completeness: 0.5,
            relevance: 1.0,
            needs_more_data: recommendation != Recommendation::Proceed,
            gaps: vec!["the dates of the orders".to_owned()],
            suggested_actions: vec![],
            recommendation,
            question: None,
            updated_plan: None,
            notes: "checked".to_owned(),
            usage: Default::default(),
        }),
    }
}

const LONG: &str = "Searching the mailbox for messages about deliveries, parcels, couriers and tracking numbers \
                    that were sent in the last fourteen days by any of the shops the user ordered from";

/// A run: two long steps, a tool call, a review, then a streamed answer 3.4 s in,
/// the end at 4 s.
fn run() -> Script {
    Script::new()
        .at(0, EventKind::RunStarted { agent: "default".into(), input: "am I expecting deliveries today?".into() })
        .at(10, EventKind::TurnStart { turn: 1 })
        .at(500, step(LONG))
        .at(
            600,
            EventKind::ToolCallStart {
                turn: 1,
                call_id: "c1".into(),
                tool: "search_emails".into(),
                args: serde_json::json!({"query": "delivery"}),
            },
        )
        .at(
            1500,
            EventKind::ToolCallEnd {
                turn: 1,
                call_id: "c1".into(),
                tool: "search_emails".into(),
                status: CallStatus::Completed,
                duration_ms: 900,
                summary: "5 emails".into(),
            },
        )
        .at(1510, step("Found 5 emails about deliveries"))
        .at(1600, review(Recommendation::Proceed))
        .at(1700, EventKind::TurnStart { turn: 2 })
        .at(3410, answer("Yes: a parcel from "))
        .at(3500, answer("Acme arrives today."))
        .at(3600, EventKind::FinalOutput { text: "Yes: a parcel from Acme arrives today.".into(), citations: vec![] })
        .at(4000, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })
}

/// Plays `events` into a live view on a `width`-column virtual terminal, ticking
/// between events; returns the screen after each event.
fn play(width: u16, events: &[RunEvent]) -> Vec<String> {
    let size = |n: u16| std::num::NonZeroU16::new(n).unwrap();
    let mut terminal = vt100::Parser::new(size(200), size(width), 0);
    let mut view = View::with_width(true, usize::from(width));
    let mut screens = Vec::new();
    for event in events {
        let mut out = Vec::new();
        view.event(&mut out, event).unwrap();
        for _ in 0..3 {
            view.tick(&mut out).unwrap();
        }
        // A terminal's line discipline turns each \n into \r\n.
        let out = String::from_utf8(out).unwrap().replace('\n', "\r\n");
        terminal.process(out.as_bytes());
        screens.push(terminal.screen().contents());
    }
    screens
}

fn lines_with(screen: &str, needle: &str) -> usize {
    screen.lines().filter(|line| line.contains(needle)).count()
}

#[test]
fn a_live_view_leaves_no_line_behind_at_60_80_and_120_columns() {
    let script = run();
    for width in [60u16, 80, 120] {
        let screens = play(width, &script.events);
        for (index, screen) in screens.iter().enumerate() {
            let reasoning = lines_with(screen, "Reasoning ·");
            let kind = script.events[index].kind.name();
            // While reasoning, exactly one block; from the answer on, none.
            let expected = usize::from((1..8).contains(&index));
            assert_eq!(reasoning, expected, "width {width}, after {kind}:\n{screen}");
            for line in screen.lines() {
                assert!(line.chars().count() <= usize::from(width), "width {width}: {line:?}");
            }
        }
        // The block shows the last two steps, cut to the width, on rows of their own.
        let reasoning = &screens[6];
        assert_eq!(lines_with(reasoning, "›"), 2, "width {width}:\n{reasoning}");
        assert!(reasoning.contains("› Found 5 emails about deliveries"), "width {width}:\n{reasoning}");
        assert!(reasoning.contains("› Searching the mailbox for"), "width {width}:\n{reasoning}");
        assert!(reasoning.contains('…'), "a long step is cut, width {width}:\n{reasoning}");

        let end = screens.last().unwrap();
        assert_eq!(lines_with(end, "Thought for 3s"), 1, "width {width}:\n{end}");
        assert_eq!(lines_with(end, "a parcel from Acme arrives today."), 1, "width {width}:\n{end}");
        assert_eq!(lines_with(end, "✓ search_emails · 900 ms  5 emails"), 1, "width {width}:\n{end}");
        assert!(end.contains("■ succeeded · 4.0s"), "the run's own duration, width {width}:\n{end}");
        assert!(!end.contains("turn 1") && !end.contains("review:"), "no mechanical steps:\n{end}");
        let rows: Vec<&str> = end.lines().filter(|line| !line.trim().is_empty()).collect();
        assert_eq!(rows.len(), 6, "width {width}: start (2 rows), tool, thought, answer, end:\n{end}");
    }
}

#[test]
fn an_answer_sent_back_by_the_review_is_erased_and_shown_as_a_draft() {
    let script = Script::new()
        .at(0, EventKind::TurnStart { turn: 1 })
        .at(1000, answer("You have no deliveries today, as far as I can see in the last week of mail."))
        .at(1100, review(Recommendation::GatherMore))
        .at(1200, EventKind::TurnStart { turn: 2 })
        .at(2000, step("Searching emails for 'parcel'"))
        .at(5000, answer("A parcel from Acme arrives today."))
        .at(5100, EventKind::FinalOutput { text: "A parcel from Acme arrives today.".into(), citations: vec![] })
        .at(5200, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None });
    for width in [60u16, 80, 120] {
        let screens = play(width, &script.events);
        let end = screens.last().unwrap();
        assert_eq!(lines_with(end, "A parcel from Acme arrives today."), 1, "{end}");
        assert_eq!(lines_with(end, "You have no deliveries"), 1, "only the draft line keeps it:\n{end}");
        assert_eq!(lines_with(end, "✎ draft (the run went on): You have no deliveries"), 1, "{end}");
        assert_eq!(lines_with(end, "Thought for"), 1, "the draft's own header is gone too:\n{end}");
        // Reasoning: 0 – 1 s, then 1.2 – 5 s.
        assert_eq!(lines_with(end, "Thought for 4s"), 1, "{end}");
    }
}

#[test]
fn a_piped_replay_reads_as_the_live_run_did() {
    let script = run();
    let mut view = View::with_width(false, 80);
    let mut out = Vec::new();
    for event in &script.events {
        view.event(&mut out, event).unwrap();
    }
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains('\r') && !text.contains('\x1b'), "nothing redraws outside a terminal: {text:?}");
    assert!(text.contains("  · Searching the mailbox for messages"), "{text}");
    assert!(text.contains("  · Found 5 emails about deliveries\n"), "{text}");
    assert!(text.contains("▸ Thought for 3s\nYes: a parcel from Acme arrives today.\n"), "{text}");
    assert!(text.contains("■ succeeded · 4.0s"), "the events' times, not the replay's: {text}");
    assert!(!text.contains("turn 1") && !text.contains("review:"), "{text}");
}

#[test]
fn the_models_reasoning_text_is_a_step() {
    let script = Script::new()
        .at(0, EventKind::TurnStart { turn: 1 })
        .at(100, EventKind::AssistantDelta { turn: 1, text: "The user wants ".into(), reasoning: true })
        .at(200, EventKind::AssistantDelta { turn: 1, text: "today's parcels.".into(), reasoning: true })
        .at(300, step("Searching emails for 'parcel'"));
    let screens = play(80, &script.events);
    assert!(screens[2].contains("› Thinking: The user wants today's parcels."), "{}", screens[2]);
    let mut view = View::with_width(false, 80);
    let mut out = Vec::new();
    for event in &script.events {
        view.event(&mut out, event).unwrap();
    }
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("Thinking:").count(), 1, "printed once, whole: {text}");
    assert!(text.contains("  · Thinking: The user wants today's parcels.\n"), "{text}");
}

#[test]
fn the_expanded_block_shows_every_step_with_its_detail() {
    let script = run();
    let block = Block::of(&script.events);
    let mut out = Vec::new();
    expanded(&mut out, &block).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("▾ Thought for 3s"), "{text}");
    assert!(text.contains("tool     search_emails (query: \"delivery\") · completed · 900 ms"), "{text}");
    assert!(text.contains("\"query\": \"delivery\""), "the arguments: {text}");
    assert!(text.contains("→ 5 emails"), "the result: {text}");
    assert!(text.contains("review   Review: carry on · proceed"), "{text}");
    assert!(text.contains("quality 1.00 · completeness 0.50"), "{text}");
    assert!(text.contains("   1.5s  step     Found 5 emails about deliveries"), "{text}");
}

#[test]
fn fit_cuts_by_columns_and_keeps_short_text() {
    assert_eq!(fit("short", 10), "short");
    assert_eq!(fit("0123456789abc", 10), "012345678…");
    assert_eq!(fit("日本語のテキスト", 7), "日本語…");
    assert_eq!(fit("a\nb", 10), "a b");
}

#[test]
fn a_run_that_parks_leaves_no_live_block_and_its_timer_stands() {
    let script = Script::new()
        .at(0, EventKind::TurnStart { turn: 1 })
        .at(500, step("Looking for the order"))
        .at(1_000, EventKind::WaitingInput { prompt: "Which shop?".into(), sub_run: None });
    for width in [60u16, 80, 120] {
        let screens = play(width, &script.events);
        let parked = screens.last().unwrap();
        assert_eq!(lines_with(parked, "Reasoning ·"), 0, "width {width}:\n{parked}");
        assert!(parked.contains("? Which shop?"), "{parked}");
        assert!(parked.trim_end().ends_with("\"…\")"), "the cursor is on a line of its own after:\n{parked}");
    }
}

#[test]
fn wide_characters_are_counted_by_their_columns() {
    // Emoji and CJK take two columns: a long step of them still fits one row.
    let wide = "🚀 ✅ 日本語のテキストを検索しています ".repeat(8);
    let script = Script::new().at(0, EventKind::TurnStart { turn: 1 }).at(100, step(&wide)).at(200, step(&wide));
    for width in [60u16, 80, 120] {
        let screens = play(width, &script.events);
        let screen = screens.last().unwrap();
        assert_eq!(lines_with(screen, "Reasoning ·"), 1, "width {width}:\n{screen}");
        assert_eq!(screen.lines().filter(|line| !line.trim().is_empty()).count(), 3, "width {width}:\n{screen}");
    }
    // A draft of wide text wraps as the terminal wraps it, and is erased whole.
    let script = Script::new()
        .at(0, EventKind::TurnStart { turn: 1 })
        .at(100, answer(&"日本語🚀".repeat(40)))
        .at(200, EventKind::TurnStart { turn: 2 })
        .at(300, answer("Done."))
        .at(400, EventKind::FinalOutput { text: "Done.".into(), citations: vec![] });
    for width in [60u16, 80, 120] {
        let screens = play(width, &script.events);
        let end = screens.last().unwrap();
        let rows = end.lines().filter(|line| line.contains("日本語🚀")).collect::<Vec<_>>();
        assert!(rows.len() == 1 && rows[0].contains("✎ draft"), "only the draft line keeps it, width {width}:\n{end}");
        assert_eq!(lines_with(end, "✎ draft"), 1, "width {width}:\n{end}");
        assert_eq!(lines_with(end, "Done."), 1, "width {width}:\n{end}");
    }
}
