//! `text_stats`: counts words, characters and sentences of a text and names its most
//! frequent words; given other texts too, measures each and adds them up. Pure and
//! idempotent.

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
    /// Other texts, to compare with it or add up: each is measured on its own.
    #[schemars(length(max = 10))]
    others: Option<Vec<String>>,
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
        "Counts the words, characters and sentences of a text and lists its most frequent words; with others, measures each, adds them up and names the one with the most words."
    }

    fn parameters(&self) -> Value {
        troupe_actors::tool::schema_of::<Args>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        let words = |text: &Value| text.as_str().map_or(0, |text| text.split_whitespace().count());
        let others = args.get("others").and_then(Value::as_array).map_or(0, Vec::len);
        let words = args.get("text").map_or(0, words);
        match others {
            0 => format!("Measuring a text of {words} words"),
            others => format!("Measuring {} texts", others + 1),
        }
    }

    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let Args { text, others, top } = crate::tools::args::parse_args(args)?;
        let mut texts = vec![text];
        for other in others.unwrap_or_default() {
            if !texts.contains(&other) {
                texts.push(other);
            }
        }
        let length: usize = texts.iter().map(String::len).sum();
        if length > MAX_TEXT {
            return Err(ToolError::InvalidArgs(format!("the texts are {length} bytes; the limit is {MAX_TEXT}")));
        }
        let top = top.map_or(3, usize::from);
        Ok(ToolOutput::value(match texts.as_slice() {
            [text] => measure(text, top),
            texts => measure_each(texts, top),
        }))
    }
}

/// The statistics of each of `texts` (two or more; no frequent words: the result
/// stays short), their sum, and which has the most words.
fn measure_each(texts: &[String], top: usize) -> Value {
    let each: Vec<Value> = texts.iter().map(|text| measure(text, top)).collect();
    let sum = |field: &str| each.iter().filter_map(|stats| stats[field].as_u64()).sum::<u64>();
    let (words, sentences, characters) = (sum("words"), sum("sentences"), sum("characters"));
    let counts: Vec<u64> = each.iter().filter_map(|stats| stats["words"].as_u64()).collect();
    let most = counts.iter().copied().max().unwrap_or(0);
    let leaders: Vec<&String> =
        texts.iter().zip(&counts).filter(|(_, count)| **count == most).map(|(text, _)| text).collect();
    let each_count: Vec<String> =
        texts.iter().zip(&counts).map(|(text, count)| format!("'{text}' has {}", plural(*count, "word"))).collect();
    let together = format!(
        "together {}, {} and {}",
        plural(words, "word"),
        plural(sentences, "sentence"),
        plural(characters, "character")
    );
    let most = match leaders.as_slice() {
        [one] => format!("'{one}' has the most words ({most})"),
        _ if leaders.len() == texts.len() => format!("each has {}", plural(most, "word")),
        many => {
            let named: Vec<String> = many.iter().map(|text| format!("'{text}'")).collect();
            format!("{} have the most words ({most} each)", named.join(" and "))
        }
    };
    let summary = [each_count.join(", "), together, most];
    let texts: Vec<Value> = texts
        .iter()
        .zip(each)
        .map(|(text, mut stats)| {
            if let Value::Object(fields) = &mut stats {
                fields.remove("summary");
                fields.remove("most_frequent");
                fields.insert("text".to_owned(), Value::String(text.clone()));
            }
            stats
        })
        .collect();
    json!({
        "summary": format!("{}.", summary.join("; ")),
        "texts": texts,
        "total": {"words": words, "sentences": sentences, "characters": characters},
    })
}

/// `count` and `what`, plural when it is not 1.
fn plural(count: impl Into<u64>, what: &str) -> String {
    match count.into() {
        1 => format!("1 {what}"),
        count => format!("{count} {what}s"),
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
    let plural = |count: usize, what: &str| plural(count as u64, what);
    let mut text = format!(
        "The text has {}, {} and {}",
        plural(words, "word"),
        plural(sentences, "sentence"),
        plural(characters, "character")
    );
    if let Some((word, count)) = frequent.first().filter(|(_, count)| *count > 1) {
        text.push_str(&format!("; its most frequent word is \"{word}\" ({})", plural(*count, "time")));
    }
    text.push('.');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn other_texts_are_measured_each_added_up_and_the_longest_named() {
        let call = |args: Value| async move {
            match TextStats.call(troupe_actors::testing::tool_context("default"), args).await {
                Ok(output) => output.value,
                Err(error) => panic!("{error}"),
            }
        };
        let two = call(json!({"text": "a quick brown fox", "others": ["the lazy old dog sleeps all day"]})).await;
        let two = two.to_string();
        assert!(
            two.contains(
                "'a quick brown fox' has 4 words, 'the lazy old dog sleeps all day' has 7 words; together 11 words"
            ) && two.contains("; 'the lazy old dog sleeps all day' has the most words (7)."),
            "{two}"
        );
        let same = call(json!({"text": "one two", "others": ["red blue", "one two"]})).await.to_string();
        assert!(same.contains("together 4 words") && same.contains("each has 2 words"), "{same}");
        let alone = call(json!({"text": "one two", "others": ["one two"]})).await;
        assert!(alone.to_string().contains("2 words, 1 sentence"), "a copy is the text itself: {alone}");
    }

    #[test]
    fn counts_words_sentences_and_frequent_words() {
        let stats = measure("The cat sat. The cat ran!", 2);
        assert_eq!(stats["words"], 6);
        assert_eq!(stats["sentences"], 2);
        assert_eq!(stats["most_frequent"][0], json!({"word": "cat", "count": 2}));
        assert_eq!(stats["most_frequent"][1], json!({"word": "the", "count": 2}));
        assert_eq!(
            stats["summary"],
            "The text has 6 words, 2 sentences and 25 characters; its most frequent word is \"cat\" (2 times)."
        );
        assert_eq!(
            measure("Hi.", 3)["summary"],
            "The text has 1 word, 1 sentence and 3 characters.",
            "no word is frequent"
        );
    }
}
