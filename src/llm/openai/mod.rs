//! An OpenAI-compatible Chat Completions client (OpenAI, vLLM, Ollama, llama.cpp's
//! server, LM Studio, LiteLLM…), hand-rolled so vendor fields survive. A provider
//! over plain HTTP is reached by a lean HTTP/1.1 client on the caller's task
//! ([`http1`]); HTTPS, and every provider when a proxy is set in the
//! environment, by reqwest.
//!
//! Per provider: one connection pool, a concurrency limit with a bounded wait
//! queue (beyond it: `ModelError::Overloaded`), and the retry policy. Timeouts:
//! connect, first byte (until the response head), and idle (between two body
//! chunks). Dropping the stream (a cancelled run) closes the connection. The API
//! key is kept in a [`Secret`] and scrubbed from every error message.
//!
//! A reply is bounded by `max_body_bytes` as it streams in, and the body, its
//! buffer and the concurrency slot are given back as soon as it is complete or
//! has failed. Each retry is logged (WARN: provider, model, the status or error,
//! the attempt and the delay), and so is a request that failed for good (WARN, or
//! ERROR when retrying could not help) and a reply cut mid-stream.

mod http1;
mod retry;
pub mod wire;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{error, warn};
use troupe_actors::llm::{ChatRequest, ModelChunk, ModelClient, ModelError, ModelStream};
use troupe_actors::metrics;

pub use retry::{Attempt, RetryPolicy, parse_retry_after, with_retries};

use wire::{Accumulator, StreamChunk};

