//! Agent steps: the turns an agent's runs open with, in order, before the model
//! takes over (an agent's `[[steps]]`). A step whose arguments are given is
//! called by the runtime, its arguments filled from the request (`{input}`) and
//! from earlier results (`{TOOL.PATH}`: the last result of `TOOL`, then a path of
//! keys and array indexes, e.g. `{search_emails.emails.0.id}`); a step without
//! arguments is the model's turn with that tool as its only choice (as is one with
//! `model_writes`, whose `args` are then set over what the model writes); a step with a
//! `prompt` instead of a tool asks the model (in those words, filled the same way)
//! to answer, with no tool; a step with `finish` ends the run with that answer
//! (filled the same way), with no model call. A step with a `when` runs only if
//! the value it names is one of the listed ones (a list of conditions: if each
//! holds).
//!
//! `{input.quoted}` is the list of texts the request quotes (in '…', "…", ‘…’ or
//! “…”), none when it quotes nothing: `{input.quoted.0}` is the first, and a path
//! key `N..` takes the items of a list from the `N`th on.
//!
//! Steps are retrieval and routing a small model would otherwise get wrong: a
//! search run with the user's own words, a classification before a draft. They
//! go through the same hook chain, approvals, events and store as the model's
//! calls, one step a turn, so a run resumed after a crash finds where it was.
//!
//! A step's call that fails (an error result, not a refusal of the hook chain)
//! is made again, in the next turn, up to [`STEP_ATTEMPTS`] times in all, unless
//! the tool refused its arguments (`invalid_args`: the same arguments would be
//! refused again), and a later step may stand in for it (a condition that its
//! result is `absent`).
//!
//! Which step comes next is read from the conversation alone, never stored: the
//! steps are walked in order against the run's turns. A step whose reference
//! does not resolve (its source failed or found nothing) is skipped, as is one
//! whose condition is false; a turn in which the model did something else than
//! its step ends the steps, and the model goes on by itself.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::llm::{Message, Role};

/// How many times a step's call is made before its failure stands.
pub const STEP_ATTEMPTS: u32 = 3;

/// One step of an agent (see the module's doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    /// The tool to call; one of the agent's tools. Left out: an answer step.
    #[serde(default)]
    pub tool: Option<String>,
    /// An answer step's request to the model, with `{input}` and `{TOOL.PATH}`.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The run's answer, with `{input}` and `{TOOL.PATH}`: the run ends with it,
    /// and the model is not asked.
    #[serde(default)]
    pub finish: Option<String>,
    /// Its arguments, with `{input}` and `{TOOL.PATH}` in strings; left out, the
    /// model writes them (the tool is its only choice that turn).
    #[serde(default)]
    pub args: Option<Value>,
    /// The model writes this call (its only choice that turn); the `args` given
    /// are set over what it writes. Implied when `args` is left out.
    #[serde(default)]
    pub model_writes: bool,
    /// Run only when a value is one of some (or, a list: when each holds).
    #[serde(default)]
    pub when: Option<When>,
}

/// A step's condition, or several that must all hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum When {
    /// One condition.
    One(StepCondition),
    /// Conditions that must all hold.
    All(Vec<StepCondition>),
}

impl When {
    /// Its conditions.
    fn conditions(&self) -> &[StepCondition] {
        match self {
            When::One(condition) => std::slice::from_ref(condition),
            When::All(conditions) => conditions,
        }
    }
}

/// When a step runs: its field's value is one of `in`, contains one of
/// `contains` (ignoring case), or is a number of at least `at_least`; or, with
/// `absent`, the field has no value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCondition {
    /// The value, as `TOOL.PATH` (e.g. `analyze_email_content.classification`),
    /// `input` (the request) or `input.PATH` (e.g. `input.quoted`).
    pub field: String,
    /// The values for which the step runs.
    #[serde(rename = "in", default)]
    pub one_of: Vec<String>,
    /// Words or phrases, one of which the value contains (ignoring case).
    #[serde(default)]
    pub contains: Vec<String>,
    /// The step runs only when the field has no value (a request that quotes
    /// nothing, a source that failed or found nothing).
    #[serde(default)]
    pub absent: bool,
    /// The least value, for a number (a confidence, say).
    #[serde(default)]
    pub at_least: Option<f64>,
}

