//! The MCP client against a real third-party server: the reference
//! `@modelcontextprotocol/server-everything` (npm), over stdio and streamable
//! HTTP. `.ci/run` installs it (pinned by `.ci/mcp/package-lock.json`) and sets
//! `TROUPE_TEST_MCP_EVERYTHING` to its `dist/index.js`; without the variable the
//! tests look where `.ci/run` installed it last. Under CI (or with the variable
//! set) a missing server fails the tests; elsewhere they say they skipped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use troupe::config::Config;
use troupe::mcp::McpHub;
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::protocol::{CallStatus, EventKind, RunEvent, RunId, RunStatus};
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{ScriptedModel, Step, calls, eventually, text};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

/// The server's `dist/index.js`, or `None` (outside CI) if it is not installed.
fn everything() -> Option<PathBuf> {
    let configured = std::env::var("TROUPE_TEST_MCP_EVERYTHING").ok();
    let path = configured.clone().map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
        Path::new(&home).join(
            ".cache/troupe-ci/mcp-servers/current/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        )
    });
    if path.is_file() {
        return Some(path);
    }
    if configured.is_some() || std::env::var("CI").is_ok() {
        panic!(
            "the MCP reference server is required here and {} is missing (run .ci/run's install step)",
            path.display()
        );
    }
    eprintln!("SKIPPED: no MCP reference server at {} (see .ci/run)", path.display());
    None
}

/// A hub on `servers` (TOML of `[[mcp.servers]]` entries) with quick backoff.
async fn hub(servers: &str) -> McpHub {
    let text = format!("[mcp]\nconnect_timeout = 20.0\nbackoff_initial = 0.05\nbackoff_max = 0.5\n{servers}");
    let config = Config::parse(Some(("test.toml", &text))).unwrap();
    McpHub::start(&config.mcp, |name| std::env::var(name).ok()).await.unwrap()
}

fn stdio_server(name: &str, command: &str, args: &[&str]) -> String {
    format!("[[mcp.servers]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = {command:?}\nargs = {args:?}\n")
}

/// A runtime whose agent `default` may use `tools`, answering `script` per turn.
async fn runtime(hub: &McpHub, tools: &[&str], script: Vec<Step>) -> Runtime {
    let agents = vec![AgentConfig::new("default", "Use tools.", tools.iter().map(|tool| (*tool).to_owned()).collect())];
    let mut registry = ToolRegistry::new();
    hub.register(&mut registry, &agents).unwrap();
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(Arc::new(ScriptedModel::per_turn(script))),
        tools: registry,
        hooks: Vec::new(),
        agents,
    };
    Runtime::start(RuntimeConfig::default(), deps).await.unwrap()
}

async fn run(runtime: &Runtime) -> (RunStatus, Vec<Arc<RunEvent>>) {
    let run_id = runtime.submit(SubmitRequest::new("default", "go")).await.unwrap();
    finish(runtime, run_id).await
}

async fn finish(runtime: &Runtime, run_id: RunId) -> (RunStatus, Vec<Arc<RunEvent>>) {
    let events = tokio::time::timeout(Duration::from_secs(60), runtime.subscribe(run_id, 0).collect::<Vec<_>>())
        .await
        .expect("the run ends");
    let events: Vec<Arc<RunEvent>> = events.into_iter().map(Result::unwrap).collect();
    (runtime.get(run_id).await.unwrap().unwrap().status, events)
}

/// How the run's call of `tool` ended: its status and what the model saw.
fn ended<'a>(events: &'a [Arc<RunEvent>], tool: &str) -> (CallStatus, &'a str) {
    ends(events)
        .into_iter()
        .find(|(name, _, _)| *name == tool)
        .map(|(_, status, summary)| (status, summary))
        .unwrap_or_else(|| panic!("no call of {tool} ended"))
}