/// An API key. Its `Debug` shows nothing, and it is never formatted into text.
#[derive(Clone, PartialEq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a key; an empty one is no key.
    pub fn new(key: String) -> Option<Self> {
        let key = key.trim();
        (!key.is_empty()).then(|| Self(key.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How to reach one provider.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// Its name in config.
    pub name: String,
    /// E.g. `https://api.openai.com/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// The bearer key, if the provider wants one.
    pub api_key: Option<Secret>,
    /// Extra headers sent with every request. Their values are treated as secrets
    /// (some providers take the key in a header).
    pub headers: Vec<(String, Secret)>,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time until the response head arrives.
    pub first_byte_timeout: Duration,
    /// Longest gap between two chunks of a response body.
    pub idle_timeout: Duration,
    /// Requests in flight at once.
    pub max_concurrency: usize,
    /// Requests that may wait for a slot; more fail with `Overloaded`.
    pub queue_limit: usize,
    /// Largest reply accepted, in bytes: its text, reasoning and tool calls plus
    /// the part of the body not yet read (a whole body when not streaming). It is
    /// checked as the reply streams in; a reply over it fails with
    /// `ModelError::Decode`.
    pub max_body_bytes: usize,
    /// Retries.
    pub retry: RetryPolicy,
}

/// A provider: settings plus its shared pool and limits.
pub struct Provider {
    settings: ProviderSettings,
    transport: Transport,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// The tool definitions its requests offer, each encoded once.
    encoded_tools: wire::EncodedTools,
}

/// How a provider's requests travel.
enum Transport {
    /// Plain HTTP, no proxy: the lean client.
    Lean(Arc<http1::Endpoint>),
    /// HTTPS, or through a proxy: reqwest.
    General(reqwest::Client),
}

impl Provider {
    /// Builds the provider's HTTP client: the lean one for a plain-HTTP base URL,
    /// reqwest for HTTPS (and a URL with credentials).
    pub fn new(settings: ProviderSettings) -> Result<Arc<Self>, ModelError> {
        // Credentials in the URL (Basic auth) are reqwest's to send.
        let url = reqwest::Url::parse(&chat_url(&settings.base_url))
            .ok()
            .filter(|url| url.scheme() == "http" && url.username().is_empty() && url.password().is_none());
        match url {
            Some(url) => {
                let key = settings.api_key.as_ref().map(|Secret(key)| format!("Bearer {key}"));
                let mut headers = vec![("content-type", "application/json"), ("accept", "*/*")];
                headers.extend(settings.headers.iter().map(|(name, Secret(value))| (name.as_str(), value.as_str())));
                headers.extend(key.as_deref().map(|key| ("authorization", key)));
                let endpoint = http1::Endpoint::new(&url, &headers, settings.connect_timeout, settings.max_concurrency)
                    .map_err(ModelError::Transport)?;
                Ok(Self::with(settings, Transport::Lean(endpoint)))
            }
            None => Self::with_general_client(settings),
        }
    }

    /// A provider that uses reqwest whatever its URL: what one behind a proxy set
    /// in the environment uses (reqwest honours `http_proxy` and the like).
    pub fn with_general_client(settings: ProviderSettings) -> Result<Arc<Self>, ModelError> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .pool_max_idle_per_host(settings.max_concurrency)
            .build()
            .map_err(|error| ModelError::Transport(format!("cannot build the HTTP client: {error}")))?;
        Ok(Self::with(settings, Transport::General(http)))
    }

    fn with(settings: ProviderSettings, transport: Transport) -> Arc<Self> {
        let slots = Arc::new(Semaphore::new(settings.max_concurrency.clamp(1, Semaphore::MAX_PERMITS)));
        Arc::new(Self {
            settings,
            transport,
            slots,
            waiting: AtomicUsize::new(0),
            encoded_tools: wire::EncodedTools::default(),
        })
    }

    /// A concurrency slot, waiting in the bounded queue if need be.
    async fn admit(&self) -> Result<OwnedSemaphorePermit, ModelError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(permit);
        }
        // Counted while waiting; the guard uncounts also when the wait is dropped
        // (a cancelled run, a model timeout).
        let waiting = Waiting::enter(&self.waiting);
        if waiting.ahead >= self.settings.queue_limit {
            return Err(ModelError::Overloaded(format!(
                "provider {}: {} requests in flight and {} waiting",
                self.settings.name, self.settings.max_concurrency, self.settings.queue_limit
            )));
        }
        let permit = self.slots.clone().acquire_owned().await;
        drop(waiting);
        permit.map_err(|_| ModelError::Overloaded("the provider is shutting down".to_owned()))
    }

    /// Removes the key from text that may echo it (an error body, say).
    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let secrets = self.settings.api_key.iter().chain(self.settings.headers.iter().map(|(_, value)| value));
        for Secret(secret) in secrets {
            if secret.len() >= 4 {
                text = text.replace(secret.as_str(), "***");
            }
        }
        match text.char_indices().nth(500) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    }
}

/// A place in a provider's wait queue, given back when dropped.
struct Waiting<'a> {
    counter: &'a AtomicUsize,
    /// Requests that were waiting before this one.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        let ahead = counter.fetch_add(1, Ordering::SeqCst);
        Self { counter, ahead }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One model of a provider.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// The name agents use.
    pub name: String,
    /// The provider's model id.
    pub id: String,
    /// Stream the reply (`stream: true`), or ask for one JSON body.
    pub stream: bool,
    /// USD per million input tokens.
    pub input_price_per_million: f64,
    /// USD per million output tokens.
    pub output_price_per_million: f64,
    /// Tokens of context (prompt and reply), if known.
    pub context_window: Option<usize>,
}

/// A model behind an OpenAI-compatible provider.
pub struct OpenAiModel {
    provider: Arc<Provider>,
    settings: ModelSettings,
}

impl OpenAiModel {
    /// The model `settings` of `provider`.
    pub fn new(provider: Arc<Provider>, settings: ModelSettings) -> Self {
        Self { provider, settings }
    }

    /// Requests of this model's provider waiting for a concurrency slot.
    pub fn queued(&self) -> usize {
        self.provider.waiting.load(Ordering::SeqCst)
    }

