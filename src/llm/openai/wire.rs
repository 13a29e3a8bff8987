//! The Chat Completions wire format: the request body, and the assembly of a reply
//! from streamed chunks (or one JSON body). Vendor fields the core cares about
//! (`reasoning_content`, `reasoning`) are kept; tool calls whose id, name and
//! argument fragments arrive split across chunks are assembled by index.
//!
//! A reply is held once: a chunk's text moves out of its parsed JSON into the
//! delta shown to the run, and is copied only into the reply being assembled.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde::de::IgnoredAny;
use serde::ser::{Error as _, SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use troupe_actors::llm::{ChatRequest, Message, ModelDelta, ModelReply, Role, ToolChoice, ToolDefinition};
use troupe_actors::protocol::{ToolCall, Usage};

use crate::llm::recover;

/// The JSON body of a request, borrowed from it: serialized in one pass, the
/// prompt (messages, tool schemas) written straight from the request instead of
/// first copied into a JSON tree.
pub fn request_body<'a>(request: &'a ChatRequest, model: &'a str, stream: bool) -> RequestBody<'a> {
    RequestBody { request, model, stream, tools: None }
}

/// See [`request_body`].
pub struct RequestBody<'a> {
    request: &'a ChatRequest,
    model: &'a str,
    stream: bool,
    tools: Option<&'a EncodedTools>,
}

impl<'a> RequestBody<'a> {
    /// The tool definitions taken from `tools`, each encoded once.
    pub fn with_tools(self, tools: &'a EncodedTools) -> Self {
        Self { tools: Some(tools), ..self }
    }
}

/// Tool definitions as they go out, each encoded once: an agent offers the same
/// definitions (shared `Arc`s) every turn, and their schemas can be most of a
/// request.
#[derive(Default)]
pub struct EncodedTools {
    /// By the definition's address; the `Weak` keeps that address from being
    /// reused while the entry exists, and tells a definition let go.
    encoded: Mutex<HashMap<usize, Encoded>>,
}

/// A definition, weakly, and its encoding.
type Encoded = (Weak<ToolDefinition>, Arc<RawValue>);

/// Entries kept before those of definitions let go are dropped.
const ENCODED_TOOLS: usize = 1024;

impl EncodedTools {
    fn get(&self, tool: &Arc<ToolDefinition>) -> Result<Arc<RawValue>, serde_json::Error> {
        let key = Arc::as_ptr(tool) as usize;
        let mut encoded = self.encoded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((weak, raw)) = encoded.get(&key)
            && weak.strong_count() > 0
        {
            return Ok(raw.clone());
        }
        if encoded.len() >= ENCODED_TOOLS {
            encoded.retain(|_, (weak, _)| weak.strong_count() > 0);
        }
        let raw: Arc<RawValue> = serde_json::value::to_raw_value(&tool_entry(tool))?.into();
        encoded.insert(key, (Arc::downgrade(tool), raw.clone()));
        Ok(raw)
    }
}

fn tool_entry(tool: &ToolDefinition) -> Named<Function<'_>> {
    Named {
        kind: "function",
        function: Function { name: &tool.name, description: &tool.description, parameters: &tool.parameters },
    }
}

impl Serialize for RequestBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let request = self.request;
        let mut body = serializer.serialize_map(None)?;
        body.serialize_entry("model", self.model)?;
        body.serialize_entry("messages", &Messages(&request.messages))?;
        if !request.tools.is_empty() {
            body.serialize_entry("tools", &Tools { tools: &request.tools, encoded: self.tools })?;
            match &request.tool_choice {
                ToolChoice::Auto => body.serialize_entry("tool_choice", "auto")?,
                ToolChoice::None => body.serialize_entry("tool_choice", "none")?,
                ToolChoice::Tool(name) => body.serialize_entry(
                    "tool_choice",
                    &Named { kind: "function", function: Name { name: name.as_str() } },
                )?,
            }
        }
        if let Some(temperature) = request.temperature {
            body.serialize_entry("temperature", &temperature)?;
        }
        if let Some(max_tokens) = request.max_tokens {
            body.serialize_entry("max_tokens", &max_tokens)?;
        }
        if self.stream {
            body.serialize_entry("stream", &true)?;
            body.serialize_entry("stream_options", &StreamOptions { include_usage: true })?;
        }
        body.end()
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// `{"type": "function", "function": {...}}`, the shape of a tool and of a named
/// tool choice.
#[derive(Serialize)]
struct Named<F> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: F,
}

