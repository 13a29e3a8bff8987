//! The local model through troupe against llama.cpp's own benchmark binary, on the
//! same machine in the same run, and the share of prompt tokens served from the KV
//! cache on the later turns of real agent runs.
//!
//! `cargo bench --bench local_model` (`TROUPE_BENCH_CACHE_ONLY=1`: only the cache
//! shares, without the speed comparison). The model: `TROUPE_BENCH_MODEL`, else
//! `data/models/<default model>` (`troupe model pull`). The reference binary:
//! `TROUPE_BENCH_LLAMA_BENCH`, else built by `benches/llama-cpp-reference.sh` from the
//! llama.cpp source troupe links.
//!
//! - Prompt processing: fresh prompts (nothing cached) of about 512 tokens, one
//!   token generated, tokens per second of prompt; llama-bench's `pp512`.
//! - Generation: a prompt that makes the model count, 128 tokens generated,
//!   tokens per second from the first generated token to the last; `tg128`.
//! - Cache: agent runs with a tool (a tool turn, then an answer turn, reviewed),
//!   one after the other; for each model call of turn 2 or later, the prompt
//!   tokens read from the cache over all its prompt tokens. Then the same
//!   questions as messages of one thread: for the first call of each follow-up,
//!   the same share (what is new in it is the previous answer and the message).

// A bench is a program of its own: it reads its settings from the environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use tikv_jemallocator::Jemalloc;
use troupe::llm::local::pull::QWEN_CODER_05B;
use troupe::llm::local::{LocalModel, LocalModelConfig};
use troupe_actors::config::RuntimeConfig;
use troupe_actors::llm::{
    ChatRequest, Message, ModelChunk, ModelClient, ModelError, ModelRegistry, ModelStream, Role, ToolChoice,
};
use troupe_actors::metrics::LOCAL_MODEL_PROMPT_TOKENS_TOTAL;
use troupe_actors::runtime::ThreadRun;
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{capture_metrics, counter};
use troupe_actors::threads::MultitaskStrategy;
use troupe_actors::{Deps, Runtime, SubmitRequest};

#[global_allocator]
static ALLOCATOR: Jemalloc = Jemalloc;

const ROUNDS: usize = 5;

