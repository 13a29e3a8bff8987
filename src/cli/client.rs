//! The CLI's client of a running daemon: `troupe run`, `troupe runs …`,
//! `troupe threads …`, `troupe chat`, `troupe agents`, `troupe tools`. Following a run reads its SSE stream and
//! reconnects with `Last-Event-ID` when the connection drops, so a flaky network
//! loses no event and shows none twice.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use troupe_actors::protocol::{EventKind, RunEvent, RunStatus};

use crate::cli::view::{TICK, View};
use crate::server::STREAM_ERROR;
use crate::server::api_types::{AgentView, RunList, RunView, ThreadDetail, ThreadList, ThreadView, ToolView};

/// Reconnections in a row without a new event before following gives up.
const MAX_RECONNECTS: u32 = 10;

/// What a followed run waits for once it parks: calls waiting for approval, and
/// its question.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Waiting {
    /// `(call id, tool, why)` of each call waiting for a decision, in order.
    pub approvals: Vec<(String, String, String)>,
    /// The question it asked, until it is answered.
    pub question: Option<String>,
}

impl Waiting {
    fn track(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ApprovalRequested { call_id, tool, reason, .. } => {
                self.approvals.push((call_id.clone(), tool.clone(), reason.clone()));
            }
            EventKind::ApprovalDecided { call_id, .. } => self.approvals.retain(|(id, _, _)| id != call_id),
            EventKind::WaitingInput { prompt, .. } => self.question = Some(prompt.clone()),
            EventKind::InputReceived { .. } => self.question = None,
            _ => {}
        }
    }
}

