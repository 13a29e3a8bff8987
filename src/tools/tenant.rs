//! Per-tenant files. A tool that keeps data (the mailbox, the journal) keeps each
//! tenant's in files of its own, named by a path template with `{tenant}` in it,
//! so no call of one tenant can reach another's data.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a template must hold.
const PLACEHOLDER: &str = "{tenant}";

/// A path template with `{tenant}` in it, e.g. `tenants/{tenant}/mailbox.db`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPath(String);

impl TenantPath {
    /// `template`, if it holds `{tenant}` (a path without it would give every
    /// tenant the same file).
    pub fn new(template: impl Into<String>) -> Result<Self, String> {
        let template = template.into();
        if template.contains(PLACEHOLDER) {
            Ok(Self(template))
        } else {
            Err(format!("{template:?} must contain {PLACEHOLDER}, so that each tenant has its own file"))
        }
    }

    /// A built-in default (each is checked by a test to hold `{tenant}`).
    pub(crate) fn builtin(template: &'static str) -> Self {
        Self(template.to_owned())
    }

    /// The template, under `dir` when relative.
    pub fn under(&self, dir: &Path) -> Self {
        if Path::new(&self.0).is_absolute() { self.clone() } else { Self(dir.join(&self.0).display().to_string()) }
    }

    /// The file of `tenant`.
    pub fn of(&self, tenant: &str) -> PathBuf {
        PathBuf::from(self.0.replace(PLACEHOLDER, &file_name(tenant)))
    }

    /// The template as written.
    pub fn template(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TenantPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl Serialize for TenantPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// `tenant` as one path component: letters, digits, `-` and `_` as they are, a `.`
/// not in first place, every other byte as `%XX`; two tenants never share a name,
/// and no name climbs out of its folder.
pub fn file_name(tenant: &str) -> String {
    if tenant.is_empty() {
        return "%".to_owned();
    }
    let mut name = String::with_capacity(tenant.len());
    for (at, byte) in tenant.bytes().enumerate() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => name.push(char::from(byte)),
            b'.' if at > 0 => name.push('.'),
            _ => {
                let _ = write!(name, "%{byte:02X}");
            }
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tenant_gets_a_file_of_its_own_inside_its_folder() {
        let path = TenantPath::new("tenants/{tenant}/mailbox.db").unwrap().under(Path::new("/data"));
        assert_eq!(path.of("acme"), Path::new("/data/tenants/acme/mailbox.db"));
        assert_eq!(path.of("../other"), Path::new("/data/tenants/%2E.%2Fother/mailbox.db"));
        assert_eq!(path.of(".."), Path::new("/data/tenants/%2E./mailbox.db"));
        assert_eq!(path.of("a.b c"), Path::new("/data/tenants/a.b%20c/mailbox.db"));
        assert_eq!(path.of("é"), Path::new("/data/tenants/%C3%A9/mailbox.db"));
        assert_ne!(file_name("a%2F"), file_name("a/"), "an escape and what it escapes differ");
        assert_eq!(
            TenantPath::new("/abs/{tenant}.log").unwrap().under(Path::new("/data")).of("x"),
            Path::new("/abs/x.log")
        );
    }

    #[test]
    fn the_defaults_keep_tenants_apart() {
        let config = crate::config::Config::parse(None).unwrap();
        for path in [&config.tools.journal_path, &config.email.mailbox_path] {
            assert!(TenantPath::new(path.template()).is_ok(), "{path:?}");
        }
        assert_eq!(crate::tools::ToolsConfig::default().journal_path, config.tools.journal_path);
        assert_eq!(crate::email::EmailConfig::default().mailbox_path, config.email.mailbox_path);
    }

    #[test]
    fn a_template_without_the_tenant_is_refused() {
        let error = TenantPath::new("mailbox.db").unwrap_err();
        assert!(error.contains("must contain {tenant}"), "{error}");
    }
}