fn main() {
    let model_path = std::env::var("TROUPE_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("data/models").join(QWEN_CODER_05B.file));
    assert!(model_path.exists(), "no model at {} (troupe model pull, or TROUPE_BENCH_MODEL)", model_path.display());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    println!("local model bench: {} on {threads} threads", model_path.display());

    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    capture_metrics();
    let config = LocalModelConfig {
        model: model_path.display().to_string(),
        parallel: 1,
        threads,
        ..LocalModelConfig::default()
    };
    let local = Arc::new(LocalModel::new(config.settings(std::path::Path::new("data")).unwrap()));
    // Load the model (and warm up) before timing.
    tokio.block_on(async { drain(local.chat(request("Warm up.".into(), "Say hi.".into(), 4)).await.unwrap()).await });
    if std::env::var_os("TROUPE_BENCH_CACHE_ONLY").is_some() {
        let (share, follow_ups) = tokio.block_on(cache_share(local));
        println!("prompt tokens from the cache on turns >= 2: {:.1} %", share * 100.0);
        println!("prompt tokens from the cache on a thread's follow-ups (first call): {:.1} %", follow_ups * 100.0);
        return;
    }
    // Rounds alternate the two sides, so that drift in the machine's load touches
    // both alike; each round's ratio is kept, and the medians reported.
    let binary = llama_bench_binary();
    let (mut prompt_ratios, mut generation_ratios) = (Vec::new(), Vec::new());
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let reference = binary.as_deref().and_then(|binary| llama_bench(binary, &model_path, threads));
        let measured = tokio.block_on(speeds(&local, round));
        println!(
            "round {round}: troupe pp {:.1} t/s, tg {:.1} t/s; llama-bench {}",
            measured.0,
            measured.1,
            reference.map_or("(not run)".to_owned(), |r| format!("pp512 {:.1} t/s, tg128 {:.1} t/s", r.0, r.1))
        );
        if let Some(reference) = reference {
            prompt_ratios.push(measured.0 / reference.0);
            generation_ratios.push(measured.1 / reference.1);
            theirs.push(reference);
        }
        ours.push(measured);
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!();
    println!("| medians of {ROUNDS} rounds | llama-bench | troupe | troupe / llama-bench |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| prompt processing | {:.1} t/s | {:.1} t/s | {:.1} % |",
        median(theirs.iter().map(|r| r.0).collect()),
        median(ours.iter().map(|r| r.0).collect()),
        100.0 * median(prompt_ratios)
    );
    println!(
        "| generation | {:.1} t/s | {:.1} t/s | {:.1} % |",
        median(theirs.iter().map(|r| r.1).collect()),
        median(ours.iter().map(|r| r.1).collect()),
        100.0 * median(generation_ratios)
    );

    let (share, follow_ups) = tokio.block_on(cache_share(local));
    println!();
    println!("prompt tokens from the cache on turns >= 2: {:.1} %", share * 100.0);
    println!("prompt tokens from the cache on a thread's follow-ups (first call): {:.1} %", follow_ups * 100.0);
}

/// The reference binary: `TROUPE_BENCH_LLAMA_BENCH`, or built by the script.
fn llama_bench_binary() -> Option<String> {
    if let Ok(path) = std::env::var("TROUPE_BENCH_LLAMA_BENCH") {
        return Some(path);
    }
    let built = Command::new("benches/llama-cpp-reference.sh").output().ok()?;
    if !built.status.success() {
        eprintln!("llama-bench could not be built: {}", String::from_utf8_lossy(&built.stderr));
        return None;
    }
    Some(String::from_utf8(built.stdout).ok()?.trim().to_owned())
}

/// One run of llama-bench: its pp512 and tg128 in tokens per second.
fn llama_bench(binary: &str, model: &std::path::Path, threads: usize) -> Option<(f64, f64)> {
    let output = Command::new(binary)
        .arg("-m")
        .arg(model)
        .args(["-p", "512", "-n", "128", "-t", &threads.to_string(), "-r", "1", "-o", "json"])
        .output()
        .ok()?;
    let results: Vec<Value> = serde_json::from_slice(&output.stdout).ok()?;
    let speed = |prompt: u64, generated: u64| {
        results
            .iter()
            .find(|result| result["n_prompt"] == prompt && result["n_gen"] == generated)
            .and_then(|result| result["avg_ts"].as_f64())
    };
    Some((speed(512, 0)?, speed(0, 128)?))
}

fn request(system: String, user: String, max_tokens: u32) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::text(Role::System, system), Message::text(Role::User, user)],
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        max_tokens: Some(max_tokens),
        temperature: None,
    }
}

/// Prompt and generation tokens per second through troupe's model client.
async fn speeds(local: &Arc<LocalModel>, round: usize) -> (f64, f64) {
    let words = "the runtime keeps every run durable while agents plan call tools and review their work ";
    // A different first line each time: nothing of the prompt is cached. About
    // 500 tokens: one decode batch, as llama-bench's pp512.
    let system = format!("Session {round}-{}. Summarise the text.", fastrand::u64(..));
    let started = Instant::now();
    let (usage, _, _) = drain(local.chat(request(system, words.repeat(31), 1)).await.unwrap()).await;
    let prompt = usage.0 as f64 / started.elapsed().as_secs_f64();
    let system = format!("Run {round}-{}. You are a counter.", fastrand::u64(..));
    let user = "Write every whole number from 1 to 1000 in order, separated by commas, and nothing else.";
    let (usage, first, last) = drain(local.chat(request(system, user.into(), 128)).await.unwrap()).await;
    let span = last.duration_since(first.unwrap_or(last)).as_secs_f64();
    assert!(usage.1 > 100, "the counting prompt generated only {} tokens", usage.1);
    (prompt, (usage.1 - 1) as f64 / span)
}

/// Reads a reply to its end: (input, output) tokens, when the first text arrived,
/// when it ended.
async fn drain(mut stream: ModelStream) -> ((u64, u64), Option<Instant>, Instant) {
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        match chunk.unwrap() {
            ModelChunk::Delta(_) => {
                first.get_or_insert_with(Instant::now);
            }
            ModelChunk::Done(reply) => {
                return ((reply.usage.input_tokens, reply.usage.output_tokens), first, Instant::now());
            }
        }
    }
    panic!("the reply ended without its final chunk");
}

/// Each model call's turn and its (cached, computed) prompt tokens.
type Calls = Arc<Mutex<Vec<(usize, u64, u64)>>>;