/// A daemon's API.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the daemon at `base` (`http://HOST:PORT`).
    pub fn new(base: &str, token: Option<String>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        Ok(Self { http, base: base.trim_end_matches('/').to_owned(), token })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    async fn call<T: DeserializeOwned>(&self, builder: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let response = builder
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        let bytes = response.bytes().await.context("the daemon's answer was cut off")?;
        if !status.is_success() {
            bail!("{}", describe_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("unexpected answer from the daemon ({status})"))
    }

    /// Starts a run.
    pub async fn create_run(&self, agent: &str, input: &str) -> anyhow::Result<RunView> {
        self.call(self.request(Method::POST, "/v1/runs").json(&json!({"agent": agent, "input": input}))).await
    }

    /// The tenant's runs, newest first.
    pub async fn list_runs(&self, status: Option<&str>, limit: usize) -> anyhow::Result<RunList> {
        let mut path = format!("/v1/runs?limit={limit}");
        if let Some(status) = status {
            if !status.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                bail!("unknown status {status:?}");
            }
            path.push_str(&format!("&status={status}"));
        }
        self.call(self.request(Method::GET, &path)).await
    }

    /// One run.
    pub async fn get_run(&self, id: &str) -> anyhow::Result<RunView> {
        self.call(self.request(Method::GET, &format!("/v1/runs/{id}"))).await
    }

    /// Cancels a run.
    pub async fn cancel(&self, id: &str) -> anyhow::Result<RunView> {
        self.call(self.request(Method::POST, &format!("/v1/runs/{id}/cancel"))).await
    }

    /// Answers a run's question.
    pub async fn input(&self, id: &str, text: &str) -> anyhow::Result<RunView> {
        self.call(self.request(Method::POST, &format!("/v1/runs/{id}/input")).json(&json!({"text": text}))).await
    }

    /// Approves or rejects a call waiting for approval (`call_id` may be left
    /// out when only one waits).
    pub async fn approve(
        &self,
        id: &str,
        call_id: Option<&str>,
        approved: bool,
        reason: Option<&str>,
    ) -> anyhow::Result<RunView> {
        let body = json!({"approve": approved, "call_id": call_id, "reason": reason});
        self.call(self.request(Method::POST, &format!("/v1/runs/{id}/input")).json(&body)).await
    }

    /// Starts a thread (a conversation) with `agent`.
    pub async fn create_thread(&self, agent: &str) -> anyhow::Result<ThreadView> {
        self.call(self.request(Method::POST, "/v1/threads").json(&json!({"agent": agent}))).await
    }

    /// One thread with its conversation.
    pub async fn get_thread(&self, id: &str) -> anyhow::Result<ThreadDetail> {
        self.call(self.request(Method::GET, &format!("/v1/threads/{id}"))).await
    }

    /// The tenant's threads, newest first.
    pub async fn list_threads(&self, limit: usize) -> anyhow::Result<ThreadList> {
        self.call(self.request(Method::GET, &format!("/v1/threads?limit={limit}"))).await
    }

    /// Deletes a thread with its runs.
    pub async fn delete_thread(&self, id: &str) -> anyhow::Result<()> {
        let response = self
            .request(Method::DELETE, &format!("/v1/threads/{id}"))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.unwrap_or_default();
            bail!("{}", describe_error(status, &bytes));
        }
        Ok(())
    }

    /// Sends a message to a thread, with `strategy` for a thread with an active
    /// run (`enqueue`: it runs after the thread's earlier runs).
    pub async fn send_message(&self, thread: &str, input: &str, strategy: &str) -> anyhow::Result<RunView> {
        let body = json!({"input": input, "multitask_strategy": strategy});
        self.call(self.request(Method::POST, &format!("/v1/threads/{thread}/runs")).json(&body)).await
    }

    /// The agents.
    pub async fn agents(&self) -> anyhow::Result<Vec<AgentView>> {
        self.call(self.request(Method::GET, "/v1/agents")).await
    }

    /// The tools.
    pub async fn tools(&self) -> anyhow::Result<Vec<ToolView>> {
        self.call(self.request(Method::GET, "/v1/tools")).await
    }

    /// Follows a run's events until it ends or parks on a question, showing them
    /// with `view` (or as JSON lines when `view` is `None`). Returns the run's
    /// status at that point.
    pub async fn follow(&self, id: &str, view: Option<View>, out: &mut impl Write) -> anyhow::Result<RunStatus> {
        self.follow_waiting(id, &mut { view }, out, &mut Waiting::default(), &mut 0).await
    }

    /// [`Client::follow`] from the event after seq `last` (kept up to date, so
    /// that following again after answering the run goes on where this stopped),
    /// keeping in `waiting` what the run waits for when it parks.
    pub async fn follow_waiting(
        &self,
        id: &str,
        view: &mut Option<View>,
        out: &mut impl Write,
        waiting: &mut Waiting,
        last: &mut u64,
    ) -> anyhow::Result<RunStatus> {
        let mut failures = 0u32;
        loop {
            let mut request = self.request(Method::GET, &format!("/v1/runs/{id}/events"));
            if *last > 0 {
                request = request.header("Last-Event-ID", last.to_string());
            }
            let outcome = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    self.read_stream(response, last, view, out, waiting).await
                }
                Ok(response) => {
                    let status = response.status();
                    let bytes = response.bytes().await.unwrap_or_default();
                    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
                        bail!("{}", describe_error(status, &bytes));
                    }
                    Err(anyhow::anyhow!("{}", describe_error(status, &bytes)))
                }
                Err(error) => Err(anyhow::Error::from(error).context(format!("cannot reach {}", self.base))),
            };
            match outcome {
                Ok(Some(status)) => return Ok(status),
                Ok(None) => failures = 0,
                Err(error) if failures >= MAX_RECONNECTS => return Err(error),
                Err(error) => {
                    failures += 1;
                    tracing::debug!(%error, "event stream dropped; reconnecting");
                }
            }
            if let Some(view) = view.as_mut() {
                view.clear(out)?;
            }
            tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.max(1)))).await;
        }
    }

    /// Reads one connection's events. `Some(status)` once the run ended or parked;
    /// `None` if the stream ended early (shutdown, a proxy): reconnect.
    async fn read_stream(
        &self,
        response: reqwest::Response,
        last: &mut u64,
        view: &mut Option<View>,
        out: &mut impl Write,
        waiting: &mut Waiting,
    ) -> anyhow::Result<Option<RunStatus>> {
        let mut body = response.bytes_stream();
        let mut parser = SseParser::default();
        let mut tick = tokio::time::interval(TICK);
        loop {
            let chunk = tokio::select! {
                chunk = body.next() => chunk,
                _ = tick.tick() => {
                    if let Some(view) = view.as_mut() {
                        view.tick(out)?;
                    }
                    continue;
                }
            };
            let Some(chunk) = chunk else { return Ok(None) };
            let chunk = chunk.context("the event stream broke")?;
            for frame in parser.push(&chunk) {
                if frame.event.as_deref() == Some(STREAM_ERROR) {
                    return Err(anyhow::anyhow!("the daemon reported: {}", frame.data));
                }
                let event: RunEvent =
                    serde_json::from_str(&frame.data).context("the daemon sent an event this client cannot read")?;
                if event.seq <= *last {
                    continue;
                }
                *last = event.seq;
                waiting.track(&event.kind);
                let ended = match view.as_mut() {
                    Some(view) => view.event(out, &event)?,
                    None => {
                        writeln!(out, "{}", serde_json::to_string(&event)?)?;
                        match &event.kind {
                            EventKind::RunEnd { status, .. } => Some(*status),
                            _ => None,
                        }
                    }
                };
                if let Some(status) = ended {
                    return Ok(Some(status));
                }
                // A question in the history may have been answered since: stop only
                // if the run waits now.
                if matches!(event.kind, EventKind::WaitingInput { .. })
                    && self.get_run(&event.run_id.to_string()).await?.status == RunStatus::WaitingInput.as_str()
                {
                    return Ok(Some(RunStatus::WaitingInput));
                }
            }
        }
    }
}

