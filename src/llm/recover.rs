//! Lenient tool-call recovery for models that write the call into their text
//! instead of `tool_calls`: a `<tool_call>{…}</tool_call>` block, a fenced JSON
//! block, a bare JSON object naming an offered tool, or such an object with its
//! arguments inside other text (a small model may wrap it in tags of its own). A block that looks like a
//! call but does not parse is not dropped: it becomes a call whose arguments are
//! the raw text, which the hook chain answers with `invalid_args`, plus a decode
//! error the client reports.

use serde_json::{Map, Value};
use troupe_actors::protocol::ToolCall;

/// Calls found in a reply's text.
#[derive(Debug, Default, PartialEq)]
pub struct Recovered {
    /// The calls, in text order.
    pub calls: Vec<ToolCall>,
    /// The text without the call blocks.
    pub text: String,
    /// What could not be decoded.
    pub decode_errors: Vec<String>,
}

/// Finds tool calls written into `text`. `offered` are the tool names on offer;
/// `id_prefix` makes the call ids (`{id_prefix}_{n}`).
pub fn recover(text: &str, offered: &[String], id_prefix: &str) -> Recovered {
    let mut found = Recovered::default();
    let rest = extract_tagged(text, &mut found, id_prefix);
    let rest = extract_fenced(&rest, offered, &mut found, id_prefix);
    let trimmed = rest.trim();
    if found.calls.is_empty()
        && trimmed.starts_with('{')
        && let Ok(value) = serde_json::from_str::<Value>(trimmed)
        && let Some(call) = as_call(&value, offered, &format!("{id_prefix}_0"))
    {
        found.calls.push(call);
        found.text = String::new();
        return found;
    }
    let rest = if found.calls.is_empty() { extract_embedded(&rest, offered, &mut found, id_prefix) } else { rest };
    found.text = rest.trim().to_owned();
    found
}

/// JSON objects that name an offered tool and carry `arguments` (or `parameters`),
/// preceded by nothing but tags: calls written in the wrong tags (`<plan>{…}`). An
/// object after prose is a quotation, not a call.
fn extract_embedded(text: &str, offered: &[String], found: &mut Recovered, id_prefix: &str) -> String {
    let mut rest = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(open) = text[at..].find('{').map(|offset| at + offset) {
        let mut values = serde_json::Deserializer::from_str(&text[open..]).into_iter::<Value>();
        let parsed = values.next().and_then(Result::ok);
        let end = open + values.byte_offset();
        let id = format!("{id_prefix}_{}", found.calls.len());
        let before = format!("{rest}{}", &text[at..open]);
        let call = parsed
            .filter(|_| only_tags(&before))
            .filter(|value| value.get("arguments").or_else(|| value.get("parameters")).is_some())
            .and_then(|value| as_call(&value, offered, &id));
        match call {
            Some(call) => {
                rest.push_str(&text[at..open]);
                found.calls.push(call);
                at = end;
            }
            None => {
                rest.push_str(&text[at..=open]);
                at = open + 1;
            }
        }
    }
    rest.push_str(&text[at..]);
    rest
}

