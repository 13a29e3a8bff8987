//! Model clients of the `troupe` binary and the registry built from config: named
//! OpenAI-compatible providers and models, a quick-start provider from the usual
//! environment variables, and the local model (or, in a build without it, the
//! offline model) when nothing is configured.

pub mod local;
pub mod offline;
pub mod openai;
pub mod prices;
pub mod recover;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::info;
use troupe_actors::llm::{ModelClient, ModelRegistry};

use crate::llm::offline::OfflineModel;
use crate::llm::openai::{ModelSettings, OpenAiModel, Provider, ProviderSettings, RetryPolicy, Secret};

/// An OpenAI-compatible provider, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// E.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// The environment variable that holds the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Extra headers sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Requests in flight at once.
    #[serde(default = "defaults::max_concurrency")]
    pub max_concurrency: usize,
    /// Requests that may wait for a slot; more fail at once.
    #[serde(default = "defaults::queue_limit")]
    pub queue_limit: usize,
    /// Seconds to connect.
    #[serde(default = "defaults::connect_timeout")]
    pub connect_timeout: f64,
    /// Seconds until the response head.
    #[serde(default = "defaults::first_byte_timeout")]
    pub first_byte_timeout: f64,
    /// Longest gap in seconds between two chunks of a response.
    #[serde(default = "defaults::idle_timeout")]
    pub idle_timeout: f64,
    /// Attempts per request, the first included.
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// Seconds after which no retry starts.
    #[serde(default = "defaults::max_retry_time")]
    pub max_retry_time: f64,
    /// Largest response accepted, in bytes.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
}

/// A model, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The provider's name under `[providers]`.
    pub provider: String,
    /// The provider's model id.
    pub id: String,
    /// Stream replies.
    #[serde(default = "defaults::stream")]
    pub stream: bool,
    /// USD per million input tokens; left out, the list price of a well-known
    /// id ([`prices`]), else 0.
    #[serde(default)]
    pub input_price_per_million: Option<f64>,
    /// USD per million output tokens; likewise.
    #[serde(default)]
    pub output_price_per_million: Option<f64>,
    /// The model's context window in tokens: a prompt that would not fit is
    /// compacted first. Left out, prompts are sent whole.
    #[serde(default)]
    pub context_window: Option<u64>,
}

impl ProviderConfig {
    /// A provider at `base_url` with every other setting at its default.
    pub fn with_base_url(base_url: String) -> Self {
        Self {
            base_url,
            api_key_env: None,
            headers: BTreeMap::new(),
            max_concurrency: defaults::max_concurrency(),
            queue_limit: defaults::queue_limit(),
            connect_timeout: defaults::connect_timeout(),
            first_byte_timeout: defaults::first_byte_timeout(),
            idle_timeout: defaults::idle_timeout(),
            max_attempts: defaults::max_attempts(),
            max_retry_time: defaults::max_retry_time(),
            max_body_bytes: defaults::max_body_bytes(),
        }
    }
}

mod defaults {
    pub fn max_concurrency() -> usize {
        16
    }
    pub fn queue_limit() -> usize {
        256
    }
    pub fn connect_timeout() -> f64 {
        10.0
    }
    pub fn first_byte_timeout() -> f64 {
        120.0
    }
    pub fn idle_timeout() -> f64 {
        60.0
    }
    pub fn max_attempts() -> u32 {
        4
    }
    pub fn max_retry_time() -> f64 {
        120.0
    }
    pub fn max_body_bytes() -> usize {
        2 << 20
    }
    pub fn stream() -> bool {
        true
    }
}

/// The name of the local model in the registry.
pub const LOCAL: &str = "local";
/// The name of the built-in offline model in the registry.
pub const OFFLINE: &str = "offline";

