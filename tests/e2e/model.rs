//! The OpenAI-compatible client against the fake server: streaming, tool calls,
//! retries, timeouts, bad bodies, secrets, and whole runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use troupe::llm::openai::{ModelSettings, OpenAiModel, Provider, ProviderSettings, RetryPolicy, Secret};
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream, usage_chunk};
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::{
    ChatRequest, Message, ModelChunk, ModelClient, ModelDelta, ModelError, ModelRegistry, ModelReply, Role, ToolChoice,
};
use troupe_actors::metrics;
use troupe_actors::protocol::{EventKind, RunEvent, RunStatus};
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{EchoTool, capture_metrics, counter, eventually};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

const CANARY: &str = "sk-CANARY-5f1d2c9a7b";

fn provider_settings(server: &FakeOpenAi) -> ProviderSettings {
    ProviderSettings {
        name: "fake".into(),
        base_url: server.base_url(),
        api_key: Secret::new(CANARY.into()),
        headers: vec![("x-team".into(), Secret::new("troupe".into()).unwrap())],
        connect_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        max_concurrency: 4,
        queue_limit: 8,
        max_body_bytes: 1 << 20,
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
            max_total: Duration::from_secs(30),
        },
    }
}

fn model_settings() -> ModelSettings {
    ModelSettings {
        name: "fake-model".into(),
        id: "gpt-fake".into(),
        stream: true,
        input_price_per_million: 1.0,
        output_price_per_million: 2.0,
        context_window: None,
    }
}

fn model_with(server: &FakeOpenAi, tweak: impl FnOnce(&mut ProviderSettings)) -> OpenAiModel {
    let mut settings = provider_settings(server);
    tweak(&mut settings);
    OpenAiModel::new(Provider::new(settings).unwrap(), model_settings())
}

/// The same model through reqwest, the client of HTTPS and proxied providers.
fn general_model_with(server: &FakeOpenAi, tweak: impl FnOnce(&mut ProviderSettings)) -> OpenAiModel {
    let mut settings = provider_settings(server);
    tweak(&mut settings);
    OpenAiModel::new(Provider::with_general_client(settings).unwrap(), model_settings())
}

fn request() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::text(Role::System, "be brief"), Message::text(Role::User, "hello")],
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        max_tokens: Some(100),
        temperature: Some(0.2),
    }
}

/// The deltas and the final reply (or the error) of one call.
async fn call(model: &OpenAiModel) -> (Vec<ModelDelta>, Result<ModelReply, ModelError>) {
    let mut stream = match model.chat(request()).await {
        Ok(stream) => stream,
        Err(error) => return (Vec::new(), Err(error)),
    };
    let mut deltas = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(ModelChunk::Delta(delta)) => deltas.push(delta),
            Ok(ModelChunk::Done(reply)) => return (deltas, Ok(reply)),
            Err(error) => return (deltas, Err(error)),
        }
    }
    (deltas, Err(ModelError::Incomplete))
}

async fn server(script: Vec<FakeReply>) -> FakeOpenAi {
    FakeOpenAi::start(script, None).await.unwrap()
}

#[tokio::test]
async fn streamed_text_arrives_as_deltas_then_a_priced_reply() {
    let server = server(vec![text_stream("Hello there, world", 3)]).await;
    let (deltas, reply) = call(&model_with(&server, |_| {})).await;
    let reply = reply.unwrap();
    assert_eq!(reply.content, "Hello there, world");
    assert!(deltas.len() >= 3);
    let streamed: String = deltas.iter().map(|d| if let ModelDelta::Text(t) = d { t.as_str() } else { "" }).collect();
    assert_eq!(streamed, "Hello there, world");
    assert_eq!((reply.usage.input_tokens, reply.usage.output_tokens), (12, 7));
    assert!((reply.usage.cost_usd - (12.0 * 1.0 + 7.0 * 2.0) / 1e6).abs() < 1e-12);

    let sent = &server.requests()[0];
    assert_eq!(sent.authorization.as_deref(), Some(format!("Bearer {CANARY}").as_str()));
    assert_eq!(sent.body["model"], "gpt-fake");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"]["include_usage"], true);
    assert_eq!(sent.body["max_tokens"], 100);
}