/// `<tool_call>…</tool_call>` blocks (Qwen, Hermes): always meant as calls.
fn extract_tagged(text: &str, found: &mut Recovered, id_prefix: &str) -> String {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut rest = String::with_capacity(text.len());
    let mut remaining = text;
    while let Some(start) = remaining.find(OPEN) {
        rest.push_str(&remaining[..start]);
        let after = &remaining[start + OPEN.len()..];
        let (inner, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        let id = format!("{id_prefix}_{}", found.calls.len());
        match serde_json::from_str::<Value>(inner.trim()) {
            Ok(value) if value.get("name").and_then(Value::as_str).is_some() => {
                found.calls.push(call_from(&value, id));
            }
            _ => {
                found.decode_errors.push(format!("a <tool_call> block could not be decoded: {}", excerpt(inner)));
                found.calls.push(ToolCall {
                    call_id: id,
                    name: guess_name(inner),
                    args: Value::String(inner.trim().to_owned()),
                });
            }
        }
        remaining = next;
    }
    rest.push_str(remaining);
    rest
}

/// ```json fenced blocks that name an offered tool.
fn extract_fenced(text: &str, offered: &[String], found: &mut Recovered, id_prefix: &str) -> String {
    let mut rest = String::with_capacity(text.len());
    let mut remaining = text;
    while let Some(start) = remaining.find("```") {
        let after = &remaining[start + 3..];
        let Some(end) = after.find("```") else { break };
        let block = &after[..end];
        let body = block.strip_prefix("json").unwrap_or(block).trim();
        let id = format!("{id_prefix}_{}", found.calls.len());
        match serde_json::from_str::<Value>(body).ok().and_then(|value| as_call(&value, offered, &id)) {
            Some(call) => {
                rest.push_str(&remaining[..start]);
                found.calls.push(call);
            }
            None => rest.push_str(&remaining[..start + 3 + end + 3]),
        }
        remaining = &after[end + 3..];
    }
    rest.push_str(remaining);
    rest
}

/// Whether `text` holds nothing but whitespace and `<tags>`.
fn only_tags(text: &str) -> bool {
    let mut rest = text.trim_start();
    while let Some(tag) = rest.strip_prefix('<') {
        let Some(end) = tag.find('>') else { return false };
        rest = tag[end + 1..].trim_start();
    }
    rest.is_empty()
}

/// A call if `value` is an object naming an offered tool.
fn as_call(value: &Value, offered: &[String], id: &str) -> Option<ToolCall> {
    let name = value.get("name").and_then(Value::as_str)?;
    offered.iter().any(|tool| tool == name).then(|| call_from(value, id.to_owned()))
}

/// `{"name", "arguments" | "parameters"}`; arguments given as JSON text are parsed.
fn call_from(value: &Value, call_id: String) -> ToolCall {
    let name = value.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let args = value.get("arguments").or_else(|| value.get("parameters")).cloned().unwrap_or(Value::Object(Map::new()));
    let args = match args {
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    };
    ToolCall { call_id, name, args }
}

fn guess_name(text: &str) -> String {
    let Some(at) = text.find("\"name\"") else { return "unparsed_tool_call".to_owned() };
    let after = &text[at + 6..];
    let value = after.trim_start().trim_start_matches(':').trim_start();
    value
        .strip_prefix('"')
        .and_then(|v| v.split('"').next())
        .filter(|v| !v.is_empty())
        .unwrap_or("unparsed_tool_call")
        .to_owned()
}

fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offered() -> Vec<String> {
        vec!["search".to_owned()]
    }

    #[test]
    fn tagged_calls_are_taken_out_of_the_text() {
        let found = recover(
            "Let me look.\n<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}</tool_call>",
            &offered(),
            "c",
        );
        assert_eq!(
            found.calls,
            vec![ToolCall { call_id: "c_0".into(), name: "search".into(), args: json!({"q": "x"}) }]
        );
        assert_eq!(found.text, "Let me look.");
    }

    #[test]
    fn fenced_and_bare_objects_count_only_for_offered_tools() {
        let fenced =
            recover("```json\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": 1}\"}\n```", &offered(), "c");
        assert_eq!(fenced.calls[0].args, json!({"q": 1}));
        let bare = recover("{\"name\": \"search\", \"parameters\": {\"q\": 2}}", &offered(), "c");
        assert_eq!(bare.calls[0].args, json!({"q": 2}));
        let other = recover("{\"name\": \"delete_all\"}", &offered(), "c");
        assert!(other.calls.is_empty());
        assert_eq!(other.text, "{\"name\": \"delete_all\"}");
    }

    #[test]
    fn calls_inside_other_text_are_found_when_they_carry_arguments() {
        let wrapped = recover(
            "<plan>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a {b}\"}}\n</plan>\n{\"name\": \"search\", \"arguments\": {}}",
            &offered(),
            "c",
        );
        assert_eq!(wrapped.calls.len(), 2);
        assert_eq!(wrapped.calls[0].args, json!({"q": "a {b}"}));
        assert_eq!((wrapped.calls[0].call_id.as_str(), wrapped.calls[1].call_id.as_str()), ("c_0", "c_1"));
        assert_eq!(wrapped.text, "<plan>\n\n</plan>");
        let quoted = recover("For example: {\"name\": \"search\", \"arguments\": {}}", &offered(), "c");
        assert!(quoted.calls.is_empty(), "an object after prose is a quotation");
        let prose =
            recover("Use {\"name\": \"search\"} like so, or {\"name\": \"nope\", \"arguments\": {}}.", &offered(), "c");
        assert!(prose.calls.is_empty(), "no arguments, or a tool not on offer: text");
        assert_eq!(prose.text, "Use {\"name\": \"search\"} like so, or {\"name\": \"nope\", \"arguments\": {}}.");
    }

    #[test]
    fn an_undecodable_tagged_call_is_kept_with_an_error() {
        let found = recover("<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": </tool_call>", &offered(), "c");
        assert_eq!(found.calls.len(), 1);
        assert_eq!(found.calls[0].name, "search");
        assert!(found.calls[0].args.is_string());
        assert_eq!(found.decode_errors.len(), 1);
    }
}
