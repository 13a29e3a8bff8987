//! The `[mcp]` section: which MCP servers to connect to and how patiently. Plain
//! serde data; [`McpConfig::servers`] checks it and turns each server into a
//! [`ServerSpec`] the supervisor runs.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

/// Settings of the MCP client. The timeouts and backoff apply to every server that
/// does not set its own.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Seconds a connection (spawn or connect, then the MCP handshake and the tool
    /// list) may take. At startup the daemon waits this long for each server at most.
    pub connect_timeout: f64,
    /// Seconds an MCP tool call may take.
    pub call_timeout: f64,
    /// Seconds before the first reconnection attempt; doubled after each failure.
    pub backoff_initial: f64,
    /// Longest wait between two reconnection attempts, in seconds.
    pub backoff_max: f64,
    /// Environment variables a stdio server inherits from the daemon (the rest,
    /// API keys included, are not passed on); a server's `env` adds to them.
    pub inherit_env: Vec<String>,
    /// The servers.
    pub servers: Vec<McpServerConfig>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: 30.0,
            call_timeout: 60.0,
            backoff_initial: 0.5,
            backoff_max: 30.0,
            inherit_env: ["HOME", "LANG", "LOGNAME", "PATH", "SHELL", "TERM", "TMPDIR", "USER"]
                .map(str::to_owned)
                .to_vec(),
            servers: Vec::new(),
        }
    }
}

/// How to reach a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio,
    /// Streamable HTTP (MCP 2025-03-26 and later).
    Http,
}

/// One `[[mcp.servers]]` entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Letters, digits, `-` and single `_`; its tools are offered as `NAME__TOOL`.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: TransportKind,
    /// stdio: the program (a path, or a name looked up in `PATH`). Never run by a shell.
    #[serde(default)]
    pub command: Option<String>,
    /// stdio: its arguments, one list item each.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: environment variables set for it, on top of `inherit_env`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// stdio: variables set for it from the daemon's environment, as
    /// `VARIABLE = "DAEMON_VARIABLE"` (for secrets: the config names them only).
    #[serde(default)]
    pub env_from: BTreeMap<String, String>,
    /// http: the endpoint, e.g. `http://127.0.0.1:3001/mcp`.
    #[serde(default)]
    pub url: Option<String>,
    /// http: headers sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// http: headers whose values come from the daemon's environment, as
    /// `Header = "DAEMON_VARIABLE"` (for secrets such as `Authorization`).
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    /// Overrides `mcp.connect_timeout` for this server.
    #[serde(default)]
    pub connect_timeout: Option<f64>,
    /// Overrides `mcp.call_timeout` for this server.
    #[serde(default)]
    pub call_timeout: Option<f64>,
    /// Overrides `mcp.backoff_initial` for this server.
    #[serde(default)]
    pub backoff_initial: Option<f64>,
    /// Overrides `mcp.backoff_max` for this server.
    #[serde(default)]
    pub backoff_max: Option<f64>,
}

/// Why the `[mcp]` section cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("mcp server {server}: {message}")]
pub struct McpConfigError {
    /// The server's name as configured.
    pub server: String,
    /// What is wrong.
    pub message: String,
}

/// A checked server: what the supervisor runs.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// Its name (the prefix of its tools).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Limit on a connection attempt.
    pub connect_timeout: Duration,
    /// Limit on a tool call.
    pub call_timeout: Duration,
    /// First reconnection delay.
    pub backoff_initial: Duration,
    /// Longest reconnection delay.
    pub backoff_max: Duration,
}

/// A checked transport.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A child process.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its whole environment: the inherited variables plus the configured ones.
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
        /// Sent with every request.
        headers: HeaderMap,
    },
}

impl McpConfig {
    /// The checked servers. `env` looks up the daemon's variables named in
    /// `inherit_env` (only `main.rs` reads the environment).
    pub fn servers(&self, env: impl Fn(&str) -> Option<String>) -> Result<Vec<ServerSpec>, McpConfigError> {
        let mut specs: Vec<ServerSpec> = Vec::new();
        for server in &self.servers {
            let spec = self.check(server, &env)?;
            if specs.iter().any(|other| other.name == spec.name) {
                return Err(invalid(&server.name, "is configured twice"));
            }
            specs.push(spec);
        }
        Ok(specs)
    }