#[tokio::test]
async fn a_tool_call_split_over_many_chunks_is_assembled() {
    let arguments = r#"{"query": "delivery status", "limit": 5}"#;
    let server = server(vec![tool_call_stream(&[("call_1", "search", arguments)], 9)]).await;
    let (_, reply) = call(&model_with(&server, |_| {})).await;
    let reply = reply.unwrap();
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].call_id, "call_1");
    assert_eq!(reply.tool_calls[0].name, "search");
    assert_eq!(reply.tool_calls[0].args, json!({"query": "delivery status", "limit": 5}));
    assert!(reply.decode_errors.is_empty());
}

#[tokio::test]
async fn two_parallel_tool_calls_keep_their_order_and_arguments() {
    let calls = [("a", "search", r#"{"q": "one"}"#), ("b", "echo", r#"{"text": "two"}"#)];
    let server = server(vec![tool_call_stream(&calls, 3)]).await;
    let (_, reply) = call(&model_with(&server, |_| {})).await;
    let names: Vec<(String, Value)> = reply.unwrap().tool_calls.into_iter().map(|c| (c.name, c.args)).collect();
    assert_eq!(names, vec![("search".into(), json!({"q": "one"})), ("echo".into(), json!({"text": "two"}))]);
}

#[tokio::test]
async fn reasoning_content_is_kept_as_reasoning_deltas() {
    let chunks = vec![
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "Think first."}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning": " Then more."}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "Answer."}, "finish_reason": "stop"}]}),
        usage_chunk(3, 4),
    ];
    let server = server(vec![FakeReply::Stream { chunks, delay_ms: 0, done: true }]).await;
    let (deltas, reply) = call(&model_with(&server, |_| {})).await;
    assert_eq!(
        deltas,
        vec![
            ModelDelta::Reasoning("Think first.".into()),
            ModelDelta::Reasoning(" Then more.".into()),
            ModelDelta::Text("Answer.".into())
        ]
    );
    assert_eq!(reply.unwrap().content, "Answer.");
}

#[tokio::test]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let busy =
        FakeReply::Status { status: 429, retry_after: Some("1".into()), body: "{\"error\": \"slow down\"}".into() };
    let server = server(vec![busy, text_stream("ok", 1)]).await;
    let (_, reply) = call(&model_with(&server, |_| {})).await;
    assert_eq!(reply.unwrap().content, "ok");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1].at - requests[0].at >= Duration::from_secs(1), "the retry honoured Retry-After");
}

#[tokio::test]
async fn a_400_or_a_quota_429_is_not_retried() {
    let bad = FakeReply::Status { status: 400, retry_after: None, body: "{\"error\": \"bad request\"}".into() };
    let server_a = server(vec![bad, text_stream("never", 1)]).await;
    let (_, reply) = call(&model_with(&server_a, |_| {})).await;
    assert!(matches!(reply, Err(ModelError::Status { status: 400, .. })), "{reply:?}");
    assert_eq!(server_a.requests().len(), 1);

    let quota = FakeReply::Status {
        status: 429,
        retry_after: None,
        body: "{\"error\": {\"code\": \"insufficient_quota\"}}".into(),
    };
    let server_b = server(vec![quota, text_stream("never", 1)]).await;
    let (_, reply) = call(&model_with(&server_b, |_| {})).await;
    assert!(matches!(reply, Err(ModelError::Status { status: 429, .. })));
    assert_eq!(server_b.requests().len(), 1);
}

#[tokio::test]
async fn repeated_500s_exhaust_the_retries_with_a_typed_error() {
    let failing = FakeReply::Status { status: 500, retry_after: None, body: "{\"error\": \"boom\"}".into() };
    let server = FakeOpenAi::start(Vec::new(), Some(failing)).await.unwrap();
    let (_, reply) = call(&model_with(&server, |_| {})).await;
    match reply {
        Err(ModelError::Status { status: 500, message }) => assert!(message.contains("boom")),
        other => panic!("expected a 500, got {other:?}"),
    }
    assert_eq!(server.requests().len(), 3, "max_attempts");
}

