//! Which tool calls wait for a human. A call needs approval when its tool says so
//! (`Tool::requires_approval`) or config lists the tool, unless an agent's
//! `auto_approve` lifts that for a confidently classified run; and, whatever the
//! agent, when a policy rule matches: by the call's arguments, or by the run's
//! classification and confidence. A run is classified by any tool whose result carries a top-level
//! `classification` (string) and/or `confidence` (0..1): the latest such result
//! wins.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `[runtime.approvals]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalConfig {
    /// Tools whose every call waits for a human, besides those that declare it.
    pub tools: Vec<String>,
    /// Policy rules; a call waits if any rule matches it.
    pub rules: Vec<ApprovalRule>,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        Self { tools: Vec::new(), rules: vec![ApprovalRule::seed()] }
    }
}

/// A rule: for the calls of `tools`, approval is needed when any condition holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalRule {
    /// The tools it covers; empty: every tool with side effects (not idempotent).
    pub tools: Vec<String>,
    /// The run is classified as one of these.
    pub classifications: Vec<String>,
    /// The run's classification confidence is below this.
    pub min_confidence: Option<f64>,
    /// An argument (top-level key) matches a pattern (`*` matches any text).
    pub args: BTreeMap<String, String>,
}

impl ApprovalRule {
    /// The seed rule: in a run classified as a complaint, or classified with a
    /// confidence below 0.8, every call with side effects goes to a human.
    pub fn seed() -> Self {
        Self { classifications: vec!["complaint".to_owned()], min_confidence: Some(0.8), ..Self::default() }
    }
}

/// An agent's `[[auto_approve]]`: calls of `tools` that their tool (or the
/// configuration) sends to a human go without one in a run classified with a
/// confidence of at least `min_confidence` (and as one of `classifications`, when
/// given). The policy rules still apply: the seed rule holds a complaint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoApproval {
    /// The tools it covers.
    pub tools: Vec<String>,
    /// The least confidence of the run's classification.
    pub min_confidence: f64,
    /// The classifications it covers; empty: any.
    #[serde(default)]
    pub classifications: Vec<String>,
}

impl AutoApproval {
    /// Whether it lifts the approval of a call of `tool` in a run of `labels`.
    /// Every classification the run was given must be covered.
    fn lifts(&self, tool: &str, labels: &RunLabels) -> bool {
        let covered = |given: &String| self.classifications.iter().any(|wanted| wanted.eq_ignore_ascii_case(given));
        self.tools.iter().any(|name| name == tool)
            && labels.confidence.is_some_and(|confidence| confidence >= self.min_confidence)
            && !labels.classifications.is_empty()
            && (self.classifications.is_empty() || labels.classifications.iter().all(covered))
    }
}

/// What the run's tools said about it. Labels only escalate: every
/// classification a tool gave is kept, and the lowest confidence, so a later
/// result (a tool fed a crafted document, say) cannot switch a rule off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLabels {
    /// Every classification given, in order.
    pub classifications: Vec<String>,
    /// The lowest confidence given.
    pub confidence: Option<f64>,
}

impl RunLabels {
    /// Takes the labels a tool result carries, if any.
    pub fn absorb(&mut self, value: &Value) {
        let Some(object) = value.as_object() else { return };
        if let Some(classification) = object.get("classification").and_then(Value::as_str)
            && !self.classifications.iter().any(|known| known.eq_ignore_ascii_case(classification))
        {
            self.classifications.push(classification.to_owned());
        }
        if let Some(confidence) = object.get("confidence").and_then(Value::as_f64).filter(|c| c.is_finite()) {
            self.confidence = Some(self.confidence.map_or(confidence, |known| known.min(confidence)));
        }
    }

    /// Takes the labels of a stored tool result (its text, JSON when the result
    /// was an object).
    pub fn absorb_text(&mut self, text: &str) {
        if text.trim_start().starts_with('{')
            && let Ok(value) = serde_json::from_str::<Value>(text)
        {
            self.absorb(&value);
        }
    }
}

/// What the policy knows about a tool.
pub struct ToolTraits {
    /// Running it twice is harmless (no side effects worth a human).
    pub idempotent: bool,
    /// The tool itself asks for approval of every call.
    pub requires_approval: bool,
}

/// Why the call needs approval, or `None` when it may run.
pub fn reason(
    config: &ApprovalConfig,
    tool: &str,
    traits: &ToolTraits,
    args: &Value,
    labels: &RunLabels,
    lifted: &[AutoApproval],
) -> Option<String> {
    let rules = || config.rules.iter().find_map(|rule| rule_reason(rule, tool, traits, args, labels));
    let listed = config.tools.iter().any(|name| name == tool);
    if (traits.requires_approval || listed) && lifted.iter().any(|lift| lift.lifts(tool, labels)) {
        return rules();
    }
    if traits.requires_approval {
        return Some(format!("{tool} always needs approval"));
    }
    if listed {
        return Some(format!("the configuration requires approval for {tool}"));
    }
    rules()
}

