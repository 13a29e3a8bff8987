//! The local model's settings: `[local_model]` of the config, resolved into what
//! the engine runs with, and what the engine is asked to do for one request.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::llm::local::pull::{self, KnownModel, known};

/// `[local_model]` of the config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalModelConfig {
    /// A known model id (its file is `<data_dir>/models/<file>`) or a GGUF path.
    pub model: String,
    /// Requests decoded at the same time (sequences of the KV cache).
    pub parallel: usize,
    /// Tokens of context per sequence: prompt and reply.
    pub context: u32,
    /// Tokens per decode step.
    pub batch: u32,
    /// CPU threads; 0 = one per core.
    pub threads: usize,
    /// Requests waiting for a sequence; more fail at once.
    pub queue_limit: usize,
    /// Longest reply, in tokens.
    pub max_tokens: u32,
    /// Sampling temperature; 0 decodes greedily (the same prompt, the same reply).
    pub temperature: f32,
    /// Constrain a tool call with a grammar once the model opens one.
    pub grammar: bool,
}

impl Default for LocalModelConfig {
    fn default() -> Self {
        Self {
            model: pull::QWEN_CODER_05B.id.to_owned(),
            parallel: 2,
            context: 8192,
            batch: 512,
            threads: 0,
            queue_limit: 64,
            max_tokens: 1024,
            temperature: 0.0,
            grammar: true,
        }
    }
}

/// What the engine runs with, resolved from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalSettings {
    /// The model's name in the registry and logs.
    pub name: String,
    /// What it is, for the `model` label of metrics: the known model's id, else
    /// the file's name without `.gguf`.
    pub id: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// The known model the file should be, if it was named by id.
    pub known: Option<&'static KnownModel>,
    /// CPU threads (`config.threads` resolved: never 0).
    pub threads: usize,
    /// The rest, as configured (and checked).
    pub config: LocalModelConfig,
}

impl LocalModelConfig {
    /// The settings, with the model's file found under `data_dir`.
    pub fn settings(&self, data_dir: &Path) -> Result<LocalSettings, String> {
        let known = known(&self.model);
        let path = match known {
            Some(model) => models_dir(data_dir).join(model.file),
            None if self.model.ends_with(".gguf") || self.model.contains(std::path::MAIN_SEPARATOR) => {
                PathBuf::from(&self.model)
            }
            None => {
                let ids: Vec<&str> = pull::KNOWN_MODELS.iter().map(|model| model.id).collect();
                return Err(format!(
                    "local_model.model {:?} is neither a known model ({}) nor a path to a .gguf file",
                    self.model,
                    ids.join(", ")
                ));
            }
        };
        if self.parallel == 0 || self.queue_limit == 0 || (self.batch as usize) < self.parallel {
            return Err(
                "local_model.parallel and queue_limit must be at least 1, and batch at least parallel".to_owned()
            );
        }
        if self.max_tokens == 0 || self.context < self.max_tokens.saturating_add(64) {
            return Err(format!(
                "local_model.context ({}) must leave room for a prompt beyond max_tokens ({})",
                self.context, self.max_tokens
            ));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err("local_model.temperature must be between 0 and 2".to_owned());
        }
        let threads = match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        };
        let id = match known {
            Some(model) => model.id.to_owned(),
            None => path.file_stem().map_or_else(|| self.model.clone(), |stem| stem.to_string_lossy().into_owned()),
        };
        Ok(LocalSettings { name: "local".to_owned(), id, path, known, threads, config: self.clone() })
    }
}

/// Where pulled models are kept.
pub fn models_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("models")
}

/// What the engine is asked to do for one request.
#[derive(Debug, Clone)]
pub struct PromptJob {
    /// The rendered prompt, in pieces: markup (special tokens parsed) or text.
    pub prompt: Vec<(String, bool)>,
    /// Names of the tools the model may call.
    pub offered: Vec<String>,
    /// The reply must be one call of the one offered tool, its arguments valid
    /// against this schema (the grammar applies from the first token).
    pub required: Option<serde_json::Value>,
    /// Longest reply.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
}