/// The model of the quick start when only `OPENAI_API_KEY` is set.
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// The quick-start provider from `OPENAI_BASE_URL`, `OPENAI_API_KEY` and
/// `TROUPE_MODEL`, read by `main`.
#[derive(Debug, Clone, Default)]
pub struct EnvModel {
    /// `OPENAI_BASE_URL` (default `https://api.openai.com/v1`).
    pub base_url: Option<String>,
    /// `OPENAI_API_KEY`.
    pub api_key: Option<String>,
    /// `TROUPE_MODEL`: the model id.
    pub model: Option<String>,
    /// A proxy for plain HTTP is set (`http_proxy`, `all_proxy`, upper or lower
    /// case): providers then go through reqwest, which honours it.
    pub http_proxy: bool,
}

/// Why the models could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// A model names a provider that is not configured.
    #[error("model {model} names unknown provider {provider}")]
    UnknownProvider {
        /// The model.
        model: String,
        /// The provider it names.
        provider: String,
    },
    /// A setting is out of range.
    #[error("provider {provider}: {message}")]
    Invalid {
        /// The provider.
        provider: String,
        /// What is wrong.
        message: String,
    },
    /// `default_model` names no model.
    #[error("default_model {0} is not a configured model")]
    UnknownDefault(String),
}

/// The models of `config`, keyed by name, with the default. `local` is the local
/// model (`None` in a build without it), registered as `local` and the default
/// when no remote model is configured; `offline` is always there. `api_key` reads
/// the environment variable a provider names (main passes `std::env::var`).
pub fn build_models(
    providers: &BTreeMap<String, ProviderConfig>,
    models: &BTreeMap<String, ModelConfig>,
    default_model: Option<&str>,
    env: &EnvModel,
    local: Option<Arc<dyn ModelClient>>,
    api_key: impl Fn(&str) -> Option<String>,
) -> Result<ModelRegistry, ModelsError> {
    let mut built: BTreeMap<String, Arc<dyn ModelClient>> = BTreeMap::new();
    let mut clients = BTreeMap::new();
    for (name, provider) in providers {
        let key = provider.api_key_env.as_deref().and_then(&api_key);
        clients.insert(name.clone(), build_provider(name, provider, key, env.http_proxy)?);
    }
    for (name, model) in models {
        if matches!(name.as_str(), LOCAL | OFFLINE) {
            return Err(ModelsError::Invalid {
                provider: model.provider.clone(),
                message: format!("a model may not be named {name:?}: that name is the built-in one's"),
            });
        }
        let prices = [model.input_price_per_million, model.output_price_per_million];
        if prices.into_iter().flatten().any(|price| !(price.is_finite() && price >= 0.0)) {
            return Err(ModelsError::Invalid {
                provider: model.provider.clone(),
                message: format!("model {name:?}: a price per million tokens must be a number of USD, 0 or more"),
            });
        }
        let provider = clients
            .get(&model.provider)
            .ok_or_else(|| ModelsError::UnknownProvider { model: name.clone(), provider: model.provider.clone() })?;
        built.insert(name.clone(), Arc::new(OpenAiModel::new(provider.clone(), settings(name, model))));
    }
    // An OpenAI key alone means OpenAI's small default model; a server of one's
    // own must say which model it serves.
    let env_model = match (&env.model, &env.base_url, &env.api_key) {
        (Some(id), _, _) => Some(id.clone()),
        (None, None, Some(_)) => Some(DEFAULT_OPENAI_MODEL.to_owned()),
        (None, Some(_), _) => {
            return Err(ModelsError::Invalid {
                provider: "OPENAI_BASE_URL".to_owned(),
                message: "is set but TROUPE_MODEL is not: set TROUPE_MODEL to a model id that server serves".to_owned(),
            });
        }
        (None, None, None) => None,
    };
    if let Some(id) = &env_model {
        let base_url = env.base_url.clone().unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
        let provider = ProviderConfig::with_base_url(base_url);
        let client = build_provider("env", &provider, env.api_key.clone(), env.http_proxy)?;
        let model = ModelConfig {
            provider: "env".into(),
            id: id.clone(),
            stream: true,
            input_price_per_million: None,
            output_price_per_million: None,
            context_window: None,
        };
        built.entry("env".to_owned()).or_insert_with(|| Arc::new(OpenAiModel::new(client, settings("env", &model))));
    }
    let offline: Arc<dyn ModelClient> = Arc::new(OfflineModel);
    if let Some(local) = &local {
        built.entry(LOCAL.to_owned()).or_insert_with(|| local.clone());
    }
    built.entry(OFFLINE.to_owned()).or_insert_with(|| offline.clone());
    let remote =
        built.iter().find(|(name, _)| !matches!(name.as_str(), LOCAL | OFFLINE)).map(|(_, model)| model.clone());
    let default: Arc<dyn ModelClient> = match default_model {
        Some(name) => built.get(name).cloned().ok_or_else(|| ModelsError::UnknownDefault(name.to_owned()))?,
        None if env_model.is_some() => built.get("env").cloned().unwrap_or_else(|| offline.clone()),
        None => remote.or(local).unwrap_or(offline),
    };
    let mut registry = ModelRegistry::new(default);
    for (name, model) in built {
        registry = registry.with(name, model);
    }
    Ok(registry)
}

