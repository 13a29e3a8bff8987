//! Bearer tokens → tenants. Tokens are known only by their SHA-256 (in config) or
//! given through `TROUPE_API_TOKENS`; a presented token is hashed and compared
//! with every known hash in constant time, so neither timing nor the order of the
//! list tells anything about a token.

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Who may call the API (`[auth]`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Tokens by hash; `TROUPE_API_TOKENS` adds more.
    pub tokens: Vec<TokenConfig>,
}

/// One token.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The tenant the token acts for.
    pub tenant: String,
    /// Hex SHA-256 of the token (`troupe hash-token TOKEN` prints it).
    pub sha256: String,
}

/// Why the token set is unusable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthError {
    /// A configured hash is not 64 hex digits.
    #[error("auth.tokens: the sha256 of tenant {0:?} is not 64 hex digits")]
    BadHash(String),
    /// `TROUPE_API_TOKENS` is malformed.
    #[error("TROUPE_API_TOKENS must read tenant=token,tenant=token: {0}")]
    BadEnv(String),
    /// One token is given to two tenants.
    #[error("the same API token is configured for tenants {0:?} and {1:?}")]
    Duplicate(String, String),
    /// No token and no explicit opt-out.
    #[error(
        "no API tokens are configured: set TROUPE_API_TOKENS=\"tenant=token\" (or [auth] tokens in the config), \
         or pass --insecure-no-auth to serve without authentication"
    )]
    NoTokens,
}

/// The tenant a request acts for, put in its extensions by [`require_tenant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// The tenant every request acts for without auth.
pub const OPEN_TENANT: &str = "default";

/// The known tokens.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Vec<([u8; 32], String)>,
    open: bool,
}

/// Hex SHA-256 of `token`.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Auth {
    /// Tokens from config and from `env` (the value of `TROUPE_API_TOKENS`).
    pub fn new(config: &AuthConfig, env: Option<&str>) -> Result<Self, AuthError> {
        let mut tokens = Vec::new();
        for token in &config.tokens {
            let digest = parse_hex(&token.sha256).ok_or_else(|| AuthError::BadHash(token.tenant.clone()))?;
            tokens.push((digest, token.tenant.clone()));
        }
        for pair in env.unwrap_or_default().split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let (tenant, token) = pair
                .split_once('=')
                .filter(|(tenant, token)| !tenant.trim().is_empty() && !token.trim().is_empty())
                .ok_or_else(|| AuthError::BadEnv(format!("{:?} is not tenant=token", redact(pair))))?;
            tokens.push((Sha256::digest(token.trim().as_bytes()).into(), tenant.trim().to_owned()));
        }
        if tokens.is_empty() {
            return Err(AuthError::NoTokens);
        }
        for (index, (digest, tenant)) in tokens.iter().enumerate() {
            if let Some((_, other)) = tokens[index + 1..].iter().find(|(known, _)| known == digest) {
                return Err(AuthError::Duplicate(tenant.clone(), other.clone()));
            }
        }
        Ok(Self { tokens, open: false })
    }

    /// No authentication: every request acts for tenant [`OPEN_TENANT`].
    pub fn open() -> Self {
        Self { tokens: Vec::new(), open: true }
    }

    /// Whether requests are not authenticated.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The tenant of an `Authorization` header value, if it carries a known token.
    pub fn tenant(&self, authorization: Option<&str>) -> Option<String> {
        if self.open {
            return Some(OPEN_TENANT.to_owned());
        }
        let token = authorization?.strip_prefix("Bearer ").map(str::trim)?;
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        // Every hash is compared, whatever matched before.
        for (known, tenant) in &self.tokens {
            if constant_time_eq(known, &presented) {
                found = Some(tenant);
            }
        }
        found.cloned()
    }
}

/// A token known by its SHA-256, as `/metrics` asks for it.
#[derive(Debug, Clone)]
pub struct HashedToken([u8; 32]);

impl HashedToken {
    /// The token whose SHA-256 is `hex` (64 hex digits), if it is one.
    pub fn from_hex(hex: &str) -> Option<Self> {
        parse_hex(hex).map(Self)
    }

    /// Whether an `Authorization` header value carries this token as a bearer.
    pub fn admits(&self, authorization: Option<&str>) -> bool {
        let Some(token) = authorization.and_then(|value| value.strip_prefix("Bearer ")).map(str::trim) else {
            return false;
        };
        constant_time_eq(&self.0, &Sha256::digest(token.as_bytes()).into())
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(out)
}

/// `tenant=***` for messages.
fn redact(pair: &str) -> String {
    match pair.split_once('=') {
        Some((tenant, _)) => format!("{tenant}=***"),
        None => "***".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_from_config_and_environment_map_to_their_tenants() {
        let config = AuthConfig { tokens: vec![TokenConfig { tenant: "acme".into(), sha256: hash_token("s3cret") }] };
        let auth = Auth::new(&config, Some("globex=g-token, initech=i-token")).unwrap();
        assert_eq!(auth.tenant(Some("Bearer s3cret")).as_deref(), Some("acme"));
        assert_eq!(auth.tenant(Some("Bearer g-token")).as_deref(), Some("globex"));
        assert_eq!(auth.tenant(Some("Bearer i-token")).as_deref(), Some("initech"));
        assert_eq!(auth.tenant(Some("Bearer nope")), None);
        assert_eq!(auth.tenant(Some("s3cret")), None, "the Bearer scheme is required");
        assert_eq!(auth.tenant(None), None);
    }

    #[test]
    fn bad_token_settings_are_refused_without_echoing_the_token() {
        let bad = AuthConfig { tokens: vec![TokenConfig { tenant: "acme".into(), sha256: "abc".into() }] };
        assert_eq!(Auth::new(&bad, None).unwrap_err(), AuthError::BadHash("acme".into()));
        let error = Auth::new(&AuthConfig::default(), Some("=leaked")).unwrap_err().to_string();
        assert!(!error.contains("leaked"), "{error}");
        assert_eq!(Auth::new(&AuthConfig::default(), None).unwrap_err(), AuthError::NoTokens);
        let twice = Auth::new(&AuthConfig::default(), Some("a=same,b=same")).unwrap_err();
        assert_eq!(twice, AuthError::Duplicate("a".into(), "b".into()));
    }

    #[test]
    fn open_mode_serves_everyone_as_the_default_tenant() {
        assert_eq!(Auth::open().tenant(None).as_deref(), Some(OPEN_TENANT));
    }
}