impl StepCondition {
    /// Whether it holds for `value` (`None`: the field has none).
    fn holds(&self, value: Option<&Value>) -> bool {
        let Some(value) = value else { return self.absent };
        if self.absent {
            return false;
        }
        if let Some(least) = self.at_least {
            return value.as_f64().is_some_and(|number| number >= least);
        }
        let value = text_of(value);
        let lowered = value.to_lowercase();
        self.one_of.contains(&value) || self.contains.iter().any(|part| lowered.contains(&part.to_lowercase()))
    }
}

/// What the next turn of a run does, by its agent's steps.
#[derive(Debug, Clone, PartialEq)]
pub enum NextStep {
    /// The runtime calls this tool with these arguments.
    Call {
        /// The tool.
        tool: String,
        /// Its arguments, filled.
        args: Value,
        /// Which try this is, from 1 (a failed call is made again).
        attempt: u32,
    },
    /// The model's turn, with this tool as its only choice.
    Model {
        /// The tool.
        tool: String,
        /// Arguments set over those the model writes, filled.
        fixed: serde_json::Map<String, Value>,
    },
    /// The model's answer, with no tool, asked in these words.
    Answer {
        /// The request to the model, filled.
        prompt: String,
    },
    /// The run ends with this answer; the model is not asked.
    Finish {
        /// The answer, filled.
        answer: String,
    },
}

/// Why an agent's steps cannot be used as written.
pub fn check(steps: &[AgentStep], tools: &[String]) -> Result<(), String> {
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        if step.finish.is_some() {
            if step.tool.is_some() || step.prompt.is_some() || step.args.is_some() || step.model_writes {
                return Err(format!("step {number}: finish stands alone (no tool, args or prompt)"));
            }
        } else {
            match (&step.tool, &step.prompt, &step.args) {
                (Some(tool), None, _) if !tools.contains(tool) => {
                    return Err(format!("step {number} calls {tool:?}, which is not among the agent's tools"));
                }
                (Some(_), None, Some(args)) if !args.is_object() => {
                    return Err(format!("step {number}: args must be a table of the tool's arguments"));
                }
                (Some(_), None, _) | (None, Some(_), None) if !(step.model_writes && step.tool.is_none()) => {}
                _ => {
                    return Err(format!(
                        "step {number} needs either a tool (with or without args), a prompt or finish"
                    ));
                }
            }
        }
        let conditions = step.when.as_ref().map_or(&[][..], When::conditions);
        let vague = |when: &&StepCondition| {
            when.one_of.is_empty() && when.contains.is_empty() && !when.absent && when.at_least.is_none()
        };
        if conditions.iter().any(|when| vague(&when)) {
            return Err(format!("step {number}: when needs `in`, `contains`, `at_least` or `absent`"));
        }
        let prompt = step.prompt.as_ref().or(step.finish.as_ref()).map(|text| Value::String(text.clone()));
        let fields = conditions.iter().map(|when| when.field.as_str());
        let templates = step.args.iter().chain(prompt.iter());
        let references: Vec<&str> = fields.chain(templates.flat_map(placeholders)).collect();
        for reference in references {
            let source = reference.split('.').next().unwrap_or_default();
            if source != "input" && !steps[..index].iter().any(|earlier| earlier.tool.as_deref() == Some(source)) {
                return Err(format!("step {number} reads {reference:?}, but no earlier step calls {source:?}"));
            }
        }
    }
    Ok(())
}

/// The step the turn after `conversation` takes, for a run of `input`; `None`
/// when the steps are over and the model decides.
pub fn next(steps: &[AgentStep], input: &str, conversation: &[Message]) -> Option<NextStep> {
    next_indexed(steps, input, conversation).map(|(_, step)| step)
}