#[derive(Serialize)]
struct Name<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

struct Tools<'a> {
    tools: &'a [Arc<ToolDefinition>],
    encoded: Option<&'a EncodedTools>,
}

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(encoded) = self.encoded else {
            return serializer.collect_seq(self.tools.iter().map(|tool| tool_entry(tool)));
        };
        let mut seq = serializer.serialize_seq(Some(self.tools.len()))?;
        for tool in self.tools {
            seq.serialize_element(&encoded.get(tool).map_err(S::Error::custom)?)?;
        }
        seq.end()
    }
}

struct Messages<'a>(&'a [Message]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireMessage))
    }
}

/// A message: its role and text (`null` for an assistant message that only
/// calls tools), the calls it asks for, the call it answers.
struct WireMessage<'a>(&'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let role = match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", role)?;
        if message.tool_calls.is_empty() {
            map.serialize_entry("content", &message.content)?;
        } else {
            let content = Some(message.content.as_str()).filter(|content| !content.is_empty());
            map.serialize_entry("content", &content)?;
            map.serialize_entry("tool_calls", &Calls(&message.tool_calls))?;
        }
        if let Some(call_id) = &message.tool_call_id {
            map.serialize_entry("tool_call_id", call_id)?;
        }
        map.end()
    }
}

struct Calls<'a>(&'a [ToolCall]);

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|call| WireCall {
            id: &call.call_id,
            kind: "function",
            function: CallFunction { name: &call.name, arguments: Arguments(&call.args) },
        }))
    }
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    arguments: Arguments<'a>,
}

/// A call's arguments as the wire wants them: a string of JSON (arguments kept
/// as text, unparsed, go as they are).
struct Arguments<'a>(&'a Value);

impl Serialize for Arguments<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(text) => serializer.serialize_str(text),
            other => serializer.collect_str(other),
        }
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// A reply being assembled from chunks.
#[derive(Debug, Default)]
pub struct Accumulator {
    content: String,
    calls: BTreeMap<u64, PartialCall>,
    usage: Option<(u64, u64)>,
    /// Bytes of reasoning streamed so far: not kept here, but every byte of it
    /// is kept downstream (the run's events), so it counts against the limit.
    reasoning: usize,
    /// Whether a chunk carried a `finish_reason`.
    pub finished: bool,
}

impl Accumulator {
    /// Bytes the reply has cost so far: its text, its reasoning, its tool calls.
    pub fn size(&self) -> usize {
        let calls = self.calls.values().map(|call| call.id.len() + call.name.len() + call.arguments.len());
        self.content.len() + self.reasoning + calls.sum::<usize>()
    }

