//! The floor: a bare server that makes the HTTP exchanges of a bench run and
//! nothing else, to tell what those exchanges alone cost on this machine.
//!
//! It answers `POST /v1/runs` with a run of the daemon's size, asks the model
//! twice over one kept-alive connection (request bodies of the daemon's sizes,
//! encoded with serde_json; each reply read to its end, not parsed), and streams
//! the run's events as the daemon does: four bursts of SSE frames of the daemon's
//! sizes, one after the run starts, one after each model reply, one after the
//! tool results. No actors, no store, no tools, no review, no logging. Same
//! runtime (tokio's multi-thread scheduler with as many workers as the daemon,
//! `[server] worker_threads` read from the environment as the daemon reads it), same allocator
//! (jemalloc), same HTTP server (hyper through axum, `TCP_NODELAY`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The environment variable that makes the bench's binary the floor server; its
/// value is the model's base URL (`http://127.0.0.1:PORT/v1`).
pub const MODEL_VAR: &str = "TROUPE_BENCH_FLOOR_MODEL";

/// The size of each of a run's event bursts (frames, without chunk framing), and
/// how many events it holds, as the daemon streamed them for this workload.
const BURSTS: [(usize, usize); 4] = [(2, 360), (6, 1_530), (9, 3_610), (6, 1_480)];
/// The daemon's request bodies to the model, turn 1 and turn 2, in bytes.
const REQUEST_BYTES: [usize; 2] = [3_081, 3_977];
/// The daemon's `201 Created` body, in bytes.
const RUN_BYTES: usize = 458;

struct Floor {
    model_host: String,
    model_path: String,
    runs: Mutex<HashMap<String, mpsc::UnboundedReceiver<Bytes>>>,
    connections: Mutex<Vec<TcpStream>>,
    next: AtomicU64,
    requests: [Value; 2],
}

/// Serves until killed; prints `troupe listening on <base>` as the daemon does.
pub fn serve(model_base: &str) {
    let config = troupe::config::Config::load(None, std::env::vars()).expect("the daemon's settings");
    let workers = config.server.workers();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let address = model_base.trim_start_matches("http://");
        let (host, path) = address.split_once('/').unwrap_or((address, ""));
        let floor = Arc::new(Floor {
            model_host: host.to_owned(),
            model_path: format!("/{path}/chat/completions").replace("//", "/"),
            runs: Mutex::default(),
            connections: Mutex::default(),
            next: AtomicU64::new(1),
            requests: [request(REQUEST_BYTES[0], false), request(REQUEST_BYTES[1], true)],
        });
        let router =
            Router::new().route("/v1/runs", post(submit)).route("/v1/runs/{id}/events", get(events)).with_state(floor);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        println!("troupe listening on http://{}", listener.local_addr().expect("an address"));
        let listener = listener.tap_io(|stream| {
            let _ = stream.set_nodelay(true);
        });
        axum::serve(listener, router).await.expect("the floor serves");
    });
}

