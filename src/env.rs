//! The process environment, read once and in one place: the only module of the
//! package that calls `std::env::var*` (clippy's `disallowed-methods` keeps it
//! so). Everything else gets an [`Environment`], which tests build from a list.

use crate::llm::EnvModel;

/// The environment's values troupe reads, taken once at start.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `OPENAI_BASE_URL`: where the environment's model is served.
    pub openai_base_url: Option<String>,
    /// `OPENAI_API_KEY`: the key of the environment's model.
    pub openai_api_key: Option<String>,
    /// `TROUPE_MODEL`: the environment's model id.
    pub model: Option<String>,
    /// `TROUPE_API_TOKENS`: API tokens given in the environment (`serve`).
    pub api_tokens: Option<String>,
    /// Every variable, in the process's order: the `TROUPE_*` config overrides,
    /// and the variables the config names (a provider's `api_key_env`, an MCP
    /// server's `api_key_env` and `headers_from_env`).
    vars: Vec<(String, String)>,
}

impl Environment {
    /// The environment of this process. A variable that is not UTF-8 cannot be
    /// a troupe setting; it is skipped.
    #[allow(clippy::disallowed_methods)]
    pub fn from_process() -> Self {
        Self::from_vars(
            std::env::vars_os().filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?))),
        )
    }

    /// An environment of these variables (for tests).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let get = |name: &str| vars.iter().find(|(var, _)| var == name).map(|(_, value)| value.clone());
        Self {
            openai_base_url: get("OPENAI_BASE_URL"),
            openai_api_key: get("OPENAI_API_KEY"),
            model: get("TROUPE_MODEL"),
            api_tokens: get("TROUPE_API_TOKENS"),
            vars,
        }
    }

    /// The value of variable `name`, if it is set.
    pub fn var(&self, name: &str) -> Option<String> {
        self.vars.iter().find(|(var, _)| var == name).map(|(_, value)| value.clone())
    }

    /// Every variable, in the process's order (for `Config::load`).
    pub fn vars(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.vars.iter().cloned()
    }

    /// The model the environment names (`OPENAI_*`, `TROUPE_MODEL`).
    pub fn model(&self) -> EnvModel {
        EnvModel {
            base_url: self.openai_base_url.clone(),
            api_key: self.openai_api_key.clone(),
            model: self.model.clone(),
            http_proxy: ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
                .iter()
                .any(|name| self.var(name).is_some_and(|value| !value.is_empty())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_for_plain_http_is_seen_in_either_case_and_an_empty_one_is_none() {
        let proxied = |vars: &[(&str, &str)]| {
            Environment::from_vars(vars.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())))
                .model()
                .http_proxy
        };
        assert!(proxied(&[("http_proxy", "http://proxy:3128")]));
        assert!(proxied(&[("ALL_PROXY", "socks5://proxy:1080")]));
        assert!(!proxied(&[("HTTP_PROXY", "")]));
        assert!(!proxied(&[("HTTPS_PROXY", "http://proxy:3128")]), "HTTPS providers go through reqwest anyway");
    }
}
