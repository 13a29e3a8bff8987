//! `http_fetch` against local servers on 127.0.0.1 (allowed through the allow-list
//! where a test needs to reach them): SSRF denials of addresses, names and redirect
//! hops, a successful fetch, the size and time limits, and a whole run. Nothing
//! here reaches the internet: denied destinations are refused before any connect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures::StreamExt;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::{Value, json};
use troupe::tools::{HttpFetch, HttpFetchConfig, ToolsConfig, builtin_registry};
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::protocol::{EventKind, RunEvent, RunStatus};
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{ScriptedModel, calls, text};
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};
use troupe_actors::{Deps, Runtime, SubmitRequest};

/// A local server: plain text, an echo, an endless body, a server that never
/// answers, one that stalls mid-body, and redirects.
async fn server() -> SocketAddr {
    let endless = || {
        let chunk = Bytes::from(vec![b'a'; 8192]);
        Body::from_stream(futures::stream::repeat(chunk).map(Ok::<_, std::io::Error>))
    };
    let app = Router::new()
        .route("/hello", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "hello from 127.0.0.1") }))
        .route("/echo", post(echo))
        .route("/endless", get(move || async move { endless() }))
        .route("/stall", get(std::future::pending::<&'static str>))
        .route("/stall-body", get(stall_body))
        .route("/redirect", get(redirect))
        .route("/loop", get(|| async { redirect_to("/loop") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

async fn echo(headers: HeaderMap, body: String) -> impl IntoResponse {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("none").to_owned();
    let user_agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("none").to_owned();
    axum::Json(json!({"body": body, "content_type": content_type, "user_agent": user_agent}))
}

/// Headers and a first chunk, then nothing, forever.
async fn stall_body() -> Response {
    let first = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"partial")) });
    let body = first.chain(futures::stream::pending());
    ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(body)).into_response()
}

async fn redirect(Query(query): Query<std::collections::HashMap<String, String>>) -> Response {
    redirect_to(query.get("to").map_or("/hello", String::as_str))
}

fn redirect_to(location: &str) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, location.to_owned())]).into_response()
}

fn allowing_loopback() -> HttpFetchConfig {
    HttpFetchConfig { allow_cidrs: vec!["127.0.0.1/32".parse().unwrap()], ..HttpFetchConfig::default() }
}

fn context() -> ToolContext {
    troupe_actors::testing::tool_context("default")
}

async fn fetch(tool: &HttpFetch, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(context(), args).await
}

