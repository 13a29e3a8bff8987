//! The HTTP API over real TCP (port 0), on a runtime with a scripted model: runs
//! and their event streams, reconnection, tenant isolation, limits and timeouts.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use troupe::cli::client::SseParser;
use troupe::server::{self, AppState, Auth, AuthConfig, QuotaConfig, ServerConfig};
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::store::{MemoryStore, RunStore};
use troupe_actors::testing::{EchoTool, GatedTool, ScriptedModel, Step, calls, eventually, text};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime};

pub(crate) const ALPHA: &str = "alpha-token";
pub(crate) const BETA: &str = "beta-token";

pub(crate) struct TestServer {
    base: String,
    pub(crate) http: reqwest::Client,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

/// A server over a fresh runtime: tenants `alpha` and `beta`, one agent `default`
/// with the `echo` tool, `model` answering.
async fn start(model: ScriptedModel, runtime_config: RuntimeConfig, server_config: ServerConfig) -> TestServer {
    start_with(Arc::new(model), runtime_config, server_config).await
}

/// [`start`] with a model the test keeps (to read the requests it got).
pub(crate) async fn start_with(
    model: Arc<ScriptedModel>,
    runtime_config: RuntimeConfig,
    server_config: ServerConfig,
) -> TestServer {
    start_gated(model, runtime_config, server_config, GatedTool::default()).await
}

/// [`start_with`] with the `pay` tool the test keeps (to read its ledger).
pub(crate) async fn start_gated(
    model: Arc<ScriptedModel>,
    runtime_config: RuntimeConfig,
    server_config: ServerConfig,
    pay: GatedTool,
) -> TestServer {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let tools = ToolRegistry::new().with(Arc::new(EchoTool)).unwrap().with(Arc::new(pay)).unwrap();
    let agent = AgentConfig::new("default", "You are a test agent.", vec!["echo".to_owned(), "pay".to_owned()]);
    let deps = Deps { store, models: ModelRegistry::new(model), tools, hooks: Vec::new(), agents: vec![agent] };
    let runtime = Arc::new(Runtime::start(runtime_config, deps).await.unwrap());
    let auth = Auth::new(&AuthConfig::default(), Some(&format!("alpha={ALPHA},beta={BETA}"))).unwrap();
    let shutdown = CancellationToken::new();
    let timeouts = server_config.connection_timeouts().unwrap();
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder().handle();
    let state = AppState::new(runtime, auth, server_config, QuotaConfig::default(), Some(prometheus), shutdown.clone())
        .unwrap();
    let (listener, address) = server::bind("127.0.0.1:0").await.unwrap();
    let served = tokio::spawn(server::serve(
        listener,
        server::router(state),
        timeouts,
        shutdown.clone(),
        Duration::from_secs(5),
    ));
    TestServer { base: format!("http://{address}"), http: reqwest::Client::new(), shutdown, served }
}

/// Two turns: an `echo` call, then the answer.
fn echo_then_answer() -> ScriptedModel {
    ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "hi"}))]), text("All done.")])
}

impl TestServer {
    async fn default() -> Self {
        start(echo_then_answer(), RuntimeConfig::default(), ServerConfig::default()).await
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut request = self.http.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let retry_after = response.headers().get("retry-after").map(|value| value.to_str().unwrap().to_owned());
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        Answer { status, body, retry_after }
    }

    /// Opens the SSE stream at `path`, resuming after `last` if given; asserts 200.
    pub(crate) async fn open_stream(&self, token: &str, path: &str, last: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(self.url(path)).bearer_auth(token);
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response
    }

    async fn create(&self, token: &str, input: &str) -> String {
        let answer = self.send(reqwest::Method::POST, "/v1/runs", Some(token), Some(json!({"input": input}))).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body["run_id"].as_str().unwrap().to_owned()
    }

    /// Opens the run's event stream, resuming after `last` if given.
    async fn events(&self, token: &str, id: &str, last: Option<u64>) -> EventStream {
        let mut request = self.http.get(self.url(&format!("/v1/runs/{id}/events"))).bearer_auth(token);
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        EventStream { body: response.bytes_stream().boxed(), parser: SseParser::default(), ready: Vec::new() }
    }
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
    retry_after: Option<String>,
}