    fn check(
        &self,
        server: &McpServerConfig,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<ServerSpec, McpConfigError> {
        let name = &server.name;
        if !valid_server_name(name) {
            return Err(invalid(
                name,
                "a name is letters, digits, '-' and single '_' (tools are offered as NAME__TOOL)",
            ));
        }
        let transport = match server.transport {
            TransportKind::Stdio => {
                let command = server.command.clone().filter(|command| !command.trim().is_empty());
                let Some(command) = command else { return Err(invalid(name, "a stdio server needs a command")) };
                if server.url.is_some() || !server.headers.is_empty() || !server.headers_from_env.is_empty() {
                    return Err(invalid(name, "url and headers are for http servers"));
                }
                let mut variables: BTreeMap<String, String> =
                    self.inherit_env.iter().filter_map(|key| Some((key.clone(), env(key)?))).collect();
                variables.extend(server.env.clone());
                variables.extend(from_env(name, &server.env_from, env)?);
                Transport::Stdio { command, args: server.args.clone(), env: variables }
            }
            TransportKind::Http => {
                let Some(url) = server.url.clone() else { return Err(invalid(name, "an http server needs a url")) };
                match reqwest::Url::parse(&url) {
                    Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                    _ => return Err(invalid(name, &format!("url {url:?} is not an http(s) URL"))),
                }
                if server.command.is_some()
                    || !server.args.is_empty()
                    || !server.env.is_empty()
                    || !server.env_from.is_empty()
                {
                    return Err(invalid(name, "command, args and env are for stdio servers"));
                }
                let mut all = server.headers.clone();
                all.extend(from_env(name, &server.headers_from_env, env)?);
                Transport::Http { url, headers: headers(name, &all)? }
            }
        };
        Ok(ServerSpec {
            name: name.clone(),
            transport,
            connect_timeout: seconds(name, "connect_timeout", server.connect_timeout.unwrap_or(self.connect_timeout))?,
            call_timeout: seconds(name, "call_timeout", server.call_timeout.unwrap_or(self.call_timeout))?,
            backoff_initial: seconds(name, "backoff_initial", server.backoff_initial.unwrap_or(self.backoff_initial))?,
            backoff_max: seconds(name, "backoff_max", server.backoff_max.unwrap_or(self.backoff_max))?,
        })
    }
}

/// `key = value of the daemon's variable` for each `key = "VARIABLE"`; a variable
/// that is not set is an error that names it (never a value).
fn from_env(
    server: &str,
    names: &BTreeMap<String, String>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, McpConfigError> {
    names
        .iter()
        .map(|(key, variable)| match env(variable) {
            Some(value) => Ok((key.clone(), value)),
            None => {
                Err(invalid(server, &format!("{key} comes from the environment variable {variable}, which is not set")))
            }
        })
        .collect()
}

/// Letters, digits, `-`, and `_` that is not doubled nor last: `__` separates the
/// server from the tool in the names the model sees.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
}

fn headers(server: &str, configured: &BTreeMap<String, String>) -> Result<HeaderMap, McpConfigError> {
    let mut headers = HeaderMap::new();
    for (key, value) in configured {
        let name = HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| invalid(server, &format!("{key:?} is not a header name")))?;
        // The value may be a secret: it is never echoed back.
        let mut value =
            HeaderValue::from_str(value).map_err(|_| invalid(server, &format!("header {key} has an invalid value")))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(headers)
}

fn seconds(server: &str, key: &str, value: f64) -> Result<Duration, McpConfigError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|duration| !duration.is_zero())
        .ok_or_else(|| invalid(server, &format!("{key} must be a positive number of seconds")))
}

