//! Where `http_fetch` may connect (SSRF protection). A [`DestinationPolicy`] denies
//! private, loopback, link-local, shared (CGNAT), documentation, reserved, multicast
//! and cloud-metadata addresses, and the names of cloud metadata services
//! (`metadata.google.internal`…), unless the operator's allow-list names the host
//! or the network. `localhost` is denied on the addresses it resolves to.
//!
//! It is enforced on the addresses actually connected to, at three points that
//! together cover every connection the HTTP client makes:
//! - [`GuardedResolver`]: every host name is resolved through it, and the addresses
//!   it returns (all of them checked) are the only ones the client connects to, so
//!   a name cannot resolve to one address when checked and another when used;
//! - [`DestinationPolicy::check_url`], before the request: an address written in
//!   the URL never reaches a resolver, so it is checked here;
//! - [`redirect_policy`]: each redirect hop's URL is checked the same way (its
//!   names then go through the resolver), hops are counted, and a hop to a scheme
//!   other than http or https is refused.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde::Deserialize;

/// An IP network: an address and a prefix length (`10.0.0.0/8`, `fd00::/8`; a bare
/// address is a network of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self { address: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self { address: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix }
    }

    /// Whether `ip` is in this network (an IPv4 network never holds an IPv6 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(network), IpAddr::V4(ip)) => {
                same_prefix(u32::from(network).into(), u32::from(ip).into(), 32 - self.prefix)
            }
            (IpAddr::V6(network), IpAddr::V6(ip)) => {
                same_prefix(u128::from(network), u128::from(ip), 128 - self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether `a` and `b` agree on all but their last `host_bits` bits.
fn same_prefix(a: u128, b: u128, host_bits: u8) -> bool {
    let shift = u32::from(host_bits);
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

impl FromStr for Network {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let invalid = || format!("{text:?} is not an IP network (such as 10.1.0.0/16, fd12::/16 or 192.0.2.7)");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address.trim().parse().map_err(|_| invalid())?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix.trim().parse::<u8>().ok().filter(|prefix| *prefix <= bits).ok_or_else(invalid)?,
            None => bits,
        };
        Ok(Self { address, prefix })
    }
}

impl TryFrom<String> for Network {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Addresses denied by default, each with the reason the model is told; the first
/// match wins, so the cloud-metadata addresses come before the ranges that hold
/// them. IPv4-mapped, NAT64 and 6to4 IPv6 addresses are checked as the IPv4
/// address they reach (see [`embedded_ipv4`]).
const DENIED: &[(Network, &str)] = &[
    (Network::v4(169, 254, 169, 254, 32), "a cloud metadata address"),
    (Network::v4(100, 100, 100, 200, 32), "a cloud metadata address"),
    (Network::v4(168, 63, 129, 16, 32), "a cloud metadata address"),
    (Network::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128), "a cloud metadata address"),
    (Network::v4(0, 0, 0, 0, 8), "an unspecified (this-network) address"),
    (Network::v4(10, 0, 0, 0, 8), "a private address"),
    (Network::v4(100, 64, 0, 0, 10), "a shared (CGNAT) address"),
    (Network::v4(127, 0, 0, 0, 8), "a loopback address"),
    (Network::v4(169, 254, 0, 0, 16), "a link-local address"),
    (Network::v4(172, 16, 0, 0, 12), "a private address"),
    (Network::v4(192, 0, 0, 0, 24), "a protocol-assignment address"),
    (Network::v4(192, 0, 2, 0, 24), "a documentation address"),
    (Network::v4(192, 88, 99, 0, 24), "a relay anycast address"),
    (Network::v4(192, 168, 0, 0, 16), "a private address"),
    (Network::v4(198, 18, 0, 0, 15), "a benchmarking address"),
    (Network::v4(198, 51, 100, 0, 24), "a documentation address"),
    (Network::v4(203, 0, 113, 0, 24), "a documentation address"),
    (Network::v4(224, 0, 0, 0, 4), "a multicast address"),
    (Network::v4(255, 255, 255, 255, 32), "the broadcast address"),
    (Network::v4(240, 0, 0, 0, 4), "a reserved address"),
    (Network::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "the unspecified address"),
    (Network::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "a loopback address"),
    (Network::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "a private (unique local) address"),
    (Network::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "a link-local address"),
    (Network::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "a multicast address"),
    (Network::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), "a Teredo tunnel address"),
    (Network::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), "a benchmarking address"),
    (Network::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "a documentation address"),
    (Network::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "a documentation address"),
];