impl Answer {
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

/// `(id, event name, data)` of each SSE event.
type Frame = (u64, String, Value);

struct EventStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    parser: SseParser,
    ready: Vec<Frame>,
}

impl EventStream {
    /// The next event, or `None` when the server ended the stream.
    async fn next(&mut self) -> Option<Frame> {
        let read = async {
            loop {
                if !self.ready.is_empty() {
                    return Some(self.ready.remove(0));
                }
                let chunk = self.body.next().await?.ok()?;
                for frame in self.parser.push(&chunk) {
                    let id = frame.id.unwrap().parse().unwrap();
                    self.ready.push((id, frame.event.unwrap(), serde_json::from_str(&frame.data).unwrap()));
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read).await.expect("no event within 30 s")
    }

    async fn rest(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_with_a_token_set_answer_only_its_bearer() {
    let open = TestServer::default().await;
    assert_eq!(open.send(reqwest::Method::GET, "/metrics", None, None).await.status, StatusCode::OK, "open by default");

    let config =
        ServerConfig { metrics_token_sha256: Some(server::hash_token("scrape-me")), ..ServerConfig::default() };
    let guarded = start(echo_then_answer(), RuntimeConfig::default(), config).await;
    for token in [None, Some("wrong"), Some(ALPHA)] {
        let answer = guarded.send(reqwest::Method::GET, "/metrics", token, None).await;
        assert_eq!((answer.status, answer.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "token {token:?}");
    }
    let answer = guarded.send(reqwest::Method::GET, "/metrics", Some("scrape-me"), None).await;
    assert_eq!(answer.status, StatusCode::OK);

    let bad = ServerConfig { metrics_token_sha256: Some("abc".into()), ..ServerConfig::default() };
    let runtime = Arc::new(
        Runtime::start(
            RuntimeConfig::default(),
            Deps {
                store: Arc::new(MemoryStore::new()),
                models: ModelRegistry::new(Arc::new(echo_then_answer())),
                tools: ToolRegistry::new(),
                hooks: Vec::new(),
                agents: Vec::new(),
            },
        )
        .await
        .unwrap(),
    );
    let refused = AppState::new(runtime, Auth::open(), bad, QuotaConfig::default(), None, CancellationToken::new())
        .err()
        .unwrap();
    assert!(refused.to_string().contains("metrics_token_sha256 must be 64 hex digits"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_run_streams_every_event_in_order_to_run_end() {
    let server = TestServer::default().await;
    let id = server.create(ALPHA, "say hi").await;
    let frames = server.events(ALPHA, &id, None).await.rest().await;

    let ids: Vec<u64> = frames.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (1..=frames.len() as u64).collect::<Vec<_>>(), "ids are the seqs, gap-free from 1");
    for (id, name, data) in &frames {
        assert_eq!(data["seq"], json!(id));
        assert_eq!(data["kind"], json!(name), "event: is the kind");
    }
    let names: Vec<&str> = frames.iter().map(|(_, name, _)| name.as_str()).collect();
    assert_eq!(names.first(), Some(&"run_started"));
    assert_eq!(names.last(), Some(&"run_end"));
    assert!(names.contains(&"tool_call_end") && names.contains(&"final_output"), "{names:?}");
    assert_eq!(names.iter().filter(|name| **name == "review").count(), 2, "one review per turn");

    let run = server.send(reqwest::Method::GET, &format!("/v1/runs/{id}"), Some(ALPHA), None).await;
    assert_eq!(run.body["status"], "succeeded");
    assert_eq!(run.body["final_output"], "All done.");
}

/// Two clients following one run (a chat page and a CLI, say) each get the
/// whole stream, the same bytes of each event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_following_one_run_get_the_same_stream() {
    let server = TestServer::default().await;
    let id = server.create(ALPHA, "say hi").await;
    let (first, second) = tokio::join!(async { server.events(ALPHA, &id, None).await.rest().await }, async {
        server.events(ALPHA, &id, None).await.rest().await
    });
    assert_eq!(first, second);
    assert_eq!(first.last().map(|(_, name, _)| name.as_str()), Some("run_end"));
    let ids: Vec<u64> = first.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (1..=first.len() as u64).collect::<Vec<_>>());
}

/// A run is deleted only once it has ended, and then it is gone: its record, its
/// events and its place in the listing; the other runs stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ended_can_be_deleted_and_one_still_running_cannot() {
    let model = ScriptedModel::per_turn(vec![text("All done.")]);
    let server = start(model, RuntimeConfig::default(), ServerConfig::default()).await;
    let (get, delete) = (reqwest::Method::GET, reqwest::Method::DELETE);
    let ended = server.create(ALPHA, "say hi").await;
    let kept = server.create(ALPHA, "say hi again").await;
    for id in [&ended, &kept] {
        let frames = server.events(ALPHA, id, None).await.rest().await;
        assert_eq!(frames.last().map(|(_, name, _)| name.as_str()), Some("run_end"));
    }

    let answer = server.send(delete.clone(), &format!("/v1/runs/{ended}"), Some(ALPHA), None).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    let gone = server.send(get.clone(), &format!("/v1/runs/{ended}"), Some(ALPHA), None).await;
    assert_eq!((gone.status, gone.code()), (StatusCode::NOT_FOUND, "not_found"));
    let events = server.http.get(server.url(&format!("/v1/runs/{ended}/events"))).bearer_auth(ALPHA).send().await;
    assert_eq!(events.unwrap().status(), StatusCode::NOT_FOUND, "its events went with it");
    let again = server.send(delete.clone(), &format!("/v1/runs/{ended}"), Some(ALPHA), None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "a second delete finds nothing");
    let listing = server.send(get.clone(), "/v1/runs", Some(ALPHA), None).await;
    let listed: Vec<&str> =
        listing.body["runs"].as_array().unwrap().iter().map(|run| run["run_id"].as_str().unwrap()).collect();
    assert_eq!(listed, vec![kept.as_str()], "the other run is kept");
}

/// Pages of `GET /v1/runs` follow one another with `after`: newest first, each
/// run once, `has_more` until the last page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_in_pages_with_after_and_has_more() {
    let server =
        start(ScriptedModel::per_turn(vec![Step::Hang]), RuntimeConfig::default(), ServerConfig::default()).await;
    let mut created = Vec::new();
    for index in 0..5 {
        created.push(server.create(ALPHA, &format!("work {index}")).await);
    }
    server.create(BETA, "not alpha's").await;
    let mut listed = Vec::new();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(id) => format!("/v1/runs?limit=2&after={id}"),
            None => "/v1/runs?limit=2".to_owned(),
        };
        let page = server.send(reqwest::Method::GET, &path, Some(ALPHA), None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let ids: Vec<String> = page.body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_owned())
            .collect();
        pages.push((ids.len(), page.body["has_more"].as_bool().unwrap()));
        after = ids.last().cloned();
        listed.extend(ids);
        if !page.body["has_more"].as_bool().unwrap() {
            break;
        }
    }
    assert_eq!(pages, vec![(2, true), (2, true), (1, false)]);
    created.reverse();
    assert_eq!(listed, created, "every run of the tenant once, newest first");
    let bad = server.send(reqwest::Method::GET, "/v1/runs?after=nope", Some(ALPHA), None).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_cannot_be_deleted_until_it_has_ended() {
    let model = ScriptedModel::per_turn(vec![Step::Hang]);
    let server = start(model, RuntimeConfig::default(), ServerConfig::default()).await;
    let id = server.create(ALPHA, "long work").await;
    let path = format!("/v1/runs/{id}");
    let refused = server.send(reqwest::Method::DELETE, &path, Some(ALPHA), None).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::CONFLICT, "not_ended"), "{}", refused.body);
    let run = server.send(reqwest::Method::GET, &path, Some(ALPHA), None).await;
    assert_eq!(run.body["status"], "running", "nothing was deleted");

