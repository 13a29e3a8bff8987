//! The shared vocabulary of troupe: ids, run specs, plans, tool calls and outcomes,
//! reviews, events and usage. Every type here is plain serde data; actor messages
//! live beside their actors and are never serialized.
//!
//! One file per subject: `run.rs`, `plan.rs`, `tool.rs`, `review.rs`,
//! `event.rs`; every type is re-exported here, where callers name it.

mod event;
mod plan;
mod review;
mod run;
mod tool;

pub use event::{EventKind, RunEvent, Thought, ThoughtStage};
pub use plan::{Plan, TaskStatus, TodoItem};
pub use review::{Recommendation, Review, ReviewStatus, SuggestedAction};
pub use run::{Limits, RunId, RunSpec, RunStatus, ThreadId, Usage};
pub use tool::{CallStatus, Citation, Fragment, SkipReason, ToolCall, ToolExecutionRecord, ToolOutcome};

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn events_serialize_with_kind_tag_and_seq() {
        let event = RunEvent {
            run_id: RunId::new(),
            seq: 7,
            ts: Utc::now(),
            parent_run_id: None,
            kind: EventKind::TurnStart { turn: 2 },
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "turn_start");
        assert_eq!(json["seq"], 7);
        assert_eq!(json["turn"], 2);
        let back: RunEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn outcome_text_names_the_reason() {
        let skipped = ToolOutcome::skipped(SkipReason::Duplicate, "same as call c1");
        assert_eq!(skipped.to_model_text(), "skipped (duplicate): same as call c1");
        assert_eq!(skipped.status(), CallStatus::Skipped);
    }
}