/// Global unicast IPv6 (`2000::/3`); anything outside it that is not an embedded
/// IPv4 address is special-purpose or unassigned, so it is denied.
const IPV6_GLOBAL: Network = Network::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// Names denied by default whatever they resolve to: the metadata services of the
/// clouds (their addresses are denied too; the names make the refusal clear).
const DENIED_NAMES: &[&str] = &["metadata", "metadata.google.internal", "metadata.goog", "instance-data"];

/// Why `ip` is denied by default, or `None` for a public address.
pub fn default_denial(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    };
    if let Some((_, reason)) = DENIED.iter().find(|(network, _)| network.contains(ip)) {
        return Some(reason);
    }
    match ip {
        IpAddr::V6(_) if !IPV6_GLOBAL.contains(ip) => Some("a special-purpose IPv6 address"),
        _ => None,
    }
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (`::ffff:a.b.c.d`),
/// NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`) addresses reach the
/// IPv4 address inside them. (IPv4-compatible `::a.b.c.d` is deprecated and lies
/// outside `2000::/3`, so it is denied whatever it holds.)
fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let last_32_bits = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    match ip.segments() {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(last_32_bits),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last_32_bits),
        [0x2002, high, low, ..] => Some(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low))),
        _ => None,
    }
}

/// Why a destination is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The URL's scheme is neither http nor https.
    #[error("the scheme {scheme:?} is not supported; only http and https")]
    Scheme {
        /// The scheme.
        scheme: String,
    },
    /// The URL has no host.
    #[error("the URL has no host")]
    NoHost,
    /// The host name is denied whatever it resolves to.
    #[error("{host} is denied: it names a cloud metadata service")]
    Name {
        /// The host.
        host: String,
    },
    /// The host is, or resolves to, a denied address.
    #[error("{host} is denied: {address} is {reason}")]
    Address {
        /// The host as written (a name or an address).
        host: String,
        /// The denied address.
        address: IpAddr,
        /// Why.
        reason: &'static str,
    },
}

/// The operator's allow-list over the default denials.
#[derive(Debug, Clone, Default)]
pub struct DestinationPolicy {
    /// Lowercase names without a trailing dot; `*.suffix` entries kept as `.suffix`.
    allow_hosts: Vec<String>,
    allow_networks: Vec<Network>,
}

impl DestinationPolicy {
    /// A policy allowing `allow_hosts` (exact names, or `*.example.internal` for every
    /// name under it) whatever they resolve to, and the addresses in `allow_networks`.
    pub fn new(allow_hosts: &[String], allow_networks: &[Network]) -> Self {
        let allow_hosts = allow_hosts
            .iter()
            .map(|host| {
                let host = normalize_host(host);
                host.strip_prefix('*').map(str::to_owned).unwrap_or(host)
            })
            .collect();
        Self { allow_hosts, allow_networks: allow_networks.to_vec() }
    }