/// A chat request of about `bytes` bytes: a system and a user message (and on
/// turn 2 the assistant's two calls and their results), one tool.
fn request(bytes: usize, second: bool) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "Measure texts with text_stats."}),
        json!({"role": "user", "content": "Count the words of two texts."}),
    ];
    if second {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "text_stats", "arguments": "{\"text\": \"the cat sat on the mat\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "text_stats", "arguments": "{\"text\": \"a dog ran in the park\"}"}},
        ]}));
        for id in ["call_1", "call_2"] {
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": "{\"words\":6,\"sentences\":1,\"characters\":22}"}));
        }
    }
    let mut body = json!({"model": "fake", "messages": messages, "stream": true, "tools": [{"type": "function",
        "function": {"name": "text_stats", "description": "", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]});
    let filler = bytes.saturating_sub(body.to_string().len());
    body["tools"][0]["function"]["description"] = Value::String("x".repeat(filler));
    body
}

async fn submit(State(floor): State<Arc<Floor>>, body: Bytes) -> Response {
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let number = floor.next.fetch_add(1, Ordering::Relaxed);
    let id = format!("00000000-0000-7000-8000-{number:012x}");
    let (events, receiver) = mpsc::unbounded_channel();
    floor.runs.lock().expect("the runs").insert(id.clone(), receiver);
    let mut run =
        json!({"run_id": id, "agent": input["agent"], "input": input["input"], "status": "running", "metadata": {}});
    let filler = RUN_BYTES.saturating_sub(run.to_string().len());
    run["limits"] = Value::String("x".repeat(filler));
    let _ = events.send(burst(&id, 0, 1));
    tokio::spawn(drive(floor, id, events));
    (StatusCode::CREATED, [(header::CONTENT_TYPE, "application/json")], run.to_string()).into_response()
}

/// The run: a model call, two bursts, a model call, the last burst.
async fn drive(floor: Arc<Floor>, id: String, events: mpsc::UnboundedSender<Bytes>) {
    let mut seq = 1 + BURSTS[0].0 as u64;
    for (turn, bursts) in [(0, &[1, 2][..]), (1, &[3][..])] {
        if let Err(error) = floor.ask(turn).await {
            eprintln!("floor: the model call failed: {error}");
            return;
        }
        for &index in bursts {
            let _ = events.send(burst(&id, index, seq));
            seq += BURSTS[index].0 as u64;
            tokio::task::yield_now().await;
        }
    }
}

impl Floor {
    /// One request to the model on a kept-alive connection; its reply read to
    /// the end of its chunked body.
    async fn ask(&self, turn: usize) -> std::io::Result<()> {
        let pooled = self.connections.lock().expect("the connections").pop();
        let mut connection = match pooled {
            Some(connection) => connection,
            None => {
                let connection = TcpStream::connect(&self.model_host).await?;
                connection.set_nodelay(true)?;
                connection
            }
        };
        let body = serde_json::to_vec(&self.requests[turn])?;
        let mut message = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: */*\r\ncontent-length: {}\r\n\r\n",
            self.model_path,
            self.model_host,
            body.len()
        )
        .into_bytes();
        message.extend_from_slice(&body);
        let exchange = async {
            connection.write_all(&message).await?;
            let mut reply = Vec::with_capacity(2048);
            let mut buffer = [0u8; 8192];
            // A streamed reply (chunked) that succeeded, read to its last chunk.
            while !reply.ends_with(b"\r\n0\r\n\r\n") {
                let read = connection.read(&mut buffer).await?;
                if read == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                reply.extend_from_slice(&buffer[..read]);
                if reply.windows(4).any(|window| window == b"\r\n\r\n") && !reply.starts_with(b"HTTP/1.1 200") {
                    return Err(std::io::Error::other(String::from_utf8_lossy(&reply).into_owned()));
                }
            }
            if !reply.windows(12).any(|window| window == b"data: [DONE]") {
                return Err(std::io::Error::other("the reply did not end with [DONE]"));
            }
            Ok::<_, std::io::Error>(())
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), exchange)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        self.connections.lock().expect("the connections").push(connection);
        Ok(())
    }
}

/// Burst `index` of run `id`, its first event numbered `seq`: SSE frames of the
/// daemon's sizes; the last one ends the run as the daemon's `run_end` does.
fn burst(id: &str, index: usize, seq: u64) -> Bytes {
    let (count, bytes) = BURSTS[index];
    let mut frames = String::with_capacity(bytes + 64);
    for n in 0..count as u64 {
        let seq = seq + n;
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let last = index == BURSTS.len() - 1 && n + 1 == count as u64;
        let (kind, status) = match (index, last) {
            (_, true) => ("run_end", "succeeded"),
            (2, _) if n < 2 => ("tool_call_end", "completed"),
            _ => ("event", "ok"),
        };
        let head = format!(
            "id: {seq}\nevent: {kind}\ndata: {{\"run_id\":\"{id}\",\"seq\":{seq},\"ts\":\"{ts}\",\"kind\":\"{kind}\",\"status\":\"{status}\",\"detail\":\""
        );
        frames.push_str(&head);
        let filler = (bytes / count).saturating_sub(head.len() + 4);
        frames.extend(std::iter::repeat_n('x', filler));
        frames.push_str("\"}\n\n");
    }
    Bytes::from(frames)
}

async fn events(State(floor): State<Arc<Floor>>, Path(id): Path<String>) -> Response {
    let Some(receiver) = floor.runs.lock().expect("the runs").remove(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        let frames = receiver.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(frames), receiver))
    });
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(stream))
        .into_response()
}