/// [`next`], with the step's position among the agent's steps (from 0).
pub fn next_indexed(steps: &[AgentStep], input: &str, conversation: &[Message]) -> Option<(usize, NextStep)> {
    // The part of the conversation the steps walked so far: its results are what
    // the next step's references read.
    let mut seen = 0;
    for (index, step) in steps.iter().enumerate() {
        let results = Results { input, conversation: &conversation[..seen] };
        // A step that cannot be filled, or whose condition is false, is skipped.
        let conditions = step.when.as_ref().map_or(&[][..], When::conditions);
        if !conditions.iter().all(|when| when.holds(results.get(&when.field).as_ref())) {
            continue;
        }
        let this = match (&step.tool, &step.args, &step.prompt) {
            _ if step.finish.is_some() => {
                match step.finish.as_ref().and_then(|text| fill(&Value::String(text.clone()), &results)) {
                    Some(filled) => NextStep::Finish { answer: text_of(&filled) },
                    None => continue,
                }
            }
            (Some(tool), Some(template), _) => match fill(template, &results) {
                Some(Value::Object(fixed)) if step.model_writes => NextStep::Model { tool: tool.clone(), fixed },
                Some(args) => NextStep::Call { tool: tool.clone(), args, attempt: 1 },
                None => continue,
            },
            (Some(tool), None, _) => NextStep::Model { tool: tool.clone(), fixed: serde_json::Map::new() },
            (None, _, Some(prompt)) => match fill(&Value::String(prompt.clone()), &results) {
                Some(filled) => NextStep::Answer { prompt: text_of(&filled) },
                None => continue,
            },
            (None, _, None) => continue,
        };
        let mut this = this;
        loop {
            let Some(offset) = conversation[seen..].iter().position(|message| message.role == Role::Assistant) else {
                return Some((index, this));
            };
            let at = seen + offset;
            let calls = &conversation[at].tool_calls;
            let taken = match &step.tool {
                Some(tool) => calls.iter().any(|call| &call.name == tool),
                None => calls.is_empty(),
            };
            if !taken {
                return None;
            }
            seen = conversation[at + 1..]
                .iter()
                .position(|message| message.role == Role::Assistant)
                .map_or(conversation.len(), |next| at + 1 + next);
            // A runtime call that failed is made again, while tries remain.
            match &mut this {
                NextStep::Call { tool, attempt, .. }
                    if *attempt < STEP_ATTEMPTS && failed(&conversation[at..seen], tool) =>
                {
                    *attempt += 1;
                }
                _ => break,
            }
        }
    }
    None
}

/// Whether the call of `tool` in a turn's stretch of conversation failed in a
/// way worth trying again (its result is an error, but not of arguments the tool
/// refused; a call the hook chain refused is not tried again either).
fn failed(turn: &[Message], tool: &str) -> bool {
    let Some(call) = turn.first().and_then(|reply| reply.tool_calls.iter().find(|call| call.name == tool)) else {
        return false;
    };
    turn.iter().any(|message| {
        message.role == Role::Tool
            && message.tool_call_id.as_deref() == Some(call.call_id.as_str())
            && message.content.starts_with("error (")
            && !message.content.starts_with("error (invalid_args)")
    })
}

/// What a step's references read: the request, and the tool results of a
/// stretch of conversation, by tool name.
struct Results<'a> {
    input: &'a str,
    conversation: &'a [Message],
}

impl Results<'_> {
    /// The value at `reference`: `input` or `input.PATH`, or `TOOL.PATH` in the
    /// last result of `TOOL`; `None` when there is none, it failed or the path
    /// leads nowhere.
    fn get(&self, reference: &str) -> Option<Value> {
        let keys = keys(reference);
        let mut parts = keys.iter().map(String::as_str);
        let source = parts.next()?;
        let mut value = if source == "input" {
            let mut object = serde_json::Map::new();
            let quoted = quoted(self.input);
            if !quoted.is_empty() {
                object.insert("quoted".to_owned(), Value::from(quoted));
            }
            match parts.clone().next() {
                None => Value::String(self.input.to_owned()),
                Some(_) => Value::Object(object),
            }
        } else {
            let result = self.conversation.iter().rev().find(|message| {
                message.role == Role::Tool && message.tool_call_id.as_deref().is_some_and(|id| self.names(id, source))
            })?;
            serde_json::from_str(&result.content).ok()?
        };
        for key in parts {
            value = match value {
                Value::Object(mut object) => object.remove(key)?,
                Value::Array(mut items) => match key.strip_suffix("..") {
                    Some(from) => {
                        let from: usize = from.parse().ok()?;
                        Value::Array(items.split_off(from.min(items.len())))
                    }
                    None => {
                        let index: usize = key.parse().ok()?;
                        (index < items.len()).then(|| items.swap_remove(index))?
                    }
                },
                _ => return None,
            };
        }
        (!value.is_null()).then_some(value)
    }

    /// Whether the call `call_id` is a call of `tool`.
    fn names(&self, call_id: &str, tool: &str) -> bool {
        self.conversation
            .iter()
            .any(|message| message.tool_calls.iter().any(|call| call.call_id == call_id && call.name == tool))
    }
}