/// `404 not_found: run not found` from an error answer.
fn describe_error(status: StatusCode, body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let detail = parsed.as_ref().and_then(|value| value.get("error"));
    match detail {
        Some(detail) => format!(
            "{} {}: {}",
            status.as_u16(),
            detail.get("code").and_then(Value::as_str).unwrap_or("error"),
            detail.get("message").and_then(Value::as_str).unwrap_or_default()
        ),
        None => format!("{status}: {}", String::from_utf8_lossy(body).chars().take(200).collect::<String>()),
    }
}

/// One SSE event.
#[derive(Debug, Default, PartialEq)]
pub struct SseFrame {
    /// `id:`.
    pub id: Option<String>,
    /// `event:`.
    pub event: Option<String>,
    /// `data:` lines joined with newlines.
    pub data: String,
}

/// Splits an SSE byte stream into events (the WHATWG rules: `\n`, `\r\n` or `\r`
/// line ends, comments skipped, an event dispatched at a blank line).
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    frame: SseFrame,
    has_data: bool,
}

impl SseParser {
    /// The events completed by `chunk`.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseFrame> {
        self.pending.extend_from_slice(chunk);
        let mut frames = Vec::new();
        let mut start = 0;
        let mut index = 0;
        while index < self.pending.len() {
            let byte = self.pending[index];
            if byte == b'\n' || byte == b'\r' {
                // A `\r` at the very end may be half of `\r\n`: wait for more.
                if byte == b'\r' && index + 1 == self.pending.len() {
                    break;
                }
                let line = String::from_utf8_lossy(&self.pending[start..index]).into_owned();
                if byte == b'\r' && self.pending.get(index + 1) == Some(&b'\n') {
                    index += 1;
                }
                if let Some(frame) = self.line(&line) {
                    frames.push(frame);
                }
                start = index + 1;
            }
            index += 1;
        }
        self.pending.drain(..start);
        frames
    }

    fn line(&mut self, line: &str) -> Option<SseFrame> {
        if line.is_empty() {
            let frame = std::mem::take(&mut self.frame);
            return std::mem::take(&mut self.has_data).then_some(frame);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => self.frame.id = Some(value.to_owned()),
            "event" => self.frame.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.frame.data.push('\n');
                }
                self.frame.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_frames_are_split_across_chunks_and_line_endings() {
        let mut parser = SseParser::default();
        assert!(parser.push(b": keep-alive\n\nid: 1\nevent: run_started\nda").is_empty());
        let frames = parser.push(b"ta: {\"a\":1}\r\n\r\nid: 2\rdata: x\rdata: y\r");
        assert_eq!(
            frames,
            vec![SseFrame { id: Some("1".into()), event: Some("run_started".into()), data: "{\"a\":1}".into() }]
        );
        let frames = parser.push(b"\n\n");
        assert_eq!(frames, vec![SseFrame { id: Some("2".into()), event: None, data: "x\ny".into() }]);
    }

    #[test]
    fn error_answers_are_shown_with_their_code() {
        let body = br#"{"error":{"code":"not_found","message":"run not found"}}"#;
        assert_eq!(describe_error(StatusCode::NOT_FOUND, body), "404 not_found: run not found");
        assert_eq!(describe_error(StatusCode::BAD_GATEWAY, b"upstream"), "502 Bad Gateway: upstream");
    }
}
