//! `http_fetch`: GET or POST an http(s) URL and return its status, content type and
//! body as text. Bounded in time (one limit over connecting, redirects and reading)
//! and in size (reading stops at the limit; the result says the body was cut), and
//! guarded against SSRF: private, loopback, link-local, cloud-metadata and other
//! non-public destinations are refused unless the operator's allow-list names them
//! (see `guard.rs` for where the check happens and why it cannot be raced).
//!
//! An HTTP error status is a result, not a failure: a 404 tells the model something,
//! and failures count towards blocking the tool. Failures (codes the model sees):
//! `invalid_url`, `unsupported_scheme`, `destination_denied`, `too_large` (request
//! body), `too_many_redirects`, `timeout`, `http_error` (connection, TLS or
//! protocol), `cancelled`.

mod guard;

use std::error::Error as StdError;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::dns::Resolve;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};
use troupe_actors::protocol::Fragment;
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

pub use guard::Network;
use guard::{DestinationPolicy, GuardedResolver, Refusal, SystemResolver};

/// Settings of `http_fetch` (`[tools.http_fetch]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpFetchConfig {
    /// Seconds a fetch may take in all: connecting, every redirect, reading the body.
    pub timeout: f64,
    /// Most response body bytes read; the body is cut there and the result says so.
    pub max_response_bytes: usize,
    /// Largest request body (POST) accepted, in bytes.
    pub max_request_bytes: usize,
    /// Redirects followed, each one checked like the first URL; one more fails the call.
    pub max_redirects: usize,
    /// The `User-Agent` header of every request.
    pub user_agent: String,
    /// Host names fetched whatever they resolve to, even a private address: exact
    /// names, or `*.example.internal` for every name under `example.internal`.
    pub allow_hosts: Vec<String>,
    /// Networks (`10.1.0.0/16`, `fd12:3456::/32`, or one address) that may be
    /// connected to although the defaults deny them.
    pub allow_cidrs: Vec<Network>,
}

impl Default for HttpFetchConfig {
    fn default() -> Self {
        Self {
            timeout: 20.0,
            max_response_bytes: 262_144,
            max_request_bytes: 65_536,
            max_redirects: 5,
            user_agent: "troupe-http-fetch/0.1".to_owned(),
            allow_hosts: Vec::new(),
            allow_cidrs: Vec::new(),
        }
    }
}

/// Request headers the model may set; any other is refused (credentials, `Host`,
/// hop-by-hop and proxy headers among them).
const ALLOWED_HEADERS: &[&str] =
    &["accept", "accept-language", "content-type", "cache-control", "if-none-match", "if-modified-since"];

/// Longest URL accepted, in bytes.
const MAX_URL: usize = 4096;

/// The tool's arguments.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct FetchArgs {
    /// The http or https URL.
    #[schemars(length(min = 1, max = MAX_URL))]
    url: String,
    /// GET (the default) or POST.
    #[serde(default)]
    method: Option<FetchMethod>,
    /// Request headers; only accept, accept-language, content-type, cache-control, if-none-match and
    /// if-modified-since are accepted.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 6))]
    headers: Option<std::collections::BTreeMap<String, String>>,
    /// The request body, POST only.
    #[serde(default)]
    body: Option<String>,
}

/// The methods the tool sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
enum FetchMethod {
    /// Read.
    #[serde(rename = "GET")]
    Get,
    /// Send a body.
    #[serde(rename = "POST")]
    Post,
}

/// Characters of the body quoted in the result's citation fragment.
const SNIPPET_CHARS: usize = 280;

