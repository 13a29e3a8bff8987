//! OpenTelemetry traces of a running daemon, received as a collector would:
//! OTLP over HTTP/protobuf (an axum route decoding the protobuf body) and over
//! gRPC (an HTTP/2 server answering the collector's Export method). One run's
//! span tree, its GenAI attributes, the client's `traceparent` it joins, and
//! the `traceparent` the model server receives.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::{Value, json};
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream};

use crate::daemon::{Served, TOKEN};

/// A span as received: ids in hex.
#[derive(Debug, Clone)]
struct Received {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn collect(spans: &Spans, body: &[u8]) {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP ExportTraceServiceRequest");
    let mut spans = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service =
            resource.resource.iter().flat_map(|resource| &resource.attributes).find(|kv| kv.key == "service.name");
        let service = service.and_then(|kv| kv.value.as_ref()).and_then(|value| value.value.clone());
        assert_eq!(service, Some(Any::StringValue("troupe".to_owned())), "the resource names the service");
        for scope in resource.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = match kv.value.as_ref().and_then(|value| value.value.clone()) {
                            Some(Any::StringValue(text)) => text,
                            Some(Any::IntValue(number)) => number.to_string(),
                            Some(Any::BoolValue(flag)) => flag.to_string(),
                            Some(Any::DoubleValue(number)) => number.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), value)
                    })
                    .collect();
                spans.push(Received {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes,
                });
            }
        }
    }
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
async fn http_receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |axum::extract::State(spans): axum::extract::State<Spans>, body: bytes::Bytes| async move {
                    collect(&spans, &body);
                    ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                },
            ),
        )
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), spans)
}

/// An OTLP/gRPC receiver: the collector's `TraceService/Export` over HTTP/2.
async fn grpc_receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shared = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else { return };
            let spans = shared.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else { return };
                while let Some(Ok((request, mut respond))) = connection.accept().await {
                    let spans = spans.clone();
                    tokio::spawn(async move {
                        assert_eq!(request.uri().path(), "/opentelemetry.proto.collector.trace.v1.TraceService/Export");
                        let mut body = request.into_body();
                        let mut bytes = Vec::new();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                            bytes.extend_from_slice(&chunk);
                        }
                        // A gRPC message: a compression flag, a 4-byte length, the protobuf.
                        assert_eq!(bytes[0], 0, "uncompressed");
                        let length = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
                        collect(&spans, &bytes[5..5 + length]);
                        let head = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let mut stream = respond.send_response(head, false).unwrap();
                        stream.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), false).unwrap();
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        stream.send_trailers(trailers).unwrap();
                    });
                }
            });
        }
    });
    (format!("http://{address}"), spans)
}

const REVIEW: &str = r#"{"quality_score": 1, "completeness": 1, "relevance": 1, "needs_more_data": false,
    "gaps": [], "suggested_actions": [], "recommendation": "proceed", "notes": "fine"}"#;