fn failure(result: Result<ToolOutput, ToolError>) -> (String, String) {
    match result {
        Err(ToolError::Failed { code, message }) => (code, message),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn private_loopback_and_metadata_addresses_are_denied_by_default() {
    let tool = HttpFetch::new(HttpFetchConfig::default());
    for url in [
        "http://127.0.0.1/",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
    ] {
        let (code, message) = failure(fetch(&tool, json!({"url": url})).await);
        assert_eq!(code, "destination_denied", "{url}: {message}");
    }
    let (code, message) = failure(fetch(&tool, json!({"url": "http://169.254.169.254/"})).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("destination_denied", "169.254.169.254 is denied: 169.254.169.254 is a cloud metadata address")
    );
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_denied_after_resolution() {
    // `localhost` is refused by name before it is resolved; this name is not, so
    // the check that stops it is the one on the resolved address.
    let server = server().await;
    let tool = HttpFetch::with_resolver(HttpFetchConfig::default(), Arc::new(Fixed(server.ip())));
    let (code, message) =
        failure(fetch(&tool, json!({"url": format!("http://innocent.example:{}/hello", server.port())})).await);
    assert_eq!(code, "destination_denied");
    assert!(message.contains("127.0.0.1 is a loopback address"), "{message}");
    // The same name reaches the server once the operator allows it.
    let allowed = HttpFetchConfig { allow_hosts: vec!["innocent.example".into()], ..HttpFetchConfig::default() };
    let tool = HttpFetch::with_resolver(allowed, Arc::new(Fixed(server.ip())));
    let output = fetch(&tool, json!({"url": format!("http://innocent.example:{}/hello", server.port())})).await;
    assert_eq!(output.unwrap().value["body"], "hello from 127.0.0.1");
}

#[tokio::test]
async fn localhost_is_denied_on_the_addresses_the_system_resolver_gives() {
    let server = server().await;
    let tool = HttpFetch::new(HttpFetchConfig::default());
    let (code, message) =
        failure(fetch(&tool, json!({"url": format!("http://localhost:{}/hello", server.port())})).await);
    assert_eq!(code, "destination_denied");
    assert!(message.starts_with("localhost is denied:") && message.contains("is a loopback address"), "{message}");
}

/// Resolves every name to one address, like a hostile DNS server.
struct Fixed(IpAddr);

impl Resolve for Fixed {
    fn resolve(&self, _name: Name) -> Resolving {
        let address = SocketAddr::new(self.0, 0);
        Box::pin(async move { Ok(Box::new(std::iter::once(address)) as Addrs) })
    }
}

#[tokio::test]
async fn an_allowed_server_is_fetched_with_status_type_and_body() {
    let server = server().await;
    let tool = HttpFetch::new(allowing_loopback());
    let output = fetch(&tool, json!({"url": format!("http://{server}/hello")})).await.unwrap();
    assert_eq!(output.value["status"], 200);
    assert_eq!(output.value["content_type"], "text/plain");
    assert_eq!(output.value["body"], "hello from 127.0.0.1");
    assert_eq!(output.value["truncated"], false);
    assert_eq!(output.fragments.len(), 1, "a text page is citable");
    assert_eq!(output.fragments[0].source, format!("http://{server}/hello"));

    let posted = json!({
        "url": format!("http://{server}/echo"),
        "method": "POST",
        "headers": {"Content-Type": "application/json"},
        "body": "{\"q\": 1}"
    });
    let output = fetch(&tool, posted).await.unwrap();
    let echoed: Value = serde_json::from_str(output.value["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        echoed,
        json!({"body": "{\"q\": 1}", "content_type": "application/json", "user_agent": "troupe-http-fetch/0.1"})
    );

    let missing = fetch(&tool, json!({"url": format!("http://{server}/missing")})).await.unwrap();
    assert_eq!(missing.value["status"], 404, "an HTTP error status is a result");
}

#[tokio::test]
async fn a_redirect_to_a_private_or_metadata_address_is_refused_at_the_hop() {
    let server = server().await;
    let tool = HttpFetch::new(allowing_loopback());
    for target in ["http://10.0.0.1/admin", "http://169.254.169.254/latest/meta-data/", "http://[::ffff:10.0.0.1]/"] {
        let url = format!("http://{server}/redirect?to={target}");
        let (code, message) = failure(fetch(&tool, json!({"url": url})).await);
        assert_eq!(code, "destination_denied", "{target}: {message}");
    }
    // A hop to a name is checked on the addresses it resolves to.
    let tool = HttpFetch::with_resolver(allowing_loopback(), Arc::new(Fixed("10.0.0.1".parse().unwrap())));
    let url = format!("http://{server}/redirect?to=http://intranet.example/");
    let (code, message) = failure(fetch(&tool, json!({"url": url})).await);
    assert_eq!(code, "destination_denied");
    assert!(message.contains("10.0.0.1 is a private address"), "{message}");
    // An allowed hop is followed.
    let tool = HttpFetch::new(allowing_loopback());
    let output = fetch(&tool, json!({"url": format!("http://{server}/redirect?to=/hello")})).await.unwrap();
    assert_eq!(output.value["body"], "hello from 127.0.0.1");
    assert_eq!(output.value["url"], format!("http://{server}/hello"));
}

#[tokio::test]
async fn redirects_are_limited_and_only_to_http() {
    let server = server().await;
    let tool = HttpFetch::new(allowing_loopback());
    let (code, _) = failure(fetch(&tool, json!({"url": format!("http://{server}/loop")})).await);
    assert_eq!(code, "too_many_redirects");
    let url = format!("http://{server}/redirect?to=file:///etc/passwd");
    let (code, _) = failure(fetch(&tool, json!({"url": url})).await);
    assert_eq!(code, "unsupported_scheme");
}

#[tokio::test]
async fn bad_urls_and_arguments_are_typed_failures() {
    let tool = HttpFetch::new(HttpFetchConfig { max_request_bytes: 8, ..HttpFetchConfig::default() });
    assert_eq!(failure(fetch(&tool, json!({"url": "not a url"})).await).0, "invalid_url");
    assert_eq!(failure(fetch(&tool, json!({"url": "http://user:pw@example.com/"})).await).0, "invalid_url");
    assert_eq!(failure(fetch(&tool, json!({"url": "ftp://example.com/file"})).await).0, "unsupported_scheme");
    assert_eq!(failure(fetch(&tool, json!({"url": "gopher://127.0.0.1:6379/_INFO"})).await).0, "unsupported_scheme");
    let big = json!({"url": "http://example.com/", "method": "POST", "body": "123456789"});
    assert_eq!(failure(fetch(&tool, big).await).0, "too_large");
    let header = json!({"url": "http://example.com/", "headers": {"Authorization": "Bearer x"}});
    assert!(matches!(fetch(&tool, header).await, Err(ToolError::InvalidArgs(_))));

    // The schema, which the hook chain checks before any call, refuses the rest.
    let registry = builtin_registry(&ToolsConfig::default()).unwrap();
    let validator = &registry.get("http_fetch").unwrap().validator;
    assert!(validator.is_valid(&json!({"url": "https://example.com/", "method": "POST", "body": "x"})));
    for bad in [json!({}), json!({"url": 7}), json!({"url": "https://example.com/", "method": "DELETE"})] {
        assert!(!validator.is_valid(&bad), "{bad}");
    }
}

#[tokio::test]
async fn reading_stops_at_the_size_limit() {
    // The body never ends: only a reader that stops at the limit returns.
    let server = server().await;
    let tool = HttpFetch::new(HttpFetchConfig { max_response_bytes: 10_000, ..allowing_loopback() });
    let output = fetch(&tool, json!({"url": format!("http://{server}/endless")})).await.unwrap();
    assert_eq!(output.value["bytes"], 10_000);
    assert_eq!(output.value["truncated"], true);
    assert_eq!(output.value["body"].as_str().unwrap().len(), 10_000);
    assert!(output.value["note"].as_str().unwrap().contains("cut at 10000 bytes"));
}

#[tokio::test]
async fn a_server_that_stalls_hits_the_time_limit() {
    // Both servers never finish: only the limit ends these calls.
    let server = server().await;
    let tool = HttpFetch::new(HttpFetchConfig { timeout: 0.3, ..allowing_loopback() });
    for path in ["stall", "stall-body"] {
        let (code, message) = failure(fetch(&tool, json!({"url": format!("http://{server}/{path}")})).await);
        assert_eq!(code, "timeout", "{path}: {message}");
    }
    assert_eq!(tool.timeout(), Some(Duration::from_millis(5300)), "the pool's backstop is later than our limit");
}

#[tokio::test]
async fn a_cancelled_run_stops_the_fetch() {
    let server = server().await;
    let tool = HttpFetch::new(allowing_loopback());
    let context = context();
    context.cancel.cancel();
    let result = tool.call(context, json!({"url": format!("http://{server}/stall")})).await;
    assert_eq!(failure(result).0, "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_sees_the_denial_and_the_allowed_page() {
    let server = server().await;
    let model = ScriptedModel::queue(vec![
        calls(&[
            ("http_fetch", json!({"url": "http://169.254.169.254/latest/meta-data/iam/"})),
            ("http_fetch", json!({"url": format!("http://{server}/hello")})),
        ]),
        text("The metadata service was refused; the page says hello."),
    ]);
    let tools = ToolsConfig { http_fetch: allowing_loopback(), ..ToolsConfig::default() };
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(Arc::new(model)),
        tools: builtin_registry(&tools).unwrap(),
        hooks: Vec::new(),
        agents: vec![AgentConfig::new("default", "Fetch pages.", vec!["http_fetch".into()])],
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    let run_id = runtime.submit(SubmitRequest::new("default", "fetch")).await.unwrap();
    let events: Vec<Arc<RunEvent>> = runtime.subscribe(run_id, 0).map(|event| event.unwrap()).collect().await;
    let summaries: Vec<String> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolCallEnd { summary, .. } => Some(summary.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(summaries.len(), 2, "{summaries:?}");
    assert!(summaries.iter().any(|s| s.starts_with("error (destination_denied)")), "{summaries:?}");
    assert!(summaries.iter().any(|s| s.contains("hello from 127.0.0.1")), "{summaries:?}");
    assert_eq!(runtime.get(run_id).await.unwrap().unwrap().status, RunStatus::Succeeded);
}