/// The tool. Its HTTP client is built on first use (inside the runtime) and kept.
pub struct HttpFetch {
    config: HttpFetchConfig,
    timeout: Duration,
    policy: Arc<DestinationPolicy>,
    lookup: Arc<dyn Resolve>,
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl HttpFetch {
    /// The tool with `config`, resolving names with the system resolver.
    pub fn new(config: HttpFetchConfig) -> Self {
        Self::with_resolver(config, Arc::new(SystemResolver))
    }

    /// The tool resolving names with `lookup` (whose answers are still checked):
    /// tests use it to stand in for a hostile DNS server.
    pub fn with_resolver(config: HttpFetchConfig, lookup: Arc<dyn Resolve>) -> Self {
        let default = HttpFetchConfig::default().timeout;
        let timeout = Duration::try_from_secs_f64(config.timeout).unwrap_or_else(|_| Duration::from_secs_f64(default));
        let policy = Arc::new(DestinationPolicy::new(&config.allow_hosts, &config.allow_cidrs));
        Self { config, timeout, policy, lookup, client: OnceLock::new() }
    }

    fn client(&self) -> Result<&reqwest::Client, ToolError> {
        let client = self.client.get_or_init(|| {
            let resolver = GuardedResolver::new(self.policy.clone(), self.lookup.clone());
            reqwest::Client::builder()
                // A proxy would make the connection, to addresses nobody checked.
                .no_proxy()
                .dns_resolver(resolver)
                .redirect(guard::redirect_policy(self.policy.clone(), self.config.max_redirects))
                .referer(false)
                .connect_timeout(self.timeout)
                .user_agent(self.config.user_agent.clone())
                .build()
                .map_err(|error| error_chain(&error))
        });
        client.as_ref().map_err(|message| ToolError::failed("http_error", format!("no HTTP client: {message}")))
    }

    /// The request the arguments describe, checked.
    fn request(&self, args: &Value) -> Result<reqwest::Request, ToolError> {
        let args: FetchArgs = crate::tools::args::parse_args(args.clone())?;
        let url_text = args.url.as_str();
        if url_text.len() > MAX_URL {
            return Err(ToolError::failed("invalid_url", format!("the URL is longer than {MAX_URL} bytes")));
        }
        let url = Url::parse(url_text)
            .map_err(|error| ToolError::failed("invalid_url", format!("{url_text:?} is not a URL: {error}")))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ToolError::failed("invalid_url", "credentials in the URL are not accepted"));
        }
        self.policy.check_url(&url).map_err(|refusal| refusal_error(&refusal))?;
        let method = match args.method.unwrap_or(FetchMethod::Get) {
            FetchMethod::Get => reqwest::Method::GET,
            FetchMethod::Post => reqwest::Method::POST,
        };
        let body = args.body.as_deref();
        if body.is_some() && method != reqwest::Method::POST {
            return Err(ToolError::InvalidArgs("a body is only sent with POST".to_owned()));
        }
        if let Some(body) = body.filter(|body| body.len() > self.config.max_request_bytes) {
            let limit = self.config.max_request_bytes;
            return Err(ToolError::failed(
                "too_large",
                format!("the body is {} bytes; the limit is {limit}", body.len()),
            ));
        }
        let mut request = reqwest::Request::new(method, url);
        *request.headers_mut() = headers(args.headers.as_ref())?;
        if let Some(body) = body {
            *request.body_mut() = Some(body.to_owned().into());
        }
        Ok(request)
    }

    /// Sends `request` and reads the response within the byte limit.
    async fn fetch(&self, client: &reqwest::Client, request: reqwest::Request) -> Result<Value, ToolError> {
        let mut response = client.execute(request).await.map_err(|error| transport_error(&error))?;
        let location = unfollowed_location(&response);
        if let Some(location) = &location {
            // The client leaves a redirect it cannot follow (to `file:`, say) to
            // us; it is refused as a hop would be.
            self.policy.check_url(location).map_err(|refusal| refusal_error(&refusal))?;
        }
        let limit = self.config.max_response_bytes;
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(|error| transport_error(&error))? {
            let room = limit - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut result = json!({
            "url": response.url().as_str(),
            "status": response.status().as_u16(),
            "content_type": content_type,
            "bytes": body.len(),
            "truncated": truncated,
        });
        if let Some(location) = location {
            result["location"] = json!(location.as_str());
        }
        let mut notes = Vec::new();
        match body_text(&body, &content_type, truncated) {
            Some(text) => result["body"] = json!(text),
            None => {
                result["body"] = Value::Null;
                notes.push(format!("binary content ({content_type}) is not shown"));
            }
        }
        if truncated {
            notes.push(format!("the body was cut at {limit} bytes; the rest was not read"));
        }
        if !notes.is_empty() {
            result["note"] = json!(notes.join("; "));
        }
        Ok(result)
    }
}

#[async_trait]
impl Tool for HttpFetch {
    fn name(&self) -> &str {
        "http_fetch"
    }

    fn description(&self) -> &str {
        "Fetches an http or https URL (GET, or POST with a body) and returns the status, the content type and \
         the body as text, cut at a size limit. Private, loopback and cloud-metadata addresses are refused."
    }

    fn parameters(&self) -> Value {
        troupe_actors::tool::schema_of::<FetchArgs>()
    }

    fn timeout(&self) -> Option<Duration> {
        // Our own limit fires first and says what timed out; this is a backstop.
        Some(self.timeout + Duration::from_secs(5))
    }

