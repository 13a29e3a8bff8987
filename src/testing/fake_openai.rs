//! A fake OpenAI-compatible server for tests and benchmarks: it answers
//! `POST /v1/chat/completions` from a script, one reply per request, with real
//! chunk timing for streams, and injects faults (any status with `Retry-After`, a
//! hang, a slow drip, a truncated stream, malformed JSON, a huge body). It records
//! every request. It stands in for the network only; the product never uses it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FakeReply {
    /// A 200 event stream: each chunk as `data: {json}`, `delay_ms` apart, then
    /// `data: [DONE]` if `done`.
    Stream {
        /// The chunks.
        chunks: Vec<Value>,
        /// Milliseconds between chunks.
        #[serde(default)]
        delay_ms: u64,
        /// Whether the stream ends properly.
        #[serde(default = "yes")]
        done: bool,
    },
    /// A 200 JSON body (non-streaming mode).
    Json {
        /// The body.
        body: Value,
    },
    /// An error status. `{auth}` in `body` is replaced by the request's
    /// Authorization header, as a careless server might echo it.
    Status {
        /// The status code.
        status: u16,
        /// The `Retry-After` header.
        #[serde(default)]
        retry_after: Option<String>,
        /// The body.
        #[serde(default)]
        body: String,
    },
    /// Never answers.
    Hang,
    /// The reply for the request's turn: `replies[n]` when the request holds `n`
    /// assistant messages (the last one past the end). Concurrent runs each get
    /// their own sequence, as from a scripted agent.
    PerTurn {
        /// The replies, by turn.
        replies: Vec<FakeReply>,
    },
    /// Any bytes with any content type.
    Raw {
        /// The status code.
        status: u16,
        /// The content type.
        content_type: String,
        /// The body.
        body: String,
    },
}

fn yes() -> bool {
    true
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// When it arrived.
    pub at: tokio::time::Instant,
    /// Its Authorization header, if any.
    pub authorization: Option<String>,
    /// Its W3C `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// Its JSON body (`Null` if it was not JSON).
    pub body: Value,
}

struct FakeState {
    script: Mutex<VecDeque<FakeReply>>,
    fallback: Option<FakeReply>,
    requests: Mutex<Vec<Recorded>>,
}

/// A running fake server.
pub struct FakeOpenAi {
    addr: SocketAddr,
    state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeOpenAi {
    /// Serves `script` on 127.0.0.1 (a free port), then `fallback` (or 500s).
    pub async fn start(script: Vec<FakeReply>, fallback: Option<FakeReply>) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), script, fallback).await
    }

    /// Serves on `addr`.
    pub async fn start_on(
        addr: SocketAddr,
        script: Vec<FakeReply>,
        fallback: Option<FakeReply>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state =
            Arc::new(FakeState { script: Mutex::new(script.into()), fallback, requests: Mutex::new(Vec::new()) });
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/stats", axum::routing::get(stats))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, state, task })
    }

    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().map(|requests| requests.clone()).unwrap_or_default()
    }

    /// Serves until the process is killed (the dev binary).
    pub async fn serve_forever(self) {
        std::future::pending::<()>().await;
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(state): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let recorded = Recorded {
        at: tokio::time::Instant::now(),
        authorization: authorization.clone(),
        traceparent: headers.get("traceparent").and_then(|value| value.to_str().ok()).map(str::to_owned),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    if let Ok(mut requests) = state.requests.lock() {
        requests.push(recorded);
    }
    let next = state.script.lock().ok().and_then(|mut script| script.pop_front()).or_else(|| state.fallback.clone());
    let Some(mut reply) = next else {
        return plain(500, "text/plain", "the fake server's script is exhausted".to_owned());
    };
    while let FakeReply::PerTurn { replies } = reply {
        let turn = request_turn(&body);
        let Some(chosen) = replies.get(turn).or(replies.last()).cloned() else {
            return plain(500, "text/plain", "an empty per-turn script".to_owned());
        };
        reply = chosen;
    }
    match reply {
        FakeReply::Stream { chunks, delay_ms, done } => {
            let mut frames: Vec<String> = chunks.iter().map(|chunk| format!("data: {chunk}\n\n")).collect();
            if done {
                frames.push("data: [DONE]\n\n".to_owned());
            }
            let delay = Duration::from_millis(delay_ms);
            let body = stream::iter(frames).then(move |frame| async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok::<Bytes, Infallible>(Bytes::from(frame))
            });
            response(200, "text/event-stream", Body::from_stream(body), None)
        }
        FakeReply::Json { body } => plain(200, "application/json", body.to_string()),
        FakeReply::Status { status, retry_after, body } => {
            let body = body.replace("{auth}", authorization.as_deref().unwrap_or(""));
            response(status, "application/json", Body::from(body), retry_after)
        }
        FakeReply::Hang => {
            std::future::pending::<()>().await;
            plain(500, "text/plain", String::new())
        }
        FakeReply::Raw { status, content_type, body } => plain(status, &content_type, body),
        FakeReply::PerTurn { .. } => plain(500, "text/plain", String::new()),
    }
}

