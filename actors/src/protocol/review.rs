//! Reviews: the reviewer's verdict on a turn.

use serde::{Deserialize, Serialize};

use crate::protocol::TodoItem;

/// Whether a review came from its intended reviewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewStatus {
    /// The configured reviewer produced it.
    Ok,
    /// The rule-based fallback produced it because the configured one failed.
    Degraded,
}

/// What the reviewer advises after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recommendation {
    /// Carry on (or accept the final answer).
    Proceed,
    /// The answer is premature: keep working while turns remain.
    GatherMore,
    /// The request is unclear.
    ClarifyQuery,
    /// The plan no longer fits: revise it.
    Replan,
}

impl Recommendation {
    /// The snake_case name, as used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proceed => "proceed",
            Self::GatherMore => "gather_more",
            Self::ClarifyQuery => "clarify_query",
            Self::Replan => "replan",
        }
    }
}

/// The reviewer's verdict on one turn. Scores are in 0..=1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    /// Whether the configured reviewer produced it.
    pub status: ReviewStatus,
    /// How well the turn's work went.
    pub quality_score: f64,
    /// How much of the plan is done.
    pub completeness: f64,
    /// How well the output addresses the request.
    pub relevance: f64,
    /// Whether the run lacks information it needs.
    pub needs_more_data: bool,
    /// What is missing.
    pub gaps: Vec<String>,
    /// What to do next.
    pub suggested_actions: Vec<String>,
    /// The advice.
    pub recommendation: Recommendation,
    /// A revised task list, with `replan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_plan: Option<Vec<TodoItem>>,
    /// Free-form notes, shown to the model next turn.
    pub notes: String,
}