/// Every ended call: tool, status, what the model saw.
fn ends(events: &[Arc<RunEvent>]) -> Vec<(&str, CallStatus, &str)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolCallEnd { tool, status, summary, .. } => Some((tool.as_str(), *status, summary.as_str())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_lists_its_tools_and_a_run_calls_one_with_checked_arguments() {
    let Some(index) = everything() else { return };
    let hub = hub(&stdio_server("everything", "node", &[index.to_str().unwrap(), "stdio"])).await;
    let status = &hub.status()[0];
    assert!(status.connected, "{status:?}");
    for tool in ["everything__echo", "everything__get-sum", "everything__trigger-long-running-operation"] {
        assert!(status.tools.iter().any(|name| name == tool), "{tool} in {:?}", status.tools);
    }

    let script = vec![
        calls(&[("everything__get-sum", json!({"a": 2, "b": 40})), ("everything__get-sum", json!({"a": "two"}))]),
        text("The sum is 42."),
    ];
    let model = Arc::new(ScriptedModel::per_turn(script));
    let agents = vec![AgentConfig::new("default", "Add.", vec!["everything__get-sum".into()])];
    let mut registry = ToolRegistry::new();
    hub.register(&mut registry, &agents).unwrap();
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools: registry,
        hooks: Vec::new(),
        agents,
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    let (status, events) = run(&runtime).await;

    assert_eq!(status, RunStatus::Succeeded);
    let ends = ends(&events);
    assert_eq!(ends.len(), 2);
    assert!(
        ends.iter().any(|(_, status, summary)| *status == CallStatus::Completed && summary.contains("42")),
        "{ends:?}"
    );
    assert!(
        ends.iter().any(|(_, status, summary)| *status == CallStatus::Failed
            && summary.starts_with("error (invalid_args)")
            && summary.contains("/a")),
        "{ends:?}"
    );
    // The telemetry names the server the tool lives on.
    let connectors: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolMetric { record } => Some(record.connector.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(connectors, ["mcp:everything", "mcp:everything"]);
    // The model was offered the server's own schema, under the safe name.
    let offered = &model.requests()[0].tools;
    let sum = offered.iter().find(|tool| tool.name == "everything__get-sum").expect("offered");
    assert_eq!(sum.parameters["properties"]["b"]["type"], "number", "{}", sum.parameters);
    runtime.shutdown(Duration::from_secs(10)).await;
    hub.shutdown().await;
}

/// The PID a `sh` wrapper wrote before `exec`ing the server, once it is there.
async fn read_pid(file: &Path, not: Option<u32>) -> u32 {
    eventually(Duration::from_secs(30), "the server wrote its pid", || async {
        let pid = std::fs::read_to_string(file).ok().and_then(|text| text.trim().parse::<u32>().ok());
        pid.filter(|pid| Some(*pid) != not)
    })
    .await
}

fn kill(pid: u32) {
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("troupe-mcp-{name}-{}", RunId::new()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_killed_mid_call_fails_that_call_cleanly_and_is_restarted() {
    let Some(index) = everything() else { return };
    let dir = scratch("kill-stdio");
    let pid_file = dir.join("pid");
    // Not a shell string of ours: `sh` is the configured program, so the test can
    // learn the server's pid (exec keeps it).
    let script = format!("echo $$ > {}; exec node {} stdio", pid_file.display(), index.display());
    let hub = hub(&stdio_server("everything", "sh", &["-c", &script])).await;
    let first = read_pid(&pid_file, None).await;

    let long = "everything__trigger-long-running-operation";
    let script = vec![calls(&[(long, json!({"duration": 30, "steps": 30}))]), text("It was cut.")];
    let runtime = runtime(&hub, &[long], script).await;
    let run_id = runtime.submit(SubmitRequest::new("default", "go")).await.unwrap();
    let mut live = runtime.subscribe(run_id, 0);
    while let Some(event) = live.next().await {
        if matches!(&event.unwrap().kind, EventKind::ToolCallStart { .. }) {
            break;
        }
    }
    kill(first);
    let (status, events) = finish(&runtime, run_id).await;

    assert_eq!(status, RunStatus::Succeeded, "the run goes on");
    let (status, seen) = ended(&events, long);
    assert_eq!(status, CallStatus::Failed);
    assert!(seen.starts_with("error (mcp_unavailable)") && seen.contains("everything"), "{seen}");
    let second = read_pid(&pid_file, Some(first)).await;
    assert!(!alive(first));
    eventually(Duration::from_secs(30), "reconnected", async || hub.status()[0].connected).await;

    let echo = runtime_with_echo(&hub).await;
    let (status, events) = run(&echo).await;
    assert_eq!(status, RunStatus::Succeeded);
    assert_eq!(ended(&events, "everything__echo").0, CallStatus::Completed, "the new server answers");
    runtime.shutdown(Duration::from_secs(10)).await;
    echo.shutdown(Duration::from_secs(10)).await;
    hub.shutdown().await;
    assert!(!alive(second), "shutdown stops the server");
    let _ = std::fs::remove_dir_all(&dir);
}

async fn runtime_with_echo(hub: &McpHub) -> Runtime {
    let script = vec![calls(&[("everything__echo", json!({"message": "hi"}))]), text("Echoed.")];
    runtime(hub, &["everything__echo"], script).await
}

/// `node index.js streamableHttp` on `port`, its output to a log file.
fn http_server(index: &Path, port: u16) -> Child {
    Command::new("node")
        .arg(index)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the server says it listens.
fn wait_listening(child: &mut Child) {
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let found = lines.any(|line| line.is_ok_and(|line| line.contains("listening on port")));
    assert!(found, "the HTTP server did not start");
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_dies_fails_calls_cleanly_and_is_reconnected_when_back() {
    let Some(index) = everything() else { return };
    let port = free_port();
    let mut server = http_server(&index, port);
    wait_listening(&mut server);
    let hub = hub(&format!(
        "[[mcp.servers]]\nname = \"everything\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"
    ))
    .await;
    assert!(hub.status()[0].connected, "{:?}", hub.status());
    let runtime = runtime_with_echo(&hub).await;
    let (status, events) = run(&runtime).await;
    assert_eq!(status, RunStatus::Succeeded);
    let (status, seen) = ended(&events, "everything__echo");
    assert!(status == CallStatus::Completed && seen.contains("hi"), "{seen}");

    server.kill().unwrap();
    server.wait().unwrap();
    let (status, events) = run(&runtime).await;
    assert_eq!(status, RunStatus::Succeeded, "a dead server fails the call, never the run");
    let (status, seen) = ended(&events, "everything__echo");
    assert!(status == CallStatus::Failed && seen.starts_with("error (mcp_unavailable)"), "{seen}");
    eventually(Duration::from_secs(30), "seen down", async || !hub.status()[0].connected).await;

    let mut server = http_server(&index, port);
    wait_listening(&mut server);
    eventually(Duration::from_secs(30), "reconnected", async || hub.status()[0].connected).await;
    let (_, events) = run(&runtime).await;
    assert_eq!(ended(&events, "everything__echo").0, CallStatus::Completed, "answered after the restart");
    runtime.shutdown(Duration::from_secs(10)).await;
    hub.shutdown().await;
    server.kill().unwrap();
    server.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_command_does_not_exist_is_reported_and_its_tools_fail_clearly() {
    let hub = hub(&stdio_server("ghost", "/nonexistent/mcp-server-ghost", &["--flag"])).await;
    let status = &hub.status()[0];
    assert!(!status.connected);
    let error = status.error.as_deref().unwrap();
    assert!(error.contains("cannot start") && error.contains("/nonexistent/mcp-server-ghost"), "{error}");

    // An agent names a tool of it: the runtime starts, and the call fails clearly.
    let script = vec![calls(&[("ghost__lookup", json!({}))]), text("No luck.")];
    let runtime = runtime(&hub, &["ghost__lookup"], script).await;
    let (status, events) = run(&runtime).await;
    assert_eq!(status, RunStatus::Succeeded);
    let (status, seen) = ended(&events, "ghost__lookup");
    assert_eq!(status, CallStatus::Failed);
    assert!(seen.starts_with("error (mcp_unavailable)") && seen.contains("cannot start"), "{seen}");
    runtime.shutdown(Duration::from_secs(10)).await;
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_at_start_is_reported_with_its_own_last_words() {
    let script =
        "import sys; sys.stderr.write('starting\\nModuleNotFoundError: No module named mcp_weather\\n'); sys.exit(1)";
    let hub = hub(&stdio_server("weather", "python3", &["-c", script])).await;
    let status = &hub.status()[0];
    assert!(!status.connected);
    let error = status.error.as_deref().unwrap();
    assert!(error.contains("handshake failed"), "{error}");
    assert!(error.contains("its stderr: starting | ModuleNotFoundError: No module named mcp_weather"), "{error}");
    hub.shutdown().await;
}

#[test]
fn the_daemon_starts_without_an_unreachable_server_and_stops_its_stdio_servers() {
    let Some(index) = everything() else { return };
    let dir = scratch("daemon");
    let pid_file = dir.join("pid");
    let script = format!("echo $$ > {}; exec node {} stdio", pid_file.display(), index.display());
    let config = dir.join("troupe.toml");
    let servers = [
        stdio_server("everything", "sh", &["-c", &script]),
        "[[mcp.servers]]\nname = \"down\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:9/mcp\"\n".to_owned(),
    ];
    std::fs::write(&config, format!("[mcp]\nconnect_timeout = 10.0\n{}", servers.join("\n"))).unwrap();
    let log = dir.join("daemon.log");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["serve", "--bind", "127.0.0.1:0", "--insecure-no-auth", "--data-dir"])
        .arg(&dir)
        .arg("--config")
        .arg(&config)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_AGENTS")
        .env_remove("TROUPE_MODEL")
        .env_remove("TROUPE_DATABASE_URL")
        .env("TROUPE_DEFAULT_MODEL", "offline")
        .env("TROUPE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = daemon.stdout.take().unwrap();
    let listening =
        BufReader::new(stdout).lines().any(|line| line.is_ok_and(|line| line.starts_with("troupe listening")));
    assert!(listening, "the daemon did not start; its log:\n{}", std::fs::read_to_string(&log).unwrap());
    let server = std::fs::read_to_string(&pid_file).unwrap().trim().parse::<u32>().unwrap();
    assert!(alive(server));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("unreachable at startup") && text.contains("down"), "reported:\n{text}");

    assert!(Command::new("kill").args(["-TERM", &daemon.id().to_string()]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(server) {
        assert!(Instant::now() < deadline, "the stdio server outlived the daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_list_that_changes_is_listed_again_and_its_new_tool_is_callable() {
    // A server of our own (tests/e2e/fixtures/mcp_list_changed.py): the reference
    // server never changes its tool list.
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/fixtures/mcp_list_changed.py");
    let hub = hub(&stdio_server("grower", "python3", &[fixture])).await;
    let status = &hub.status()[0];
    assert!(status.connected, "{status:?}");
    assert_eq!(status.tools, vec!["grower__grow".to_owned()], "`late` does not exist yet");

    // `grow` changes the list; the server's list_changed makes the hub list it
    // again, with no call of the new tool needed.
    let grow = vec![calls(&[("grower__grow", json!({}))]), text("Grown.")];
    let first = runtime(&hub, &["grower__grow"], grow).await;
    let (status, events) = run(&first).await;
    assert_eq!(status, RunStatus::Succeeded);
    assert_eq!(ended(&events, "grower__grow").0, CallStatus::Completed);
    eventually(Duration::from_secs(20), "the list_changed refresh", async || {
        hub.status()[0].tools.contains(&"grower__late".to_owned())
    })
    .await;

    let greet = vec![calls(&[("grower__late", json!({"name": "troupe"}))]), text("Done.")];
    let second = runtime(&hub, &["grower__late"], greet).await;
    let (status, events) = run(&second).await;
    assert_eq!(status, RunStatus::Succeeded);
    let (late, said) = ended(&events, "grower__late");
    assert_eq!(late, CallStatus::Completed, "{said}");
    assert!(said.contains("hello troupe"), "{said}");
    hub.shutdown().await;
}
