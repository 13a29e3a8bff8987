//! In-process throughput and footprint of the runtime, with instant scripted model
//! replies and the memory store.
//!
//! `cargo bench -p troupe-actors --features testing --bench turns [-- RUNS PARKED]`
//!
//! 1. Throughput: RUNS concurrent runs of three turns each (a `todo_write`, two
//!    parallel tool calls, a final answer), every turn reviewed. Reports turns/s and
//!    CPU µs per turn (user + system time of the whole process, all threads).
//! 2. Footprint: PARKED runs left waiting on a model reply that never comes (a live
//!    session, its model task and its stored events; after a `todo_write`, its
//!    planner and plan too). Reports heap bytes per parked run, measured by a
//!    counting allocator.

// The counting allocator is the one unsafe thing here: it forwards to jemalloc (the
// allocator the `troupe` binary uses) and keeps a tally.
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use tikv_jemallocator::Jemalloc;
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::bench::{TURNS_PER_RUN, throughput};
use troupe_actors::testing::{EchoTool, ScriptedModel, Step, calls, todo};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

struct Counting;

/// Net bytes allocated while `COUNTING` is on. Counting is off during the
/// throughput phase so the shared counter does not slow it.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

fn count(delta: isize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { Jemalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { Jemalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { Jemalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let mut args = std::env::args().skip(1).filter(|arg| !arg.starts_with('-'));
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(4000);
    let parked: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
    println!("troupe-actors bench: {workers} worker threads");
    tokio.block_on(throughput(Arc::new(MemoryStore::new()), runs.min(100), true)).unwrap();
    for (followed, how) in [(true, "each followed by a subscriber"), (false, "unobserved")] {
        let store = Arc::new(MemoryStore::new());
        let (turns_per_second, cpu_per_turn) = tokio.block_on(throughput(store, runs, followed)).unwrap();
        println!(
            "throughput: {runs} runs x {TURNS_PER_RUN} turns, {how}: {turns_per_second:.0} turns/s, \
             {cpu_per_turn:.1} µs CPU per turn"
        );
    }
    for (planned, when) in [(false, "in turn 1, before any plan"), (true, "in turn 2, after todo_write")] {
        let bytes = tokio.block_on(footprint(parked, planned));
        println!("footprint: {parked} runs parked on the model {when}: {:.1} KiB heap per run", bytes / 1024.0);
    }
}

/// Heap bytes per run parked on a model reply: in its first turn (no plan yet, so
/// no planner actor), or in its second turn after a `todo_write` (with a planner).
async fn footprint(parked: usize, planned: bool) -> f64 {
    let plan = calls(&[("todo_write", todo(&[("1", "wait", "in_progress")]))]);
    let script = if planned { vec![plan, Step::Hang] } else { vec![Step::Hang] };
    let model = Arc::new(ScriptedModel::per_turn(script).quiet());
    let tools = ToolRegistry::new().with(Arc::new(EchoTool)).unwrap();
    let agent = AgentConfig::new("bench", "You are a benchmark.", vec!["echo".into()]);
    let config =
        RuntimeConfig { max_active_runs: parked + 1, max_active_runs_per_tenant: 0, ..RuntimeConfig::default() };
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools,
        hooks: Vec::new(),
        agents: vec![agent],
    };
    let runtime = Runtime::start(config, deps).await.unwrap();
    let requests_per_run = if planned { 2 } else { 1 };
    // Warm up lazily allocated structures (registries, metric handles) with one run.
    runtime.submit(SubmitRequest::new("bench", "warm up")).await.unwrap();
    wait_until(|| model.request_count() == requests_per_run).await;
    LIVE_BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for index in 0..parked {
        runtime.submit(SubmitRequest::new("bench", format!("run {index}"))).await.unwrap();
    }
    wait_until(|| model.request_count() == (parked + 1) * requests_per_run).await;
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(runtime.active_runs().await, parked + 1);
    LIVE_BYTES.load(Ordering::SeqCst).max(0) as f64 / parked as f64
}

async fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