    /// Folds one streamed chunk in, as read by [`StreamChunk`]; returns the
    /// deltas to show as they come.
    pub fn push(&mut self, chunk: StreamChunk<'_>) -> Vec<ModelDelta> {
        let mut deltas = Vec::new();
        if let Some(usage) = chunk.usage {
            self.usage = Some((usage.prompt_tokens.unwrap_or(0), usage.completion_tokens.unwrap_or(0)));
        }
        for choice in chunk.choices.into_iter().flatten() {
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                self.content.push_str(&text);
                deltas.push(ModelDelta::Text(text.into_owned()));
            }
            for text in [delta.reasoning_content, delta.reasoning].into_iter().flatten() {
                if !text.is_empty() {
                    self.reasoning += text.len();
                    deltas.push(ModelDelta::Reasoning(text.into_owned()));
                }
            }
            for call in delta.tool_calls.into_iter().flatten() {
                let id = call.id.as_deref().filter(|id| !id.is_empty());
                // Without an index, a fragment with a new id opens a call; one without
                // continues the last call.
                let index = match (call.index, id) {
                    (Some(index), _) => index,
                    (None, Some(id)) => self
                        .calls
                        .iter()
                        .find(|(_, partial)| partial.id == id)
                        .map(|(index, _)| *index)
                        .unwrap_or_else(|| self.calls.keys().next_back().map_or(0, |last| last + 1)),
                    (None, None) => self.calls.keys().next_back().copied().unwrap_or(0),
                };
                let partial = self.calls.entry(index).or_default();
                if let Some(id) = id {
                    extend_field(&mut partial.id, id);
                }
                if let Some(function) = call.function {
                    if let Some(name) = &function.name {
                        extend_field(&mut partial.name, name);
                    }
                    if let Some(arguments) = &function.arguments {
                        partial.arguments.push_str(arguments);
                    }
                }
            }
        }
        deltas
    }

    /// Folds a whole non-streamed response in (its text moved out of `response`).
    pub fn push_response(&mut self, mut response: Value) {
        if let Some(usage) = response.get("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(read_usage(usage));
        }
        let choice = response.get_mut("choices").and_then(Value::as_array_mut).and_then(|c| c.first_mut());
        let Some(choice) = choice else { return };
        self.finished = true;
        let Some(message) = choice.get_mut("message") else { return };
        if let Some(text) = take_text(message, "content") {
            self.content.push_str(&text);
        }
        for (index, call) in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let function = call.get("function");
            let text = |key: &str| function.and_then(|f| f.get(key)).and_then(Value::as_str).unwrap_or_default();
            let arguments = match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
            self.calls.insert(index as u64, PartialCall { id, name: text("name").to_owned(), arguments });
        }
    }

    /// The reply: tool calls decoded (or recovered from the text), usage priced.
    pub fn finish(self, offered: &[String], prices: (f64, f64), id_prefix: &str) -> ModelReply {
        let mut decode_errors = Vec::new();
        let mut tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|(index, partial)| {
                let call_id = if partial.id.is_empty() { format!("{id_prefix}_{index}") } else { partial.id };
                let args = if partial.arguments.trim().is_empty() {
                    Value::Object(Map::new())
                } else {
                    match serde_json::from_str::<Value>(&partial.arguments) {
                        Ok(value) => value,
                        Err(error) => {
                            decode_errors.push(format!(
                                "call {call_id} ({}): arguments are not valid JSON: {error}",
                                partial.name
                            ));
                            Value::String(partial.arguments)
                        }
                    }
                };
                ToolCall { call_id, name: partial.name, args }
            })
            .collect();
        let mut content = self.content;
        // The text grew by doubling: give back what it will never use.
        content.shrink_to_fit();
        // Recovery only where calls are possible: never on a tool-free request.
        if tool_calls.is_empty() && !content.is_empty() && !offered.is_empty() {
            let found = recover::recover(&content, offered, id_prefix);
            if !found.calls.is_empty() {
                tool_calls = found.calls;
                content = found.text;
                decode_errors.extend(found.decode_errors);
            }
        }
        let (input_tokens, output_tokens) = self.usage.unwrap_or((0, 0));
        let cost_usd = (input_tokens as f64 * prices.0 + output_tokens as f64 * prices.1) / 1e6;
        ModelReply { content, tool_calls, usage: Usage { input_tokens, output_tokens, cost_usd }, decode_errors }
    }
}

/// The non-empty string at `key` of `object`, moved out.
fn take_text(object: &mut Value, key: &str) -> Option<String> {
    match object.get_mut(key).map(Value::take) {
        Some(Value::String(text)) if !text.is_empty() => Some(text),
        _ => None,
    }
}

/// What a streamed chunk says that a reply is made of, read straight from its
/// JSON (text borrowed where it has no escapes). A chunk of another shape (a
/// field of an unexpected type, a vendor's) is read leniently from a `Value`
/// instead ([`StreamChunk::from_value`]), with the same meaning.
#[derive(Debug, Default, Deserialize)]
pub struct StreamChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
}

#[derive(Debug, Default, Deserialize)]
struct ChunkChoice<'a> {
    /// Any value but `null`.
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
    #[serde(default, borrow)]
    delta: Option<ChunkDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct ChunkDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<CallFragment<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
struct CallFragment<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionFragment<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct FunctionFragment<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