#[tokio::test]
async fn a_hanging_server_hits_the_first_byte_timeout() {
    let server = FakeOpenAi::start(Vec::new(), Some(FakeReply::Hang)).await.unwrap();
    let model = model_with(&server, |settings| {
        settings.first_byte_timeout = Duration::from_millis(200);
        settings.retry.max_attempts = 2;
    });
    let started = Instant::now();
    let (_, reply) = call(&model).await;
    assert_eq!(reply, Err(ModelError::Timeout(Duration::from_millis(200))));
    assert_eq!(server.requests().len(), 2, "a timeout is retried, within the bound");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn the_general_client_streams_retries_and_times_out_alike() {
    let busy = FakeReply::Status { status: 429, retry_after: Some("1".into()), body: "{}".into() };
    let truncated = FakeReply::Stream {
        chunks: vec![json!({"choices": [{"index": 0, "delta": {"content": "half"}}]})],
        delay_ms: 0,
        done: false,
    };
    let server = server(vec![busy, text_stream("Hello there, world", 3), truncated, FakeReply::Hang]).await;
    let model = general_model_with(&server, |settings| {
        settings.first_byte_timeout = Duration::from_millis(300);
        settings.retry.max_attempts = 2;
    });
    let (deltas, reply) = call(&model).await;
    assert_eq!(reply.unwrap().content, "Hello there, world");
    assert!(deltas.len() >= 3);
    let requests = server.requests();
    assert!(requests[1].at - requests[0].at >= Duration::from_secs(1), "the retry honoured Retry-After");
    assert_eq!(requests[1].authorization.as_deref(), Some(format!("Bearer {CANARY}").as_str()));
    assert_eq!(call(&model).await.1, Err(ModelError::Incomplete));
    // The hang, then the script is exhausted (a 500): the timeout is retried once.
    let (_, reply) = call(&model).await;
    assert!(matches!(reply, Err(ModelError::Status { status: 500, .. })), "{reply:?}");
    assert_eq!(server.requests().len(), 5);
}

#[tokio::test]
async fn a_slow_drip_beyond_the_idle_timeout_fails() {
    let drip = FakeReply::Stream {
        chunks: vec![json!({"choices": [{"index": 0, "delta": {"content": "a"}}]}); 3],
        delay_ms: 400,
        done: true,
    };
    let server = server(vec![drip]).await;
    let model = model_with(&server, |settings| settings.idle_timeout = Duration::from_millis(150));
    let (_, reply) = call(&model).await;
    assert_eq!(reply, Err(ModelError::Timeout(Duration::from_millis(150))));
}

#[tokio::test]
async fn a_truncated_stream_is_an_error_and_yields_no_reply() {
    let truncated = FakeReply::Stream {
        chunks: vec![
            json!({"choices": [{"index": 0, "delta": {"content": "half an ans"}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "search", "arguments": "{\"q\""}}]}}]}),
        ],
        delay_ms: 0,
        done: false,
    };
    let server = server(vec![truncated]).await;
    let (deltas, reply) = call(&model_with(&server, |_| {})).await;
    assert_eq!(reply, Err(ModelError::Incomplete));
    assert_eq!(deltas, vec![ModelDelta::Text("half an ans".into())], "only display deltas came before the error");
}

#[tokio::test]
async fn malformed_chunks_and_oversized_bodies_are_typed_errors() {
    let garbage =
        FakeReply::Raw { status: 200, content_type: "text/event-stream".into(), body: "data: {not json\n\n".into() };
    let huge = FakeReply::Raw { status: 200, content_type: "text/event-stream".into(), body: "x".repeat(2 << 20) };
    let server = server(vec![garbage, huge]).await;
    let model = model_with(&server, |_| {});
    let (_, reply) = call(&model).await;
    assert!(matches!(reply, Err(ModelError::Decode(ref message)) if message.contains("not JSON")), "{reply:?}");
    let (_, reply) = call(&model).await;
    assert!(matches!(reply, Err(ModelError::Decode(ref message)) if message.contains("larger than")), "{reply:?}");
}

#[tokio::test]
async fn non_streaming_mode_reads_one_json_body() {
    let body = json!({
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "whole",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6}
    });
    let server = server(vec![FakeReply::Json { body }]).await;
    let mut settings = provider_settings(&server);
    settings.api_key = None;
    let model = ModelSettings {
        name: "plain".into(),
        id: "m".into(),
        stream: false,
        input_price_per_million: 0.0,
        output_price_per_million: 0.0,
        context_window: None,
    };
    let model = OpenAiModel::new(Provider::new(settings).unwrap(), model);
    let (_, reply) = call(&model).await;
    let reply = reply.unwrap();
    assert_eq!(reply.tool_calls[0].args, json!({"text": "hi"}));
    assert_eq!(reply.usage.output_tokens, 6);
    assert!(server.requests()[0].body.get("stream").is_none());
    assert!(server.requests()[0].authorization.is_none());
}