    let cancelled = server.send(reqwest::Method::POST, &format!("{path}/cancel"), Some(ALPHA), None).await;
    assert_eq!(cancelled.status, StatusCode::OK);
    let deleted = server.send(reqwest::Method::DELETE, &path, Some(ALPHA), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "once cancelled it can go: {}", deleted.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_with_last_event_id_gets_exactly_the_missing_events() {
    // The run parks on a question; the first connection drops there, the second
    // reconnects while the run is parked and follows it live once it is answered.
    let model = ScriptedModel::per_turn(vec![calls(&[("ask_user", json!({"question": "which one?"}))]), text("Done.")]);
    let server = start(model, RuntimeConfig::default(), ServerConfig::default()).await;
    let id = server.create(ALPHA, "pick one").await;

    let mut first = server.events(ALPHA, &id, None).await;
    let mut seen = Vec::new();
    while let Some(frame) = first.next().await {
        let parked = frame.1 == "waiting_input";
        seen.push(frame.0);
        if parked {
            break;
        }
    }
    drop(first);
    let last = *seen.last().unwrap();
    assert_eq!(seen, (1..=last).collect::<Vec<_>>());

    let mut second = server.events(ALPHA, &id, Some(last)).await;
    let answer = server
        .send(reqwest::Method::POST, &format!("/v1/runs/{id}/input"), Some(ALPHA), Some(json!({"text": "the red one"})))
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let mut rest = Vec::new();
    while let Some(frame) = second.next().await {
        rest.push(frame);
    }
    let resumed: Vec<u64> = rest.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(resumed, (last + 1..=last + rest.len() as u64).collect::<Vec<_>>(), "no gap, no duplicate at the seam");
    assert_eq!(rest[0].1, "input_received", "the first event after the seam is live");
    assert_eq!(rest.last().unwrap().1, "run_end");

    // `?after=` is the same cursor for clients that cannot set headers, and a
    // reconnect after the end gets nothing and is closed.
    let end = *resumed.last().unwrap();
    let response = server
        .http
        .get(server.url(&format!("/v1/runs/{id}/events?after={}", end - 1)))
        .bearer_auth(ALPHA)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(text.contains(&format!("id: {end}\n")) && !text.contains(&format!("id: {}\n", end - 1)), "{text}");
    assert!(server.events(ALPHA, &id, Some(end)).await.rest().await.is_empty());
    // A cursor that is not a seq is refused.
    for bad in ["18446744073709551615", "nine", "-1"] {
        let response = server
            .http
            .get(server.url(&format!("/v1/runs/{id}/events")))
            .bearer_auth(ALPHA)
            .header("Last-Event-ID", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "Last-Event-ID {bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_gets_404_on_every_route_and_changes_nothing() {
    let model = ScriptedModel::per_turn(vec![Step::Hang]);
    let server = start(model, RuntimeConfig::default(), ServerConfig::default()).await;
    let id = server.create(ALPHA, "private work").await;
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;

    let routes = [
        (get.clone(), format!("/v1/runs/{id}"), None),
        (get.clone(), format!("/v1/runs/{id}/events"), None),
        (post.clone(), format!("/v1/runs/{id}/input"), Some(json!({"text": "hijack"}))),
        (post.clone(), format!("/v1/runs/{id}/cancel"), None),
        (reqwest::Method::DELETE, format!("/v1/runs/{id}"), None),
    ];
    for (method, path, body) in &routes {
        let answer = server.send(method.clone(), path, Some(BETA), body.clone()).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}: {}", answer.body);
        assert_eq!(answer.code(), "not_found");
        assert!(!answer.body.to_string().contains("private work"), "no data leaks: {}", answer.body);
        // Exactly what a run that does not exist answers.
        let missing = path.replace(&id, "01a20750-0000-7000-8000-000000000000");
        let unknown = server.send(method.clone(), &missing, Some(BETA), body.clone()).await;
        assert_eq!((unknown.status, unknown.body.clone()), (answer.status, answer.body.clone()));
        // And without a token, nothing at all.
        let anonymous = server.send(method.clone(), path, None, body.clone()).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert_eq!(anonymous.code(), "unauthorized");
    }
    let listing = server.send(get.clone(), "/v1/runs", Some(BETA), None).await;
    assert_eq!(listing.body["runs"], json!([]), "beta lists none of alpha's runs");
    for path in ["/v1/runs", "/v1/agents", "/v1/tools"] {
        assert_eq!(server.send(get.clone(), path, Some("forged"), None).await.status, StatusCode::UNAUTHORIZED);
    }

    let run = server.send(get.clone(), &format!("/v1/runs/{id}"), Some(ALPHA), None).await;
    assert_eq!(run.body["status"], "running", "beta's cancel changed nothing");
    let listing = server.send(get, "/v1/runs", Some(ALPHA), None).await;
    assert_eq!(listing.body["runs"][0]["run_id"], json!(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_errors() {
    let config = ServerConfig { max_body_bytes: 1024, ..ServerConfig::default() };
    let server = start(echo_then_answer(), RuntimeConfig::default(), config).await;
    let post = reqwest::Method::POST;

    let huge = json!({"input": "x".repeat(4096)});
    let answer = server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(huge)).await;
    assert_eq!((answer.status, answer.code()), (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"));

    let malformed = server
        .http
        .post(server.url("/v1/runs"))
        .bearer_auth(ALPHA)
        .header("content-type", "application/json")
        .body("{\"input\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    assert_eq!(malformed.json::<Value>().await.unwrap()["error"]["code"], "invalid_json");

    let unknown =
        server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(json!({"agent": "nope", "input": "x"}))).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "unknown_agent"));
    let extra = server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(json!({"input": "x", "inptu": "y"}))).await;
    assert_eq!((extra.status, extra.code()), (StatusCode::BAD_REQUEST, "invalid_json"));
    for bad in [
        json!({"max_turns": 0, "max_parallel_tools": 1}),
        json!({"max_cost_usd": -1.0}),
        json!({"max_cost_usd": 0.0}),
        json!({"max_tokens": 0}),
    ] {
        let limits =
            server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(json!({"input": "x", "limits": bad}))).await;
        assert_eq!(
            (limits.status, limits.code()),
            (StatusCode::BAD_REQUEST, "invalid_limits"),
            "{bad}: {}",
            limits.body
        );
    }
    let listed = server.send(reqwest::Method::GET, "/v1/runs", Some(ALPHA), None).await;
    assert_eq!(listed.body["runs"], json!([]), "a refused request creates no run");
    let nowhere = server.send(reqwest::Method::GET, "/v2/nothing", Some(ALPHA), None).await;
    assert_eq!((nowhere.status, nowhere.code()), (StatusCode::NOT_FOUND, "not_found"));
    let wrong = server.send(reqwest::Method::DELETE, "/v1/runs", Some(ALPHA), None).await;
    assert_eq!((wrong.status, wrong.code()), (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));
    let garbled = server.send(reqwest::Method::GET, "/v1/runs/%FF", Some(ALPHA), None).await;
    assert_eq!((garbled.status, garbled.code()), (StatusCode::BAD_REQUEST, "invalid_request"));
    let anonymous = server.http.get(server.url("/v1/runs")).send().await.unwrap();
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_over_the_active_limit_queue_and_get_429_when_the_queue_is_full() {
    let runtime = RuntimeConfig {
        max_active_runs: 1,
        max_active_runs_per_tenant: 1,
        max_queued_runs: 1,
        ..RuntimeConfig::default()
    };
    let server = start(ScriptedModel::per_turn(vec![Step::Hang]), runtime, ServerConfig::default()).await;
    let first = server.create(ALPHA, "one").await;
    let post = reqwest::Method::POST;

    let queued = server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(json!({"input": "two"}))).await;
    assert_eq!(queued.status, StatusCode::CREATED);
    assert_eq!(queued.body["status"], "queued");

    let tenant = server.send(post.clone(), "/v1/runs", Some(ALPHA), Some(json!({"input": "three"}))).await;
    assert_eq!((tenant.status, tenant.code()), (StatusCode::TOO_MANY_REQUESTS, "tenant_overloaded"));
    assert_eq!(tenant.retry_after.as_deref(), Some("5"));
    let global = server.send(post.clone(), "/v1/runs", Some(BETA), Some(json!({"input": "four"}))).await;
    assert_eq!((global.status, global.code()), (StatusCode::TOO_MANY_REQUESTS, "overloaded"));
    assert!(global.retry_after.is_some());

    // The queued run starts when the first ends.
    assert_eq!(server.send(reqwest::Method::GET, "/readyz", None, None).await.status, StatusCode::OK);
    let cancel = server.send(post, &format!("/v1/runs/{first}/cancel"), Some(ALPHA), None).await;
    assert_eq!(cancel.status, StatusCode::OK);
    let id = queued.body["run_id"].as_str().unwrap();
    let mut events = server.events(ALPHA, id, None).await;
    while let Some((_, name, _)) = events.next().await {
        if name == "turn_start" {
            return;
        }
    }
    panic!("the queued run never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_over_the_tenant_limit_get_429() {
    let config = ServerConfig { max_sse_clients_per_tenant: 1, ..ServerConfig::default() };
    let server = start(ScriptedModel::per_turn(vec![Step::Hang]), RuntimeConfig::default(), config).await;
    let id = server.create(ALPHA, "wait").await;
    let open = server.events(ALPHA, &id, None).await;
    let refused = server.send(reqwest::Method::GET, &format!("/v1/runs/{id}/events"), Some(ALPHA), None).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"));
    drop(open);
    // The slot frees when the server notices the client left; poll with a deadline.
    eventually(Duration::from_secs(10), "the stream slot was never freed", || async {
        let response =
            server.http.get(server.url(&format!("/v1/runs/{id}/events"))).bearer_auth(ALPHA).send().await.unwrap();
        response.status() == StatusCode::OK
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_is_dropped_by_the_header_timeout() {
    let config = ServerConfig { header_read_timeout: 1.0, ..ServerConfig::default() };
    let server = start(echo_then_answer(), RuntimeConfig::default(), config).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: troupe\r\n").await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buffer = Vec::new();
    // The server closes the connection (perhaps after a 408); it never answers 200.
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "the half-sent request was still open after 20 s");
    assert!(started.elapsed() >= Duration::from_millis(900), "dropped before the timeout");
    assert!(!String::from_utf8_lossy(&buffer).contains("200 OK"));
    // Meanwhile whole requests are served.
    let health = server.send(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, StatusCode::OK);

    // A keep-alive connection that goes quiet after a request is dropped too.
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: troupe\r\n\r\n").await.unwrap();
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), idle.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "an idle keep-alive connection was still open after 20 s");
    assert!(String::from_utf8_lossy(&buffer).starts_with("HTTP/1.1 200 OK"), "the request itself was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_event_streams_and_the_server() {
    let server =
        start(ScriptedModel::per_turn(vec![Step::Hang]), RuntimeConfig::default(), ServerConfig::default()).await;
    let id = server.create(ALPHA, "wait").await;
    let mut stream = server.events(ALPHA, &id, None).await;
    assert_eq!(stream.next().await.unwrap().1, "run_started");
    server.shutdown.cancel();
    let rest = stream.rest().await;
    assert!(rest.iter().all(|(_, name, _)| name != "run_end"), "the run did not end, the stream did");
    tokio::time::timeout(Duration::from_secs(10), server.served).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_health_and_openapi_routes_answer() {
    let server = TestServer::default().await;
    let get = reqwest::Method::GET;
    let agents = server.send(get.clone(), "/v1/agents", Some(ALPHA), None).await;
    assert_eq!(agents.body[0]["name"], "default");
    assert_eq!(agents.body[0]["tools"], json!(["echo", "pay"]));
    let tools = server.send(get.clone(), "/v1/tools", Some(ALPHA), None).await;
    assert_eq!(tools.body[0]["name"], "echo");
    assert_eq!(tools.body[0]["parameters"]["type"], "object");
    assert_eq!(server.send(get.clone(), "/healthz", None, None).await.status, StatusCode::OK);
    assert_eq!(server.send(get.clone(), "/readyz", None, None).await.body["status"], "ready");

    let document = server.send(get, "/openapi.json", None, None).await.body;
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"), "{}", document["openapi"]);
    for path in ["/v1/runs", "/v1/runs/{id}", "/v1/runs/{id}/events", "/v1/runs/{id}/input", "/v1/runs/{id}/cancel"] {
        assert!(document["paths"][path].is_object(), "{path} is documented");
    }
    assert!(document["components"]["securitySchemes"]["bearer"].is_object());
    // What strict validators and client generators need (CI also runs one).
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            for (status, response) in operation["responses"].as_object().unwrap() {
                let described = response["description"].as_str().is_some_and(|text| !text.is_empty());
                assert!(described, "{method} {path} {status} has a description");
            }
            if path.starts_with("/v1/") {
                assert!(operation["responses"]["401"].is_object(), "{method} {path} documents 401");
            }
        }
    }
    let schemas = &document["components"]["schemas"];
    assert_eq!(schemas["RunView"]["properties"]["status"]["enum"][0], "queued");
    assert_eq!(schemas["CreateRun"]["properties"]["input"]["minLength"], 1);
    assert_eq!(schemas["LimitsBody"]["properties"]["max_turns"]["minimum"], 1);
    // Every event kind has a schema: the `data` of each SSE event.
    let stream = &document["paths"]["/v1/runs/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"];
    assert_eq!(stream["schema"]["$ref"], "#/components/schemas/RunEvent");
    let kinds: Vec<&str> = schemas["RunEvent"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|kind| kind["properties"]["kind"]["const"].as_str())
        .collect();
    for kind in [
        "run_started",
        "turn_start",
        "assistant_delta",
        "tool_call_end",
        "review",
        "final_output",
        "run_end",
        "approval_requested",
    ] {
        assert!(kinds.contains(&kind), "{kind} has no schema: {kinds:?}");
    }
    assert_eq!(kinds.len(), 24, "one schema per event kind: {kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_queue_a_run_over_the_active_limit_gets_429() {
    let runtime = RuntimeConfig { max_active_runs: 1, max_queued_runs: 0, ..RuntimeConfig::default() };
    let server = start(ScriptedModel::per_turn(vec![Step::Hang]), runtime, ServerConfig::default()).await;
    server.create(ALPHA, "one").await;
    let over = server.send(reqwest::Method::POST, "/v1/runs", Some(BETA), Some(json!({"input": "two"}))).await;
    assert_eq!((over.status, over.code()), (StatusCode::TOO_MANY_REQUESTS, "overloaded"));
    assert_eq!(over.retry_after.as_deref(), Some("5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_only_lower_the_agents_own() {
    let server = TestServer::default().await;
    let body = json!({"input": "x", "limits": {"max_turns": 1000000, "max_tokens": 50}});
    let run = server.send(reqwest::Method::POST, "/v1/runs", Some(ALPHA), Some(body)).await;
    assert_eq!(run.status, StatusCode::CREATED, "{}", run.body);
    // The agent allows 15 turns and 4 parallel calls and sets no token budget:
    // the request cannot raise the turns, keeps the rest, and adds a budget.
    assert_eq!(
        run.body["limits"],
        json!({"max_turns": 15, "max_parallel_tools": 4, "max_tokens": 50, "max_cost_usd": null})
    );
    let lower = json!({"input": "x", "limits": {"max_turns": 2}});
    let run = server.send(reqwest::Method::POST, "/v1/runs", Some(ALPHA), Some(lower)).await;
    assert_eq!(run.body["limits"]["max_turns"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_approval_is_approved_or_rejected_over_the_api() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("pay", json!({"entry": "a"})), ("pay", json!({"entry": "b"}))]),
        text("Done."),
    ]);
    let server = start(model, RuntimeConfig::default(), ServerConfig::default()).await;
    let id = server.create(ALPHA, "pay both").await;
    let mut events = server.events(ALPHA, &id, None).await;
    let mut waiting = Vec::new();
    while let Some((_, name, data)) = events.next().await {
        if name == "approval_requested" {
            waiting.push(data["call_id"].as_str().unwrap().to_owned());
        }
        if name == "waiting_input" {
            break;
        }
    }
    assert_eq!(waiting.len(), 2);
    let input = format!("/v1/runs/{id}/input");
    let post = reqwest::Method::POST;
    let vague = server.send(post.clone(), &input, Some(ALPHA), Some(json!({"approve": true}))).await;
    assert_eq!((vague.status, vague.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "a decision names its call");
    let unknown =
        server.send(post.clone(), &input, Some(ALPHA), Some(json!({"approve": true, "call_id": "nope"}))).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::BAD_REQUEST, "invalid_input"));
    let both = server.send(post.clone(), &input, Some(ALPHA), Some(json!({"approve": true, "text": "x"}))).await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    let other =
        server.send(post.clone(), &input, Some(BETA), Some(json!({"approve": true, "call_id": waiting[0]}))).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND, "another tenant cannot approve");

    let yes = json!({"approve": true, "call_id": waiting[0]});
    assert_eq!(server.send(post.clone(), &input, Some(ALPHA), Some(yes)).await.status, StatusCode::ACCEPTED);
    let no = json!({"approve": false, "call_id": waiting[1], "reason": "twice is too many"});
    assert_eq!(server.send(post, &input, Some(ALPHA), Some(no)).await.status, StatusCode::ACCEPTED);
    let mut decided = Vec::new();
    while let Some((_, name, data)) = events.next().await {
        if name == "approval_decided" {
            decided.push((data["call_id"].as_str().unwrap().to_owned(), data["approved"].as_bool().unwrap()));
        }
    }
    assert_eq!(decided, vec![(waiting[0].clone(), true), (waiting[1].clone(), false)]);
    let run = server.send(reqwest::Method::GET, &format!("/v1/runs/{id}"), Some(ALPHA), None).await;
    assert_eq!(run.body["status"], "succeeded");
}

#[tokio::test]
async fn a_refused_request_leaves_one_log_line_and_a_flood_no_more() {
    let (logs, _guard) = crate::model::CapturedLogs::install();
    let config = ServerConfig { max_body_bytes: 1024, ..ServerConfig::default() };
    let runtime = RuntimeConfig { max_active_runs: 1, max_queued_runs: 0, ..RuntimeConfig::default() };
    let server = start(ScriptedModel::per_turn(vec![Step::Hang]), runtime, config).await;
    let huge = json!({"input": "x".repeat(4096)});
    for _ in 0..20 {
        let answer = server.send(reqwest::Method::POST, "/v1/runs", Some(ALPHA), Some(huge.clone())).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    }
    let lines = logs.matching(&["request refused"]);
    assert_eq!(lines.len(), 1, "one line, the rest suppressed: {lines:?}");
    for part in ["INFO", "status=413", "code=\"payload_too_large\"", "tenant=\"alpha\"", "route=\"/v1/runs\""] {
        assert!(lines[0].contains(part), "{part} missing from {}", lines[0]);
    }

    // A full daemon is the operator's to act on: a warning, throttled apart.
    server.create(ALPHA, "one").await;
    for _ in 0..3 {
        let over = server.send(reqwest::Method::POST, "/v1/runs", Some(BETA), Some(json!({"input": "two"}))).await;
        assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let overloaded = logs.matching(&["request refused", "code=\"overloaded\""]);
    assert_eq!(overloaded.len(), 1, "{overloaded:?}");
    assert!(overloaded[0].contains("WARN") && overloaded[0].contains("tenant=\"beta\""), "{}", overloaded[0]);
    assert_eq!(logs.matching(&["request refused"]).len(), 2);
}

#[tokio::test]
async fn a_slow_client_dropped_and_a_stream_cut_by_shutdown_leave_a_line_each() {
    let (logs, _guard) = crate::model::CapturedLogs::install();
    let config = ServerConfig { header_read_timeout: 0.3, ..ServerConfig::default() };
    let server = start(ScriptedModel::per_turn(vec![Step::Hang]), RuntimeConfig::default(), config).await;
    let address = server.base.trim_start_matches("http://").to_owned();

    // A keep-alive connection that goes quiet after its request is no slow client.
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: troupe\r\n\r\n").await.unwrap();
    idle.read_to_end(&mut Vec::new()).await.unwrap();
    assert!(logs.matching(&["dropped a client"]).is_empty(), "an idle keep-alive was logged as a slow client");

    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: troupe\r\n").await.unwrap();
    let _ = slow.read_to_end(&mut Vec::new()).await;
    eventually(Duration::from_secs(10), "the dropped client left no line", || async {
        logs.matching(&["INFO", "did not finish its request head", "peer=127.0.0.1"]).len() == 1
    })
    .await;

    let id = server.create(ALPHA, "wait").await;
    let mut stream = server.events(ALPHA, &id, None).await;
    assert_eq!(stream.next().await.unwrap().1, "run_started");
    server.shutdown.cancel();
    stream.rest().await;
    let cut = logs.matching(&["event stream closed: the server is shutting down", &id, "tenant=\"alpha\""]);
    assert_eq!(cut.len(), 1, "{cut:?}");
}

/// A client that sends its whole body before reading (Python's urllib and
/// requests do) reads the 413 of an oversized body instead of a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_a_whole_oversized_body_first_reads_the_413() {
    let config = ServerConfig { max_body_bytes: 1024, ..ServerConfig::default() };
    let server = start(echo_then_answer(), RuntimeConfig::default(), config).await;
    let address = server.url("").trim_start_matches("http://").to_owned();
    let body = format!("{{\"input\": \"{}\"}}", "x".repeat(4 * 1024 * 1024));
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {ALPHA}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.expect("the whole body is taken, not reset");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("the answer is readable");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large") && answer.contains("server.max_body_bytes"), "{answer}");
    let listed = server.send(reqwest::Method::GET, "/v1/runs", Some(ALPHA), None).await;
    assert_eq!(listed.body["runs"], json!([]), "nothing was created");
}