/// The keys of a reference: its parts between dots, a slice such as `1..` kept
/// whole.
fn keys(reference: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for part in reference.split('.') {
        match keys.last_mut() {
            Some(last)
                if part.is_empty() && !last.is_empty() && last.chars().all(|c| c.is_ascii_digit() || c == '.') =>
            {
                last.push('.');
            }
            _ => keys.push(part.to_owned()),
        }
    }
    keys
}

/// The texts `request` quotes: between '…', "…", ‘…’ or “…”, a quote opening
/// where no letter or digit comes before it and closing where none comes after
/// (so the apostrophe of "Marta's" opens nothing), in order, each once.
fn quoted(request: &str) -> Vec<String> {
    const PAIRS: [(char, char); 4] = [('\'', '\''), ('"', '"'), ('‘', '’'), ('“', '”')];
    let characters: Vec<char> = request.chars().collect();
    let word = |at: Option<&char>| at.is_some_and(|c| c.is_alphanumeric());
    let mut found: Vec<String> = Vec::new();
    let mut at = 0;
    while at < characters.len() {
        let opening = PAIRS.iter().find(|(open, _)| *open == characters[at]);
        let Some((_, close)) = opening.filter(|_| at == 0 || !word(characters.get(at - 1))) else {
            at += 1;
            continue;
        };
        let end = (at + 1..characters.len())
            .find(|&end| characters[end] == *close && end > at + 1 && !word(characters.get(end + 1)));
        let Some(end) = end else {
            at += 1;
            continue;
        };
        let text: String = characters[at + 1..end].iter().collect();
        let text = text.trim().to_owned();
        if !text.is_empty() && !found.contains(&text) {
            found.push(text);
        }
        at = end + 1;
    }
    found
}

/// `value` as the text a condition compares.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The `{…}` references in the strings of `template`.
fn placeholders(template: &Value) -> Vec<&str> {
    match template {
        Value::String(text) => {
            let mut found = Vec::new();
            let mut rest = text.as_str();
            while let Some(open) = rest.find('{') {
                let Some(close) = rest[open..].find('}') else { break };
                found.push(&rest[open + 1..open + close]);
                rest = &rest[open + close + 1..];
            }
            found
        }
        Value::Array(items) => items.iter().flat_map(placeholders).collect(),
        Value::Object(object) => object.values().flat_map(placeholders).collect(),
        _ => Vec::new(),
    }
}