fn rule_reason(
    rule: &ApprovalRule,
    tool: &str,
    traits: &ToolTraits,
    args: &Value,
    labels: &RunLabels,
) -> Option<String> {
    let covered = if rule.tools.is_empty() { !traits.idempotent } else { rule.tools.iter().any(|name| name == tool) };
    if !covered {
        return None;
    }
    if let Some(classification) = labels
        .classifications
        .iter()
        .find(|given| rule.classifications.iter().any(|wanted| wanted.eq_ignore_ascii_case(given)))
    {
        return Some(format!("the run is classified as {classification}"));
    }
    if let (Some(threshold), Some(confidence)) = (rule.min_confidence, labels.confidence)
        && confidence < threshold
    {
        return Some(format!("the run's classification confidence {confidence:.2} is below {threshold:.2}"));
    }
    rule.args.iter().find_map(|(key, pattern)| {
        let value = args.get(key)?;
        let text = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
        glob(pattern, &text).then(|| format!("argument {key} matches {pattern:?}"))
    })
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SIDE_EFFECT: ToolTraits = ToolTraits { idempotent: false, requires_approval: false };
    const READ_ONLY: ToolTraits = ToolTraits { idempotent: true, requires_approval: false };

    fn labels(classification: &str, confidence: f64) -> RunLabels {
        RunLabels { classifications: vec![classification.into()], confidence: Some(confidence) }
    }

    #[test]
    fn the_seed_rule_sends_complaints_and_low_confidence_to_a_human() {
        let config = ApprovalConfig::default();
        let args = json!({});
        assert!(reason(&config, "reply", &SIDE_EFFECT, &args, &labels("complaint", 0.95), &[]).is_some());
        assert!(reason(&config, "reply", &SIDE_EFFECT, &args, &labels("question", 0.5), &[]).is_some());
        assert_eq!(reason(&config, "reply", &SIDE_EFFECT, &args, &labels("question", 0.95), &[]), None);
        assert_eq!(
            reason(&config, "search", &READ_ONLY, &args, &labels("complaint", 0.5), &[]),
            None,
            "reads run freely"
        );
        assert_eq!(
            reason(&config, "reply", &SIDE_EFFECT, &args, &RunLabels::default(), &[]),
            None,
            "unclassified runs"
        );
    }

    #[test]
    fn tools_and_argument_rules_and_declared_tools_need_approval() {
        let rule = ApprovalRule {
            tools: vec!["send".into()],
            args: BTreeMap::from([("to".into(), "*@outside.example".into())]),
            ..ApprovalRule::default()
        };
        let config = ApprovalConfig { tools: vec!["pay".into()], rules: vec![rule] };
        let none = RunLabels::default();
        assert!(reason(&config, "pay", &READ_ONLY, &json!({}), &none, &[]).is_some());
        assert!(reason(&config, "send", &SIDE_EFFECT, &json!({"to": "bob@outside.example"}), &none, &[]).is_some());
        assert_eq!(reason(&config, "send", &SIDE_EFFECT, &json!({"to": "bob@inside.example"}), &none, &[]), None);
        let declared = ToolTraits { idempotent: true, requires_approval: true };
        assert!(reason(&config, "anything", &declared, &json!({}), &none, &[]).is_some());
    }

    #[test]
    fn an_agents_auto_approval_lifts_a_tools_own_approval_for_a_confident_run_but_not_the_rules() {
        let config = ApprovalConfig::default();
        let send = ToolTraits { idempotent: false, requires_approval: true };
        let lift = [AutoApproval { tools: vec!["send".into()], min_confidence: 0.8, classifications: vec![] }];
        let args = json!({});
        assert_eq!(reason(&config, "send", &send, &args, &labels("meeting_request", 0.9), &lift), None, "sent");
        let held = |labels: &RunLabels| reason(&config, "send", &send, &args, labels, &lift);
        assert!(
            held(&labels("complaint", 0.95)).unwrap().contains("classified as complaint"),
            "the seed rule holds it"
        );
        assert!(held(&labels("meeting_request", 0.7)).is_some(), "not confident enough");
        assert!(held(&RunLabels::default()).is_some(), "an unclassified run");
        assert!(reason(&config, "pay", &send, &args, &labels("meeting_request", 0.9), &lift).is_some(), "another tool");
        let only = [AutoApproval { classifications: vec!["inquiry".into()], ..lift[0].clone() }];
        assert!(reason(&config, "send", &send, &args, &labels("meeting_request", 0.9), &only).is_some());
        assert_eq!(reason(&config, "send", &send, &args, &labels("inquiry", 0.9), &only), None);
    }

    #[test]
    fn labels_come_from_tool_results() {
        let mut labels = RunLabels::default();
        labels.absorb_text("plain text");
        labels.absorb_text(r#"{"classification": "complaint", "confidence": 0.7, "other": 1}"#);
        assert_eq!(labels, self::labels("complaint", 0.7));
        // A later, reassuring result changes nothing.
        labels.absorb(&json!({"classification": "question", "confidence": 0.99}));
        assert_eq!(labels.confidence, Some(0.7));
        assert_eq!(labels.classifications, vec!["complaint".to_owned(), "question".to_owned()]);
        let config = ApprovalConfig::default();
        assert!(reason(&config, "reply", &SIDE_EFFECT, &json!({}), &labels, &[]).is_some());
    }

    #[test]
    fn globs_match_prefixes_suffixes_and_middles() {
        assert!(glob("*@x.org", "a@x.org") && glob("a*", "abc") && glob("a*c*e", "abcde") && glob("*", ""));
        assert!(!glob("*@x.org", "a@y.org") && !glob("ab*ba", "aba") && !glob("abc", "abcd"));
    }
}