/// A runtime whose default model is `model`, with the echo tool.
async fn runtime(model: Arc<dyn ModelClient>) -> Runtime {
    runtime_with(RuntimeConfig::default(), model).await
}

async fn runtime_with(config: RuntimeConfig, model: Arc<dyn ModelClient>) -> Runtime {
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model),
        tools: ToolRegistry::new().with(Arc::new(EchoTool)).unwrap(),
        hooks: Vec::new(),
        agents: vec![AgentConfig::new("default", "Use tools when useful.", vec!["echo".into()])],
    };
    Runtime::start(config, deps).await.unwrap()
}

async fn run(runtime: &Runtime, input: &str) -> (troupe_actors::store::RunRecord, Vec<Arc<RunEvent>>) {
    let run_id = runtime.submit(SubmitRequest::new("default", input)).await.unwrap();
    let events: Vec<Arc<RunEvent>> = runtime.subscribe(run_id, 0).map(|event| event.unwrap()).collect().await;
    (runtime.get(run_id).await.unwrap().unwrap(), events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_with_the_fake_server_as_the_model() {
    let server = server(vec![
        tool_call_stream(&[("c1", "echo", r#"{"text": "pong"}"#)], 4),
        text_stream("The echo said pong.", 2),
    ])
    .await;
    capture_metrics();
    let runtime = runtime(Arc::new(model_with(&server, |_| {}))).await;
    let (record, events) = run(&runtime, "ping").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("The echo said pong."));
    // Labelled by what the model is (its id at the provider), not its name here.
    let requests_ok = counter(metrics::MODEL_REQUESTS_TOTAL, &[("model", "gpt-fake"), ("status", "ok")]);
    assert_eq!(requests_ok, 2, "one request per turn, counted");
    assert_eq!(counter(metrics::MODEL_REQUESTS_TOTAL, &[("model", "fake-model"), ("status", "ok")]), 0);
    let tokens = counter(metrics::MODEL_TOKENS_TOTAL, &[("model", "gpt-fake"), ("direction", "input")]);
    assert_eq!(tokens, 32);
    assert_eq!((record.usage.input_tokens, record.usage.output_tokens), (32, 16));
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::ToolCallEnd { tool, .. } if tool == "echo")));
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::AssistantDelta { .. })));
    let second = &server.requests()[1].body;
    let tool_message = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!((tool_message["tool_call_id"].as_str(), tool_message["content"].as_str()), (Some("c1"), Some("pong")));
    assert!(second["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "echo"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_become_a_decode_error_and_the_run_goes_on() {
    let server =
        server(vec![tool_call_stream(&[("c1", "echo", r#"{"text": "unterminated"#)], 3), text_stream("Recovered.", 1)])
            .await;
    let runtime = runtime(Arc::new(model_with(&server, |_| {}))).await;
    let (record, events) = run(&runtime, "try").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::DecodeError { detail, .. } if detail.contains("c1"))));
    let second = &server.requests()[1].body;
    let tool_message = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_message["content"].as_str().unwrap().contains("not valid JSON"), "the model sees the error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_fail_the_run_with_a_clear_reason_and_no_secret() {
    let failing =
        FakeReply::Status { status: 503, retry_after: None, body: "{\"error\": \"overloaded, key {auth}\"}".into() };
    let server = FakeOpenAi::start(Vec::new(), Some(failing)).await.unwrap();
    // The run waits the outage out once (a pause of 2 s), then its wait is spent.
    let config = RuntimeConfig { model_outage_wait: Duration::from_secs(3), ..RuntimeConfig::default() };
    let runtime = runtime_with(config, Arc::new(model_with(&server, |_| {}))).await;
    let (record, events) = run(&runtime, "anything").await;

    assert_eq!(record.status, RunStatus::Failed);
    let retries = events.iter().filter(|event| matches!(event.kind, EventKind::ModelRetry { .. })).count();
    assert_eq!(retries, 1, "the run asked again once before failing");
    let reason = record.reason.unwrap();
    assert!(reason.starts_with("model error: model returned status 503"), "{reason}");
    assert!(!reason.contains(CANARY), "the echoed key is scrubbed: {reason}");
    for event in &events {
        assert!(!serde_json::to_string(event.as_ref()).unwrap().contains(CANARY));
    }
}

#[tokio::test]
async fn requests_beyond_the_limit_and_its_queue_fail_as_overloaded() {
    let server = FakeOpenAi::start(Vec::new(), Some(FakeReply::Hang)).await.unwrap();
    let model = Arc::new(model_with(&server, |settings| {
        settings.max_concurrency = 1;
        settings.queue_limit = 1;
    }));
    let first = tokio::spawn({
        let model = model.clone();
        async move { model.chat(request()).await.map(drop) }
    });
    let second = tokio::spawn({
        let model = model.clone();
        async move { model.chat(request()).await.map(drop) }
    });
    // Poll until the first request reached the server and the second waits for its slot.
    eventually(Duration::from_secs(10), "the requests never got in flight and queued", || async {
        !server.requests().is_empty() && model.queued() > 0
    })
    .await;
    let third = model.chat(request()).await.map(drop);
    assert!(matches!(third, Err(ModelError::Overloaded(_))), "{third:?}");
    assert_eq!(server.requests().len(), 1, "the queued request waits; the third never left");
    first.abort();
    second.abort();
    // A request dropped while it waited gives its place in the queue back.
    eventually(Duration::from_secs(10), "the dropped wait kept its place", || async { model.queued() == 0 }).await;
}

#[tokio::test]
async fn a_last_event_without_its_blank_line_and_vendor_error_chunks_are_understood() {
    let finish = r#"{"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": "stop"}]}"#;
    let unterminated = FakeReply::Raw {
        status: 200,
        content_type: "text/event-stream".into(),
        body: format!(
            "data: {finish}

data: [DONE]"
        ),
    };
    let vendor_error = FakeReply::Raw {
        status: 200,
        content_type: "text/event-stream".into(),
        body: "data: {\"object\": \"error\", \"message\": \"model overloaded\"}\n\n".into(),
    };
    let server = server(vec![unterminated, vendor_error]).await;
    let model = model_with(&server, |_| {});
    assert_eq!(call(&model).await.1.unwrap().content, "done");
    let (_, reply) = call(&model).await;
    assert!(matches!(reply, Err(ModelError::Decode(ref message)) if message.contains("model overloaded")), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_aborts_its_request_and_frees_the_slot() {
    let server = FakeOpenAi::start(vec![FakeReply::Hang], Some(text_stream("free again", 1))).await.unwrap();
    let model = Arc::new(model_with(&server, |settings| {
        settings.max_concurrency = 1;
        settings.queue_limit = 0;
    }));
    let runtime = runtime(model.clone()).await;
    let run_id = runtime.submit(SubmitRequest::new("default", "wait")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    eventually(Duration::from_secs(10), "the request never arrived", || async { !server.requests().is_empty() }).await;
    runtime.cancel(run_id).await.unwrap();
    // With one slot and no queue, a request still in flight would make this overloaded.
    let mut reply = call(&model).await.1;
    while matches!(reply, Err(ModelError::Overloaded(_))) {
        assert!(Instant::now() < deadline, "the cancelled request kept its slot");
        tokio::time::sleep(Duration::from_millis(5)).await;
        reply = call(&model).await.1;
    }
    assert_eq!(reply.unwrap().content, "free again");
}

/// Log lines written while it is installed on this thread (a current-thread
/// runtime keeps every task of a test on it), as the daemon's formatter writes
/// them, without colours.
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Captures DEBUG and above until the guard is dropped.
    pub fn install() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// The lines so far that hold every one of `parts`.
    pub fn matching(&self, parts: &[&str]) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().filter(|line| parts.iter().all(|part| line.contains(part))).map(str::to_owned).collect()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn each_retry_and_a_final_failure_leave_a_warning_naming_the_status() {
    let (logs, _guard) = CapturedLogs::install();
    let busy = FakeReply::Status { status: 429, retry_after: None, body: "{\"error\": \"slow down\"}".into() };
    let server = server(vec![busy, text_stream("ok", 1)]).await;
    let (_, reply) = call(&model_with(&server, |_| {})).await;
    assert_eq!(reply.unwrap().content, "ok");
    let retries = logs.matching(&["WARN", "model request failed; retrying", "provider=fake", "model=fake-model"]);
    assert_eq!(retries.len(), 1, "{retries:?}");
    for part in ["status 429", "slow down", "attempt=1", "max_attempts=3", "delay_ms="] {
        assert!(retries[0].contains(part), "{part} missing from {}", retries[0]);
    }
    assert!(!retries[0].contains(CANARY));

    let failing = FakeReply::Status { status: 503, retry_after: None, body: "{\"error\": \"down\"}".into() };
    let down = FakeOpenAi::start(Vec::new(), Some(failing)).await.unwrap();
    let (_, reply) = call(&model_with(&down, |_| {})).await;
    assert!(matches!(reply, Err(ModelError::Status { status: 503, .. })), "{reply:?}");
    let gave_up = logs.matching(&["WARN", "model request failed after its retries", "status 503", "attempts=3"]);
    assert_eq!(gave_up.len(), 1, "{gave_up:?}");

    let refused = FakeReply::Status { status: 401, retry_after: None, body: "{\"error\": \"bad key\"}".into() };
    let locked = server_with_one(refused).await;
    let (_, reply) = call(&model_with(&locked, |_| {})).await;
    assert!(matches!(reply, Err(ModelError::Status { status: 401, .. })), "{reply:?}");
    let hard = logs.matching(&["ERROR", "retrying cannot help", "status 401", "attempts=1"]);
    assert_eq!(hard.len(), 1, "a hard error is an ERROR: {hard:?}");
}

async fn server_with_one(reply: FakeReply) -> FakeOpenAi {
    FakeOpenAi::start(vec![reply], None).await.unwrap()
}

#[tokio::test]
async fn a_reply_over_the_limit_fails_early_with_a_typed_error_reasoning_included() {
    let (logs, _guard) = CapturedLogs::install();
    let limit = 256 * 1024;
    // 1 MiB of text in 1 KiB deltas: the call fails once the reply passes the limit.
    let long = text_stream(&"word ".repeat(200 * 1024), 1024);
    let reasoning: Vec<Value> = (0..512)
        .map(|_| json!({"choices": [{"index": 0, "delta": {"reasoning_content": "r".repeat(1024)}}]}))
        .collect();
    let thinking = FakeReply::Stream { chunks: reasoning, delay_ms: 0, done: true };
    let server = server(vec![long, thinking]).await;
    let model = model_with(&server, |settings| {
        settings.max_body_bytes = limit;
        settings.max_concurrency = 1;
        settings.queue_limit = 0;
    });

    let mut first = model.chat(request()).await.unwrap();
    let mut streamed = 0;
    let error = loop {
        match first.next().await {
            Some(Ok(ModelChunk::Delta(ModelDelta::Text(text)))) => streamed += text.len(),
            Some(Ok(other)) => panic!("no reply was due: {other:?}"),
            Some(Err(error)) => break error,
            None => panic!("the stream ended without an error"),
        }
    };
    assert!(
        matches!(error, ModelError::Decode(ref message) if message.contains("larger than 262144 bytes")),
        "{error:?}"
    );
    assert!(streamed <= limit, "it stopped at the limit: {streamed} bytes streamed");

    // The failed stream is still held, but its slot (the only one) is free again.
    let (deltas, reply) = call(&model).await;
    assert!(matches!(reply, Err(ModelError::Decode(ref message)) if message.contains("larger than")), "{reply:?}");
    assert!(deltas.len() <= 256, "reasoning counts toward the reply: {} deltas", deltas.len());
    let failed = logs.matching(&["WARN", "model reply failed while streaming", "larger than", "provider=fake"]);
    assert_eq!(failed.len(), 2, "{failed:?}");
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_reply_is_over_the_limit_fails_with_a_clear_reason() {
    let huge = text_stream(&"word ".repeat(400 * 1024), 2000);
    let server = FakeOpenAi::start(Vec::new(), Some(huge)).await.unwrap();
    let model = model_with(&server, |settings| settings.max_body_bytes = 1 << 20);
    let runtime = runtime(Arc::new(model)).await;
    let (record, events) = run(&runtime, "write a lot").await;

    assert_eq!(record.status, RunStatus::Failed);
    let reason = record.reason.unwrap();
    assert!(reason.contains("the reply is larger than 1048576 bytes"), "{reason}");
    assert_eq!(server.requests().len(), 1, "a reply over the limit is not asked for again");
    let streamed: usize = events
        .iter()
        .map(|event| match &event.kind {
            EventKind::AssistantDelta { text, .. } => text.len(),
            _ => 0,
        })
        .sum();
    assert!(streamed <= 1 << 20, "no more than the limit reached the run: {streamed} bytes");
}