/// `GET /stats`: `{"requests": N}`, the requests received so far (for a
/// benchmark in another process, to know when its runs reached the model).
async fn stats(State(state): State<Arc<FakeState>>) -> Response {
    let requests = state.requests.lock().map_or(0, |requests| requests.len());
    plain(200, "application/json", json!({ "requests": requests }).to_string())
}

/// How many assistant messages the request body holds.
fn request_turn(body: &Bytes) -> usize {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| messages.iter().filter(|m| m["role"] == "assistant").count())
}

fn plain(status: u16, content_type: &str, body: String) -> Response {
    response(status, content_type, Body::from(body), None)
}

fn response(status: u16, content_type: &str, body: Body, retry_after: Option<String>) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type);
    if let Some(after) = retry_after {
        builder = builder.header(header::RETRY_AFTER, after);
    }
    builder.body(body).unwrap_or_else(|_| Response::new(Body::empty()))
}

/// A stream of `text` in `pieces` content deltas, then a finish and usage chunk.
pub fn text_stream(text: &str, pieces: usize) -> FakeReply {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let per = words.len().div_ceil(pieces.max(1)).max(1);
    let mut chunks: Vec<Value> =
        words.chunks(per).map(|part| json!({"choices": [{"index": 0, "delta": {"content": part.concat()}}]})).collect();
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    chunks.push(usage_chunk(12, 7));
    FakeReply::Stream { chunks, delay_ms: 0, done: true }
}

/// A stream of tool calls (`id`, `name`, `arguments` JSON text), each call's
/// arguments split into `pieces` fragments, calls interleaved by index.
pub fn tool_call_stream(calls: &[(&str, &str, &str)], pieces: usize) -> FakeReply {
    let mut chunks = Vec::new();
    for (index, (id, name, _)) in calls.iter().enumerate() {
        chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}
        ]}}]}));
    }
    let fragments: Vec<Vec<String>> = calls
        .iter()
        .map(|(_, _, arguments)| {
            let chars: Vec<char> = arguments.chars().collect();
            let per = chars.len().div_ceil(pieces.max(1)).max(1);
            chars.chunks(per).map(|part| part.iter().collect()).collect()
        })
        .collect();
    let rounds = fragments.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..rounds {
        for (index, parts) in fragments.iter().enumerate() {
            if let Some(part) = parts.get(round) {
                chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": index, "function": {"arguments": part}}
                ]}}]}));
            }
        }
    }
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
    chunks.push(usage_chunk(20, 9));
    FakeReply::Stream { chunks, delay_ms: 0, done: true }
}

/// The last chunk of a stream with `stream_options.include_usage`.
pub fn usage_chunk(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens}})
}
