//! What a user pays per turn: the daemon driven over HTTP as a client drives it.
//!
//! ```sh
//! cargo bench --bench daemon                    # 500 runs with 1 client, 2,000 with 50 in flight; SQLite, the floor, PostgreSQL
//! cargo bench --bench daemon -- 1000 4000 sqlite # RUNS_ONE RUNS_MANY, only the stores named
//! cargo bench --bench daemon -- 2000 2000 floor  # a bare server making the same HTTP exchanges (floor.rs)
//! TROUPE_BENCH_PG_URL=postgres://user@host:5432/postgres cargo bench --bench daemon
//! cargo bench --bench daemon -- 0 2000 cluster  # 1, 2, 3 daemons on one PostgreSQL, then 20 takeovers
//! TROUPE_BENCH_WRAP="valgrind --tool=callgrind" cargo bench --bench daemon -- 100 0 sqlite  # the daemon under a tool
//! TROUPE_SERVER__WORKER_THREADS=2 cargo bench --bench daemon -- 1000 4000 sqlite  # the daemon (and floor) on 2 workers
//! ```
//!
//! Three processes: this driver, `troupe serve` (the release binary of this
//! package) and `fake-openai` serving a scripted model that answers at once. A
//! run is one turn of two parallel `text_stats` calls and one answer turn,
//! reviewed by the rule-based reviewer: 2 turns. The driver POSTs
//! `/v1/runs`, then reads `GET /v1/runs/{id}/events` to its end and checks the
//! run succeeded with both calls completed. Figures are of the daemon process
//! only (from /proc): CPU per turn, context switches per run, and RSS per run
//! parked on a model call that never answers.

// A bench is a program of its own: it reads its settings from the environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use troupe::testing::fake_openai::{FakeReply, text_stream, tool_call_stream};

#[path = "daemon/floor.rs"]
mod floor;

// The daemon's allocator, for the floor server this binary also is.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const TURNS_PER_RUN: u64 = 2;
const IN_FLIGHT: usize = 50;
const PARKED: usize = 1000;

