//! Several `troupe serve` processes on one PostgreSQL database ([cluster]): runs
//! spread over the nodes; a node killed with SIGKILL has its runs finished by the
//! others; a node paused past its lease is fenced off the runs taken meanwhile and
//! goes on; streams, input
//! and cancels work from any node.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream};
use troupe_actors::testing::eventually;

use crate::daemon::{Served, TOKEN};
use crate::store::postgres_database;

/// A folder shared by the nodes: config, agents, the journal (the side effect).
struct Cluster {
    dir: std::path::PathBuf,
    database: String,
    model: String,
}

impl Cluster {
    /// `cluster`: the `[cluster]` settings besides `enabled`.
    fn new(name: &str, database: String, model: &FakeOpenAi, cluster: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("troupe-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("agents")).unwrap();
        let journal = dir.join("tenants/{tenant}/journal.log");
        let config = format!(
            "[tools]\njournal_path = {:?}\n[cluster]\nenabled = true\n{cluster}\n",
            journal.display().to_string()
        );
        std::fs::write(dir.join("troupe.toml"), config).unwrap();
        let agent =
            "name = \"crash\"\ninstructions = \"Record, then measure.\"\ntools = [\"journal\", \"text_stats\"]\n";
        std::fs::write(dir.join("agents/crash.toml"), agent).unwrap();
        Self { dir, database, model: model.base_url() }
    }

    /// Starts node `name`.
    fn node(&self, name: &str) -> Served {
        let data = self.dir.join(format!("node-{name}"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .env("TROUPE_CONFIG", self.dir.join("troupe.toml"))
            .env("TROUPE_AGENTS", self.dir.join("agents"))
            .env("TROUPE_DATABASE_URL", &self.database)
            .env("TROUPE_CLUSTER__NODE_NAME", name)
            .env("OPENAI_BASE_URL", &self.model)
            .env("TROUPE_MODEL", "fake")
            .env_remove("OPENAI_API_KEY")
            .env_remove("TROUPE_DEFAULT_MODEL");
        Served::start(command)
    }

    /// The journal's entries by key: each must be there once.
    fn journal(&self) -> HashMap<String, usize> {
        let text = std::fs::read_to_string(self.dir.join("tenants/e2e/journal.log")).unwrap_or_default();
        let mut written = HashMap::new();
        for line in text.lines() {
            *written.entry(line.split('\t').nth(1).unwrap_or_default().to_owned()).or_insert(0) += 1;
        }
        written
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A journal entry, then a measurement, then the answer; each chunk `delay` apart.
fn slow_run(delay: u64) -> FakeReply {
    let mut act = tool_call_stream(
        &[("j", "journal", r#"{"text": "paid invoice"}"#), ("m", "text_stats", r#"{"text": "a b b"}"#)],
        4,
    );
    let mut answer = text_stream("All done.", 3);
    for reply in [&mut act, &mut answer] {
        if let FakeReply::Stream { delay_ms, .. } = reply {
            *delay_ms = delay;
        }
    }
    FakeReply::PerTurn { replies: vec![act, answer] }
}

async fn get(node: &Served, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new().get(node.url(path)).bearer_auth(TOKEN).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn post(node: &Served, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new().post(node.url(path)).bearer_auth(TOKEN).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Sends `text` as the answer to run `id`'s question through `node`: the status.
async fn answer(node: &Served, id: &str, text: &str) -> u16 {
    let url = node.url(&format!("/v1/runs/{id}/input"));
    let body = serde_json::json!({ "text": text });
    reqwest::Client::new().post(url).bearer_auth(TOKEN).json(&body).send().await.unwrap().status().as_u16()
}

async fn status(node: &Served, id: &str) -> String {
    get(node, &format!("/v1/runs/{id}")).await.1["status"].as_str().unwrap_or_default().to_owned()
}

/// A metric's value summed over its series, from `/metrics`.
async fn metric(node: &Served, name: &str) -> f64 {
    let text = reqwest::get(node.url("/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The run's events, gap-free from 1 and ending with its one `run_end`.
fn check_events(id: &str, events: &[Value]) {
    let seqs: Vec<u64> = events.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free events of {id}");
    let ends = events.iter().filter(|event| event["kind"] == "run_end").count();
    assert_eq!(ends, 1, "one run_end in {id}");
    assert_eq!(events.last().unwrap()["kind"], "run_end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_runs_finish_on_the_other_nodes_within_ten_seconds() {
    let Some(database) = postgres_database().await else { return };
    let model = FakeOpenAi::start(Vec::new(), Some(slow_run(100))).await.unwrap();
    // The default lease, heartbeat and claim interval.
    let cluster = Cluster::new("kill", database, &model, "");
    let nodes = [cluster.node("a"), cluster.node("b"), cluster.node("c")];

    let mut runs: Vec<(usize, String, String)> = Vec::new();
    for round in 0..9 {
        let input = format!("request {round}");
        let id = nodes[round % 3].post_run(&input, "crash").await;
        runs.push((round % 3, id, input));
    }
    eventually(Duration::from_secs(30), "every run reached the model", || async {
        let requests = model.requests();
        runs.iter().all(|(_, _, input)| requests.iter().any(|request| request.body.to_string().contains(input)))
    })
    .await;
    let [a, b, c] = nodes;
    a.signal("KILL");
    let killed = Instant::now();
    drop(a);

    let on_a: Vec<&String> = runs.iter().filter(|(node, _, _)| *node == 0).map(|(_, id, _)| id).collect();
    eventually(Duration::from_secs(10), "the killed node's runs ended on the others", || async {
        for id in &on_a {
            if status(&b, id).await != "succeeded" {
                return false;
            }
        }
        true
    })
    .await;
    eprintln!("the killed node's runs ended {:?} after the kill", killed.elapsed());
    for (_, id, _) in &runs {
        eventually(Duration::from_secs(30), "every run succeeded", || async { status(&c, id).await == "succeeded" })
            .await;
        // Read from a node that may not have driven it.
        check_events(id, &b.events(id).await);
    }
    let written = cluster.journal();
    assert_eq!(written.len(), runs.len(), "one journal entry per run: {written:?}");
    assert!(written.values().all(|count| *count == 1), "a journal entry was written twice: {written:?}");
    let takeovers =
        metric(&b, "troupe_cluster_takeovers_total").await + metric(&c, "troupe_cluster_takeovers_total").await;
    assert!(takeovers >= 1.0, "the other nodes took the killed node's runs over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_streams_cancels_and_answers_a_run_another_node_drives() {
    let Some(database) = postgres_database().await else { return };
    // The first request hangs (a run to cancel); then each run is slow.
    let model = FakeOpenAi::start(vec![FakeReply::Hang], Some(slow_run(100))).await.unwrap();
    let cluster = Cluster::new("any", database, &model, "lease = 3.0\nheartbeat = 1.0\nclaim_interval = 0.5");
    let (a, b, c) = (cluster.node("a"), cluster.node("b"), cluster.node("c"));

    // Cancelled through B while A drives it.
    let hanging = a.post_run("hang", "crash").await;
    eventually(Duration::from_secs(30), "the run reached the model", || async { !model.requests().is_empty() }).await;
    let (code, view) = post(&b, &format!("/v1/runs/{hanging}/cancel")).await;
    assert_eq!((code, &view["status"]), (200, &Value::from("cancelled")), "{view}");
    let (code, _) = post(&c, &format!("/v1/runs/{hanging}/cancel")).await;
    assert_eq!(code, 409, "an ended run cannot be cancelled again, from any node");

    // Followed on B to its end while A drives it.
    let id = a.post_run("followed", "crash").await;
    let events = b.events(&id).await;
    check_events(&id, &events);
    assert_eq!(status(&c, &id).await, "succeeded");

    // Followed on B while A, which drives it, is killed: the stream goes on.
    let id = a.post_run("taken over", "crash").await;
    let stream = tokio::spawn({
        let url = b.url(&format!("/v1/runs/{id}/events"));
        async move {
            let response = reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await.unwrap();
            let text = tokio::time::timeout(Duration::from_secs(60), response.text()).await.unwrap().unwrap();
            text.lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .map(|data| serde_json::from_str::<Value>(data).unwrap())
                .collect::<Vec<_>>()
        }
    });
    eventually(Duration::from_secs(30), "the run reached the model", || async {
        model.requests().iter().any(|request| request.body.to_string().contains("taken over"))
    })
    .await;
    a.signal("KILL");
    drop(a);
    let events = stream.await.unwrap();
    check_events(&id, &events);
    assert_eq!(status(&b, &id).await, "succeeded");
    assert!(cluster.journal().values().all(|count| *count == 1), "no journal entry twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_is_fenced_off_its_run_and_goes_on() {
    let Some(database) = postgres_database().await else { return };
    let model = FakeOpenAi::start(Vec::new(), Some(slow_run(300))).await.unwrap();
    let cluster = Cluster::new("pause", database, &model, "lease = 2.0\nheartbeat = 0.5\nclaim_interval = 0.5");
    let (mut a, b) = (cluster.node("a"), cluster.node("b"));

    let id = a.post_run("paused", "crash").await;
    eventually(Duration::from_secs(30), "the run reached the model", || async { !model.requests().is_empty() }).await;
    a.signal("STOP");
    eventually(Duration::from_secs(20), "the other node finished the run", || async {
        status(&b, &id).await == "succeeded"
    })
    .await;
    a.signal("CONT");
    // It finds its lease gone and takes it again; its commit for the run B took
    // is refused, and its session for it stops.
    eventually(Duration::from_secs(20), "the paused node's commit was refused", || async {
        metric(&a, "troupe_cluster_fenced_commits_total").await >= 1.0
    })
    .await;
    assert!(a.exited().is_none(), "it goes on: {}", a.log());
    check_events(&id, &b.events(&id).await);
    let written = cluster.journal();
    assert!(written.values().all(|count| *count == 1), "a journal entry was written twice: {written:?}");

    // It takes runs again.
    assert_eq!(get(&a, "/readyz").await.0, 200);
    let id = a.post_run("after the pause", "crash").await;
    check_events(&id, &a.events(&id).await);
    assert_eq!(status(&b, &id).await, "succeeded");
}

/// The store's side, in-process: a run created by node A is claimed by node B
/// once A's lease has expired; A's commits are refused from then on, B's land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_by_a_node_whose_run_was_claimed_is_refused() {
    use troupe::store::{ClusterOptions, SqlStore};
    use troupe_actors::protocol::{EventKind, RunId};
    use troupe_actors::store::{Commit, RunStore, StoreError};

    use crate::store::{event, record};

    let Some(database) = postgres_database().await else { return };
    let options = |name: &str| ClusterOptions { node_name: name.to_owned(), lease: Duration::from_secs(5) };
    let a = SqlStore::connect_cluster(&database, &options("a"), Duration::from_secs(1)).await.unwrap();
    let b = SqlStore::connect_cluster(&database, &options("b"), Duration::from_secs(1)).await.unwrap();
    let refused = SqlStore::connect(&database).await.err().expect("a single-node process is refused beside a cluster");
    assert!(refused.to_string().contains("[cluster]"), "{refused}");

    let run_id = RunId::new();
    let started = event(run_id, 1, EventKind::RunStarted { agent: "agent".into(), input: "x".into() });
    a.create_run(record(run_id, "t"), vec![started]).await.unwrap();
    assert!(b.unfinished_runs().await.unwrap().is_empty(), "a live node's run is not claimed");
    let turn =
        |seq| Commit { run_id, writes: vec![], events: vec![event(run_id, seq, EventKind::TurnStart { turn: 1 })] };
    a.commit(&turn(2)).await.unwrap();

    // A stops renewing (paused): its lease runs out.
    let membership = a.membership().unwrap();
    sqlx::query("UPDATE cluster_nodes SET lease_until = now() - interval '1 second' WHERE node_id = $1")
        .bind(&membership.node.id)
        .execute(&membership.pool)
        .await
        .unwrap();
    assert_eq!(b.unfinished_runs().await.unwrap(), vec![run_id], "B claims the orphaned run");
    assert_eq!(a.commit(&turn(3)).await, Err(StoreError::Fenced(run_id)), "A may no longer write it");
    b.commit(&turn(3)).await.unwrap();
    assert_eq!(b.events_after(run_id, 0, 10).await.unwrap().len(), 3, "only B's commit landed");
    assert!(b.unfinished_runs().await.unwrap().is_empty(), "a run is claimed once");

    // A run B gives back (its session gave up while the store was away) is
    // claimed again, by any node.
    b.release(run_id).await.unwrap();
    assert_eq!(a.unfinished_runs().await.unwrap(), vec![run_id], "a run given back is claimed again");
    a.commit(&turn(4)).await.unwrap();
    assert_eq!(b.commit(&turn(5)).await, Err(StoreError::Fenced(run_id)), "B let it go");
}

/// The crash test of `crash.rs` on a cluster: three nodes take runs that write a
/// journal entry (a side effect) and measure text (idempotent) while a random
/// node is killed with SIGKILL at a seeded random moment and started again, many
/// times; then every run has ended well, none is lost, no journal entry is written
/// twice, a call cut off is reported interrupted, and every run's events are
/// gap-free. `TROUPE_CRASH_SEED` replays a schedule; `TROUPE_CLUSTER_KILLS` sets
/// the kills (100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_survive_random_nodes_killed_again_and_again() {
    use troupe::store::SqlStore;
    use troupe_actors::protocol::{CallStatus, RunStatus};
    use troupe_actors::store::{RunQuery, RunStore};

    let Some(database) = postgres_database().await else { return };
    let seed: u64 = std::env::var("TROUPE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261128);
    let kills: usize = std::env::var("TROUPE_CLUSTER_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    eprintln!("cluster crash schedule: seed {seed}, {kills} kills (TROUPE_CRASH_SEED replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let model = FakeOpenAi::start(Vec::new(), Some(slow_run(15))).await.unwrap();
    let cluster =
        Cluster::new("crash", database.clone(), &model, "lease = 1.5\nheartbeat = 0.5\nclaim_interval = 0.25");
    let names = ["a", "b", "c"];
    let mut nodes: Vec<Served> = names.iter().map(|name| cluster.node(name)).collect();

    let mut runs = Vec::new();
    for round in 0..kills {
        let input = format!("request {round}");
        runs.push(nodes[rng.usize(0..3)].post_run(&input, "crash").await);
        eventually(Duration::from_secs(60), &format!("round {round}: the run never reached the model"), || async {
            model.requests().iter().any(|request| request.body.to_string().contains(&input))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        let victim = rng.usize(0..3);
        nodes[victim].signal("KILL");
        nodes[victim] = cluster.node(names[victim]);
    }
    for id in &runs {
        eventually(Duration::from_secs(120), &format!("run {id} ended"), || async {
            ["succeeded", "failed", "cancelled"].contains(&status(&nodes[0], id).await.as_str())
        })
        .await;
    }
    for node in nodes {
        node.terminate();
    }

    let store = SqlStore::connect(&database).await.unwrap();
    let stored = store.list_runs(RunQuery { limit: 10_000, ..RunQuery::default() }).await.unwrap();
    assert_eq!(stored.len(), kills, "every submitted run is kept");
    let written = cluster.journal();
    assert!(written.values().all(|count| *count == 1), "a journal entry was written twice: {written:?}");
    let mut interrupted = 0;
    for run in &stored {
        assert_eq!(run.status, RunStatus::Succeeded, "run {} ended {:?}: {:?}", run.run_id, run.status, run.reason);
        let events = store.events_after(run.run_id, 0, 100_000).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free seq in run {}", run.run_id);
        let snapshot = store.load(run.run_id).await.unwrap().unwrap();
        let journal = snapshot.tool_executions.iter().find(|call| call.tool == "journal").expect("the journal call");
        match journal.status {
            CallStatus::Completed => {
                assert_eq!(written.get(&format!("{}:1:0", run.run_id)), Some(&1), "a completed call wrote once")
            }
            CallStatus::Interrupted => interrupted += 1,
            other => panic!("journal call ended {other:?}"),
        }
    }
    eprintln!(
        "{} runs, {} journal entries, {interrupted} calls cut off and reported interrupted",
        stored.len(),
        written.len()
    );
}

/// SIGTERM hands a node's runs over at once: with a lease of a minute, the other
/// node finishes a run the stopped node was driving long before it would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_with_sigterm_hands_its_runs_over_at_once() {
    let Some(database) = postgres_database().await else { return };
    let model = FakeOpenAi::start(Vec::new(), Some(slow_run(200))).await.unwrap();
    let cluster = Cluster::new("handover", database, &model, "lease = 60.0\nheartbeat = 1.0\nclaim_interval = 0.5");
    let (a, b) = (cluster.node("a"), cluster.node("b"));
    let id = a.post_run("handed over", "crash").await;
    eventually(Duration::from_secs(30), "the run reached the model", || async { !model.requests().is_empty() }).await;
    let stopped = Instant::now();
    a.terminate();
    eventually(Duration::from_secs(20), "the other node finished the run", || async {
        status(&b, &id).await == "succeeded"
    })
    .await;
    assert!(stopped.elapsed() < Duration::from_secs(20), "handed over, not taken after the lease");
    check_events(&id, &b.events(&id).await);
    assert!(cluster.journal().values().all(|count| *count == 1), "no journal entry twice");
}

/// An answer to a run's question sent to a node that does not drive the run
/// reaches it; one sent again, once it moved on, is refused from any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sent_to_any_node_reaches_the_run() {
    let Some(database) = postgres_database().await else { return };
    let ask = tool_call_stream(&[("q", "ask_user", r#"{"question": "Which day?"}"#)], 1);
    let reply = FakeReply::PerTurn { replies: vec![ask, text_stream("Booked for Tuesday.", 1)] };
    let model = FakeOpenAi::start(Vec::new(), Some(reply)).await.unwrap();
    let cluster = Cluster::new("input", database, &model, "");
    let (a, b) = (cluster.node("a"), cluster.node("b"));
    let id = a.post_run("book it", "crash").await;
    eventually(Duration::from_secs(30), "the run asked its question", || async {
        status(&b, &id).await == "waiting_input"
    })
    .await;
    assert_eq!(answer(&b, &id, "Tuesday").await, 202);
    check_events(&id, &b.events(&id).await);
    let (_, run) = get(&a, &format!("/v1/runs/{id}")).await;
    assert_eq!(
        (run["status"].as_str(), run["final_output"].as_str()),
        (Some("succeeded"), Some("Booked for Tuesday."))
    );
    assert!(model.requests().last().unwrap().body.to_string().contains("Tuesday"), "the model got the answer");
    assert_eq!(answer(&b, &id, "Wednesday").await, 409, "the run is no longer waiting");
}

/// A PostgreSQL server of the test's own, so that it can be restarted: `initdb`
/// and `pg_ctl` of the machine's PostgreSQL, run as the `postgres` user when the
/// test runs as root (PostgreSQL refuses root).
struct OwnPostgres {
    dir: std::path::PathBuf,
    port: u16,
    bin: std::path::PathBuf,
}

impl OwnPostgres {
    /// `None` where the machine has no PostgreSQL binaries (outside CI).
    fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql").ok()?.flatten().map(|entry| entry.path().join("bin")).next();
        let Some(bin) = bin.filter(|bin| bin.join("initdb").exists()) else {
            assert!(std::env::var("CI").is_err(), "CI needs PostgreSQL's binaries under /usr/lib/postgresql");
            eprintln!("SKIPPED: no PostgreSQL binaries");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("troupe-own-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = Self { dir, port, bin };
        if server.as_root() {
            assert!(Command::new("chown").arg("postgres").arg(&server.dir).status().unwrap().success());
        }
        let data = server.dir.join("data");
        server.run("initdb", &["-D", data.to_str().unwrap(), "-A", "trust", "-U", "postgres", "--no-sync"]);
        server.pg_ctl("start");
        Some(server)
    }

    fn as_root(&self) -> bool {
        Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = if self.as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        let output = command.args(args).output().unwrap();
        assert!(output.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    fn pg_ctl(&self, action: &str) {
        let options = format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", self.port, self.dir.display());
        let data = self.dir.join("data");
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap(), "-o", &options, "-m", "fast", "-w", action],
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ =
            std::panic::catch_unwind(|| self.run("pg_ctl", &["-D", data.to_str().unwrap(), "-m", "immediate", "stop"]));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PostgreSQL restarted (`pg_ctl restart`) while three nodes drive runs: they
/// reconnect, and every run in flight resumes and ends once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_flight_finish_after_postgresql_restarts() {
    let Some(server) = OwnPostgres::start() else { return };
    let model = FakeOpenAi::start(Vec::new(), Some(slow_run(200))).await.unwrap();
    let cluster = Cluster::new("pg-restart", server.url(), &model, "");
    let nodes = [cluster.node("a"), cluster.node("b"), cluster.node("c")];
    let mut runs = Vec::new();
    for round in 0..12 {
        runs.push(nodes[round % 3].post_run(&format!("request {round}"), "crash").await);
    }
    eventually(Duration::from_secs(30), "every run reached the model", || async { model.requests().len() >= 12 }).await;
    server.pg_ctl("restart");
    for id in &runs {
        eventually(Duration::from_secs(60), &format!("run {id} succeeded"), || async {
            status(&nodes[1], id).await == "succeeded"
        })
        .await;
        check_events(id, &nodes[2].events(id).await);
    }
    for node in &nodes {
        assert_eq!(get(node, "/readyz").await.0, 200, "every node is up: {}", node.log());
    }
    // A journal call cut off by the restart is reported interrupted, not made again.
    let written = cluster.journal();
    assert!(written.len() <= runs.len() && written.values().all(|count| *count == 1), "{written:?}");
}