    /// Checks a URL before it is requested or followed: its scheme, its host name,
    /// and an address written in it (no resolver sees that one).
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Scheme { scheme: url.scheme().to_owned() });
        }
        let host = url.host_str().filter(|host| !host.is_empty()).ok_or(Refusal::NoHost)?;
        if self.host_allowed(host) {
            return Ok(());
        }
        // The url crate writes IPv6 hosts in brackets and normalises IPv4 forms
        // such as `2130706433` or `127.1` to dotted quads.
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(address) => self.check_address(host, address),
            Err(_) => self.check_name(host),
        }
    }

    /// Checks a host name before it is resolved.
    pub fn check_name(&self, host: &str) -> Result<(), Refusal> {
        let name = normalize_host(host);
        if DENIED_NAMES.contains(&name.as_str()) && !self.host_allowed(host) {
            return Err(Refusal::Name { host: host.to_owned() });
        }
        Ok(())
    }

    /// Checks the addresses `host` resolved to: all must pass, since the client
    /// may connect to any of them.
    pub fn check_resolved(&self, host: &str, addresses: impl IntoIterator<Item = IpAddr>) -> Result<(), Refusal> {
        if self.host_allowed(host) {
            return Ok(());
        }
        addresses.into_iter().try_for_each(|address| self.check_address(host, address))
    }

    /// Checks one address `host` stands for.
    pub fn check_address(&self, host: &str, address: IpAddr) -> Result<(), Refusal> {
        let Some(reason) = default_denial(address) else { return Ok(()) };
        let canonical = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            IpAddr::V4(_) => address,
        };
        let allowed =
            self.allow_networks.iter().any(|network| network.contains(address) || network.contains(canonical));
        if allowed { Ok(()) } else { Err(Refusal::Address { host: host.to_owned(), address, reason }) }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.allow_hosts.iter().any(|allowed| match allowed.strip_prefix('.') {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(allowed.as_str()),
            None => host == *allowed,
        })
    }
}

/// A host as compared: lowercase, brackets and a trailing dot removed.
fn normalize_host(host: &str) -> String {
    host.trim().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase()
}

/// The resolver of `http_fetch`'s client: resolves with `lookup`, then hands the
/// client only addresses the policy accepts, so what was checked is what is
/// connected to.
pub struct GuardedResolver {
    policy: Arc<DestinationPolicy>,
    lookup: Arc<dyn Resolve>,
}

impl GuardedResolver {
    /// `lookup` checked by `policy`.
    pub fn new(policy: Arc<DestinationPolicy>, lookup: Arc<dyn Resolve>) -> Self {
        Self { policy, lookup }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let lookup = self.lookup.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            policy.check_name(&host)?;
            let addresses: Vec<SocketAddr> = lookup.resolve(name).await?.collect();
            policy.check_resolved(&host, addresses.iter().map(SocketAddr::ip))?;
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// The system's resolver (`getaddrinfo`, on a blocking thread).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// A redirect chain longer than the configured limit.
#[derive(Debug, thiserror::Error)]
#[error("more than {0} redirects")]
pub struct TooManyRedirects(pub usize);

/// Follows at most `max_redirects` redirects, each to a URL the policy accepts.
pub fn redirect_policy(policy: Arc<DestinationPolicy>, max_redirects: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        // `previous` starts with the first URL, which is not a redirect.
        if attempt.previous().len() > max_redirects {
            return attempt.error(TooManyRedirects(max_redirects));
        }
        match policy.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(refusal) => attempt.error(refusal),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn denied(ip: &str) -> bool {
        default_denial(ip.parse().unwrap()).is_some()
    }

    #[test]
    fn private_loopback_link_local_metadata_and_special_addresses_are_denied() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "100.100.100.200",
            "168.63.129.16",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "::",
            "::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(denied(ip), "{ip} should be denied");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in ["93.184.215.14", "8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"] {
            assert!(!denied(ip), "{ip} should pass");
        }
    }

    #[test]
    fn metadata_addresses_are_named_as_such() {
        assert_eq!(default_denial("169.254.169.254".parse().unwrap()), Some("a cloud metadata address"));
        assert_eq!(default_denial("fd00:ec2::254".parse().unwrap()), Some("a cloud metadata address"));
    }