fn invalid(server: &str, message: &str) -> McpConfigError {
    McpConfigError { server: server.to_owned(), message: message.to_owned() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::Config;

    fn servers(text: &str) -> Result<Vec<ServerSpec>, String> {
        let config = Config::parse(Some(("test.toml", text))).map_err(|error| error.to_string())?;
        config.mcp.servers(|name| (name == "PATH").then(|| "/bin".to_owned())).map_err(|error| error.to_string())
    }

    #[test]
    fn a_stdio_server_gets_only_the_inherited_variables_and_its_own() {
        let specs = servers(
            "[mcp]\ncall_timeout = 5.0\n[[mcp.servers]]\nname = \"time\"\ntransport = \"stdio\"\ncommand = \"uvx\"\nargs = [\"mcp-server-time\"]\nenv = { TZ = \"UTC\" }\ncall_timeout = 2.0\n",
        )
        .unwrap();
        let Transport::Stdio { command, args, env } = &specs[0].transport else { panic!("stdio") };
        assert_eq!((command.as_str(), args.as_slice()), ("uvx", ["mcp-server-time".to_owned()].as_slice()));
        assert_eq!(
            env.iter().collect::<Vec<_>>(),
            [(&"PATH".to_owned(), &"/bin".to_owned()), (&"TZ".to_owned(), &"UTC".to_owned())]
        );
        assert_eq!(specs[0].call_timeout, Duration::from_secs(2), "the server's own value wins");
        assert_eq!(specs[0].backoff_max, Duration::from_secs(30));
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            ("name = \"a.b\"\ntransport = \"stdio\"\ncommand = \"x\"", "letters, digits"),
            ("name = \"a__b\"\ntransport = \"stdio\"\ncommand = \"x\"", "single '_'"),
            ("name = \"a\"\ntransport = \"stdio\"", "needs a command"),
            ("name = \"a\"\ntransport = \"http\"", "needs a url"),
            ("name = \"a\"\ntransport = \"http\"\nurl = \"ftp://x\"", "not an http(s) URL"),
            ("name = \"a\"\ntransport = \"http\"\nurl = \"http://x/mcp\"\ncommand = \"x\"", "for stdio servers"),
            (
                "name = \"a\"\ntransport = \"http\"\nurl = \"http://x/mcp\"\nheaders = { \"a b\" = \"1\" }",
                "not a header name",
            ),
            ("name = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\nconnect_timeout = 0.0", "connect_timeout must be"),
            ("name = \"a\"\ntransport = \"pipe\"\ncommand = \"x\"", "unknown variant"),
            ("name = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\nshell = true", "unknown field"),
        ];
        for (server, expected) in cases {
            let error = servers(&format!("[[mcp.servers]]\n{server}\n")).unwrap_err();
            assert!(error.contains(expected), "{server}: {error}");
        }
        let twice = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\n";
        assert!(servers(&format!("{twice}{twice}")).unwrap_err().contains("configured twice"));
    }

    #[test]
    fn secrets_come_from_the_environment_by_name() {
        let env = |name: &str| match name {
            "MCP_TOKEN" => Some("Bearer s3cret".to_owned()),
            "MCP_KEY" => Some("k3y".to_owned()),
            _ => None,
        };
        let text = "[[mcp.servers]]\nname = \"remote\"\ntransport = \"http\"\nurl = \"http://x/mcp\"\nheaders_from_env = { Authorization = \"MCP_TOKEN\" }\n\
                    [[mcp.servers]]\nname = \"local\"\ntransport = \"stdio\"\ncommand = \"x\"\nenv_from = { API_KEY = \"MCP_KEY\" }\n";
        let config = Config::parse(Some(("test.toml", text))).unwrap();
        let specs = config.mcp.servers(env).unwrap();
        let Transport::Http { headers, .. } = &specs[0].transport else { panic!("http") };
        assert_eq!(headers.get("authorization").map(|value| value.to_str().unwrap()), Some("Bearer s3cret"));
        let Transport::Stdio { env: variables, .. } = &specs[1].transport else { panic!("stdio") };
        assert_eq!(variables.get("API_KEY").map(String::as_str), Some("k3y"));
        let missing = config.mcp.servers(|_| None).unwrap_err().to_string();
        assert!(missing.contains("MCP_TOKEN") && missing.contains("not set"), "{missing}");
    }
}