impl StreamChunk<'static> {
    /// A chunk read leniently: a field of another type than expected counts as
    /// absent (text moved out of `chunk`).
    pub fn from_value(mut chunk: Value) -> Self {
        let text = |value: Option<&Value>| value.and_then(Value::as_str).map(|text| Cow::Owned(text.to_owned()));
        let usage = chunk.get("usage").filter(|usage| !usage.is_null()).map(|usage| ChunkUsage {
            prompt_tokens: usage.get("prompt_tokens").and_then(Value::as_u64),
            completion_tokens: usage.get("completion_tokens").and_then(Value::as_u64),
        });
        let choices = chunk.get_mut("choices").and_then(Value::as_array_mut).map(|choices| {
            choices
                .iter_mut()
                .map(|choice| ChunkChoice {
                    finish_reason: choice.get("finish_reason").filter(|reason| !reason.is_null()).map(|_| IgnoredAny),
                    delta: choice.get_mut("delta").map(|delta| ChunkDelta {
                        content: take_text(delta, "content").map(Cow::Owned),
                        reasoning_content: take_text(delta, "reasoning_content").map(Cow::Owned),
                        reasoning: take_text(delta, "reasoning").map(Cow::Owned),
                        tool_calls: delta.get("tool_calls").and_then(Value::as_array).map(|calls| {
                            calls
                                .iter()
                                .map(|call| CallFragment {
                                    index: call.get("index").and_then(Value::as_u64),
                                    id: text(call.get("id")),
                                    function: call.get("function").map(|function| FunctionFragment {
                                        name: text(function.get("name")),
                                        arguments: text(function.get("arguments")),
                                    }),
                                })
                                .collect()
                        }),
                    }),
                })
                .collect()
        });
        Self { choices, usage }
    }
}

/// Adds a streamed id or name fragment. Some servers repeat the whole value on
/// every fragment instead of splitting it: a repeat is not appended.
fn extend_field(field: &mut String, fragment: &str) {
    if field != fragment {
        field.push_str(fragment);
    }
}

fn read_usage(usage: &Value) -> (u64, u64) {
    let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    (count("prompt_tokens"), count("completion_tokens"))
}

/// The `data` payloads of the events in `events`: complete `text/event-stream`
/// events, each ended by a blank line, carriage returns already removed. A
/// payload borrows from `events` unless its event has several `data` lines.
pub fn event_payloads(events: &[u8]) -> impl Iterator<Item = Cow<'_, [u8]>> {
    events
        .split(|byte| *byte == b'\n')
        .scan(None::<Cow<'_, [u8]>>, |data, line| {
            if line.is_empty() {
                // A blank line ends an event (and an event without data is nothing).
                return Some(data.take());
            }
            if let Some(value) = line.strip_prefix(b"data:") {
                let value = value.strip_prefix(b" ").unwrap_or(value);
                *data = Some(match data.take() {
                    None => Cow::Borrowed(value),
                    Some(earlier) => Cow::Owned([earlier.as_ref(), b"\n", value].concat()),
                });
            }
            Some(None)
        })
        .flatten()
}

