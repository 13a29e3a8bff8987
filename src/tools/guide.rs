//! The tool guide (`config/tools.md`): the text the model sees for each tool in
//! the `<available_tools>` part of its system prompt. Each `## name` section is
//! one tool's entry; text before the first section is for people only.

use std::collections::BTreeMap;

/// The guide built into the binary.
pub const DEFAULT_GUIDE: &str = include_str!("../../config/tools.md");

/// The parts every entry of the built-in guide has.
pub const SECTIONS: &[&str] =
    &["**Purpose.**", "**When to use it.**", "**Parameters.**", "**Example.**", "**Combines with.**"];

/// Entries by tool name. A name given twice keeps its last entry.
pub fn parse(markdown: &str) -> BTreeMap<String, String> {
    let mut entries = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            if let Some((name, body)) = current.take() {
                entries.insert(name, body.trim().to_owned());
            }
            current = Some((name.trim().to_owned(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        entries.insert(name, body.trim().to_owned());
    }
    entries.retain(|name, body| !name.is_empty() && !body.is_empty());
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_become_entries_and_the_preamble_is_left_out() {
        let guide = parse("# Guide\nfor people\n\n## a\n\nalpha\nmore\n\n## b\nbeta\n## empty\n\n");
        assert_eq!(guide.len(), 2);
        assert_eq!(guide["a"], "alpha\nmore");
        assert_eq!(guide["b"], "beta");
    }

    #[test]
    fn every_built_in_tool_has_a_complete_entry() {
        let guide = parse(DEFAULT_GUIDE);
        let registry = crate::tools::builtin_registry(&crate::tools::ToolsConfig::default()).unwrap();
        let mut names = registry.names();
        names.extend(["todo_write", "ask_user", "list_agents", "run_agent"].map(str::to_owned));
        for name in names {
            let entry = guide.get(&name).unwrap_or_else(|| panic!("config/tools.md has no entry for {name}"));
            for section in SECTIONS {
                assert!(entry.contains(section), "the entry for {name} lacks {section}");
            }
        }
    }
}
