//! List prices of well-known model ids, so that a run's cost (and its cost
//! budget, and a tenant's daily quota) means something without configuring
//! prices. A model's own `input_price_per_million` / `output_price_per_million`
//! override them; an id not listed costs $0 unless configured.

/// The day the prices below were the providers' published list prices (standard
/// tier, no caching or batch discounts).
pub const PRICES_AS_OF: &str = "2025-08-07";

/// (model id, USD per million input tokens, USD per million output tokens).
const LIST_PRICES: &[(&str, f64, f64)] = &[
    // OpenAI
    ("gpt-5", 1.25, 10.0),
    ("gpt-5-mini", 0.25, 2.0),
    ("gpt-5-nano", 0.05, 0.40),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4.1-mini", 0.40, 1.60),
    ("gpt-4.1-nano", 0.10, 0.40),
    ("gpt-4o", 2.50, 10.0),
    ("gpt-4o-mini", 0.15, 0.60),
    ("gpt-4-turbo", 10.0, 30.0),
    ("gpt-4", 30.0, 60.0),
    ("gpt-3.5-turbo", 0.50, 1.50),
    ("o1", 15.0, 60.0),
    ("o1-mini", 1.10, 4.40),
    ("o3", 2.0, 8.0),
    ("o3-mini", 1.10, 4.40),
    ("o3-pro", 20.0, 80.0),
    ("o4-mini", 1.10, 4.40),
    // Anthropic
    ("claude-opus-4-1", 15.0, 75.0),
    ("claude-opus-4", 15.0, 75.0),
    ("claude-sonnet-4", 3.0, 15.0),
    ("claude-3-7-sonnet", 3.0, 15.0),
    ("claude-3-5-sonnet", 3.0, 15.0),
    ("claude-3-5-haiku", 0.80, 4.0),
    ("claude-3-haiku", 0.25, 1.25),
    // Google
    ("gemini-2.5-pro", 1.25, 10.0),
    ("gemini-2.5-flash", 0.30, 2.50),
    ("gemini-2.5-flash-lite", 0.10, 0.40),
    ("gemini-2.0-flash", 0.10, 0.40),
];

/// The list price (input, output; USD per million tokens) of model `id`: the
/// longest listed id that `id` is or starts with followed by `-`, `:` or `@` (a
/// dated snapshot such as `gpt-4o-2024-08-06`), after any `provider/` prefix
/// (`openai/gpt-4o` as a router names it). Case is ignored.
pub fn list_price(id: &str) -> Option<(f64, f64)> {
    let id = id.rsplit('/').next().unwrap_or(id).to_ascii_lowercase();
    LIST_PRICES
        .iter()
        .filter(|(listed, ..)| {
            id.strip_prefix(listed).is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '@']))
        })
        .max_by_key(|(listed, ..)| listed.len())
        .map(|&(_, input, output)| (input, output))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_or_routed_id_takes_its_family_price_and_the_longest_name_wins() {
        assert_eq!(list_price("gpt-4o-mini"), Some((0.15, 0.60)));
        assert_eq!(list_price("gpt-4o-mini-2024-07-18"), Some((0.15, 0.60)));
        assert_eq!(list_price("gpt-4o-2024-08-06"), Some((2.50, 10.0)));
        assert_eq!(list_price("openai/GPT-4o"), Some((2.50, 10.0)));
        assert_eq!(list_price("o3-mini"), Some((1.10, 4.40)));
        assert_eq!(list_price("o3"), Some((2.0, 8.0)));
        assert_eq!(list_price("claude-sonnet-4-20250514"), Some((3.0, 15.0)));
        assert_eq!(list_price("claude-opus-4-1-20250805"), Some((15.0, 75.0)));
    }

    #[test]
    fn an_unknown_id_or_a_longer_name_is_not_priced() {
        for id in ["qwen2.5-coder-0.5b-instruct", "llama3:8b", "o1x", "gpt-4oo", "my-gpt-4o", ""] {
            assert_eq!(list_price(id), None, "{id}");
        }
    }

    #[test]
    fn every_listed_id_is_unique_lowercase_and_priced() {
        let mut seen = std::collections::HashSet::new();
        for (id, input, output) in LIST_PRICES {
            assert!(seen.insert(id), "{id} twice");
            assert_eq!(*id, id.to_ascii_lowercase());
            assert!(*input > 0.0 && *output >= *input, "{id}");
        }
    }
}