    #[test]
    fn networks_parse_and_contain() {
        let network: Network = "10.1.0.0/16".parse().unwrap();
        assert!(network.contains("10.1.200.3".parse().unwrap()));
        assert!(!network.contains("10.2.0.1".parse().unwrap()));
        assert!(!network.contains("::1".parse().unwrap()));
        let single: Network = "127.0.0.1".parse().unwrap();
        assert_eq!(single.to_string(), "127.0.0.1/32");
        assert!(single.contains("127.0.0.1".parse().unwrap()) && !single.contains("127.0.0.2".parse().unwrap()));
        let everything: Network = "::/0".parse().unwrap();
        assert!(everything.contains("2001:db8::1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/", "::/129", ""] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn urls_are_checked_by_scheme_name_and_written_address() {
        let policy = DestinationPolicy::default();
        assert!(policy.check_url(&url("https://example.com/a")).is_ok());
        assert!(matches!(policy.check_url(&url("file:///etc/passwd")), Err(Refusal::Scheme { .. })));
        assert!(matches!(policy.check_url(&url("ftp://example.com/")), Err(Refusal::Scheme { .. })));
        for denied in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://127.1/",
            "http://0x7f.0.0.1/",
            "http://[::1]:8080/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
        ] {
            assert!(matches!(policy.check_url(&url(denied)), Err(Refusal::Address { .. })), "{denied}");
        }
        for name in ["http://metadata.google.internal/", "http://METADATA.google.internal./", "http://metadata/"] {
            assert!(matches!(policy.check_url(&url(name)), Err(Refusal::Name { .. })), "{name}");
        }
    }

    #[test]
    fn the_allow_list_admits_named_hosts_and_networks_only() {
        let policy = DestinationPolicy::new(
            &["internal-api.corp".to_owned(), "*.svc.cluster.local".to_owned()],
            &["10.1.0.0/16".parse().unwrap(), "127.0.0.1".parse().unwrap()],
        );
        let ten_one: IpAddr = "10.1.2.3".parse().unwrap();
        let ten_two: IpAddr = "10.2.0.1".parse().unwrap();
        assert!(policy.check_resolved("internal-api.corp", [ten_two]).is_ok());
        assert!(policy.check_resolved("INTERNAL-API.corp.", [ten_two]).is_ok());
        assert!(policy.check_resolved("db.svc.cluster.local", [ten_two]).is_ok());
        assert!(policy.check_resolved("svc.cluster.local", [ten_two]).is_err(), "the wildcard covers names under it");
        assert!(policy.check_resolved("other.corp", [ten_one]).is_ok());
        assert!(policy.check_resolved("other.corp", [ten_one, ten_two]).is_err(), "every address must pass");
        assert!(policy.check_url(&url("http://127.0.0.1:9/")).is_ok());
        assert!(policy.check_url(&url("http://[::ffff:127.0.0.1]:9/")).is_ok());
        assert!(policy.check_url(&url("http://127.0.0.2/")).is_err());
        assert!(policy.check_url(&url("http://169.254.169.254/")).is_err());
    }

    /// Answers every name with fixed addresses, like a DNS server an attacker runs.
    struct FixedResolver(Vec<IpAddr>);

    impl Resolve for FixedResolver {
        fn resolve(&self, _name: Name) -> Resolving {
            let addresses: Vec<SocketAddr> = self.0.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
            Box::pin(async move { Ok(Box::new(addresses.into_iter()) as Addrs) })
        }
    }

    async fn resolve(policy: DestinationPolicy, answer: &[&str], host: &str) -> Result<Vec<SocketAddr>, String> {
        let answer = answer.iter().map(|ip| ip.parse().unwrap()).collect();
        let resolver = GuardedResolver::new(Arc::new(policy), Arc::new(FixedResolver(answer)));
        match resolver.resolve(host.parse().unwrap()).await {
            Ok(addresses) => Ok(addresses.collect()),
            Err(error) => Err(error.to_string()),
        }
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_that_resolve_to_denied_addresses() {
        let error = resolve(DestinationPolicy::default(), &["127.0.0.1"], "innocent.example").await.unwrap_err();
        assert_eq!(error, "innocent.example is denied: 127.0.0.1 is a loopback address");
        let error = resolve(DestinationPolicy::default(), &["93.184.215.14", "10.0.0.1"], "mixed.example").await;
        assert!(error.unwrap_err().contains("10.0.0.1"));
        let error = resolve(DestinationPolicy::default(), &["93.184.215.14"], "metadata.google.internal").await;
        assert!(error.unwrap_err().contains("cloud metadata service"));
        let addresses = resolve(DestinationPolicy::default(), &["93.184.215.14"], "example.com").await.unwrap();
        assert_eq!(addresses, vec!["93.184.215.14:0".parse().unwrap()]);
        let allowed = DestinationPolicy::new(&["innocent.example".to_owned()], &[]);
        assert!(resolve(allowed, &["127.0.0.1"], "innocent.example").await.is_ok());
    }
}
