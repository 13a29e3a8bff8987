//! `text_stats`: counts words, characters and sentences of a text and names its most
//! frequent words. Pure and idempotent.

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::{Value, json};
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// The tool.
pub struct TextStats;

/// Its arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The text to measure.
    text: String,
    /// How many frequent words to list (default 3).
    #[schemars(range(min = 1, max = 20))]
    top: Option<u8>,
}

/// Longest text accepted, in bytes.
const MAX_TEXT: usize = 1 << 20;

#[async_trait]
impl Tool for TextStats {
    fn name(&self) -> &str {
        "text_stats"
    }

    fn description(&self) -> &str {
        "Counts the words, characters and sentences of a text and lists its most frequent words."
    }

    fn parameters(&self) -> Value {
        troupe_actors::tool::schema_of::<Args>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        let words = args.get("text").and_then(Value::as_str).map_or(0, |text| text.split_whitespace().count());
        format!("Measuring a text of {words} words")
    }

    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let Args { text, top } = crate::tools::args::parse_args(args)?;
        if text.len() > MAX_TEXT {
            return Err(ToolError::InvalidArgs(format!("text is {} bytes; the limit is {MAX_TEXT}", text.len())));
        }
        Ok(ToolOutput::value(measure(&text, top.map_or(3, usize::from))))
    }
}

/// The statistics of `text`.
pub fn measure(text: &str, top: usize) -> Value {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for word in &words {
        *counts.entry(word.as_str()).or_insert(0) += 1;
    }
    let mut frequent: Vec<(&str, usize)> = counts.into_iter().collect();
    frequent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    frequent.truncate(top);
    let sentences = text.split(['.', '!', '?']).filter(|s| !s.trim().is_empty()).count();
    let characters = text.chars().count();
    json!({
        "summary": summary(words.len(), sentences, characters, &frequent),
        "words": words.len(),
        "characters": characters,
        "sentences": sentences,
        "most_frequent": frequent.iter().map(|(word, count)| json!({"word": word, "count": count})).collect::<Vec<_>>(),
    })
}

/// The figures in one sentence: what a model answering from them most often
/// needs, in words it can repeat.
fn summary(words: usize, sentences: usize, characters: usize, frequent: &[(&str, usize)]) -> String {
    let plural = |count: usize, what: &str| if count == 1 { format!("1 {what}") } else { format!("{count} {what}s") };
    let mut text =
        format!("{}, {}, {}", plural(words, "word"), plural(sentences, "sentence"), plural(characters, "character"));
    if let Some((word, count)) = frequent.first() {
        text.push_str(&format!("; the most frequent word is \"{word}\" ({})", plural(*count, "time")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_sentences_and_frequent_words() {
        let stats = measure("The cat sat. The cat ran!", 2);
        assert_eq!(stats["words"], 6);
        assert_eq!(stats["sentences"], 2);
        assert_eq!(stats["most_frequent"][0], json!({"word": "cat", "count": 2}));
        assert_eq!(stats["most_frequent"][1], json!({"word": "the", "count": 2}));
        assert_eq!(
            stats["summary"],
            "6 words, 2 sentences, 25 characters; the most frequent word is \"cat\" (2 times)"
        );
        assert_eq!(
            measure("Hi.", 3)["summary"],
            "1 word, 1 sentence, 3 characters; the most frequent word is \"hi\" (1 time)"
        );
    }
}
