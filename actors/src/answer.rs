//! The answer guard: text the model wrote that is not an answer to anyone. A
//! small model continues whatever it read last, so it may copy the runtime's own
//! text (a review, a note) or write a tool call as plain text. Such a reply is
//! never a run's final output: the reviewer sends it back, and a run that ends
//! with nothing else fails with `no_answer` instead of succeeding. So is a reply
//! that only repeats the request (a small model echoes the question it read last).

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde_json::Value;

/// Runtime text a reply must not contain: it marks the runtime's own messages.
const RUNTIME_MARKERS: &[&str] = &[
    "The run so far",
    "updated every turn",
    "todo_write changes the plan",
    "Review of turn",
    "by the runtime (not the user)",
    "<plan",
    "</plan>",
    "<available_tools>",
    "</available_tools>",
    "Do not call a tool.",
    "Do not call tools.",
    "Answer my request now",
    "My request was:",
    "from the tool results above",
    "You have used all",
    "skipped (duplicate)",
    "identical call already succeeded",
    "its result was:",
    "Go on: call a tool if more is needed",
    BEFORE_ACTING,
    AFTER_RESPONSE,
];

/// How a reflecting agent's reasoning before acting opens in the conversation.
pub const BEFORE_ACTING: &str = "Your reasoning before acting (not the user):";
/// How a reflection that found an answer incomplete opens in the conversation.
pub const AFTER_RESPONSE: &str = "Your reflection on your answer (not the user):";

/// Why `text` is not an answer: `"runtime text"` or `"a tool call written as
/// text"`; `None` when it may be one.
pub fn not_an_answer(text: &str) -> Option<&'static str> {
    // The markers' searchers are built once (building one cost more than a
    // search through a typical answer).
    static FINDERS: LazyLock<Vec<Finder<'static>>> =
        LazyLock::new(|| RUNTIME_MARKERS.iter().map(|marker| Finder::new(marker.as_bytes())).collect());
    if FINDERS.iter().any(|finder| finder.find(text.as_bytes()).is_some()) {
        return Some("runtime text");
    }
    let call = text.contains("<tool_call>")
        || text.contains("</tool_call>")
        || opens_call(text)
        || json_objects(text).any(|object| is_call(&object));
    if call {
        return Some("a tool call written as text");
    }
    None
}

/// Why `answer` does not answer `request`: as `not_an_answer`, or `"the request
/// repeated"` when it is the request with little around it, or twice.
pub fn not_an_answer_to(request: &str, answer: &str) -> Option<&'static str> {
    not_an_answer(answer).or_else(|| repeats(request, answer).then_some("the request repeated"))
}

/// Whether `answer` is the request again (words compared, case and punctuation
/// aside): all of it with little else, or twice.
fn repeats(request: &str, answer: &str) -> bool {
    // Its words, lowercased, one space apart.
    let plain = |text: &str| -> String {
        let mut words = String::with_capacity(text.len());
        for word in text.split(|c: char| !c.is_alphanumeric()).filter(|word| !word.is_empty()) {
            if !words.is_empty() {
                words.push(' ');
            }
            words.extend(word.chars().map(|c| c.to_ascii_lowercase()));
        }
        words
    };
    let (request, answer) = (plain(request), plain(answer));
    if request.is_empty() || answer.is_empty() {
        return false;
    }
    match answer.matches(&request).count() {
        0 => false,
        1 => answer.len() <= request.len() + request.len() / 5 + 12,
        _ => true,
    }
}

/// Whether `text` opens an object with a `"name"` that `"arguments"` follow:
/// a call, even one cut off before it closes.
fn opens_call(text: &str) -> bool {
    text.match_indices("\"name\"").any(|(at, _)| {
        let opened = text[..at].trim_end().ends_with('{');
        let rest = &text[at..];
        opened && (rest.contains("\"arguments\"") || rest.contains("\"parameters\""))
    })
}

/// Whether an object is a tool call (`name` and `arguments`) or a plan
/// (`todos`), the shapes a model writes when it means to call a tool.
fn is_call(object: &serde_json::Map<String, Value>) -> bool {
    let named = object.get("name").is_some_and(Value::is_string);
    named && (object.contains_key("arguments") || object.contains_key("parameters")) || object.contains_key("todos")
}

/// The JSON objects that start at a `{` of `text` (at most 16 tried).
fn json_objects(text: &str) -> impl Iterator<Item = serde_json::Map<String, Value>> + '_ {
    text.match_indices('{').take(16).filter_map(|(at, _)| {
        let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(Value::Object(object))) => Some(object),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_pass() {
        assert_eq!(not_an_answer("The sentence has 5 words."), None);
        assert_eq!(not_an_answer("Use {curly} braces, or {\"a\": 1} in JSON."), None);
    }

    #[test]
    fn runtime_text_is_not_an_answer() {
        let note = "The run so far (updated every turn; todo_write changes the plan):\n<plan version=\"1\">";
        assert_eq!(not_an_answer(note), Some("runtime text"));
        assert_eq!(not_an_answer("Review of turn 2 by the runtime (not the user): proceed."), Some("runtime text"));
        let skip = "skipped (duplicate): identical call already succeeded as call json18_0 in turn 1";
        assert_eq!(not_an_answer(skip), Some("runtime text"));
    }

    #[test]
    fn the_request_repeated_is_not_an_answer() {
        let asked = "Am I expecting any deliveries today?";
        assert_eq!(not_an_answer_to(asked, "Am I expecting any deliveries today?"), Some("the request repeated"));
        assert_eq!(not_an_answer_to(asked, "am I expecting any deliveries today"), Some("the request repeated"));
        let twice = format!("Your question \"{asked}\" was answered: 1. \"{asked}\"");
        assert_eq!(not_an_answer_to(asked, &twice), Some("the request repeated"));
        assert_eq!(not_an_answer_to(asked, "Yes: your books (LB-55821) arrive by 8 pm [1]."), None);
        assert_eq!(not_an_answer_to("Is it spam? Answer yes or no.", "Yes."), None, "a part is an answer");
        assert_eq!(not_an_answer_to("echo alpha and beta", "alpha and beta"), None);
        assert_eq!(
            not_an_answer_to(asked, "Question: am I expecting any deliveries today?"),
            Some("the request repeated")
        );
        assert_eq!(not_an_answer_to(asked, "Go on: call a tool if more is needed; otherwise"), Some("runtime text"));
    }

    #[test]
    fn calls_written_as_text_are_not_answers() {
        let call = r#"{"name": "todo_write", "arguments": {"todos": []}}"#;
        assert_eq!(not_an_answer(call), Some("a tool call written as text"));
        let fenced = "Sure:\n```json\n{\"name\": \"text_stats\", \"arguments\": {\"text\": \"a\"}}\n```";
        assert_eq!(not_an_answer(fenced), Some("a tool call written as text"));
        assert_eq!(not_an_answer("<tool_call>\n{}\n</tool_call>"), Some("a tool call written as text"));
        assert_eq!(not_an_answer(r#"{"todos": [{"id": "1"}]}"#), Some("a tool call written as text"));
        let cut_off = r#"{"name": "ask_user", "arguments": {"question": "What is it?"}"#;
        assert_eq!(not_an_answer(cut_off), Some("a tool call written as text"));
        assert_eq!(not_an_answer(r#"The field "name" holds the sender; "arguments" are not needed."#), None);
    }
}