/// Where the last event of `buffer` ends (after its blank line), looking only
/// from `from` on: the bytes before it were searched already.
pub fn last_event_end(buffer: &[u8], from: usize) -> Option<usize> {
    let from = from.saturating_sub(1).min(buffer.len());
    memchr::memmem::rfind(&buffer[from..], b"\n\n").map(|at| from + at + 2)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Folds a chunk read leniently from a `Value` (as one of another shape is).
    fn push_value(accumulator: &mut Accumulator, chunk: Value) -> Vec<ModelDelta> {
        accumulator.push(StreamChunk::from_value(chunk))
    }

    #[test]
    fn split_tool_calls_are_assembled_by_index() {
        let mut accumulator = Accumulator::default();
        let chunks = [
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "sea", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "rch", "arguments": "{\"q\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "echo", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " \"x\"}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 1000000, "completion_tokens": 500000}}),
        ];
        for chunk in chunks {
            push_value(&mut accumulator, chunk);
        }
        assert!(accumulator.finished);
        let reply = accumulator.finish(&[], (2.0, 8.0), "c");
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(
            reply.tool_calls[0],
            ToolCall { call_id: "call_a".into(), name: "search".into(), args: json!({"q": "x"}) }
        );
        assert_eq!(reply.usage.cost_usd, 6.0);
    }

    #[test]
    fn repeated_ids_and_names_are_not_doubled_and_unindexed_fragments_continue() {
        let mut accumulator = Accumulator::default();
        for chunk in [
            json!({"choices": [{"delta": {"tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": "{\"q\""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": ": 1}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ""}}]}, "finish_reason": "tool_calls"}]}),
        ] {
            push_value(&mut accumulator, chunk);
        }
        let reply = accumulator.finish(&[], (0.0, 0.0), "c");
        assert_eq!(
            reply.tool_calls,
            vec![ToolCall { call_id: "c1".into(), name: "search".into(), args: json!({"q": 1}) }]
        );
    }

    #[test]
    fn no_recovery_from_text_when_no_tool_is_offered() {
        let mut accumulator = Accumulator::default();
        let text = "The format is <tool_call>{\"name\": \"search\"}</tool_call>.";
        push_value(&mut accumulator, json!({"choices": [{"delta": {"content": text}, "finish_reason": "stop"}]}));
        let reply = accumulator.finish(&[], (0.0, 0.0), "c");
        assert!(reply.tool_calls.is_empty());
        assert_eq!(reply.content, text);
    }

    #[test]
    fn a_required_tool_is_named_in_tool_choice() {
        let tool = std::sync::Arc::new(troupe_actors::llm::ToolDefinition {
            name: "create_draft".into(),
            description: "Drafts.".into(),
            parameters: json!({"type": "object"}),
        });
        let mut request = ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            tools: vec![tool],
            tool_choice: ToolChoice::Tool("create_draft".into()),
            max_tokens: None,
            temperature: None,
        };
        let body = json!(request_body(&request, "m", false));
        assert_eq!(body["tool_choice"], json!({"type": "function", "function": {"name": "create_draft"}}));
        request.tool_choice = ToolChoice::None;
        assert_eq!(json!(request_body(&request, "m", false))["tool_choice"], "none");
        assert_eq!(ToolChoice::Tool("x".into()).callable(&request.tools), Vec::<String>::new(), "only an offered tool");
    }

    #[test]
    fn a_request_body_is_the_chat_completions_format() {
        let tool = std::sync::Arc::new(troupe_actors::llm::ToolDefinition {
            name: "search".into(),
            description: "Searches \"mail\".".into(),
            parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        });
        let asks = Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![
                ToolCall { call_id: "c1".into(), name: "search".into(), args: json!({"q": "a \"b\""}) },
                ToolCall { call_id: "c2".into(), name: "search".into(), args: json!("{\"q\": 1") },
            ],
            tool_call_id: None,
        };
        let answer = Message { tool_call_id: Some("c1".into()), ..Message::text(Role::Tool, "found\n2") };
        let request = ChatRequest {
            messages: vec![Message::text(Role::System, "Be brief."), Message::text(Role::User, "hi"), asks, answer],
            tools: vec![tool],
            tool_choice: ToolChoice::Auto,
            max_tokens: Some(100),
            temperature: Some(0.2),
        };
        let encoded = serde_json::to_string(&request_body(&request, "gpt", true)).unwrap();
        let body: Value = serde_json::from_str(&encoded).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"a \\\"b\\\"\"}"}},
                        {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{\"q\": 1"}},
                    ]},
                    {"role": "tool", "content": "found\n2", "tool_call_id": "c1"},
                ],
                "tools": [{"type": "function", "function": {"name": "search", "description": "Searches \"mail\".",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
                "tool_choice": "auto",
                "temperature": 0.2,
                "max_tokens": 100,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
        let quiet = ChatRequest { tools: Vec::new(), temperature: None, max_tokens: None, ..request };
        let body = json!(request_body(&quiet, "gpt", false));
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["messages", "model"], "no tools, no tool_choice, no sampling settings, no stream");
    }

    #[test]
    fn tool_definitions_are_encoded_once_and_a_new_one_gets_its_own() {
        let tool = |name: &str| {
            Arc::new(ToolDefinition {
                name: name.into(),
                description: "Does it.".into(),
                parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            })
        };
        let request = |tools: Vec<Arc<ToolDefinition>>| ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            tools,
            tool_choice: ToolChoice::Auto,
            max_tokens: None,
            temperature: None,
        };
        let encoded = EncodedTools::default();
        let search = tool("search");
        let first = request(vec![search.clone(), tool("echo")]);
        let plain = serde_json::to_string(&request_body(&first, "m", false)).unwrap();
        let cached = serde_json::to_string(&request_body(&first, "m", false).with_tools(&encoded)).unwrap();
        assert_eq!(cached, plain, "the same bytes as encoding each time");
        let again = serde_json::to_string(&request_body(&first, "m", false).with_tools(&encoded)).unwrap();
        assert_eq!(again, plain);
        assert!(Arc::ptr_eq(&encoded.get(&search).unwrap(), &encoded.get(&search).unwrap()), "encoded once");
        drop(first);
        drop(search);
        let second = request(vec![tool("create_draft")]);
        let body = json!(request_body(&second, "m", false).with_tools(&encoded));
        assert_eq!(body["tools"][0]["function"]["name"], "create_draft");
        assert_eq!(body["tools"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn events_are_split_on_blank_lines_and_partial_tails_wait() {
        let buffer = b"data: {\"a\":1}\n\n: comment\n\nevent: x\ndata: [DONE]\n\ndata: {\"b\"";
        let end = last_event_end(buffer, 0).unwrap();
        assert_eq!(&buffer[end..], b"data: {\"b\"", "the partial tail waits");
        let payloads: Vec<Cow<'_, [u8]>> = event_payloads(&buffer[..end]).collect();
        assert_eq!(payloads, vec![Cow::Borrowed(&b"{\"a\":1}"[..]), Cow::Borrowed(&b"[DONE]"[..])]);
        assert!(matches!(payloads[0], Cow::Borrowed(_)), "one data line is not copied");
        let joined: Vec<Cow<'_, [u8]>> = event_payloads(b"data: {\"a\":\ndata: 1}\n\n").collect();
        assert_eq!(joined, vec![Cow::Owned::<[u8]>(b"{\"a\":\n1}".to_vec())]);
        assert_eq!(last_event_end(b"abc\n", 0), None);
        assert_eq!(last_event_end(b"abc\n\nde", 4), Some(5), "a boundary across the searched part is found");
    }

    #[test]
    fn reasoning_counts_toward_the_reply_size_and_text_is_moved_not_copied() {
        let mut accumulator = Accumulator::default();
        let deltas = push_value(
            &mut accumulator,
            json!({"choices": [{"delta": {"content": "abc", "reasoning_content": "12345"}}]}),
        );
        assert_eq!(deltas, vec![ModelDelta::Text("abc".into()), ModelDelta::Reasoning("12345".into())]);
        assert_eq!(accumulator.size(), 8);
        let mut response = Accumulator::default();
        response.push_response(json!({"choices": [{"message": {"content": "whole"}}]}));
        assert_eq!(response.finish(&[], (0.0, 0.0), "c").content, "whole");
    }

    #[test]
    fn a_chunk_read_straight_means_what_it_means_read_as_a_value() {
        let chunks = [
            r#"{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"Think \"twice\"\n"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"caf\u00e9 ","tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"search","arguments":"{\"q\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"a\\tb\"}"}}]},"logprobs":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#,
        ];
        let mut straight = Accumulator::default();
        let mut valued = Accumulator::default();
        for chunk in chunks {
            let read: StreamChunk<'_> = serde_json::from_str(chunk).unwrap();
            let deltas = straight.push(read);
            assert_eq!(deltas, push_value(&mut valued, serde_json::from_str(chunk).unwrap()), "{chunk}");
        }
        assert!(straight.finished);
        let offered = ["search".to_owned()];
        let reply = straight.finish(&offered, (1.0, 1.0), "c");
        assert_eq!(reply, valued.finish(&offered, (1.0, 1.0), "c"));
        assert_eq!(reply.content, "café ");
        assert_eq!(reply.tool_calls[0].args, json!({"q": "a\tb"}));
        assert_eq!((reply.usage.input_tokens, reply.usage.output_tokens), (12, 7));

        // A field of an unexpected type fails the straight read; the lenient one
        // takes the chunk with that field as absent.
        let odd =
            r#"{"choices":[{"index":0,"delta":{"content":5,"reasoning":"r","tool_calls":[{"index":"0","id":"c2"}]}}]}"#;
        assert!(serde_json::from_str::<StreamChunk<'_>>(odd).is_err());
        let mut lenient = Accumulator::default();
        let deltas = push_value(&mut lenient, serde_json::from_str(odd).unwrap());
        assert_eq!(deltas, vec![ModelDelta::Reasoning("r".into())]);
        assert_eq!(lenient.calls.get(&0).map(|call| call.id.as_str()), Some("c2"));
    }
}
