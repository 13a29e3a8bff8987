//! The scripted model: it answers each turn (or each call) with the next
//! [`Step`] of its script, and can hold a stream mid-way ([`StreamHold`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream;
use serde_json::{Value, json};

use crate::llm::{ChatRequest, ModelChunk, ModelClient, ModelDelta, ModelError, ModelReply, ModelStream, Role};
use crate::protocol::{ToolCall, Usage};

/// One scripted model answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// Stream the reply's text as one delta, then the reply.
    Reply(ModelReply),
    /// Fail the call.
    Fail(ModelError),
    /// Never answer (until the call is dropped).
    Hang,
    /// Panic inside the model client.
    Panic,
    /// Stream `deltas` one by one, then the reply. With `hold`: wait for a permit
    /// of `hold.resume` before the second delta; once every delta was taken (the
    /// stream is polled past the last one), tell `hold.streamed` and wait for a
    /// permit of `hold.finish` before the reply.
    Streamed {
        /// The pieces, in order.
        deltas: Vec<ModelDelta>,
        /// The reply that ends the stream.
        reply: ModelReply,
        /// Where the stream stops before its reply.
        hold: Option<Arc<StreamHold>>,
    },
}

/// Where a [`Step::Streamed`] stream waits before its reply.
#[derive(Debug)]
pub struct StreamHold {
    /// The deltas after the first come after a permit is added here.
    pub resume: tokio::sync::Semaphore,
    /// Told once every delta was taken.
    pub streamed: tokio::sync::Notify,
    /// The reply comes after a permit is added here.
    pub finish: tokio::sync::Semaphore,
}

impl Default for StreamHold {
    fn default() -> Self {
        let (resume, finish) = (tokio::sync::Semaphore::new(0), tokio::sync::Semaphore::new(0));
        Self { resume, streamed: tokio::sync::Notify::new(), finish }
    }
}

/// Takes one permit of `semaphore` for good (none if it was closed).
async fn take_permit(semaphore: &tokio::sync::Semaphore) {
    if let Ok(permit) = semaphore.acquire().await {
        permit.forget();
    }
}

/// A reply with text only (a final answer).
pub fn text(content: &str) -> Step {
    Step::Reply(ModelReply { content: content.to_owned(), usage: usage(), ..Default::default() })
}

/// A reply calling `calls` as (tool, args); call ids are `{tool}_{index}`.
pub fn calls(calls: &[(&str, Value)]) -> Step {
    let tool_calls = calls
        .iter()
        .enumerate()
        .map(|(index, (name, args))| ToolCall {
            call_id: format!("{name}_{index}"),
            name: (*name).to_owned(),
            args: args.clone(),
        })
        .collect();
    Step::Reply(ModelReply { tool_calls, usage: usage(), ..Default::default() })
}

/// A `todo_write` call with `(id, content, status)` tasks.
pub fn todo(tasks: &[(&str, &str, &str)]) -> Value {
    let todos: Vec<Value> =
        tasks.iter().map(|(id, content, status)| json!({"id": id, "content": content, "status": status})).collect();
    json!({ "todos": todos })
}

/// What every scripted reply spends: 100 tokens in, 20 out, $0.0001.
pub fn usage() -> Usage {
    Usage { input_tokens: 100, output_tokens: 20, cost_usd: 0.0001 }
}

enum Script {
    /// Answers in order, whatever the run.
    Queue(VecDeque<Step>),
    /// Answers by turn: the request's turn is its assistant messages + 1. Runs that
    /// interleave each get their own sequence.
    PerTurn(Vec<Step>),
}

/// A model that answers from a script and keeps every request it got.
pub struct ScriptedModel {
    name: String,
    script: Mutex<Script>,
    /// Answer once the script is exhausted.
    fallback: Step,
    requests: Mutex<Vec<ChatRequest>>,
    count: AtomicUsize,
    /// Streams text deltas and keeps requests; off for benchmarks.
    verbose: bool,
    /// The context window it reports.
    context_window: Option<usize>,
    /// What it answers when asked to summarise a thread (outside the script).
    summary: Option<String>,
}

impl ScriptedModel {
    /// Answers `steps` in order, then "done".
    pub fn queue(steps: Vec<Step>) -> Self {
        Self::new(Script::Queue(steps.into()))
    }

    /// Answers step N to every run's turn N, then "done".
    pub fn per_turn(steps: Vec<Step>) -> Self {
        Self::new(Script::PerTurn(steps))
    }

    fn new(script: Script) -> Self {
        Self {
            name: "scripted".to_owned(),
            script: Mutex::new(script),
            fallback: text("done"),
            requests: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
            verbose: true,
            context_window: None,
            summary: None,
        }
    }

    /// Answers a request to summarise a thread with `text`, outside the script
    /// (such requests are kept with the others).
    pub fn summarising(mut self, text: &str) -> Self {
        self.summary = Some(text.to_owned());
        self
    }

    /// Reports a context window of `tokens`.
    pub fn with_context_window(mut self, tokens: usize) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Keeps no requests and streams no deltas (benchmarks).
    pub fn quiet(mut self) -> Self {
        self.verbose = false;
        self
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().map(|requests| requests.clone()).unwrap_or_default()
    }

    /// How many requests came.
    pub fn request_count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn next_step(&self, request: &ChatRequest) -> Step {
        let Ok(mut script) = self.script.lock() else {
            return self.fallback.clone();
        };
        match &mut *script {
            Script::Queue(steps) => steps.pop_front(),
            Script::PerTurn(steps) => {
                let turn = request.messages.iter().filter(|m| m.role == Role::Assistant).count();
                steps.get(turn).cloned()
            }
        }
        .unwrap_or_else(|| self.fallback.clone())
    }
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> Option<usize> {
        self.context_window
    }

    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let asks_summary = request.messages.first().is_some_and(|m| m.content == crate::runtime::SUMMARISE);
        let step = match &self.summary {
            Some(summary) if asks_summary => text(summary),
            _ => self.next_step(&request),
        };
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.verbose
            && let Ok(mut requests) = self.requests.lock()
        {
            requests.push(request);
        }
        match step {
            Step::Reply(reply) => {
                let mut chunks = Vec::with_capacity(2);
                if self.verbose && !reply.content.is_empty() {
                    chunks.push(Ok(ModelChunk::Delta(ModelDelta::Text(reply.content.clone()))));
                }
                chunks.push(Ok(ModelChunk::Done(reply)));
                Ok(Box::pin(stream::iter(chunks)))
            }
            Step::Fail(error) => Err(error),
            Step::Hang => Ok(Box::pin(stream::pending())),
            Step::Streamed { deltas, reply, hold } => {
                let start = (0, deltas.into_iter(), Some(reply), hold);
                let chunks = stream::unfold(start, |(index, mut deltas, reply, hold)| async move {
                    if let Some(delta) = deltas.next() {
                        if let (1, Some(hold)) = (index, &hold) {
                            take_permit(&hold.resume).await;
                        }
                        return Some((Ok(ModelChunk::Delta(delta)), (index + 1, deltas, reply, hold)));
                    }
                    let reply = reply?;
                    if let Some(hold) = &hold {
                        hold.streamed.notify_one();
                        take_permit(&hold.finish).await;
                    }
                    Some((Ok(ModelChunk::Done(reply)), (index, deltas, None, hold)))
                });
                Ok(Box::pin(chunks))
            }
            Step::Panic => panic!("injected model client panic"),
        }
    }
}