fn main() {
    if let Ok(model) = std::env::var(floor::MODEL_VAR) {
        floor::serve(&model);
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    runtime.expect("a runtime").block_on(bench());
}

async fn bench() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).collect();
    let numbers: Vec<usize> = args.iter().filter_map(|arg| arg.parse().ok()).collect();
    let runs_one = numbers.first().copied().unwrap_or(500);
    let runs_many = numbers.get(1).copied().unwrap_or(2000);
    let stores: Vec<&str> = args.iter().map(String::as_str).filter(|arg| arg.parse::<usize>().is_err()).collect();
    // `cluster` alone runs only the cluster's figures.
    let wanted = |store: &str| (stores.is_empty() || stores.contains(&store)) && stores != ["cluster"];

    let scratch = std::env::temp_dir().join(format!("troupe-bench-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    println!(
        "daemon over HTTP: {runs_one} runs with 1 client, {runs_many} with {IN_FLIGHT} in flight, {TURNS_PER_RUN} turns a run"
    );
    if wanted("sqlite") {
        bench_store(&scratch, "sqlite", None, runs_one, runs_many).await;
    }
    if wanted("floor") {
        bench_store(&scratch, "floor", None, runs_one, runs_many).await;
    }
    if stores.contains(&"cluster") {
        bench_cluster(&scratch, runs_many).await;
    }
    if wanted("postgres") {
        let base = std::env::var("TROUPE_BENCH_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        match postgres_database(&base).await {
            Some(url) => bench_store(&scratch, "postgres", Some(url), runs_one, runs_many).await,
            None => println!("postgres: skipped ({base} unreachable)"),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

async fn bench_store(scratch: &Path, store: &str, url: Option<String>, runs_one: usize, runs_many: usize) {
    let dir = scratch.join(store);
    let model = FakeModel::start(&dir, &model_script());
    let daemon = match store {
        "floor" => Daemon::floor(&model.base_url),
        _ => Daemon::start(&dir, &model.base_url, url.as_deref()),
    };
    let driver = Driver::new(&daemon.base);
    // Warm-up: connections, the store's caches, the allocator's heap.
    driver.many(100, IN_FLIGHT).await;

    for (label, runs, in_flight) in [("1 client", runs_one, 1), ("50 in flight", runs_many, IN_FLIGHT)] {
        if runs == 0 {
            continue;
        }
        let before = daemon.sample();
        let wall = Instant::now();
        let mut latencies = driver.many(runs, in_flight).await;
        let wall = wall.elapsed();
        let after = daemon.sample();
        latencies.sort();
        let turns = (runs as u64 * TURNS_PER_RUN) as f64;
        println!(
            "{store}, {label}: {:.0} µs CPU a turn, {:.0} turns/s, run p50 {:.2} ms p99 {:.2} ms, {:.1} context switches a run",
            (after.cpu - before.cpu) * 1e6 / turns,
            turns / wall.as_secs_f64(),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            (after.switches - before.switches) as f64 / runs as f64,
        );
        if std::env::var_os("TROUPE_BENCH_THREADS").is_some() {
            for (name, (cpu, switches)) in &after.threads {
                let (cpu_before, switches_before) = before.threads.get(name).copied().unwrap_or_default();
                println!(
                    "    {name}: {:.0} µs CPU a turn, {:.1} context switches a run",
                    (cpu - cpu_before) * 1e6 / turns,
                    (switches - switches_before) as f64 / runs as f64
                );
            }
        }
    }
    drop(daemon);
    drop(model);
    if store == "floor" {
        return;
    }

    // Runs parked on a model call that never answers.
    let parked_dir = dir.join("parked");
    let model = FakeModel::start(&parked_dir, &json!({"kind": "hang"}));
    let daemon = Daemon::start(&parked_dir, &model.base_url, url.as_deref());
    let driver = Driver::new(&daemon.base);
    driver.park(20, &model).await;
    let before = daemon.sample();
    driver.park(PARKED, &model).await;
    let after = daemon.sample();
    println!(
        "{store}: {:.1} KiB RSS a run parked on a model call ({PARKED} runs)",
        (after.rss_kib - before.rss_kib) as f64 / PARKED as f64
    );
}

/// 1, 2 and 3 daemons of a cluster on one PostgreSQL database, `runs` runs with
/// 50 in flight spread over them: CPU per turn of the daemons together and of
/// the PostgreSQL server, turns/s. Then 20 times: a node is killed while it
/// drives a run, and the time until another node claimed the run is measured.
async fn bench_cluster(scratch: &Path, runs: usize) {
    let base = std::env::var("TROUPE_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let names = ["a", "b", "c"];
    for size in 1..=3 {
        let Some(url) = postgres_database_named(&base, &format!("cluster{size}")).await else {
            println!("cluster: skipped ({base} unreachable)");
            return;
        };
        let dir = scratch.join(format!("cluster-{size}"));
        let model = FakeModel::start(&dir, &model_script());
        let daemons: Vec<Daemon> = names[..size]
            .iter()
            .map(|name| Daemon::start_node(&dir.join(name), &model.base_url, Some(&url), Some(name)))
            .collect();
        let drivers: Vec<Driver> = daemons.iter().map(|daemon| Driver::new(&daemon.base)).collect();
        futures::future::join_all(drivers.iter().map(|driver| driver.many(100 / size, IN_FLIGHT / size))).await;
        let cpu = |daemons: &[Daemon]| daemons.iter().map(|daemon| daemon.sample().cpu).sum::<f64>();
        let (before, pg_before) = (cpu(&daemons), postgres_cpu());
        let wall = Instant::now();
        let share = runs / size;
        futures::future::join_all(drivers.iter().map(|driver| driver.many(share, IN_FLIGHT.div_ceil(size)))).await;
        let wall = wall.elapsed();
        let turns = (share * size) as f64 * TURNS_PER_RUN as f64;
        println!(
            "cluster of {size}, 50 in flight: {:.0} µs CPU a turn in the daemons, {:.0} µs in PostgreSQL, {:.0} turns/s",
            (cpu(&daemons) - before) * 1e6 / turns,
            (postgres_cpu() - pg_before) * 1e6 / turns,
            turns / wall.as_secs_f64(),
        );
    }

    // Takeovers: a run driven by the killed node, claimed by another.
    let Some(url) = postgres_database_named(&base, "takeover").await else { return };
    let dir = scratch.join("takeover");
    let mut slow = model_script();
    for reply in slow["replies"].as_array_mut().expect("per-turn replies") {
        reply["delay_ms"] = json!(200);
    }
    let model = FakeModel::start(&dir, &slow);
    let mut daemons: Vec<Daemon> =
        names.iter().map(|name| Daemon::start_node(&dir.join(name), &model.base_url, Some(&url), Some(name))).collect();
    let database = sqlx::PgPool::connect(&url).await.expect("the bench's database");
    let mut takeovers = Vec::new();
    for kill in 0..20 {
        let victim = kill % names.len();
        let driver = Driver::new(&daemons[victim].base);
        let asked = driver.model_requests(&model).await;
        let id = driver.submit().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while driver.model_requests(&model).await <= asked {
            assert!(Instant::now() < deadline, "the run never reached the model");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let killed = Instant::now();
        drop(daemons.remove(victim));
        loop {
            let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM runs WHERE run_id = $1")
                .bind(&id)
                .fetch_one(&database)
                .await
                .expect("the run's epoch");
            if epoch > 1 {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(60), "the run was never taken over");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        takeovers.push(killed.elapsed());
        daemons.insert(
            victim,
            Daemon::start_node(&dir.join(names[victim]), &model.base_url, Some(&url), Some(names[victim])),
        );
    }
    takeovers.sort();
    println!(
        "takeover after a kill (lease 5 s, heartbeat 1 s, claims every 0.5 s), 20 kills: min {:.2} s, p50 {:.2} s, p90 {:.2} s, max {:.2} s",
        takeovers[0].as_secs_f64(),
        percentile(&takeovers, 0.5) / 1e3,
        percentile(&takeovers, 0.9) / 1e3,
        takeovers[takeovers.len() - 1].as_secs_f64(),
    );
}

/// CPU seconds of every PostgreSQL server process on this machine.
fn postgres_cpu() -> f64 {
    let Ok(processes) = std::fs::read_dir("/proc") else { return 0.0 };
    processes
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().bytes().all(|byte| byte.is_ascii_digit()))
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|name| name.starts_with("postgres"))
        })
        .map(|entry| thread_cpu(&entry.path().join("stat")))
        .sum()
}

/// Turn 1: two parallel `text_stats` calls; turn 2: the answer.
fn model_script() -> Value {
    let calls = tool_call_stream(
        &[
            ("call_1", "text_stats", r#"{"text": "the cat sat on the mat"}"#),
            ("call_2", "text_stats", r#"{"text": "a dog ran in the park"}"#),
        ],
        2,
    );
    let answer = text_stream("The first text has 6 words and the second has 6 words.", 4);
    serde_json::to_value(FakeReply::PerTurn { replies: vec![calls, answer] }).expect("a script")
}

fn percentile(sorted: &[Duration], share: f64) -> f64 {
    let index = ((sorted.len() as f64 * share).ceil() as usize).saturating_sub(1);
    sorted.get(index).map_or(0.0, |latency| latency.as_secs_f64() * 1e3)
}

struct FakeModel {
    child: Child,
    base_url: String,
}

impl FakeModel {
    fn start(dir: &Path, script: &Value) -> Self {
        std::fs::create_dir_all(dir).expect("a directory");
        let path = dir.join("script.json");
        std::fs::write(&path, script.to_string()).expect("the script");
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fake-openai"))
            .args(["--port", &port.to_string(), "--script"])
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .expect("fake-openai starts");
        let line = first_line(&mut child, "fake-openai serving ");
        Self { child, base_url: line }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Daemon {
    child: Child,
    base: String,
}

#[derive(Debug, Clone)]
struct Sample {
    /// CPU seconds of the whole process.
    cpu: f64,
    /// Context switches of all its threads, voluntary and not.
    switches: u64,
    rss_kib: u64,
    /// CPU seconds and context switches by thread name (digits dropped).
    threads: std::collections::BTreeMap<String, (f64, u64)>,
}

impl Daemon {
    fn start(dir: &Path, model_url: &str, store_url: Option<&str>) -> Self {
        Self::start_node(dir, model_url, store_url, None)
    }

    /// A node of a cluster when `node` names it.
    fn start_node(dir: &Path, model_url: &str, store_url: Option<&str>, node: Option<&str>) -> Self {
        let agents = dir.join("agents");
        std::fs::create_dir_all(&agents).expect("a directory");
        std::fs::write(
            agents.join("bench.toml"),
            "name = \"bench\"\ninstructions = \"Measure texts with text_stats.\"\ntools = [\"text_stats\"]\n\
             [limits]\nmax_parallel_tools = 4\n[reviewer]\nkind = \"rule_based\"\n",
        )
        .expect("the agent");
        let config = format!(
            "default_model = \"fake\"\n\
             [server]\nmax_sse_clients_per_tenant = 4096\nmax_sse_clients = 4096\n\
             [runtime]\nmax_active_runs = 4096\nmax_active_runs_per_tenant = 0\n\
             [providers.fake]\nbase_url = \"{model_url}\"\nmax_concurrency = 4096\nqueue_limit = 4096\n\
             [models.fake]\nprovider = \"fake\"\nid = \"fake\"\n"
        );
        std::fs::write(dir.join("troupe.toml"), config).expect("the config");
        let log = std::fs::File::create(dir.join("daemon.log")).expect("the log");
        let mut command = wrapped(daemon_binary());
        command
            .args(["serve", "--bind", "127.0.0.1:0", "--insecure-no-auth", "--data-dir"])
            .arg(dir.join("data"))
            .env("TROUPE_CONFIG", dir.join("troupe.toml"))
            .env("TROUPE_AGENTS", &agents)
            .env_remove("TROUPE_DATABASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("TROUPE_MODEL")
            .env_remove("TROUPE_DEFAULT_MODEL")
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(url) = store_url {
            command.env("TROUPE_DATABASE_URL", url);
        }
        if let Some(node) = node {
            command.env("TROUPE_CLUSTER__ENABLED", "true").env("TROUPE_CLUSTER__NODE_NAME", node);
        }
        let mut child = command.spawn().expect("troupe serve starts");
        let base = first_line(&mut child, "troupe listening on ");
        Self { child, base }
    }

    /// The floor server (`floor.rs`): this binary again, on `model_url`.
    fn floor(model_url: &str) -> Self {
        let mut command = wrapped(std::env::current_exe().expect("this bench's binary"));
        command.env(floor::MODEL_VAR, model_url).stdout(Stdio::piped());
        let mut child = command.spawn().expect("the floor server starts");
        let base = first_line(&mut child, "troupe listening on ");
        Self { child, base }
    }

    fn sample(&self) -> Sample {
        let pid = self.child.id();
        let mut sample = Sample { cpu: 0.0, switches: 0, rss_kib: 0, threads: Default::default() };
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads");
        for task in tasks.flatten() {
            let path = task.path();
            let cpu = thread_cpu(&path.join("stat"));
            sample.cpu += cpu;
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
            let switches = status_field(&status, "voluntary_ctxt_switches:")
                + status_field(&status, "nonvoluntary_ctxt_switches:");
            sample.switches += switches;
            let group = sample
                .threads
                .entry(name.trim().trim_end_matches(|c: char| c.is_ascii_digit()).to_owned())
                .or_default();
            group.0 += cpu;
            group.1 += switches;
        }
        // The process-wide figure also counts the threads that have ended.
        sample.cpu = sample.cpu.max(thread_cpu(Path::new(&format!("/proc/{pid}/stat"))));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        sample.rss_kib = status_field(&status, "VmRSS:");
        sample
    }
}

impl Drop for Daemon {
    /// Under a tool (`TROUPE_BENCH_WRAP`), the daemon is stopped as a service
    /// manager stops it (SIGTERM), so that the tool writes its report; otherwise,
    /// and after 60 s, it is killed.
    fn drop(&mut self) {
        if std::env::var_os("TROUPE_BENCH_WRAP").is_some() {
            let pid = self.child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/release/troupe`, next to this bench's own binary.
fn daemon_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_troupe"))
}

/// A command that runs `program`, under the command in `TROUPE_BENCH_WRAP` if it
/// is set (e.g. `valgrind --tool=callgrind`: instruction counts repeat where CPU
/// time on a shared machine does not).
fn wrapped(program: PathBuf) -> Command {
    let wrap = std::env::var("TROUPE_BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    match words.next() {
        Some(tool) => {
            let mut command = Command::new(tool);
            command.args(words).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// User plus system seconds from a `stat` file (USER_HZ is 100 on mainstream Linux).
fn thread_cpu(path: &Path) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

fn status_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// The rest of the first stdout line of `child` that starts with `prefix`.
fn first_line(child: &mut Child, prefix: &str) -> String {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("a piped stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let found = lines.by_ref().map_while(Result::ok).find_map(|line| line.strip_prefix(prefix).map(str::to_owned));
    // Keep reading so that the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    found.unwrap_or_else(|| panic!("the process never printed {prefix:?}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("a free port").port()
}

/// A database of its own on the PostgreSQL server at `base`, or `None` if the
/// server is unreachable.
async fn postgres_database(base: &str) -> Option<String> {
    postgres_database_named(base, "daemon").await
}

async fn postgres_database_named(base: &str, label: &str) -> Option<String> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(base).await.ok()?;
    let name = format!("troupe_bench_{label}_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).execute(&mut connection).await.ok()?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut connection).await.ok()?;
    let (server, _) = base.rsplit_once('/')?;
    Some(format!("{server}/{name}"))
}

#[derive(Clone)]
struct Driver {
    http: reqwest::Client,
    base: Arc<str>,
}

impl Driver {
    fn new(base: &str) -> Self {
        let http = reqwest::Client::builder().tcp_nodelay(true).build().expect("an HTTP client");
        Self { http, base: base.into() }
    }

    /// `runs` runs, `in_flight` at a time; each one's latency from its POST to
    /// the end of its event stream.
    async fn many(&self, runs: usize, in_flight: usize) -> Vec<Duration> {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..in_flight.min(runs) {
            let driver = self.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < runs {
                    let started = Instant::now();
                    driver.run().await;
                    latencies.push(started.elapsed());
                }
                latencies
            }));
        }
        let mut latencies = Vec::with_capacity(runs);
        for task in tasks {
            latencies.extend(task.await.expect("a client task"));
        }
        latencies
    }

    /// One run, its stream read to the end and checked.
    async fn run(&self) {
        let id = self.submit().await;
        let response =
            self.http.get(format!("{}/v1/runs/{id}/events", self.base)).send().await.expect("the event stream opens");
        assert_eq!(response.status(), 200, "the event stream of {id}");
        let body = response.text().await.expect("the event stream to its end");
        let completed = body.matches(r#""status":"completed""#).count();
        assert!(
            body.contains(r#""kind":"run_end""#) && body.contains(r#""status":"succeeded""#) && completed >= 2,
            "run {id} did not succeed with its two calls completed:\n{body}"
        );
    }

    async fn submit(&self) -> String {
        let response = self
            .http
            .post(format!("{}/v1/runs", self.base))
            .json(&json!({"input": "Count the words of two texts.", "agent": "bench"}))
            .send()
            .await
            .expect("POST /v1/runs");
        assert_eq!(response.status(), 201, "POST /v1/runs");
        let run: Value = response.json().await.expect("a run");
        run["run_id"].as_str().expect("a run id").to_owned()
    }

    /// Submits `runs` runs and waits until the model has been asked by each.
    async fn park(&self, runs: usize, model: &FakeModel) {
        let asked_before = self.model_requests(model).await;
        for _ in 0..runs {
            self.submit().await;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.model_requests(model).await < asked_before + runs {
            assert!(Instant::now() < deadline, "the parked runs never all reached the model");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let the last allocations settle.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    async fn model_requests(&self, model: &FakeModel) -> usize {
        let url = model.base_url.trim_end_matches("/v1").to_owned() + "/stats";
        let stats: Value = self.http.get(url).send().await.expect("the fake's stats").json().await.expect("JSON");
        stats["requests"].as_u64().unwrap_or(0) as usize
    }
}
