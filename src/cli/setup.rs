//! The configuration of a command: `config/default.toml`, the `--config` file,
//! the `TROUPE_*` variables, then the command line's own overrides.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::Config;
use crate::env::Environment;

/// The command line's overrides of the configuration.
#[derive(Debug, Default)]
pub struct Overrides {
    /// `--config`: a TOML file overriding keys of config/default.toml.
    pub config_file: Option<PathBuf>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `serve --bind`.
    pub bind: Option<String>,
}

/// The configuration of a command: the defaults, the `--config` file, the
/// environment's `TROUPE_*` variables, then `overrides`; the journal's path is
/// made absolute under the data dir.
pub fn load_config(overrides: Overrides, env: &Environment) -> anyhow::Result<Config> {
    let overlay = match &overrides.config_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some((path.display().to_string(), text))
        }
        None => None,
    };
    let overlay = overlay.as_ref().map(|(origin, text)| (origin.as_str(), text.as_str()));
    let mut config = Config::load(overlay, env.vars())?;
    if let Some(dir) = overrides.data_dir {
        config.data_dir = dir;
    }
    if let Some(bind) = &overrides.bind {
        config.server.bind.clone_from(bind);
    }
    config.tools.journal_path = config.tools.journal_path.under(&config.data_dir);
    Ok(config)
}

/// `--agents`, else `config/agents` when the working directory has one.
pub fn agents_dir(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.or_else(|| {
        let local = Path::new("config/agents");
        local.is_dir().then(|| local.to_path_buf())
    })
}