    /// One attempt at sending `body`, classified for the retry loop.
    async fn send(&self, body: &Bytes) -> Attempt<Reply> {
        let settings = &self.provider.settings;
        // The call's span (`chat MODEL`) as the parent of the server's work.
        let trace = crate::otel::traceparent_of(&tracing::Span::current());
        // A failed send: its message, and whether trying again may help.
        let sent = match &self.provider.transport {
            Transport::Lean(endpoint) => {
                let extra: Vec<(&str, &str)> = trace.iter().map(|value| ("traceparent", value.as_str())).collect();
                tokio::time::timeout(settings.first_byte_timeout, endpoint.post(&extra, body))
                    .await
                    .map(|sent| sent.map(Reply::Lean).map_err(|error| (error.to_string(), true)))
            }
            Transport::General(http) => {
                let mut request = http
                    .post(chat_url(&settings.base_url))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
                for (name, Secret(value)) in &settings.headers {
                    request = request.header(name, value);
                }
                if let Some(Secret(key)) = &settings.api_key {
                    request = request.bearer_auth(key);
                }
                if let Some(trace) = &trace {
                    request = request.header("traceparent", trace);
                }
                tokio::time::timeout(settings.first_byte_timeout, request.send()).await.map(|sent| {
                    sent.map(Reply::General).map_err(|error| {
                        let retriable = error.is_connect() || error.is_timeout() || error.is_request();
                        (error.without_url().to_string(), retriable)
                    })
                })
            }
        };
        let response = match sent {
            Err(_) => {
                return Attempt::Retry { error: ModelError::Timeout(settings.first_byte_timeout), after: None };
            }
            Ok(Err((message, retriable))) => {
                let error = ModelError::Transport(self.provider.scrub(&message));
                if retriable {
                    return Attempt::Retry { error, after: None };
                }
                return Attempt::Fail(error);
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if (200..300).contains(&status) {
            return Attempt::Done(response);
        }
        let after = response.retry_after().and_then(|value| parse_retry_after(value, chrono::Utc::now()));
        let text = read_limited(response.into_body(), 64 * 1024, settings.idle_timeout).await;
        let text = String::from_utf8_lossy(&text);
        let error = ModelError::Status { status, message: self.provider.scrub(text.trim()) };
        let quota = text.contains("insufficient_quota") || text.contains("quota_exceeded");
        match status {
            429 if !quota => Attempt::Retry { error, after },
            408 | 500 | 502 | 503 | 504 => Attempt::Retry { error, after },
            _ => Attempt::Fail(error),
        }
    }
}

#[async_trait]
impl ModelClient for OpenAiModel {
    fn name(&self) -> &str {
        &self.settings.name
    }

    fn model_id(&self) -> &str {
        &self.settings.id
    }

    fn context_window(&self) -> Option<usize> {
        self.settings.context_window
    }

    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let started = Instant::now();
        let provider = &self.provider.settings;
        let permit = match self.provider.admit().await {
            Ok(permit) => permit,
            Err(error) => {
                let model = &self.settings.name;
                warn!(provider = %provider.name, %model, %error, "model request refused: the provider's queue is full");
                return Err(error);
            }
        };
        // Encoded once, and the request let go: a call waiting on a slow model
        // holds one copy of its prompt (the bytes every attempt sends), and no more
        // than its length (encoding grows the buffer by doubling).
        let body = wire::request_body(&request, &self.settings.id, self.settings.stream)
            .with_tools(&self.provider.encoded_tools);
        let body = serde_json::to_vec(&body)
            .map(|mut encoded| {
                encoded.shrink_to_fit();
                Bytes::from(encoded)
            })
            .map_err(|error| ModelError::Decode(format!("the request could not be encoded: {error}")))?;
        // Tools listed with tool choice `none` (the synthesis turn) may not be
        // called: nothing in its text is read as a call.
        let offered = request.tool_choice.callable(&request.tools);
        drop(request);
        // The attempts retried; the one that ended the loop came after them.
        let mut retried = 0;
        let on_retry = |error: &ModelError, number: u32, delay: Duration| {
            retried = number;
            metrics::model_retry(&self.settings.id, retry_reason(error));
            warn!(
                provider = %provider.name,
                model = %self.settings.name,
                %error,
                attempt = number,
                max_attempts = provider.retry.max_attempts,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "model request failed; retrying"
            );
        };
        let response = match with_retries(&provider.retry, |_| self.send(&body), on_retry).await {
            Ok(response) => response,
            Err(error) => {
                self.log_failure(&error, retried + 1, started);
                return Err(error);
            }
        };
        drop(body);
        let reading = Reading {
            body: Some(response.into_body()),
            buffer: Vec::new(),
            searched: 0,
            accumulator: Accumulator::default(),
            pending: VecDeque::new(),
            offered,
            stream: self.settings.stream,
            provider: self.provider.clone(),
            model: self.settings.clone(),
            started,
            ended: false,
            permit: Some(permit),
        };
        Ok(Box::pin(stream::unfold(reading, |mut reading| async move {
            let item = reading.next().await?;
            Some((item, reading))
        })))
    }
}

impl OpenAiModel {
    /// Logs a request that failed for good: ERROR when retrying could never help
    /// (a rejected key, an unknown model, a spent quota: the configuration must
    /// change), WARN for a provider that stayed down, slow or overloaded.
    fn log_failure(&self, error: &ModelError, attempts: u32, started: Instant) {
        let provider = &self.provider.settings.name;
        let model = &self.settings.name;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if error.is_transient() || matches!(error, ModelError::Timeout(_)) {
            warn!(%provider, %model, %error, attempts, elapsed_ms, "model request failed after its retries");
        } else {
            error!(%provider, %model, %error, attempts, elapsed_ms, "model request failed; retrying cannot help");
        }
    }
}

/// Kept at most between two pieces of a streamed body once its events are read:
/// one large event must not keep its buffer for the rest of the reply.
const KEEP_BUFFER: usize = 64 * 1024;

/// A response body being read into chunks; holds the concurrency slot until done.
/// Everything it holds is given back once the reply is complete or has failed,
/// even if the caller keeps the stream.
struct Reading {
    /// `None` once the reply is over: the connection goes back to the pool.
    body: Option<BodyReader>,
    /// Bytes not yet read as events (the whole body, when not streaming).
    buffer: Vec<u8>,
    /// How much of `buffer` is known to hold no event boundary.
    searched: usize,
    accumulator: Accumulator,
    pending: VecDeque<ModelChunk>,
    offered: Vec<String>,
    stream: bool,
    provider: Arc<Provider>,
    model: ModelSettings,
    started: Instant,
    ended: bool,
    /// The provider's concurrency slot, given back when the reply is over.
    permit: Option<OwnedSemaphorePermit>,
}

impl Reading {
    async fn next(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some(Ok(chunk));
            }
            let body = self.body.as_mut()?;
            let settings = &self.provider.settings;
            let piece = match tokio::time::timeout(settings.idle_timeout, body.next()).await {
                Err(_) => return self.fail(ModelError::Timeout(settings.idle_timeout)),
                Ok(Some(Err(error))) => return self.fail(ModelError::Transport(self.provider.scrub(&error))),
                Ok(Some(Ok(piece))) => piece,
                Ok(None) => return self.end_of_body(),
            };
            // The bound is on what the reply costs: the unparsed tail and the reply
            // so far, its reasoning included (a long stream's framing does not count
            // against it). It is checked before the piece is kept: a reply over it
            // fails as soon as it is, whatever its size.
            let limit = settings.max_body_bytes;
            if self.buffer.len() + piece.len() + self.accumulator.size() > limit {
                return self.fail(ModelError::Decode(format!(
                    "the reply is larger than {limit} bytes (the provider's max_body_bytes)"
                )));
            }
            if self.stream {
                // Carriage returns only end lines in an event stream (JSON escapes
                // its own); dropping them leaves one event separator: a blank line.
                for part in piece.split(|byte| *byte == b'\r') {
                    self.buffer.extend_from_slice(part);
                }
                if let Err(error) = self.take_events() {
                    return self.fail(error);
                }
            } else {
                self.buffer.extend_from_slice(&piece);
            }
        }
    }

    /// Folds the complete events of the buffer in, and drops them from it.
    fn take_events(&mut self) -> Result<(), ModelError> {
        let Some(end) = wire::last_event_end(&self.buffer, self.searched) else {
            self.searched = self.buffer.len();
            return Ok(());
        };
        let mut done = false;
        let mut result = Ok(());
        for payload in wire::event_payloads(&self.buffer[..end]) {
            if payload.trim_ascii() == b"[DONE]" {
                done = true;
                break;
            }
            result = fold_chunk(&mut self.accumulator, &mut self.pending, &self.provider, &payload);
            if result.is_err() {
                break;
            }
        }
        self.buffer.drain(..end);
        // What is left is an event's beginning, with no boundary in it.
        self.searched = self.buffer.len();
        if self.buffer.capacity() > KEEP_BUFFER && self.buffer.len() <= KEEP_BUFFER / 2 {
            self.buffer.shrink_to(KEEP_BUFFER);
        }
        if done {
            self.finish();
        }
        result
    }

    fn end_of_body(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        if !self.stream {
            let body = std::mem::take(&mut self.buffer);
            let response: Result<Value, _> = serde_json::from_slice(&body);
            // The raw body is not needed once parsed.
            drop(body);
            match response {
                Ok(response) => self.accumulator.push_response(response),
                Err(error) => return self.fail(ModelError::Decode(format!("the response is not JSON: {error}"))),
            }
            if !self.accumulator.finished {
                return self.fail(ModelError::Decode("the response has no choices".to_owned()));
            }
        } else {
            // A last event without its blank line still counts.
            if !self.buffer.is_empty() {
                self.buffer.extend_from_slice(b"\n\n");
                if let Err(error) = self.take_events() {
                    return self.fail(error);
                }
            }
            if self.ended {
                return self.next_pending();
            }
            if !self.accumulator.finished {
                // The body ended before `[DONE]` and before any finish reason: a
                // truncated stream. Nothing of it is used.
                return self.fail(ModelError::Incomplete);
            }
        }
        self.finish();
        self.next_pending()
    }

    fn next_pending(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        self.pending.pop_front().map(Ok)
    }

    fn finish(&mut self) {
        if self.ended {
            return;
        }
        self.release();
        let accumulator = std::mem::take(&mut self.accumulator);
        let prices = (self.model.input_price_per_million, self.model.output_price_per_million);
        let reply = accumulator.finish(&self.offered, prices, "call");
        metrics::gen_ai_operation(
            &self.model.id,
            self.started.elapsed(),
            reply.usage.input_tokens,
            reply.usage.output_tokens,
        );
        self.pending.push_back(ModelChunk::Done(reply));
    }

    fn fail(&mut self, error: ModelError) -> Option<Result<ModelChunk, ModelError>> {
        if self.stream && self.accumulator.finished && !self.ended {
            // The reply was complete (a finish reason came); only `[DONE]` or the
            // usage chunk is missing. Keep the reply.
            tracing::debug!(model = %self.model.name, %error, "stream ended uncleanly after its finish reason");
            self.finish();
            return self.next_pending();
        }
        warn!(
            provider = %self.provider.settings.name,
            model = %self.model.name,
            %error,
            received_bytes = self.accumulator.size(),
            elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "model reply failed while streaming"
        );
        self.release();
        self.accumulator = Accumulator::default();
        self.pending.clear();
        Some(Err(error))
    }

    /// The reply is over: the body, the buffer and the concurrency slot go back.
    fn release(&mut self) {
        self.ended = true;
        if let Some(body) = self.body.take() {
            body.close();
        }
        self.buffer = Vec::new();
        self.permit = None;
    }
}