/// `template` with its references replaced; a string that is one reference alone
/// takes the value as it is (a number stays a number). `None` when a reference
/// does not resolve.
fn fill(template: &Value, results: &Results<'_>) -> Option<Value> {
    Some(match template {
        Value::String(text) => {
            let found = placeholders(template);
            if let [only] = found.as_slice()
                && text.len() == only.len() + 2
            {
                return results.get(only);
            }
            let mut filled = text.clone();
            for reference in found {
                filled = filled.replace(&format!("{{{reference}}}"), &text_of(&results.get(reference)?));
            }
            Value::String(filled)
        }
        Value::Array(items) => Value::Array(items.iter().map(|item| fill(item, results)).collect::<Option<_>>()?),
        Value::Object(object) => Value::Object(
            object.iter().map(|(key, value)| Some((key.clone(), fill(value, results)?))).collect::<Option<_>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::ToolCall;

    fn triage() -> Vec<AgentStep> {
        serde_json::from_value(json!([
            {"tool": "search_emails", "args": {"query": "{input}", "limit": 1}},
            {"tool": "analyze_email_content", "args": {"email_id": "{search_emails.emails.0.id}"}},
            {"tool": "create_draft", "model_writes": true, "args": {"in_reply_to": "{search_emails.emails.0.id}"},
             "when": {"field": "analyze_email_content.classification", "in": ["complaint", "meeting_request"]}},
            {"tool": "send_email",
             "args": {"draft_id": "{create_draft.draft_id}", "note": "draft {create_draft.draft_id} of {input}"}},
            {"prompt": "Report on {analyze_email_content.classification}: {input}"},
        ]))
        .unwrap()
    }

    fn call(id: &str, tool: &str) -> Message {
        let call = ToolCall { call_id: id.to_owned(), name: tool.to_owned(), args: json!({}) };
        Message { role: Role::Assistant, content: String::new(), tool_calls: vec![call], tool_call_id: None }
    }

    #[test]
    fn steps_are_walked_in_order_with_references_filled_from_earlier_results() {
        let steps = triage();
        let input = "Triage x@y";
        let mut conversation = vec![Message::text(Role::User, input)];
        let first = next(&steps, input, &conversation);
        assert_eq!(
            first,
            Some(NextStep::Call {
                tool: "search_emails".into(),
                args: json!({"query": input, "limit": 1}),
                attempt: 1
            })
        );
        conversation.push(call("s1", "search_emails"));
        conversation.push(Message::tool_result("s1", json!({"emails": [{"id": "x@y"}]}).to_string()));
        let second = next(&steps, input, &conversation);
        assert_eq!(
            second,
            Some(NextStep::Call { tool: "analyze_email_content".into(), args: json!({"email_id": "x@y"}), attempt: 1 })
        );
        conversation.push(call("a1", "analyze_email_content"));
        conversation.push(Message::tool_result("a1", json!({"classification": "complaint"}).to_string()));
        conversation.push(Message::text(Role::User, "Review of turn 2 by the runtime"));
        let fixed = json!({"in_reply_to": "x@y"}).as_object().cloned().unwrap();
        assert_eq!(next(&steps, input, &conversation), Some(NextStep::Model { tool: "create_draft".into(), fixed }));
        conversation.push(call("call9", "create_draft"));
        conversation.push(Message::tool_result("call9", json!({"draft_id": 7}).to_string()));
        let send = next(&steps, input, &conversation);
        let args = json!({"draft_id": 7, "note": "draft 7 of Triage x@y"});
        assert_eq!(send, Some(NextStep::Call { tool: "send_email".into(), args, attempt: 1 }));
        conversation.push(call("e1", "send_email"));
        conversation.push(Message::tool_result("e1", json!({"status": "queued"}).to_string()));
        let report = next(&steps, input, &conversation);
        assert_eq!(report, Some(NextStep::Answer { prompt: "Report on complaint: Triage x@y".into() }));
        conversation.push(Message::text(Role::User, "Report on complaint: Triage x@y"));
        conversation.push(Message::text(Role::Assistant, "A complaint, drafted and sent."));
        assert_eq!(next(&steps, input, &conversation), None, "every step is taken");
    }

    #[test]
    fn a_confident_classification_may_finish_the_run_at_once() {
        let steps: Vec<AgentStep> = serde_json::from_value(json!([
            {"tool": "analyze_email_content", "args": {"email_id": "{input}"}},
            {"finish": "Spam ({analyze_email_content.confidence}): no reply.",
             "when": [{"field": "analyze_email_content.classification", "in": ["spam"]},
                      {"field": "analyze_email_content.confidence", "at_least": 0.8}]},
            {"prompt": "Report"},
        ]))
        .unwrap();
        assert_eq!(check(&steps, &["analyze_email_content".to_owned()]), Ok(()));
        let after = |analysis: Value| {
            let conversation = vec![
                Message::text(Role::User, "x"),
                call("a1", "analyze_email_content"),
                Message::tool_result("a1", analysis.to_string()),
            ];
            next(&steps, "x", &conversation)
        };
        let finish = Some(NextStep::Finish { answer: "Spam (0.95): no reply.".into() });
        assert_eq!(after(json!({"classification": "spam", "confidence": 0.95})), finish);
        let report = Some(NextStep::Answer { prompt: "Report".into() });
        assert_eq!(after(json!({"classification": "spam", "confidence": 0.6})), report, "not confident enough");
        assert_eq!(after(json!({"classification": "inquiry", "confidence": 0.95})), report);
    }

    #[test]
    fn a_failed_call_of_a_step_is_made_again_up_to_three_times() {
        let steps = triage();
        let search = |attempt| {
            Some(NextStep::Call { tool: "search_emails".into(), args: json!({"query": "q", "limit": 1}), attempt })
        };
        let mut conversation = vec![Message::text(Role::User, "q")];
        for attempt in 1..=STEP_ATTEMPTS {
            assert_eq!(next(&steps, "q", &conversation), search(attempt));
            let id = format!("s{attempt}");
            conversation.push(call(&id, "search_emails"));
            conversation.push(Message::tool_result(&id, "error (mailbox_unavailable): down"));
        }
        assert_eq!(next(&steps, "q", &conversation), None, "the third failure stands; what it feeds is skipped");
        let refused = vec![
            Message::text(Role::User, "q"),
            call("s1", "search_emails"),
            Message::tool_result("s1", "skipped (blocked): search_emails failed 3 times"),
        ];
        assert_eq!(next(&steps, "q", &refused), None, "a refusal is not tried again");
        let mut recovered = conversation[..3].to_vec();
        recovered.push(call("s2", "search_emails"));
        recovered.push(Message::tool_result("s2", json!({"emails": [{"id": "x@y"}]}).to_string()));
        let analyze =
            NextStep::Call { tool: "analyze_email_content".into(), args: json!({"email_id": "x@y"}), attempt: 1 };
        assert_eq!(next(&steps, "q", &recovered), Some(analyze), "the second try succeeded: the steps go on");
    }

    #[test]
    fn arguments_the_tool_refused_are_not_tried_again_and_a_later_step_stands_in() {
        let steps: Vec<AgentStep> = serde_json::from_value(json!([
            {"tool": "calculate", "args": {"expression": "{input}"}},
            {"tool": "calculate", "model_writes": true, "when": {"field": "calculate.result", "absent": true}},
            {"prompt": "Reply with {calculate.summary}"},
        ]))
        .unwrap();
        let input = "What is 20 percent of the bill?";
        let mut conversation = vec![Message::text(Role::User, input)];
        conversation.push(call("c1", "calculate"));
        conversation.push(Message::tool_result("c1", "error (invalid_args): \"bill\" is not arithmetic"));
        let fixed = serde_json::Map::new();
        assert_eq!(
            next(&steps, input, &conversation),
            Some(NextStep::Model { tool: "calculate".into(), fixed }),
            "not the same arguments again: the model writes them"
        );
        let mut worked = conversation[..1].to_vec();
        worked.push(call("c1", "calculate"));
        worked.push(Message::tool_result("c1", json!({"summary": "17 × 23 = 391", "result": 391}).to_string()));
        assert_eq!(
            next(&steps, input, &worked),
            Some(NextStep::Answer { prompt: "Reply with 17 × 23 = 391".into() }),
            "the request's own words worked: the model does not write them"
        );
    }

    #[test]
    fn a_false_condition_skips_a_step_and_the_steps_it_feeds() {
        let steps = triage();
        let mut conversation = vec![Message::text(Role::User, "q")];
        conversation.push(call("s1", "search_emails"));
        conversation.push(Message::tool_result("s1", json!({"emails": [{"id": "x@y"}]}).to_string()));
        conversation.push(call("a1", "analyze_email_content"));
        conversation.push(Message::tool_result("a1", json!({"classification": "spam"}).to_string()));
        // The draft is skipped; so is the send, which reads the draft's id.
        assert_eq!(next(&steps, "q", &conversation), Some(NextStep::Answer { prompt: "Report on spam: q".into() }));
    }

    #[test]
    fn a_condition_may_read_the_request() {
        let steps: Vec<AgentStep> = serde_json::from_value(json!([
            {"tool": "create_draft", "when": {"field": "input", "contains": ["draft", "reply to"]}},
            {"prompt": "Answer: {input}"},
        ]))
        .unwrap();
        let ask = |input: &str| next(&steps, input, &[Message::text(Role::User, input)]);
        let fixed = serde_json::Map::new();
        assert_eq!(ask("Please DRAFT a note"), Some(NextStep::Model { tool: "create_draft".into(), fixed }));
        assert_eq!(ask("Who wrote?"), Some(NextStep::Answer { prompt: "Answer: Who wrote?".into() }));
        let tools = vec!["create_draft".to_owned()];
        let vague: Vec<AgentStep> =
            serde_json::from_value(json!([{"tool": "create_draft", "when": {"field": "input"}}])).unwrap();
        assert!(check(&vague, &tools).unwrap_err().contains("`in`, `contains`, `at_least` or `absent`"));
    }

    #[test]
    fn the_texts_a_request_quotes_fill_a_call_and_a_request_quoting_none_goes_to_the_model() {
        let steps: Vec<AgentStep> = serde_json::from_value(json!([
            {"tool": "text_stats", "args": {"text": "{input.quoted.0}", "others": "{input.quoted.1..}"},
             "when": {"field": "input", "contains": ["word"]}},
            {"tool": "text_stats", "model_writes": true,
             "when": [{"field": "input", "contains": ["word"]}, {"field": "input.quoted", "absent": true}]},
        ]))
        .unwrap();
        assert_eq!(check(&steps, &["text_stats".to_owned()]), Ok(()));
        let ask = |input: &str| next(&steps, input, &[Message::text(Role::User, input)]);
        let call = |text: &str, others: Value| {
            Some(NextStep::Call {
                tool: "text_stats".into(),
                args: json!({"text": text, "others": others}),
                attempt: 1,
            })
        };
        assert_eq!(
            ask("Which has more words: 'a quick fox' or \"the lazy dog\"?"),
            call("a quick fox", json!(["the lazy dog"]))
        );
        assert_eq!(ask("How many words in ‘Marta's car’ and “it’s”?"), call("Marta's car", json!(["it’s"])));
        assert_eq!(ask("Count the words of 'one two' and 'one two'"), call("one two", json!([])), "each once");
        let model = Some(NextStep::Model { tool: "text_stats".into(), fixed: serde_json::Map::new() });
        assert_eq!(ask("Count the words of Marta's note: it's late"), model, "an apostrophe quotes nothing");
        assert_eq!(ask("Translate 'thank you'"), None, "a request that measures nothing");
        let mut taken = vec![Message::text(Role::User, "Count words: 'a b'")];
        taken.push(super::tests::call("t1", "text_stats"));
        taken.push(Message::tool_result("t1", json!({"words": 2}).to_string()));
        assert_eq!(next(&steps, "Count words: 'a b'", &taken), None, "the model's step is skipped");
    }

    #[test]
    fn a_source_that_found_nothing_skips_what_it_feeds_and_a_turn_of_the_models_own_ends_the_steps() {
        let steps = triage();
        let failed = vec![
            Message::text(Role::User, "q"),
            call("s1", "search_emails"),
            Message::tool_result("s1", "error (mailbox_unavailable): down"),
        ];
        let again =
            NextStep::Call { tool: "search_emails".into(), args: json!({"query": "q", "limit": 1}), attempt: 2 };
        assert_eq!(next(&steps, "q", &failed), Some(again), "a failure is tried again first");
        let nothing = vec![
            Message::text(Role::User, "q"),
            call("s1", "search_emails"),
            Message::tool_result("s1", json!({"emails": []}).to_string()),
        ];
        assert_eq!(next(&steps, "q", &nothing), None);
        let own = vec![Message::text(Role::User, "q"), call("c1", "get_email_thread")];
        assert_eq!(next(&steps, "q", &own), None, "the model's own first turn");
        assert_eq!(next(&[], "q", &[Message::text(Role::User, "q")]), None, "no steps");
    }

    #[test]
    fn steps_are_checked_against_the_agents_tools_and_earlier_steps() {
        let tools: Vec<String> =
            ["search_emails", "analyze_email_content", "create_draft", "send_email"].map(String::from).to_vec();
        assert_eq!(check(&triage(), &tools), Ok(()));
        let error = check(&triage(), &tools[..3]).unwrap_err();
        assert!(error.contains("step 4") && error.contains("send_email"), "{error}");
        let both: Vec<AgentStep> = serde_json::from_value(json!([{"tool": "send_email", "prompt": "hi"}])).unwrap();
        assert!(check(&both, &tools).unwrap_err().contains("either a tool"));
        let finish_and_tool: Vec<AgentStep> =
            serde_json::from_value(json!([{"tool": "send_email", "finish": "done"}])).unwrap();
        assert!(check(&finish_and_tool, &tools).unwrap_err().contains("finish stands alone"));
        let backwards: Vec<AgentStep> = serde_json::from_value(json!([
            {"tool": "analyze_email_content", "args": {"email_id": "{search_emails.emails.0.id}"}}
        ]))
        .unwrap();
        let error = check(&backwards, &tools).unwrap_err();
        assert!(error.contains("no earlier step calls \"search_emails\""), "{error}");
    }
}
