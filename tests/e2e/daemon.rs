//! `troupe serve` as a user runs it: the real binary on a port it picks, driven
//! over HTTP and by the CLI client; SIGTERM mid-run and a restart; `/metrics`
//! checked by `promtool`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream};

use crate::crash::Sandbox;
use troupe_actors::testing::eventually;

pub(crate) const TOKEN: &str = "e2e-token";

/// A running `troupe serve`.
pub(crate) struct Served {
    child: Child,
    pub(crate) base: String,
    /// Its stderr.
    log: std::path::PathBuf,
}

impl Served {
    /// Starts `command` (a `troupe serve`) and waits for its address line.
    pub(crate) fn start(mut command: Command) -> Self {
        command.args(["--bind", "127.0.0.1:0"]).env("TROUPE_API_TOKENS", format!("e2e={TOKEN}"));
        let log =
            std::env::temp_dir().join(format!("troupe-e2e-serve-{}-{}.log", std::process::id(), fastrand::u32(..)));
        command.stdout(Stdio::piped()).stderr(std::fs::File::create(&log).unwrap());
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(address) = line.strip_prefix("troupe listening on ") {
                    let _ = sender.send(address.to_owned());
                }
            }
        });
        let Ok(base) = receiver.recv_timeout(Duration::from_secs(60)) else {
            panic!("the daemon did not announce its address; its log:\n{}", std::fs::read_to_string(&log).unwrap());
        };
        Self { child, base, log }
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) async fn post_run(&self, input: &str, agent: &str) -> String {
        let response = reqwest::Client::new()
            .post(self.url("/v1/runs"))
            .bearer_auth(TOKEN)
            .json(&json!({"input": input, "agent": agent}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json::<Value>().await.unwrap()["run_id"].as_str().unwrap().to_owned()
    }

    /// The run's whole event stream, as the JSON of each event.
    pub(crate) async fn events(&self, id: &str) -> Vec<Value> {
        self.events_within(id, Duration::from_secs(60)).await
    }

    /// The run's whole event stream, which must end within `limit`.
    pub(crate) async fn events_within(&self, id: &str, limit: Duration) -> Vec<Value> {
        let response = reqwest::Client::new()
            .get(self.url(&format!("/v1/runs/{id}/events")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let text = tokio::time::timeout(limit, response.text()).await.unwrap().unwrap();
        text.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    /// Sends SIGTERM and waits (a minute at most) for a clean exit.
    pub(crate) fn terminate(self) {
        self.signal_term();
        self.wait_exit();
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`…).
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([format!("-{signal}"), pid]).status().unwrap().success());
    }

    /// How it exited, if it has.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Sends SIGTERM.
    pub(crate) fn signal_term(&self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    }

    /// Waits (a minute at most) for a clean exit.
    pub(crate) fn wait_exit(mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "the daemon exited with {status} after SIGTERM");
                return;
            }
            assert!(Instant::now() < deadline, "the daemon did not stop within a minute of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|event| event["seq"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_sigterm_completes_after_a_restart() {
    let sandbox = Sandbox::new("sigterm", r#"["text_stats"]"#);
    // Turn 1 measures; the first ask for turn 2 hangs until the daemon stops; the
    // restarted daemon asks again and gets the answer.
    let act = tool_call_stream(&[("m", "text_stats", r#"{"text": "a b b"}"#)], 2);
    let model = FakeOpenAi::start(vec![act, FakeReply::Hang, text_stream("Three words.", 2)], None).await.unwrap();

    let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let id = daemon.post_run("measure a b b", "crash").await;
    eventually(Duration::from_secs(30), "turn 2 was never requested", || async { model.requests().len() >= 2 }).await;
    daemon.terminate();

    let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let events = daemon.events(&id).await;
    assert_eq!(seqs(&events), (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free across the restart");
    let last = events.last().unwrap();
    assert_eq!((last["kind"].as_str(), last["status"].as_str()), (Some("run_end"), Some("succeeded")));
    let answer = events.iter().find(|event| event["kind"] == "final_output").unwrap();
    assert_eq!(answer["text"], "Three words.");
    assert_eq!(model.requests().len(), 3, "turn 1 was not asked again");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&sandbox.dir);
}

/// While the daemon runs, its SQLite file is locked to other programs (it keeps
/// the WAL index in its own memory, so an outside reader could not see its
/// commits, nor an outside writer be seen); once the daemon has stopped, the
/// file opens and holds the run. With `store.sqlite_exclusive = false` another
/// program reads it while the daemon runs (a backup, a replication tool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_file_is_locked_to_other_programs_unless_shared() {
    for exclusive in [true, false] {
        let sandbox = Sandbox::new(&format!("store-exclusive-{exclusive}"), r#"["text_stats"]"#);
        let config = sandbox.dir.join("troupe.toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!("[store]\nsqlite_exclusive = {exclusive}\n"));
        std::fs::write(&config, text).unwrap();
        let model = FakeOpenAi::start(vec![text_stream("Done.", 2)], None).await.unwrap();
        let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
        let id = daemon.post_run("say done", "crash").await;
        let last = daemon.events(&id).await.pop().unwrap();
        assert_eq!(last["status"], "succeeded");

        let path = sandbox.dir.join("troupe.db");
        let count = || -> rusqlite::Result<i64> {
            let outside = rusqlite::Connection::open(&path)?;
            outside.busy_timeout(Duration::ZERO)?;
            outside.query_row("SELECT COUNT(*) FROM runs WHERE run_id = ?1 AND status = 'succeeded'", [&id], |row| {
                row.get(0)
            })
        };
        if exclusive {
            let error = count().expect_err("another program read the store while the daemon ran");
            assert_eq!(error.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy), "{error}");
        } else {
            assert_eq!(count().unwrap(), 1, "another program reads the shared store while the daemon runs");
        }
        daemon.terminate();
        assert_eq!(count().unwrap(), 1, "the stopped daemon's file opens and holds the run");
        let _ = std::fs::remove_dir_all(&sandbox.dir);
    }
}

/// An HTTP server whose every answer waits until `release` is notified; it counts
/// the requests it got.
async fn held_server(
    release: std::sync::Arc<tokio::sync::Notify>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/pay", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (release, counted) = (release.clone(), counted.clone());
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let _ = socket.read(&mut request).await;
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                release.notified().await;
                let _ =
                    socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\npaid").await;
            });
        }
    });
    (url, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_side_effecting_call_in_flight_finish_and_records_it_completed() {
    let sandbox = Sandbox::new("sigterm-drain", r#"["http_fetch"]"#);
    let config = sandbox.dir.join("troupe.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[tools.http_fetch]\nallow_cidrs = [\"127.0.0.1/32\"]\n");
    std::fs::write(&config, text).unwrap();
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let (url, hits) = held_server(release.clone()).await;
    // Turn 1 calls the held URL (http_fetch is not idempotent: a side effect); turn 2 answers.
    let call = format!(r#"{{"url": "{url}"}}"#);
    let act = tool_call_stream(&[("p", "http_fetch", &call)], 2);
    let model = FakeOpenAi::start(vec![act, text_stream("Paid.", 2)], None).await.unwrap();

    let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let id = daemon.post_run("pay it", "crash").await;
    eventually(Duration::from_secs(30), "the call never reached the server", || async {
        hits.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    daemon.signal_term();
    // The runtime drains: only then does the server answer.
    eventually(Duration::from_secs(30), "the daemon never began to drain", || async {
        daemon.log().contains("let their tool calls in flight finish")
    })
    .await;
    release.notify_one();
    daemon.wait_exit();

    let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let events = daemon.events(&id).await;
    let ends: Vec<&str> = events
        .iter()
        .filter(|event| event["kind"] == "tool_call_end")
        .filter_map(|event| event["status"].as_str())
        .collect();
    assert_eq!(ends, ["completed"], "the call that ran is recorded as it ended, not interrupted");
    let last = events.last().unwrap();
    assert_eq!((last["kind"].as_str(), last["status"].as_str()), (Some("run_end"), Some("succeeded")));
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1, "the side effect happened once");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&sandbox.dir);
}

/// The binary on the offline model, in a data dir of its own.
fn offline(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_AGENTS")
        .env_remove("TROUPE_MODEL")
        .env_remove("TROUPE_DATABASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env("TROUPE_DEFAULT_MODEL", "offline");
    command
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("troupe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_follows_a_run_and_metrics_pass_promtool() {
    let dir = scratch_dir("daemon-cli");
    let daemon = Served::start(offline(&dir, &["serve"]));
    let client = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(args)
            .env("TROUPE_URL", &daemon.base)
            .env("TROUPE_TOKEN", TOKEN)
            .output()
            .unwrap();
        (output.status, String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap())
    };

    let (status, shown, errors) = client(&["run", "--follow", "the cat saw the dog"]);
    assert!(status.success(), "{errors}");
    assert!(shown.contains("plan v1:") && shown.contains("✓ text_stats ·"), "{shown}");
    assert!(shown.contains("Thought for ") && shown.contains("■ succeeded"), "{shown}");

    let (status, listed, _) = client(&["runs", "list", "--json"]);
    assert!(status.success());
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["runs"][0]["status"], "succeeded");
    let run_id = listed["runs"][0]["run_id"].as_str().unwrap();
    let (status, steps, errors) = client(&["runs", "show", run_id, "--reasoning"]);
    assert!(status.success(), "{errors}");
    assert!(steps.starts_with("▾ Thought for "), "{steps}");
    let call = steps.lines().find(|line| line.contains("tool     text_stats (text: \"the cat saw the dog\""));
    assert!(call.is_some_and(|line| line.contains(" · completed · ")), "{steps}");
    assert!(steps.contains("review   Review: carry on · proceed"), "{steps}");
    let (status, agents, _) = client(&["agents", "--json"]);
    assert!(status.success());
    assert_eq!(serde_json::from_str::<Value>(&agents).unwrap()[0]["name"], "default");
    let (status, _, errors) = client(&["runs", "show", "01a20750-0000-7000-8000-000000000000"]);
    assert!(!status.success() && errors.contains("404 not_found"), "{errors}");

    let metrics = reqwest::get(daemon.url("/metrics")).await.unwrap().text().await.unwrap();
    for expected in [
        "troupe_runs_finished_total{agent=\"default\",status=\"succeeded\"} 1",
        "troupe_turns_total",
        "troupe_tool_calls_total{tool=\"text_stats\",status=\"completed\"}",
        "troupe_http_requests_total{method=\"POST\",route=\"/v1/runs\",status=\"201\"} 1",
        "troupe_http_request_duration_seconds_bucket",
        "troupe_sse_clients",
        "troupe_tool_queue_depth",
        // Series that have not fired yet read 0, not "No data".
        "troupe_supervisor_meltdowns_total{level=\"root\"} 0",
        "troupe_admission_rejected_total{reason=\"overloaded\"} 0",
        "troupe_actor_restarts_total{actor=\"session\"} 0",
        "troupe_retention_deleted_runs_total",
    ] {
        assert!(metrics.contains(expected), "/metrics lacks {expected}:\n{metrics}");
    }
    assert!(!daemon.log().contains("\x1b["), "no colour codes in a log file:\n{}", daemon.log());
    let checked = promtool(&metrics);
    assert!(checked.status.success(), "promtool check metrics: {}", String::from_utf8_lossy(&checked.stderr));
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `promtool check metrics` on `text` (CI installs the Debian package `prometheus`).
fn promtool(text: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian package `prometheus`)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn serve_refuses_to_start_without_tokens_unless_told_to() {
    let dir = scratch_dir("daemon-noauth");
    let output = offline(&dir, &["serve", "--bind", "127.0.0.1:0"]).env_remove("TROUPE_API_TOKENS").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let errors = String::from_utf8(output.stderr).unwrap();
    assert!(errors.contains("TROUPE_API_TOKENS") && errors.contains("--insecure-no-auth"), "{errors}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_dashboard_names_only_metrics_troupe_exports_and_the_scrape_example_is_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard = std::fs::read_to_string(format!("{root}/config/grafana/troupe.json")).unwrap();
    let parsed: Value = serde_json::from_str(&dashboard).unwrap();
    assert!(parsed["panels"].as_array().unwrap().len() >= 10);
    let exported = std::fs::read_to_string(format!("{root}/actors/src/metrics.rs")).unwrap();
    let mut names: Vec<String> = Vec::new();
    for (index, _) in dashboard.match_indices("troupe_") {
        let name: String = dashboard[index..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
            .collect();
        if name == "troupe_" {
            continue;
        }
        let base = name.strip_suffix("_bucket").unwrap_or(&name).to_owned();
        names.push(base);
    }
    assert!(!names.is_empty());
    for name in names {
        assert!(exported.contains(&format!("\"{name}\"")), "the dashboard uses {name}, which troupe does not export");
    }
    let checked = Command::new("promtool")
        .args(["check", "config", &format!("{root}/config/prometheus.yml")])
        .output()
        .expect("promtool is installed (Debian package `prometheus`)");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_a_failing_run_shows_the_failure_and_exits_1() {
    let sandbox = Sandbox::new("follow-fail", r#"["text_stats"]"#);
    let refused = FakeReply::Status { status: 400, retry_after: None, body: "{\"error\": \"bad request\"}".into() };
    let model = FakeOpenAi::start(vec![refused], None).await.unwrap();
    let daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["run", "--follow", "--agent", "crash", "measure this"])
        .env("TROUPE_URL", &daemon.base)
        .env("TROUPE_TOKEN", TOKEN)
        .output()
        .unwrap();
    let shown = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1), "{shown}{}", String::from_utf8_lossy(&output.stderr));
    assert!(shown.contains("! ") && shown.contains("✘ failed"), "the error event and the end are shown: {shown}");
    assert!(started.elapsed() < Duration::from_secs(5), "no reconnect loop on the run's own error event");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&sandbox.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_reads_the_tool_guide_for_the_agents_tools() {
    let sandbox = Sandbox::new("guide", r#"["text_stats"]"#);
    let model = FakeOpenAi::start(vec![text_stream("Nothing to do.", 1)], None).await.unwrap();
    let status = sandbox.troupe(&model, &["demo", "--agent", "crash", "hello"]).status().unwrap();
    assert!(status.success());
    let request = &model.requests()[0].body;
    let guide = troupe::tools::guide::parse(troupe::tools::guide::DEFAULT_GUIDE);
    // Each tool on offer is described by its guide entry (markdown bold dropped),
    // where the model looks for it: the tool's own description.
    let described: Vec<(String, String)> = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            let function = &tool["function"];
            (function["name"].as_str().unwrap().to_owned(), function["description"].as_str().unwrap().to_owned())
        })
        .collect();
    for tool in ["todo_write", "ask_user", "text_stats"] {
        let description = described.iter().find(|(name, _)| name == tool).map(|(_, text)| text.clone());
        assert_eq!(description, Some(guide[tool].replace("**", "")), "the guide's entry describes {tool}");
    }
    assert!(!described.iter().any(|(name, _)| name == "journal"), "a tool the agent may not use is not offered");
    let system = request["messages"][0]["content"].as_str().unwrap();
    assert!(!system.contains(&guide["text_stats"].replace("**", "")), "the guide is not repeated in the system prompt");
    let _ = std::fs::remove_dir_all(&sandbox.dir);
}

/// Messages to one thread, each sent with an idempotency key, the daemon killed
/// with SIGKILL at a random moment after each and restarted, the message then
/// sent again as a client retrying would: each message makes one run, the runs
/// run in order, each is answered once, and the thread lists every exchange once,
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_messages_survive_kill_9_once_each_and_in_order() {
    use reqwest::Method;

    let seed: u64 = std::env::var("TROUPE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261127);
    let mut rng = fastrand::Rng::with_seed(seed);
    eprintln!("thread crash schedule: seed {seed} (TROUPE_CRASH_SEED replays it)");
    let sandbox = Sandbox::new(&format!("thread-crash-{seed}"), r#"["text_stats"]"#);
    let mut reply = text_stream("I have noted that.", 3);
    if let FakeReply::Stream { delay_ms, .. } = &mut reply {
        *delay_ms = 15;
    }
    let model = FakeOpenAi::start(Vec::new(), Some(reply)).await.unwrap();
    let http = reqwest::Client::new();
    let call = |daemon: &Served, method: Method, path: String, key: Option<String>, body: Option<Value>| {
        let mut request = http.request(method, daemon.url(&path)).bearer_auth(TOKEN);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    let mut daemon = Served::start(sandbox.troupe(&model, &["serve"]));
    let (status, thread) =
        call(&daemon, Method::POST, "/v1/threads".into(), None, Some(json!({"agent": "crash"}))).await;
    assert_eq!(status, 201, "{thread}");
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let rounds = 12;
    let mut runs = Vec::new();
    for round in 0..rounds {
        let message = json!({"input": format!("message {round}"), "multitask_strategy": "enqueue"});
        let path = format!("/v1/threads/{thread}/runs");
        let key = Some(format!("message-{round}"));
        let (status, first) = call(&daemon, Method::POST, path.clone(), key.clone(), Some(message.clone())).await;
        assert_eq!(status, 201, "round {round}: {first}");
        tokio::time::sleep(Duration::from_millis(rng.u64(0..200))).await;
        drop(daemon); // SIGKILL
        daemon = Served::start(sandbox.troupe(&model, &["serve"]));
        let (status, retried) = call(&daemon, Method::POST, path, key, Some(message)).await;
        assert_eq!(status, 201, "round {round}: {retried}");
        assert_eq!(retried["run_id"], first["run_id"], "round {round}: the retry returns the first run");
        runs.push(first["run_id"].as_str().unwrap().to_owned());
    }

    let listed = eventually(Duration::from_secs(120), "every message to be answered", || async {
        let (_, listed) = call(&daemon, Method::GET, format!("/v1/threads/{thread}/runs?limit=100"), None, None).await;
        let all = listed["runs"].as_array().cloned().unwrap_or_default();
        all.iter().all(|run| run["status"] == "succeeded").then_some(all)
    })
    .await;
    let mut listed: Vec<String> = listed.iter().map(|run| run["run_id"].as_str().unwrap().to_owned()).collect();
    listed.reverse();
    assert_eq!(listed, runs, "one run per message, in the order sent");
    let (_, detail) = call(&daemon, Method::GET, format!("/v1/threads/{thread}"), None, None).await;
    let said: Vec<(String, String)> = detail["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap().to_owned()))
        .collect();
    let expected: Vec<(String, String)> = (0..rounds)
        .flat_map(|round| {
            [("user".to_owned(), format!("message {round}")), ("assistant".to_owned(), "I have noted that.".to_owned())]
        })
        .collect();
    assert_eq!(said, expected);
    for run in &runs {
        let events = daemon.events(run).await;
        let seqs: Vec<u64> = events.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "run {run}: gap-free");
        let answers = events.iter().filter(|event| event["kind"] == "final_output").count();
        assert_eq!(answers, 1, "run {run} answered once");
    }
    // Each run's last model request held every earlier exchange, in order.
    for (round, run) in runs.iter().enumerate() {
        let asked = format!("message {round}");
        let request = model
            .requests()
            .into_iter()
            .rev()
            .find(|request| {
                request.body["messages"]
                    .as_array()
                    .is_some_and(|m| m.last().is_some_and(|m| m["content"] == asked.as_str()))
            })
            .unwrap_or_else(|| panic!("run {run} never asked the model"));
        let users: Vec<String> = request.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(users, (0..=round).map(|n| format!("message {n}")).collect::<Vec<_>>(), "round {round}");
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&sandbox.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line() {
    let dir = scratch_dir("daemon-json-logs");
    let mut command = offline(&dir, &["serve"]);
    command.env("TROUPE_LOG_FORMAT", "json");
    let daemon = Served::start(command);
    let run = daemon.post_run("one two", "default").await;
    assert!(!daemon.events(&run).await.is_empty());
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|line| !line.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "the daemon logs at info");
    for line in lines {
        let entry: Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
        assert!(entry["timestamp"].is_string() && entry["level"].is_string() && entry["target"].is_string(), "{line}");
    }
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
