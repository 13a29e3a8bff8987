//! The inference engine: one loaded model (llama.cpp), one context with a fixed
//! number of sequences, and one thread that runs every request. Requests wait in a
//! bounded queue; each takes a free sequence (the one whose cached tokens share the
//! longest prefix with its prompt, so a run's next turn finds its previous prompt
//! still in the KV cache and processes only the new tokens), and the thread decodes
//! all active sequences together in one batch per step (continuous batching).
//!
//! The thread is the only owner of the context. If it dies (a panic in the
//! bindings), the next request starts a new one with a fresh context; the loaded
//! model is kept.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use tokio::sync::mpsc::UnboundedSender;
use troupe_actors::llm::{ModelChunk, ModelDelta, ModelError, ModelReply};
use troupe_actors::metrics;
use troupe_actors::protocol::Usage;

use super::chat::{self, Template, TextGate};
use super::settings::{LocalSettings, PromptJob};

/// Chunks of a reply as the engine sends them.
pub type ReplySender = UnboundedSender<Result<ModelChunk, ModelError>>;

/// The process's llama.cpp backend (it may be initialised once).
fn backend() -> Result<&'static LlamaBackend, ModelError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|error| ModelError::Unavailable(format!("llama.cpp did not start: {error}")))
}

/// A loaded model, shared by every run. Dropped, it stops its thread and waits
/// for it (at most one decode step): llama.cpp must not be decoding while the
/// process tears down.
pub struct Engine {
    settings: LocalSettings,
    model: Arc<LlamaModel>,
    sender: Mutex<Option<SyncSender<Work>>>,
    queued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Without a sender the idle thread's wait ends too.
        drop(self.sender.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// A request on its way to the engine thread.
struct Work {
    job: PromptJob,
    out: ReplySender,
}

impl Engine {
    /// Loads the model file (blocking: call it off the async threads).
    pub fn load(settings: LocalSettings) -> Result<Self, ModelError> {
        let backend = backend()?;
        let model =
            LlamaModel::load_from_file(backend, &settings.path, &LlamaModelParams::default()).map_err(|error| {
                ModelError::Unavailable(format!(
                    "cannot load {}: {error}; if it is damaged, delete it and run `troupe model pull`",
                    settings.path.display()
                ))
            })?;
        let template = model.chat_template(None).ok().and_then(|template| template.to_string().ok());
        if template.as_deref().and_then(Template::recognise).is_none() {
            return Err(ModelError::Unavailable(format!(
                "{}: its chat template is not one troupe renders (ChatML with Qwen-style <tool_call> tool calls)",
                settings.path.display()
            )));
        }
        Ok(Self {
            settings,
            model: Arc::new(model),
            sender: Mutex::new(None),
            queued: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        })
    }

    /// Queues `job`; its reply streams to `out`. Fails at once when the queue is full.
    pub fn submit(&self, job: PromptJob, out: ReplySender) -> Result<(), ModelError> {
        let mut sender = self.sender.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut work = Work { job, out };
        for _ in 0..2 {
            let live = match sender.as_ref() {
                Some(live) => live.clone(),
                None => {
                    let started = self.start_thread()?;
                    *sender = Some(started.clone());
                    started
                }
            };
            self.queued.fetch_add(1, Ordering::Relaxed);
            match live.try_send(work) {
                Ok(()) => {
                    metrics::local_model_queue_depth(&self.settings.id, self.queued.load(Ordering::Relaxed));
                    return Ok(());
                }
                Err(TrySendError::Full(_)) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    return Err(ModelError::Overloaded(format!(
                        "{} requests are waiting for the local model (local_model.queue_limit)",
                        self.settings.config.queue_limit
                    )));
                }
                Err(TrySendError::Disconnected(back)) => {
                    // The engine thread died: start another one.
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(model = %self.settings.name, "the local model's engine thread stopped; restarting it");
                    *sender = None;
                    work = back;
                }
            }
        }
        Err(ModelError::Crashed)
    }

    fn start_thread(&self) -> Result<SyncSender<Work>, ModelError> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(self.settings.config.queue_limit.max(1));
        let (model, settings, queued) = (self.model.clone(), self.settings.clone(), self.queued.clone());
        let stop = self.stop.clone();
        let thread = std::thread::Builder::new()
            .name("troupe-local-model".to_owned())
            // llama.cpp matches the grammar's trigger patterns with std::regex,
            // which recurses per character of the output: room for long replies.
            .stack_size(32 << 20)
            .spawn(move || run(&model, &settings, &receiver, &queued, &stop))
            .map_err(|error| ModelError::Unavailable(format!("cannot start the engine thread: {error}")))?;
        // A thread started again replaces one that died.
        *self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(thread);
        Ok(sender)
    }
}