/// The local model, with the cache counters read around each call.
struct Observed {
    inner: Arc<LocalModel>,
    calls: Calls,
}

fn prompt_tokens() -> (u64, u64) {
    let of = |source| counter(LOCAL_MODEL_PROMPT_TOKENS_TOTAL, &[("model", "local"), ("source", source)]);
    (of("cache"), of("computed"))
}

#[async_trait]
impl ModelClient for Observed {
    fn name(&self) -> &str {
        "local"
    }

    fn context_window(&self) -> Option<usize> {
        self.inner.context_window()
    }

    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let turn = request.messages.iter().filter(|message| message.role == Role::Assistant).count() + 1;
        let before = prompt_tokens();
        let calls = self.calls.clone();
        let stream = self.inner.chat(request).await?;
        Ok(Box::pin(stream.inspect(move |chunk| {
            if let Ok(ModelChunk::Done(_)) = chunk {
                let after = prompt_tokens();
                calls.lock().unwrap().push((turn, after.0 - before.0, after.1 - before.1));
            }
        })))
    }
}

async fn cache_share(local: Arc<LocalModel>) -> (f64, f64) {
    let calls: Calls = Arc::default();
    let model = Arc::new(Observed { inner: local, calls: calls.clone() });
    let agent = troupe::config::parse_agent(
        "bench.toml",
        "name = \"counter\"\ninstructions = \"\"\"\nYou answer questions about text. To count the words of a text, call \
         the\ntext_stats tool with that text, then answer with the number it reports.\"\"\"\ntools = \
         [\"text_stats\"]\n[limits]\nmax_turns = 4\n",
    )
    .unwrap();
    let tools = troupe::tools::builtin_registry(&troupe::tools::ToolsConfig::default()).unwrap();
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model),
        tools,
        hooks: Vec::new(),
        agents: vec![agent],
    };
    // The tool guide the daemon shows in `<available_tools>`, as in a real run.
    let config = RuntimeConfig {
        tool_docs: Arc::new(troupe::tools::guide::parse(troupe::tools::guide::DEFAULT_GUIDE)),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::start(config, deps).await.unwrap();
    let texts = ["the quick brown fox jumps over the lazy dog", "to be or not to be", "a b c d e f g"];
    for text in texts {
        let question = format!("How many words are in this text: \"{text}\"?");
        let run = runtime.submit(SubmitRequest::new("counter".to_owned(), question)).await.unwrap();
        let record = runtime.wait_settled(run).await.unwrap();
        println!("run {run}: {:?} after {} turns", record.status, record.turn);
    }
    let runs = calls.lock().unwrap().clone();
    // The same questions as one conversation: each follow-up's first call.
    let (thread, _) =
        runtime.create_thread("default".to_owned(), "counter".to_owned(), Default::default(), None).await.unwrap();
    let mut follow_ups = Vec::new();
    for (index, text) in texts.iter().enumerate() {
        let first_call = calls.lock().unwrap().len();
        let mut request = SubmitRequest::new("counter".to_owned(), format!("And this one: \"{text}\"?"));
        request.thread = Some(ThreadRun { thread_id: thread.thread_id, strategy: MultitaskStrategy::Reject });
        let run = runtime.submit(request).await.unwrap();
        let record = runtime.wait_settled(run).await.unwrap();
        println!("thread message {index}: {:?} after {} turns", record.status, record.turn);
        if index > 0 {
            follow_ups.push(calls.lock().unwrap()[first_call]);
        }
    }
    runtime.shutdown(Duration::from_secs(5)).await;
    for (turn, cached, computed) in &runs {
        println!("turn {turn}: {cached} prompt tokens from the cache, {computed} computed");
    }
    for (_, cached, computed) in &follow_ups {
        println!("follow-up: {cached} prompt tokens from the cache, {computed} computed");
    }
    let share = |calls: &[&(usize, u64, u64)]| {
        let cached: u64 = calls.iter().map(|(_, cached, _)| cached).sum();
        let total: u64 = calls.iter().map(|(_, cached, computed)| cached + computed).sum();
        if total == 0 { 0.0 } else { cached as f64 / total as f64 }
    };
    let later: Vec<_> = runs.iter().filter(|(turn, _, _)| *turn >= 2).collect();
    (share(&later), share(&follow_ups.iter().collect::<Vec<_>>()))
}
