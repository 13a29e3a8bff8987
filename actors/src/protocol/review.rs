//! Reviews: the reviewer's verdict on a turn.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{TodoItem, Usage};

/// Whether a review came from its intended reviewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewStatus {
    /// The configured reviewer produced it.
    Ok,
    /// The rule-based fallback produced it because the configured one failed.
    Degraded,
}

/// What the reviewer advises after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    pub suggested_actions: Vec<SuggestedAction>,
    /// The advice.
    pub recommendation: Recommendation,
    /// With `clarify_query`: the question the run asks the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// A revised task list, with `replan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_plan: Option<Vec<TodoItem>>,
    /// Free-form notes, shown to the model next turn.
    pub notes: String,
    /// What a model-backed review's call spent (charged to the run); nothing for
    /// the rule-based one.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

/// An action a review suggests: a call (the tool, perhaps its arguments) or
/// something else to do, and why. Read from a plain string too (the reason
/// alone), as reviews written before actions were typed, and model reviewers
/// that write strings, give them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(from = "ActionForm")]
pub struct SuggestedAction {
    /// The tool it concerns, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The arguments to call it with, if the reviewer knows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// What to do and why.
    pub reason: String,
}

impl SuggestedAction {
    /// An action that is not about one tool.
    pub fn reason(reason: impl Into<String>) -> Self {
        Self { tool: None, arguments: None, reason: reason.into() }
    }

    /// An action about `tool`.
    pub fn about(tool: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { tool: Some(tool.into()), arguments: None, reason: reason.into() }
    }
}

/// The forms a suggested action is read from.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum ActionForm {
    Typed {
        #[serde(default)]
        tool: Option<String>,
        #[serde(default)]
        arguments: Option<Value>,
        reason: String,
    },
    Text(String),
}

impl From<ActionForm> for SuggestedAction {
    fn from(form: ActionForm) -> Self {
        match form {
            ActionForm::Typed { tool, arguments, reason } => Self { tool, arguments, reason },
            ActionForm::Text(reason) => Self::reason(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_suggested_action_reads_from_an_object_or_a_plain_string() {
        let typed: SuggestedAction =
            serde_json::from_value(json!({"tool": "search", "arguments": {"q": "x"}, "reason": "look it up"})).unwrap();
        assert_eq!((typed.tool.as_deref(), typed.arguments), (Some("search"), Some(json!({"q": "x"}))));
        let text: SuggestedAction = serde_json::from_value(json!("answer now")).unwrap();
        assert_eq!(text, SuggestedAction::reason("answer now"));
        assert_eq!(serde_json::to_value(&text).unwrap(), json!({"reason": "answer now"}));
        assert!(serde_json::from_value::<SuggestedAction>(json!({"tool": "x"})).is_err(), "a reason is required");
    }
}