/// Folds one event's payload (a JSON chunk) into the reply; its deltas queue up.
fn fold_chunk(
    accumulator: &mut Accumulator,
    pending: &mut VecDeque<ModelChunk>,
    provider: &Provider,
    payload: &[u8],
) -> Result<(), ModelError> {
    // The usual chunk is read straight into what the reply needs. One that may
    // report an error (an `error` key, `"object": "error"`: the quoted word
    // appears nowhere else, as text in JSON escapes its quotes), or is of another
    // shape, is read as a whole.
    let typed = if memchr::memmem::find(payload, b"\"error\"").is_some() {
        None
    } else {
        serde_json::from_slice::<StreamChunk<'_>>(payload).ok()
    };
    let chunk = match typed {
        Some(chunk) => chunk,
        None => {
            let chunk: Value = serde_json::from_slice(payload)
                .map_err(|error| ModelError::Decode(format!("a stream chunk is not JSON: {error}")))?;
            let vendor_error = (chunk.get("object").and_then(Value::as_str) == Some("error")).then_some(&chunk);
            if let Some(error) = chunk.get("error").or(vendor_error) {
                let error = provider.scrub(&error.to_string());
                return Err(ModelError::Decode(format!("the provider reported: {error}")));
            }
            StreamChunk::from_value(chunk)
        }
    };
    pending.extend(accumulator.push(chunk).into_iter().map(ModelChunk::Delta));
    Ok(())
}