    fn describe_start(&self, args: &Value) -> String {
        let method = args.get("method").and_then(Value::as_str).unwrap_or("GET");
        let url = args.get("url").and_then(Value::as_str).unwrap_or_default();
        let host = Url::parse(url).ok().and_then(|url| url.host_str().map(str::to_owned));
        format!("Fetching {method} {}", host.as_deref().unwrap_or("a URL"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let request = self.request(&args)?;
        let client = self.client()?;
        let fetched = tokio::select! {
            () = context.cancel.cancelled() => return Err(ToolError::failed("cancelled", "the run was cancelled")),
            fetched = tokio::time::timeout(self.timeout, self.fetch(client, request)) => fetched,
        };
        let value = fetched.map_err(|_| timeout_error(self.timeout))??;
        let fragments = fragment(&value).into_iter().collect();
        Ok(ToolOutput { value, fragments, ..Default::default() })
    }
}

/// Where a redirect the client did not follow points, resolved against its URL.
fn unfollowed_location(response: &reqwest::Response) -> Option<Url> {
    if !response.status().is_redirection() {
        return None;
    }
    let location = response.headers().get(reqwest::header::LOCATION)?.to_str().ok()?;
    response.url().join(location).ok()
}

/// The request headers of the arguments, restricted to [`ALLOWED_HEADERS`].
fn headers(args: Option<&std::collections::BTreeMap<String, String>>) -> Result<HeaderMap, ToolError> {
    let mut map = HeaderMap::new();
    let Some(headers) = args else { return Ok(map) };
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if !ALLOWED_HEADERS.contains(&lower.as_str()) {
            let allowed = ALLOWED_HEADERS.join(", ");
            return Err(ToolError::InvalidArgs(format!("header {name} is not accepted; only {allowed}")));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| ToolError::InvalidArgs(format!("header {name} has an invalid value")))?;
        map.insert(HeaderName::from_bytes(lower.as_bytes()).map_err(|_| invalid_header(name))?, value);
    }
    Ok(map)
}

fn invalid_header(name: &str) -> ToolError {
    ToolError::InvalidArgs(format!("{name} is not a header name"))
}

/// The body as text, or `None` for binary content. A body cut in the middle of a
/// UTF-8 character loses that character.
fn body_text(body: &[u8], content_type: &str, truncated: bool) -> Option<String> {
    let body = match std::str::from_utf8(body) {
        Err(error) if truncated && error.error_len().is_none() => &body[..error.valid_up_to()],
        _ => body,
    };
    match std::str::from_utf8(body) {
        Ok(text) => Some(text.to_owned()),
        Err(_) if is_text(content_type) => Some(String::from_utf8_lossy(body).into_owned()),
        Err(_) => None,
    }
}

fn is_text(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(essence.as_str(), "application/json" | "application/xml" | "application/javascript")
}

/// A citable fragment of a successful text response.
fn fragment(value: &Value) -> Option<Fragment> {
    let status = value["status"].as_u64()?;
    let body = value["body"].as_str().filter(|_| (200..300).contains(&status))?;
    let url = value["url"].as_str()?.to_owned();
    Some(Fragment {
        id: url.clone(),
        source: url,
        title: String::new(),
        snippet: body.chars().take(SNIPPET_CHARS).collect(),
    })
}

fn refusal_error(refusal: &Refusal) -> ToolError {
    let code = match refusal {
        Refusal::Scheme { .. } => "unsupported_scheme",
        Refusal::NoHost => "invalid_url",
        Refusal::Name { .. } | Refusal::Address { .. } => "destination_denied",
    };
    ToolError::failed(code, refusal.to_string())
}

fn timeout_error(limit: Duration) -> ToolError {
    ToolError::failed("timeout", format!("no complete response within {limit:?}"))
}

/// A failed request as the model sees it: a refusal from the resolver or the
/// redirect policy keeps its own code, wherever the HTTP stack wrapped it.
fn transport_error(error: &reqwest::Error) -> ToolError {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(refusal) = current.downcast_ref::<Refusal>() {
            return refusal_error(refusal);
        }
        if let Some(too_many) = current.downcast_ref::<guard::TooManyRedirects>() {
            return ToolError::failed("too_many_redirects", too_many.to_string());
        }
        source = current.source();
    }
    if error.is_timeout() {
        return ToolError::failed("timeout", error_chain(error));
    }
    ToolError::failed("http_error", error_chain(error))
}

/// `error` with its causes, `outer: inner: innermost`.
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message = format!("{message}: {cause_text}");
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_text_unless_binary() {
        assert_eq!(body_text(b"hello", "", false).as_deref(), Some("hello"));
        assert_eq!(body_text(&[0xff, 0xfe, 0], "image/png", false), None);
        assert_eq!(body_text(&[b'a', 0xff], "text/plain; charset=latin1", false).as_deref(), Some("a\u{fffd}"));
        // "é" is two bytes; a cut after the first drops it.
        assert_eq!(body_text(&[b'a', 0xc3], "application/octet-stream", true).as_deref(), Some("a"));
    }

    #[test]
    fn only_the_allowed_headers_pass() {
        let of = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
        };
        let map = headers(Some(&of(&[("Accept", "text/html"), ("content-type", "application/json")]))).map(|m| m.len());
        assert_eq!(map, Ok(2));
        for refused in [of(&[("Authorization", "Bearer x")]), of(&[("Host", "10.0.0.1")]), of(&[("accept", "a\nb")])] {
            assert!(matches!(headers(Some(&refused)), Err(ToolError::InvalidArgs(_))), "{refused:?}");
        }
    }
}