/// A sequence of the context: the tokens its KV cache holds, and its request.
struct Slot {
    seq: i32,
    tokens: Vec<LlamaToken>,
    active: Option<Active>,
    last_used: u64,
}

/// A request being served.
struct Active {
    out: ReplySender,
    prompt: Vec<LlamaToken>,
    /// Prompt tokens in the KV cache.
    fed: usize,
    /// Prompt tokens found there when the request started.
    cached: usize,
    /// The sampled token not yet decoded.
    next: Option<LlamaToken>,
    /// Where this sequence's logits are in the last batch.
    logits_at: Option<i32>,
    generated: Vec<u8>,
    count: u32,
    max_tokens: u32,
    sampler: LlamaSampler,
    /// Greedy decoding with no grammar: the token is the logits' argmax, read in
    /// place (the sampler would first copy every token's logit into a candidate list).
    argmax: bool,
    /// Tokens this reply may not use: `<tool_call>` when no tool is offered, so a
    /// turn that must answer (tool choice `none`) cannot open a call instead.
    banned: Vec<LlamaToken>,
    /// Tokens that may not open such a reply either: those that start a call
    /// object or a fence (`{`, `` ``` ``), marked by token id.
    openers: Option<Arc<Vec<bool>>>,
    gate: TextGate,
    offered: Vec<String>,
    started: Instant,
}

/// The shortest reply a prompt must leave room for in its sequence.
const MIN_REPLY: usize = 64;

/// Tokens that end a reply even when the model does not emit an end-of-turn token.
const STOPS: &[&str] = &["<|im_end|>", "<|im_start|>", "<|endoftext|>"];