fn settings(name: &str, model: &ModelConfig) -> ModelSettings {
    let listed = prices::list_price(&model.id);
    let (input, output) = match (model.input_price_per_million, model.output_price_per_million, listed) {
        (None, None, Some(listed)) => listed,
        (None, None, None) => {
            info!(model = name, id = %model.id, "no price configured or listed for this model: its calls count as $0");
            (0.0, 0.0)
        }
        (input, output, listed) => (
            input.or(listed.map(|(input, _)| input)).unwrap_or(0.0),
            output.or(listed.map(|(_, output)| output)).unwrap_or(0.0),
        ),
    };
    ModelSettings {
        name: name.to_owned(),
        id: model.id.clone(),
        stream: model.stream,
        input_price_per_million: input,
        output_price_per_million: output,
        context_window: model.context_window.and_then(|tokens| usize::try_from(tokens).ok()),
    }
}

fn build_provider(
    name: &str,
    config: &ProviderConfig,
    api_key: Option<String>,
    http_proxy: bool,
) -> Result<Arc<Provider>, ModelsError> {
    let invalid = |message: String| ModelsError::Invalid { provider: name.to_owned(), message };
    let seconds = |what: &str, value: f64| {
        Duration::try_from_secs_f64(value)
            .ok()
            .filter(|duration| !duration.is_zero())
            .ok_or_else(|| invalid(format!("{what} must be a positive number of seconds")))
    };
    let settings = ProviderSettings {
        name: name.to_owned(),
        base_url: config.base_url.clone(),
        api_key: api_key.and_then(Secret::new),
        headers: config
            .headers
            .iter()
            .filter_map(|(name, value)| Secret::new(value.clone()).map(|value| (name.clone(), value)))
            .collect(),
        connect_timeout: seconds("connect_timeout", config.connect_timeout)?,
        first_byte_timeout: seconds("first_byte_timeout", config.first_byte_timeout)?,
        idle_timeout: seconds("idle_timeout", config.idle_timeout)?,
        max_concurrency: config.max_concurrency.max(1),
        queue_limit: config.queue_limit,
        max_body_bytes: config.max_body_bytes,
        retry: RetryPolicy {
            max_attempts: config.max_attempts.max(1),
            base: Duration::from_millis(500),
            cap: Duration::from_secs(20),
            max_total: seconds("max_retry_time", config.max_retry_time)?,
        },
    };
    let provider = if http_proxy { Provider::with_general_client(settings) } else { Provider::new(settings) };
    provider.map_err(|error| invalid(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> BTreeMap<String, ProviderConfig> {
        BTreeMap::from([("local".to_owned(), ProviderConfig::with_base_url("http://127.0.0.1:9/v1".into()))])
    }

    fn model(provider: &str) -> ModelConfig {
        ModelConfig {
            provider: provider.into(),
            id: "m".into(),
            stream: true,
            input_price_per_million: None,
            output_price_per_million: None,
            context_window: None,
        }
    }

    #[tokio::test]
    async fn configured_models_are_named_and_the_default_chosen() {
        let models = BTreeMap::from([("a".to_owned(), model("local")), ("b".to_owned(), model("local"))]);
        let registry = build_models(&provider(), &models, Some("b"), &EnvModel::default(), None, |_| None).unwrap();
        assert_eq!(registry.get(None).unwrap().name(), "b");
        assert_eq!(registry.get(Some("a")).unwrap().name(), "a");
        assert_eq!(registry.get(Some("offline")).unwrap().name(), "offline");
        assert!(registry.get(Some("c")).is_none());
    }

    #[tokio::test]
    async fn the_environment_quick_start_and_the_offline_fallback() {
        let (none, no_models) = (BTreeMap::new(), BTreeMap::new());
        let offline = build_models(&none, &no_models, None, &EnvModel::default(), None, |_| None).unwrap();
        assert_eq!(offline.get(None).unwrap().name(), "offline", "a build without the local model");
        let local = local_model();
        let with_local = build_models(&none, &no_models, None, &EnvModel::default(), Some(local.clone()), |_| None);
        assert_eq!(with_local.unwrap().get(None).unwrap().name(), "local", "no remote model: the local one");
        let models = BTreeMap::from([("a".to_owned(), model("local"))]);
        let remote = build_models(&provider(), &models, None, &EnvModel::default(), Some(local.clone()), |_| None);
        let remote = remote.unwrap();
        assert_eq!(remote.get(None).unwrap().name(), "a", "a configured remote model comes first");
        assert_eq!(remote.get(Some("local")).unwrap().name(), "local");
        let chosen = build_models(&none, &no_models, Some("offline"), &EnvModel::default(), Some(local), |_| None);
        assert_eq!(chosen.unwrap().get(None).unwrap().name(), "offline");
        let env = EnvModel {
            base_url: Some("http://127.0.0.1:9/v1".into()),
            api_key: None,
            model: Some("gpt-x".into()),
            http_proxy: false,
        };
        let quick = build_models(&none, &no_models, None, &env, None, |_| None).unwrap();
        assert_eq!(quick.get(None).unwrap().name(), "env");
        let key_only = EnvModel { base_url: None, api_key: Some("sk-test".into()), model: None, http_proxy: false };
        let openai = build_models(&none, &no_models, None, &key_only, None, |_| None).unwrap();
        assert_eq!(openai.get(None).unwrap().name(), "env", "a key alone uses OpenAI");
        let server_only =
            EnvModel { base_url: Some("http://127.0.0.1:9/v1".into()), api_key: None, model: None, http_proxy: false };
        let error = error_of(build_models(&none, &no_models, None, &server_only, None, |_| None));
        assert!(error.contains("TROUPE_MODEL"), "{error}");
    }

    fn local_model() -> Arc<dyn ModelClient> {
        let settings = local::LocalModelConfig::default().settings(std::path::Path::new("/nowhere")).unwrap();
        Arc::new(local::LocalModel::new(settings))
    }

    fn error_of(result: Result<ModelRegistry, ModelsError>) -> String {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(error) => error.to_string(),
        }
    }

    #[tokio::test]
    async fn bad_references_and_settings_are_named() {
        let models = BTreeMap::from([("a".to_owned(), model("nowhere"))]);
        let error = error_of(build_models(&provider(), &models, None, &EnvModel::default(), None, |_| None));
        assert_eq!(error, "model a names unknown provider nowhere");
        let error =
            error_of(build_models(&provider(), &BTreeMap::new(), Some("zz"), &EnvModel::default(), None, |_| None));
        assert_eq!(error, "default_model zz is not a configured model");
        let mut broken = provider();
        broken.get_mut("local").unwrap().idle_timeout = 0.0;
        let error = error_of(build_models(&broken, &BTreeMap::new(), None, &EnvModel::default(), None, |_| None));
        assert!(error.contains("idle_timeout must be a positive number of seconds"), "{error}");
    }
}