/// The metrics label of a retried error.
fn retry_reason(error: &ModelError) -> &'static str {
    match error {
        ModelError::Status { status: 429, .. } => "429",
        ModelError::Status { .. } => "5xx",
        ModelError::Timeout(_) => "timeout",
        _ => "connect",
    }
}

/// At most `limit` bytes of a body, each chunk within `idle`.
async fn read_limited(mut body: BodyReader, limit: usize, idle: Duration) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Ok(Some(Ok(piece))) = tokio::time::timeout(idle, body.next()).await {
        bytes.extend_from_slice(&piece);
        if bytes.len() >= limit {
            bytes.truncate(limit);
            break;
        }
    }
    bytes
}

/// The Chat Completions URL under `base_url`.
fn chat_url(base_url: &str) -> String {
    format!("{}/chat/completions", base_url.trim_end_matches('/'))
}

/// A response with its head read, from either client.
enum Reply {
    Lean(http1::Response),
    General(reqwest::Response),
}

impl Reply {
    fn status(&self) -> u16 {
        match self {
            Self::Lean(response) => response.status,
            Self::General(response) => response.status().as_u16(),
        }
    }

    fn retry_after(&self) -> Option<&str> {
        match self {
            Self::Lean(response) => response.retry_after.as_deref(),
            Self::General(response) => {
                response.headers().get(reqwest::header::RETRY_AFTER).and_then(|value| value.to_str().ok())
            }
        }
    }

    fn into_body(self) -> BodyReader {
        match self {
            Self::Lean(response) => BodyReader::Lean(response.body),
            Self::General(response) => BodyReader::General(response.bytes_stream().boxed()),
        }
    }
}

/// A response body being read, from either client.
enum BodyReader {
    Lean(http1::Body),
    General(BoxStream<'static, reqwest::Result<Bytes>>),
}

impl BodyReader {
    /// The next piece; an error as text (not yet scrubbed of secrets).
    async fn next(&mut self) -> Option<Result<Bytes, String>> {
        match self {
            Self::Lean(body) => body.next().await.map(|piece| piece.map_err(|error| error.to_string())),
            Self::General(body) => {
                body.next().await.map(|piece| piece.map_err(|error| error.without_url().to_string()))
            }
        }
    }

    /// The reply is over: what has arrived of the body's end is read, so that
    /// its connection can be reused; the rest is not waited for.
    fn close(self) {
        if let Self::Lean(body) = self {
            body.finish_now();
        }
    }
}