fn run(
    model: &LlamaModel,
    settings: &LocalSettings,
    receiver: &Receiver<Work>,
    queued: &AtomicUsize,
    stop: &AtomicBool,
) {
    let Ok(backend) = backend() else { return };
    let threads = i32::try_from(settings.threads).unwrap_or(1);
    let parallel = settings.config.parallel.max(1);
    let total = settings.config.context.saturating_mul(parallel as u32);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(total))
        .with_n_batch(settings.config.batch)
        .with_n_ubatch(settings.config.batch)
        .with_n_seq_max(parallel as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut context = match model.new_context(backend, params) {
        Ok(context) => context,
        Err(error) => {
            let failure = ModelError::Unavailable(format!("cannot create the model's context: {error}"));
            while let Ok(work) = receiver.recv() {
                queued.fetch_sub(1, Ordering::Relaxed);
                let _ = work.out.send(Err(failure.clone()));
            }
            return;
        }
    };
    let mut slots: Vec<Slot> =
        (0..parallel).map(|seq| Slot { seq: seq as i32, tokens: Vec::new(), active: None, last_used: 0 }).collect();
    let mut batch = LlamaBatch::new(settings.config.batch as usize, parallel as i32);
    let mut clock = 0u64;
    let openers = Arc::new(call_openers(model));
    loop {
        // The engine was dropped: requests still decoding end here (their
        // callers see the stream end).
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Take new requests while a sequence is free; wait for one when all are idle.
        while slots.iter().any(|slot| slot.active.is_none()) {
            let idle = slots.iter().all(|slot| slot.active.is_none());
            let work = if idle {
                match receiver.recv() {
                    Ok(work) => work,
                    Err(_) => return,
                }
            } else {
                match receiver.try_recv() {
                    Ok(work) => work,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            let depth = queued.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            metrics::local_model_queue_depth(&settings.id, depth);
            clock += 1;
            admit(model, settings, &mut context, &mut slots, work, clock, &openers);
        }
        // Requests whose caller went away stop here; their tokens stay cached.
        for slot in &mut slots {
            if slot.active.as_ref().is_some_and(|active| active.out.is_closed()) {
                slot.active = None;
            }
        }
        if slots.iter().all(|slot| slot.active.is_none()) {
            continue;
        }
        step(model, settings, &mut context, &mut slots, &mut batch);
    }
}

/// Starts `work` on the free sequence that has the most of its prompt cached.
fn admit(
    model: &LlamaModel,
    settings: &LocalSettings,
    context: &mut LlamaContext<'_>,
    slots: &mut [Slot],
    work: Work,
    clock: u64,
    openers: &Arc<Vec<bool>>,
) {
    let Work { job, out } = work;
    let vocab = model.vocab();
    let mut prompt = Vec::new();
    for (index, (text, special)) in job.prompt.iter().enumerate() {
        prompt.extend(vocab.tokenize(text.as_bytes(), index == 0, *special));
    }
    // A long prompt gets a shorter reply, down to MIN_REPLY tokens.
    let limit = settings.config.context as usize;
    let room = limit.saturating_sub(prompt.len());
    let max_tokens = (job.max_tokens.min(settings.config.max_tokens) as usize).min(room) as u32;
    if prompt.is_empty() || (max_tokens as usize) < MIN_REPLY.min(job.max_tokens as usize).max(1) {
        let _ = out.send(Err(ModelError::ContextOverflow { tokens: prompt.len(), limit: limit - MIN_REPLY }));
        return;
    }
    let Some(slot) = slots
        .iter_mut()
        .filter(|slot| slot.active.is_none())
        .max_by_key(|slot| (common_prefix(&slot.tokens, &prompt), u64::MAX - slot.last_used))
    else {
        return;
    };
    // At least the last prompt token is decoded again, for its logits.
    let keep = common_prefix(&slot.tokens, &prompt).min(prompt.len() - 1);
    if context.kv_cache_seq_rm(slot.seq, Some(keep as u32), None).is_err() {
        let _ = context.kv_cache_seq_rm(slot.seq, None, None);
        slot.tokens.clear();
    } else {
        slot.tokens.truncate(keep);
    }
    let cached = slot.tokens.len();
    slot.last_used = clock;
    let banned = if job.offered.is_empty() {
        let call = vocab.tokenize(chat::CALL_OPEN.as_bytes(), false, true);
        if call.len() == 1 { call } else { Vec::new() }
    } else {
        Vec::new()
    };
    let sampler = sampler(model, settings, &job, &banned);
    let argmax =
        job.temperature <= 0.0 && job.required.is_none() && (job.offered.is_empty() || !settings.config.grammar);
    slot.active = Some(Active {
        out,
        prompt,
        fed: cached,
        cached,
        next: None,
        logits_at: None,
        generated: Vec::new(),
        count: 0,
        max_tokens,
        sampler,
        argmax,
        openers: (!banned.is_empty()).then(|| openers.clone()),
        banned,
        gate: TextGate::default(),
        offered: job.offered,
        started: Instant::now(),
    });
}

/// Which tokens open a call written as text: a JSON object or a code fence.
fn call_openers(model: &LlamaModel) -> Vec<bool> {
    let vocab = model.vocab();
    (0..model.n_vocab())
        .map(|id| {
            let piece = vocab.token_to_piece(LlamaToken(id), true, None);
            let text = String::from_utf8_lossy(&piece);
            let text = text.trim_start();
            text.starts_with('{') || text.starts_with("```")
        })
        .collect()
}

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The sampling chain: the call grammar (lazy: it applies once the model opens a
/// `<tool_call>`; from the first token when a call is required), the banned
/// tokens, then greedy decoding or temperature sampling.
fn sampler(model: &LlamaModel, settings: &LocalSettings, job: &PromptJob, banned: &[LlamaToken]) -> LlamaSampler {
    let temperature = job.temperature;
    let mut chain = Vec::new();
    if !banned.is_empty() {
        let biases: Vec<LlamaLogitBias> =
            banned.iter().map(|token| LlamaLogitBias::new(*token, f32::NEG_INFINITY)).collect();
        chain.push(LlamaSampler::logit_bias(model.n_vocab(), &biases));
    }
    let required = match (&job.required, job.offered.as_slice()) {
        (Some(schema), [tool]) => Some(chat::required_call_grammar(tool, schema)),
        _ => None,
    };
    if let Some(grammar) = required {
        match LlamaSampler::grammar(model, &grammar, "root") {
            Ok(grammar) => chain.push(grammar),
            Err(error) => tracing::warn!(%error, "the required call's grammar was refused"),
        }
    } else if settings.config.grammar
        && let Some(grammar) = chat::call_grammar(&job.offered)
    {
        let triggers: Vec<String> = chat::GRAMMAR_TRIGGERS.iter().map(|&pattern| pattern.to_owned()).collect();
        match LlamaSampler::grammar_lazy_patterns(model, &grammar, "root", &triggers, &[]) {
            Ok(grammar) => chain.push(grammar),
            Err(error) => tracing::warn!(%error, "the tool-call grammar was refused; calls are parsed leniently"),
        }
    }
    if temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        static SEED: AtomicU64 = AtomicU64::new(1);
        chain.push(LlamaSampler::top_k(40));
        chain.push(LlamaSampler::top_p(0.95, 1));
        chain.push(LlamaSampler::temp(temperature));
        chain.push(LlamaSampler::dist(SEED.fetch_add(1, Ordering::Relaxed) as u32));
    }
    LlamaSampler::chain_simple(chain)
}

/// One decode over every active sequence: each generating sequence feeds its last
/// token, and sequences still reading their prompt share the rest of the batch.
fn step(
    model: &LlamaModel,
    settings: &LocalSettings,
    context: &mut LlamaContext<'_>,
    slots: &mut [Slot],
    batch: &mut LlamaBatch,
) {
    batch.clear();
    let mut budget = settings.config.batch as usize;
    let mut added: Vec<(usize, Vec<LlamaToken>)> = Vec::new();
    for (index, slot) in slots.iter_mut().enumerate() {
        let Some(active) = slot.active.as_mut() else { continue };
        active.logits_at = None;
        if let Some(next) = active.next.take() {
            if budget > 0 && batch.add(next, slot.tokens.len() as i32, &[slot.seq], true).is_ok() {
                active.logits_at = Some(batch.n_tokens() - 1);
                added.push((index, vec![next]));
                budget -= 1;
            } else {
                // No room this step: decoded with the next one.
                active.next = Some(next);
            }
        }
    }
    for (index, slot) in slots.iter_mut().enumerate() {
        let Some(active) = slot.active.as_mut() else { continue };
        if active.fed >= active.prompt.len() || budget == 0 {
            continue;
        }
        let take = budget.min(active.prompt.len() - active.fed);
        let mut chunk = Vec::with_capacity(take);
        for (offset, token) in active.prompt[active.fed..active.fed + take].iter().enumerate() {
            let last = active.fed + offset + 1 == active.prompt.len();
            let position = (slot.tokens.len() + offset) as i32;
            if batch.add(*token, position, &[slot.seq], last).is_err() {
                break;
            }
            chunk.push(*token);
            if last {
                active.logits_at = Some(batch.n_tokens() - 1);
            }
        }
        // Only what went into the batch counts as read.
        active.fed += chunk.len();
        budget -= chunk.len();
        added.push((index, chunk));
    }
    if let Err(error) = context.decode(batch) {
        for (index, _) in &added {
            let slot = &mut slots[*index];
            if let Some(active) = slot.active.take() {
                let _ = active.out.send(Err(ModelError::Inference(format!("decoding failed: {error}"))));
            }
            let _ = context.kv_cache_seq_rm(slot.seq, None, None);
            slot.tokens.clear();
        }
        return;
    }
    for (index, tokens) in added {
        slots[index].tokens.extend(tokens);
    }
    for slot in slots.iter_mut() {
        let Some(active) = slot.active.as_mut() else { continue };
        let Some(at) = active.logits_at else { continue };
        let token = if active.argmax {
            let logits = context.get_logits_ith(at);
            let openers = active.openers.as_deref().filter(|_| active.count == 0);
            let best = logits
                .iter()
                .enumerate()
                .filter(|(index, _)| !active.banned.contains(&LlamaToken(*index as i32)))
                .filter(|(index, _)| !openers.is_some_and(|openers| openers.get(*index).copied().unwrap_or(false)))
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(index, _)| index);
            LlamaToken(best as i32)
        } else {
            active.sampler.sample(context, at)
        };
        let vocab = model.vocab();
        let mut stop = vocab.is_eog(token);
        if !stop {
            active.generated.extend(vocab.token_to_piece(token, true, None));
            active.count += 1;
            let text = valid_utf8(&active.generated).into_owned();
            if let Some(at) = STOPS.iter().filter_map(|stop| text.find(stop)).min() {
                active.generated = text.as_bytes()[..at].to_vec();
                stop = true;
            } else {
                let piece = active.gate.release(&text);
                if !piece.is_empty() {
                    let _ = active.out.send(Ok(ModelChunk::Delta(ModelDelta::Text(piece.to_owned()))));
                }
                active.next = Some(token);
                stop = active.count >= active.max_tokens;
            }
        }
        if stop && let Some(active) = slot.active.take() {
            finish(settings, active);
        }
    }
}

/// The output as text so far: a character a token ended inside of waits for the
/// next token; bytes that can never be UTF-8 are shown replaced.
fn valid_utf8(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.into(),
        Err(error) if error.error_len().is_none() => String::from_utf8_lossy(&bytes[..error.valid_up_to()]),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

fn finish(settings: &LocalSettings, mut active: Active) {
    static CALLS: AtomicU64 = AtomicU64::new(1);
    let text = String::from_utf8_lossy(&active.generated).into_owned();
    // With no tool to call (the synthesis turn), everything written is the answer.
    let recovered = if active.offered.is_empty() {
        // A call written anyway (tags and all) is no part of the answer.
        let read = chat::parse_reply(&text, &[], "unused");
        crate::llm::recover::Recovered { text: read.text, ..Default::default() }
    } else {
        let number = CALLS.fetch_add(1, Ordering::Relaxed);
        chat::parse_reply(&text, &active.offered, &chat::call_id_prefix(&text, number))
    };
    if recovered.calls.is_empty() {
        // Text held back in case it was a call turned out not to be one.
        let rest = text.get(active.gate.released()..).unwrap_or_default().trim_end();
        if !rest.is_empty() {
            let _ = active.out.send(Ok(ModelChunk::Delta(ModelDelta::Text(rest.to_owned()))));
        }
        active.gate = TextGate::default();
    }
    let computed = active.prompt.len() - active.cached;
    metrics::local_model_prompt(&settings.id, active.cached as u64, computed as u64);
    metrics::local_model_generated(&settings.id, u64::from(active.count));
    tracing::debug!(
        model = %settings.name,
        prompt = active.prompt.len(),
        cached = active.cached,
        generated = active.count,
        elapsed_ms = active.started.elapsed().as_millis() as u64,
        "local model reply"
    );
    tracing::trace!(model = %settings.name, output = %text, "local model output");
    let reply = ModelReply {
        content: recovered.text,
        tool_calls: recovered.calls,
        usage: Usage {
            input_tokens: active.prompt.len() as u64,
            output_tokens: u64::from(active.count),
            cost_usd: 0.0,
        },
        decode_errors: recovered.decode_errors,
    };
    let _ = active.out.send(Ok(ModelChunk::Done(reply)));
}