/// The agent `traced` (text_stats, a model reviewer) on a daemon exporting to
/// `endpoint` over `protocol`, its model `gpt-4o-mini` at `model`.
fn serve(name: &str, model: &FakeOpenAi, endpoint: &str, protocol: &str) -> (Served, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("troupe-traces-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    let agent = "name = \"traced\"\ninstructions = \"Count the words.\"\ntools = [\"text_stats\"]\n\
                 [reviewer]\nkind = \"model\"\n";
    std::fs::write(dir.join("agents/traced.toml"), agent).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(&dir)
        .env("TROUPE_AGENTS", dir.join("agents"))
        .env("OPENAI_BASE_URL", model.base_url())
        .env("TROUPE_MODEL", "gpt-4o-mini")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        // Debug lines inside the run (a tool call finished) show its trace id.
        .env("TROUPE_LOG", "info,troupe_actors::tool_pool=debug")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_DEFAULT_MODEL")
        .env_remove("TROUPE_DATABASE_URL");
    (Served::start(command), dir)
}

fn script() -> Vec<FakeReply> {
    vec![
        tool_call_stream(&[("c1", "text_stats", r#"{"text": "one two three"}"#)], 1),
        text_stream(REVIEW, 1),
        text_stream("The text has three words.", 1),
        text_stream(REVIEW, 1),
    ]
}

/// Runs one request on `daemon` (with `traceparent`, if given) to its end, stops
/// the daemon (which flushes its spans) and returns the run's view and the log.
async fn one_run(daemon: Served, traceparent: Option<&str>) -> (Value, String) {
    let mut request = reqwest::Client::new()
        .post(daemon.url("/v1/runs"))
        .bearer_auth(TOKEN)
        .json(&json!({"agent": "traced", "input": "How many words are in 'one two three'?"}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 201);
    let id = response.json::<Value>().await.unwrap()["run_id"].as_str().unwrap().to_owned();
    daemon.events(&id).await;
    let view = reqwest::Client::new().get(daemon.url(&format!("/v1/runs/{id}"))).bearer_auth(TOKEN).send();
    let view: Value = view.await.unwrap().json().await.unwrap();
    assert_eq!(view["status"], "succeeded", "{view}");
    let log = daemon.log();
    daemon.terminate();
    (view, log)
}

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|span| span.name == name).collect()
}

/// The run's span tree: server span → invoke_agent → turns → chat / execute_tool /
/// review → chat; GenAI attributes; every span in `trace_id`.
fn check_tree(all: &[Received], trace_id: &str) -> String {
    // The client's other requests (its event stream, the run view) are traces of their own.
    let run_spans = ["invoke_agent traced", "turn", "chat gpt-4o-mini", "execute_tool text_stats", "review"];
    for span in all.iter().filter(|span| run_spans.contains(&span.name.as_str())) {
        assert_eq!(span.trace_id, trace_id, "every span of the run is in its trace: {span:?}");
    }
    let spans: Vec<Received> = all.iter().filter(|span| span.trace_id == trace_id).cloned().collect();
    let spans = spans.as_slice();
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    let post = named(spans, "POST /v1/runs");
    assert_eq!(post.len(), 1, "{names:?}");
    assert_eq!(post[0].kind, 2, "a server span");
    let run = named(spans, "invoke_agent traced");
    assert_eq!(run.len(), 1, "{names:?}");
    let run = run[0];
    assert_eq!(run.parent, post[0].span_id, "the run is the child of the request that created it");
    assert_eq!(run.attributes["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run.attributes["gen_ai.agent.name"], "traced");
    let turns = named(spans, "turn");
    assert_eq!(turns.len(), 2, "{names:?}");
    assert!(turns.iter().all(|turn| turn.parent == run.span_id));
    let is_turn = |id: &str| turns.iter().any(|turn| turn.span_id == id);
    let tool = named(spans, "execute_tool text_stats");
    assert_eq!(tool.len(), 1, "{names:?}");
    assert!(is_turn(&tool[0].parent));
    assert_eq!(tool[0].attributes["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool[0].attributes["gen_ai.tool.name"], "text_stats");
    assert_eq!(tool[0].attributes["gen_ai.tool.call.id"], "c1");
    let reviews = named(spans, "review");
    assert_eq!(reviews.len(), 2, "{names:?}");
    assert!(reviews.iter().all(|review| is_turn(&review.parent)));
    let chats = named(spans, "chat gpt-4o-mini");
    assert_eq!(chats.len(), 4, "the agent's two calls and the reviewer's two: {names:?}");
    for chat in &chats {
        assert_eq!(chat.attributes["gen_ai.operation.name"], "chat");
        assert_eq!(chat.attributes["gen_ai.request.model"], "gpt-4o-mini");
        assert_eq!(chat.kind, 3, "a client span");
        assert!(is_turn(&chat.parent) || reviews.iter().any(|review| review.span_id == chat.parent), "{chat:?}");
    }
    let first = chats.iter().find(|chat| chat.attributes["gen_ai.usage.input_tokens"] == "20");
    assert!(first.is_some_and(|chat| chat.attributes["gen_ai.usage.output_tokens"] == "9"), "{chats:?}");
    run.span_id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_trace_over_otlp_http_joined_to_the_clients_and_the_model_gets_its_traceparent() {
    let (endpoint, spans) = http_receiver().await;
    let model = FakeOpenAi::start(script(), None).await.unwrap();
    let (daemon, dir) = serve("http", &model, &endpoint, "http/protobuf");
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (view, log) = one_run(daemon, Some(&format!("00-{client_trace}-{client_span}-01"))).await;
    assert_eq!(view["trace_id"], client_trace, "the run view names its trace");
    let line = log.lines().find(|line| line.contains("tool call finished"));
    assert!(
        line.is_some_and(|line| line.contains(&format!("trace_id=\"{client_trace}\""))),
        "the log names it:\n{log}"
    );

    let spans = spans.lock().unwrap().clone();
    check_tree(&spans, client_trace);
    let post = spans.iter().find(|span| span.name == "POST /v1/runs" && span.trace_id == client_trace);
    assert_eq!(post.unwrap().parent, client_span, "the request joins the client's trace");
    // Each model request carries the traceparent of its own `chat` span.
    let chats = named(&spans, "chat gpt-4o-mini");
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    for request in requests {
        let traceparent = request.traceparent.expect("a traceparent header");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!((parts[0], parts[1], parts[3]), ("00", client_trace, "01"), "{traceparent}");
        assert!(chats.iter().any(|chat| chat.span_id == parts[2]), "{traceparent} names a chat span");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_trace_over_otlp_grpc() {
    let (endpoint, spans) = grpc_receiver().await;
    let model = FakeOpenAi::start(script(), None).await.unwrap();
    let (daemon, dir) = serve("grpc", &model, &endpoint, "grpc");
    let (view, _) = one_run(daemon, None).await;
    let trace_id = view["trace_id"].as_str().expect("a trace id").to_owned();
    assert_eq!(trace_id.len(), 32);

    let spans = spans.lock().unwrap().clone();
    check_tree(&spans, &trace_id);
    let post = spans.iter().find(|span| span.name == "POST /v1/runs" && span.trace_id == trace_id);
    assert_eq!(post.unwrap().parent, "", "without a client trace the request is the root");
    let _ = std::fs::remove_dir_all(&dir);
}
