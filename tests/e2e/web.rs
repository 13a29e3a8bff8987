//! The web page at `/`: served with its security headers, and driven in headless
//! Chromium (through chromedriver's WebDriver API) against the real HTTP server
//! with a scripted model held at chosen points, so each state of the reasoning
//! block can be seen: idle → reasoning → collapsed → complete, approvals by
//! clicking, a stream cut mid-run, another tenant's run. Screenshots of the block's
//! states go to `$CARGO_TARGET_TMPDIR/screenshots`.
//!
//! Chromium and chromedriver: `TROUPE_TEST_CHROMEDRIVER` (else
//! `/usr/bin/chromedriver`) and `/usr/bin/chromium`; in CI their absence fails
//! these tests, elsewhere it skips them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use troupe::cli::client::SseParser;
use troupe::server::ServerConfig;
use troupe_actors::config::RuntimeConfig;
use troupe_actors::llm::{ModelDelta, ModelReply};
use troupe_actors::testing::{GatedTool, ScriptedModel, Step, StreamHold, calls, eventually, text};

use crate::mcp::free_port;
use crate::server::{ALPHA, BETA, TestServer, start_gated, start_with};

const WAIT: Duration = Duration::from_secs(20);

// ---- without a browser: the page's headers, CORS, the block frames -----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_with_a_strict_content_security_policy() {
    let server =
        start_with(Arc::new(ScriptedModel::queue(vec![])), RuntimeConfig::default(), ServerConfig::default()).await;
    for (path, kind) in [("/", "text/html"), ("/app.js", "text/javascript"), ("/app.css", "text/css")] {
        let response = server.http.get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind), "{path}: {headers:?}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("http"), "nothing from elsewhere: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
    }
    let page = server.http.get(server.url("/")).send().await.unwrap().text().await.unwrap();
    assert!(!page.contains("<script>") && !page.contains("style="), "no inline script or style");
    assert!(!page.contains("//cdn") && !page.contains("https://"), "no asset from elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_on_for_a_configured_origin() {
    let model = || Arc::new(ScriptedModel::queue(vec![]));
    let closed = start_with(model(), RuntimeConfig::default(), ServerConfig::default()).await;
    let origin = "https://app.example.com";
    let response =
        closed.http.get(closed.url("/v1/agents")).bearer_auth(ALPHA).header("Origin", origin).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("access-control-allow-origin").is_none(), "no CORS unless configured");

    let config = ServerConfig { cors_origins: vec![origin.to_owned()], ..ServerConfig::default() };
    let open = start_with(model(), RuntimeConfig::default(), config).await;
    let preflight = open
        .http
        .request(Method::OPTIONS, open.url("/v1/runs"))
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "POST")
        .header("Access-Control-Request-Headers", "authorization, content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), StatusCode::NO_CONTENT, "a preflight needs no token");
    assert_eq!(preflight.headers()["access-control-allow-origin"], origin);
    let allowed = preflight.headers()["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("authorization") && allowed.contains("last-event-id"), "{allowed}");
    let response =
        open.http.get(open.url("/v1/agents")).bearer_auth(ALPHA).header("Origin", origin).send().await.unwrap();
    assert_eq!(response.headers()["access-control-allow-origin"], origin);
    let other = open
        .http
        .get(open.url("/v1/agents"))
        .bearer_auth(ALPHA)
        .header("Origin", "https://evil.example.com")
        .send()
        .await
        .unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none(), "another origin is not allowed");
}

/// `(event name, data)` of a run's stream read to its end.
async fn read_stream(server: &TestServer, token: &str, path: &str, last: Option<&str>) -> Vec<(String, Value)> {
    let mut body = server.open_stream(token, path, last).await.bytes_stream();
    let mut parser = SseParser::default();
    let mut frames = Vec::new();
    while let Some(chunk) = body.next().await {
        for event in parser.push(&chunk.unwrap()) {
            frames.push((event.event.clone().unwrap_or_default(), serde_json::from_str(&event.data).unwrap()));
        }
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_view_sends_the_block_after_each_change_and_resumes_whole() {
    let model = ScriptedModel::queue(vec![calls(&[("echo", json!({"text": "hi"}))]), text("All done.")]);
    let server = start_with(Arc::new(model), RuntimeConfig::default(), ServerConfig::default()).await;
    let run = server.send(Method::POST, "/v1/runs", Some(ALPHA), Some(json!({"input": "say hi"}))).await;
    let id = run.body["run_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/runs/{id}/events?view=block");
    server.ended(&id).await;
    // A finished run's events are all ready at once: they come, then one block.
    let frames = read_stream(&server, ALPHA, &path, None).await;
    let blocks: Vec<&Value> = frames.iter().filter(|(name, _)| name == "block").map(|(_, data)| data).collect();
    assert_eq!(blocks.len(), 1, "{frames:?}");
    assert_eq!(frames.last().unwrap().0, "block", "the block follows the events");
    assert_eq!(blocks[0]["phase"], "complete");
    let last = blocks.last().unwrap();
    assert_eq!(last["answer"], "All done.");
    assert_eq!(last["status"], "succeeded");
    let tool = last["steps"].as_array().unwrap().iter().find(|step| step["kind"] == "tool").unwrap();
    assert_eq!(tool["status"], "completed", "{tool}");
    assert!(tool["detail"].as_str().unwrap().contains("\"text\": \"hi\""), "{tool}");
    assert!(last["server_time"].is_string());

    // Resumed after event 3: only later events, and the block of the whole run.
    let resumed = read_stream(&server, ALPHA, &path, Some("3")).await;
    let seqs: Vec<u64> =
        resumed.iter().filter(|(name, _)| name != "block").map(|(_, e)| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs.first(), Some(&4), "{seqs:?}");
    let resumed_last = resumed.iter().rev().find(|(name, _)| name == "block").unwrap();
    assert_eq!(&resumed_last.1["steps"], &last["steps"], "the same block, built from the whole run");

    let wrong = server.send(Method::GET, &format!("/v1/runs/{id}/events?view=nope"), Some(ALPHA), None).await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
}

// ---- in a browser ----------------------------------------------------------

/// chromedriver, if this machine has it (see the module's doc).
fn chromedriver() -> Option<PathBuf> {
    let configured = std::env::var("TROUPE_TEST_CHROMEDRIVER").ok();
    let required = configured.is_some() || std::env::var("CI").is_ok();
    let path = PathBuf::from(configured.unwrap_or_else(|| "/usr/bin/chromedriver".to_owned()));
    if path.exists() && PathBuf::from("/usr/bin/chromium").exists() {
        return Some(path);
    }
    assert!(
        !required,
        "browser tests need {} and /usr/bin/chromium (apt-get install chromium chromium-driver)",
        path.display()
    );
    eprintln!("SKIPPED a browser test: no chromedriver at {}", path.display());
    None
}

/// A headless Chromium session through chromedriver.
struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    /// chromedriver's port and the session's path, to end it on drop.
    port: u16,
    path: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    async fn start(chromedriver: &PathBuf, width: u32, height: u32) -> Self {
        let http = reqwest::Client::new();
        // A port found free may be taken before chromedriver binds it (tests run
        // in parallel): then chromedriver exits, and another port is tried.
        let mut attempt = 0;
        let (driver, port) = loop {
            attempt += 1;
            let port = free_port();
            let mut driver = Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts");
            let status = format!("http://127.0.0.1:{port}/status");
            let up = eventually(WAIT, "chromedriver to listen or exit", || {
                let exited = driver.try_wait().ok().flatten().is_some();
                let (http, status) = (&http, &status);
                async move { if http.get(status).send().await.is_ok() { Some(true) } else { exited.then_some(false) } }
            })
            .await;
            if up {
                break (driver, port);
            }
            let _ = driver.wait();
            assert!(attempt < 5, "chromedriver did not start");
        };
        let base = format!("http://127.0.0.1:{port}");
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                format!("--window-size={width},{height}")]
        }}}});
        let created: Value =
            http.post(format!("{base}/session")).json(&capabilities).send().await.unwrap().json().await.unwrap();
        let session =
            created["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("a session: {created}")).to_owned();
        Self { driver, http, session: format!("{base}/session/{session}"), port, path: format!("/session/{session}") }
    }

    async fn command(&self, method: Method, path: &str, body: Value) -> Value {
        let request = self.http.request(method, format!("{}{path}", self.session));
        let request = if body.is_null() { request } else { request.json(&body) };
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.command(Method::POST, "/url", json!({"url": url})).await;
    }

    /// Runs `script` (a function body) in the page; its return value.
    async fn run(&self, script: &str, args: Value) -> Value {
        self.command(Method::POST, "/execute/sync", json!({"script": script, "args": args})).await
    }

    async fn element(&self, css: &str) -> String {
        let found = self.command(Method::POST, "/element", json!({"using": "css selector", "value": css})).await;
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("{css}: {found}")).to_owned()
    }

    /// Clicks the element (a real click, as a person's).
    async fn click(&self, css: &str) {
        let element = self.element(css).await;
        self.command(Method::POST, &format!("/element/{element}/click"), json!({})).await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css).await;
        self.command(Method::POST, &format!("/element/{element}/value"), json!({"text": text})).await;
    }

    /// Waits until `script` returns something other than null or false; that.
    async fn until(&self, what: &str, script: &str) -> Value {
        eventually(WAIT, what, || async {
            let value = self.run(script, json!([])).await;
            (!value.is_null() && value != Value::Bool(false)).then_some(value)
        })
        .await
    }

    async fn screenshot(&self, name: &str) {
        let encoded = self.command(Method::GET, "/screenshot", Value::Null).await;
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let png = decode_base64(encoded.as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn sign_in(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/")).await;
        self.until("the sign-in form", "return !document.getElementById('signin').hidden").await;
        self.type_into("#token", token).await;
        self.click("#signin-form button[type=submit]").await;
        self.until("the app", "return !document.getElementById('app').hidden").await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session (Chromium with it) before chromedriver: a plain request,
        // as nothing can be awaited here.
        use std::io::{Read, Write};
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let request = format!("DELETE {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", self.path);
            let _ = stream.write_all(request.as_bytes());
            let _ = stream.read_to_end(&mut Vec::new());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut bits = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            bits |= u32::from(value(*c)) << (18 - 6 * i);
        }
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// The reasoning block of the page's `index`th turn: phase, title, the latest
/// steps, every step's seq and whether it is expanded.
const BLOCK: &str = "const turn = document.querySelectorAll('.turn')[arguments[0]]; if (!turn) return null;
  const block = turn.querySelector('.block');
  return { phase: block.dataset.phase, title: block.querySelector('.block-title').textContent,
    latest: [...block.querySelectorAll('.block-latest li')].map((li) => li.textContent),
    latest_shown: !block.querySelector('.block-latest').hidden,
    steps: [...block.querySelectorAll('.block-steps li')].map((li) => Number(li.dataset.seq)),
    expanded: block.querySelector('.block-head').getAttribute('aria-expanded'),
    steps_shown: !block.querySelector('.block-steps').hidden,
    answer: turn.querySelector('.answer').textContent };";

async fn block(browser: &Browser, index: usize) -> Value {
    browser.run(BLOCK, json!([index])).await
}

async fn wait_phase(browser: &Browser, index: usize, phase: &str) -> Value {
    let what = format!("turn {index} to be {phase}");
    eventually(WAIT, &what, || async {
        let block = block(browser, index).await;
        (block["phase"] == phase).then_some(block)
    })
    .await
}

/// The block the server ends a finished run's stream with.
async fn final_block(server: &TestServer, token: &str, run_id: &str) -> Value {
    let frames = read_stream(server, token, &format!("/v1/runs/{run_id}/events?view=block"), None).await;
    frames.into_iter().rev().find(|(name, _)| name == "block").unwrap().1
}

/// A model whose second turn reasons, then waits for `hold.resume` before it
/// answers, and for `hold.finish` before the answer ends.
fn held_model(hold: &Arc<StreamHold>) -> Step {
    let deltas = vec![
        ModelDelta::Reasoning("The echo came back; now I compose the answer.".to_owned()),
        ModelDelta::Text("All ".to_owned()),
        ModelDelta::Text("done.".to_owned()),
    ];
    let reply = ModelReply { content: "All done.".to_owned(), ..ModelReply::default() };
    Step::Streamed { deltas, reply, hold: Some(hold.clone()) }
}

async fn send_message(browser: &Browser, text: &str) {
    browser.type_into("#message", text).await;
    browser.click("#composer button[type=submit]").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_goes_idle_reasoning_collapsed_complete_in_a_browser() {
    let Some(chromedriver) = chromedriver() else { return };
    let hold = Arc::new(StreamHold::default());
    let model = ScriptedModel::queue(vec![
        calls(&[("echo", json!({"text": "parcel"}))]),
        held_model(&hold),
        text("Second answer."),
    ]);
    let server = start_with(Arc::new(model), RuntimeConfig::default(), ServerConfig::default()).await;
    let browser = Browser::start(&chromedriver, 1100, 800).await;
    browser.sign_in(&server.url(""), ALPHA).await;

    send_message(&browser, "Am I expecting a parcel?").await;
    let reasoning = wait_phase(&browser, 0, "reasoning").await;
    assert!(reasoning["title"].as_str().unwrap().starts_with("Reasoning · "), "{reasoning}");
    assert!(reasoning["latest_shown"].as_bool().unwrap());
    // The run waits before its answer, its model's reasoning the latest step.
    let latest = browser
        .until("the model's reasoning as the latest step", "const l = [...document.querySelectorAll('.turn .block-latest li')].map((li) => li.textContent); return l.length == 2 && l[1].startsWith('Thinking:') ? l : null;")
        .await;
    let server_block = browser.run("return document.querySelector('.turn').turn.block;", json!([])).await;
    let headlines: Vec<&Value> =
        server_block["steps"].as_array().unwrap().iter().filter(|step| step["headline"] == true).collect();
    let expected: Vec<&Value> = headlines[headlines.len() - 2..].iter().map(|step| &step["summary"]).collect();
    assert_eq!(latest.as_array().unwrap().iter().collect::<Vec<_>>(), expected, "the last two steps are the latest");

    // A second message waits for the first: its block is idle.
    send_message(&browser, "And when?").await;
    let idle = wait_phase(&browser, 1, "idle").await;
    assert_eq!(idle["title"], "Waiting to start");
    browser.screenshot("block-1-idle").await;

    // The timer advances while the block reasons.
    let seconds = |block: &Value| -> u64 {
        block["title"].as_str().unwrap().trim_start_matches("Reasoning · ").trim_end_matches('s').parse().unwrap()
    };
    let first = seconds(&block(&browser, 0).await);
    eventually(WAIT, "the timer to advance", || async { seconds(&block(&browser, 0).await) > first }).await;
    browser.screenshot("block-2-reasoning").await;

    // The first answer delta collapses it.
    hold.resume.add_permits(1);
    let collapsed = wait_phase(&browser, 0, "collapsed").await;
    assert!(collapsed["title"].as_str().unwrap().starts_with("Thought for "), "{collapsed}");
    assert!(!collapsed["latest_shown"].as_bool().unwrap());
    browser
        .until("the streamed answer", "return document.querySelector('.turn .answer').textContent == 'All done.'")
        .await;
    browser.screenshot("block-3-collapsed").await;

    hold.finish.add_permits(1);
    let complete = wait_phase(&browser, 0, "complete").await;
    assert_eq!(complete["answer"], "All done.");
    assert_eq!(complete["expanded"], "false");
    browser.click(".turn .block-head").await;
    let expanded = block(&browser, 0).await;
    assert_eq!(expanded["expanded"], "true");
    assert!(expanded["steps_shown"].as_bool().unwrap());
    let run_id = browser.run("return document.querySelector('.turn').dataset.runId;", json!([])).await;
    let whole = final_block(&server, ALPHA, run_id.as_str().unwrap()).await;
    let seqs: Vec<u64> = whole["steps"].as_array().unwrap().iter().map(|step| step["seq"].as_u64().unwrap()).collect();
    assert!(seqs.len() >= 4, "{whole}");
    assert_eq!(expanded["steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(), seqs);
    let tool_text =
        browser.run("return document.querySelector('.turn .block-steps li.tool').textContent;", json!([])).await;
    assert!(tool_text.as_str().unwrap().contains("completed"), "{tool_text}");
    browser.screenshot("block-4-complete-expanded").await;

    // The queued message ran after it.
    let second = wait_phase(&browser, 1, "complete").await;
    assert_eq!(second["answer"], "Second answer.");

    // At a phone's width, a tablet's and a desktop's: nothing wider than the
    // window, the block and the composer on screen.
    for width in [390, 768, 1280] {
        browser.command(Method::POST, "/window/rect", json!({"width": width, "height": 900})).await;
        let layout = browser
            .run(
                "const r = (s) => document.querySelector(s).getBoundingClientRect();
                 return { overflow: document.documentElement.scrollWidth - window.innerWidth,
                   block: r('.turn .block').right <= window.innerWidth, composer: r('#composer button').right <= window.innerWidth };",
                json!([]),
            )
            .await;
        assert!(layout["overflow"].as_i64().unwrap() <= 0, "width {width}: {layout}");
        assert_eq!(layout["block"], true, "width {width}: {layout}");
        assert_eq!(layout["composer"], true, "width {width}: {layout}");
        browser.screenshot(&format!("page-{width}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_are_approved_and_rejected_by_clicking() {
    let Some(chromedriver) = chromedriver() else { return };
    let model = ScriptedModel::queue(vec![
        calls(&[("pay", json!({"entry": "invoice 17"}))]),
        text("Paid invoice 17."),
        calls(&[("pay", json!({"entry": "invoice 18"}))]),
        text("I did not do it."),
    ]);
    let pay = GatedTool::default();
    let ledger = pay.ledger.lines.clone();
    let server = start_gated(Arc::new(model), RuntimeConfig::default(), ServerConfig::default(), pay).await;
    let browser = Browser::start(&chromedriver, 1100, 800).await;
    browser.sign_in(&server.url(""), ALPHA).await;

    send_message(&browser, "Pay invoice 17").await;
    browser.until("the approval request", "return document.querySelector('.turn .ask.approval button.approve')").await;
    // The run has parked (its `waiting_input` came): buttons, and no answer box.
    browser
        .until(
            "the run to park",
            "return document.querySelector('.turn').turn.events.some((e) => e.kind == 'waiting_input');",
        )
        .await;
    let boxes = browser.run("return document.querySelectorAll('.turn .ask.question').length;", json!([])).await;
    assert_eq!(boxes, 0, "an approval is decided with its buttons, not a text box");
    let parked = block(&browser, 0).await;
    assert!(parked["title"].as_str().unwrap().starts_with("Waiting for you"), "{parked}");
    browser.click(".turn .ask.approval button.approve").await;
    let first = wait_phase(&browser, 0, "complete").await;
    assert_eq!(first["answer"], "Paid invoice 17.");
    assert_eq!(ledger.lock().unwrap().iter().map(|(_, entry)| entry.clone()).collect::<Vec<_>>(), ["invoice 17"]);

    send_message(&browser, "Pay invoice 18").await;
    browser
        .until(
            "the second approval request",
            "return document.querySelectorAll('.turn')[1]?.querySelector('.ask.approval button.reject')",
        )
        .await;
    browser.type_into(".turn:nth-child(2) .ask.approval input", "not this month").await;
    browser.click(".turn:nth-child(2) .ask.approval button.reject").await;
    let second = wait_phase(&browser, 1, "complete").await;
    assert_eq!(second["answer"], "I did not do it.");
    assert_eq!(ledger.lock().unwrap().len(), 1, "the rejected payment was not made");
    let runs = server.send(Method::GET, "/v1/runs?limit=10", Some(ALPHA), None).await;
    let rejected = runs.body["runs"].as_array().unwrap().iter().find(|run| run["input"] == "Pay invoice 18").unwrap();
    let frames =
        read_stream(&server, ALPHA, &format!("/v1/runs/{}/events", rejected["run_id"].as_str().unwrap()), None).await;
    let decided = frames.iter().find(|(name, _)| name == "approval_decided").unwrap();
    assert_eq!(decided.1["approved"], false);
    assert_eq!(decided.1["reason"], "not this month");
    let shown = browser.run("return document.querySelectorAll('.ask').length;", json!([])).await;
    assert_eq!(shown, 0, "no approval is left on the page");
}

/// A TCP proxy to `target` whose open connections the test can cut; counts the
/// event streams opened through it.
struct Proxy {
    address: SocketAddr,
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    streams: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let cut = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let streams = Arc::new(AtomicUsize::new(0));
        let (cuts, counted) = (cut.clone(), streams.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let token = cuts.lock().unwrap().clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = async {
                        let mut buffer = vec![0u8; 16 * 1024];
                        while let Ok(read) = tokio::io::AsyncReadExt::read(&mut client_read, &mut buffer).await {
                            if read == 0 {
                                break;
                            }
                            if buffer[..read].windows(12).any(|w| w == b"/events?view") {
                                counted.fetch_add(1, Ordering::SeqCst);
                            }
                            if tokio::io::AsyncWriteExt::write_all(&mut server_write, &buffer[..read]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
                    tokio::select! {
                        () = token.cancelled() => {}
                        () = upstream => {}
                        _ = downstream => {}
                    }
                });
            }
        });
        Self { address, cut, streams }
    }

    /// Drops every connection open now.
    fn cut_all(&self) {
        let mut token = self.cut.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_run_resumes_with_no_step_missing_or_doubled() {
    let Some(chromedriver) = chromedriver() else { return };
    let hold = Arc::new(StreamHold::default());
    let model = ScriptedModel::queue(vec![calls(&[("echo", json!({"text": "parcel"}))]), held_model(&hold)]);
    let server = start_with(Arc::new(model), RuntimeConfig::default(), ServerConfig::default()).await;
    let target: SocketAddr = server.url("").trim_start_matches("http://").parse().unwrap();
    let proxy = Proxy::start(target).await;
    let browser = Browser::start(&chromedriver, 1100, 800).await;
    browser.sign_in(&format!("http://{}", proxy.address), ALPHA).await;

    send_message(&browser, "Am I expecting a parcel?").await;
    browser
        .until("the model's reasoning", "const l = [...document.querySelectorAll('.turn .block-latest li')]; return l.length == 2 && l[1].textContent.startsWith('Thinking:');")
        .await;
    let opened = proxy.streams.load(Ordering::SeqCst);
    proxy.cut_all();
    eventually(WAIT, "the page to open its stream again", || async { proxy.streams.load(Ordering::SeqCst) > opened })
        .await;
    // The answer starts and ends on the new connection.
    hold.resume.add_permits(1);
    hold.finish.add_permits(1);
    let complete = wait_phase(&browser, 0, "complete").await;
    assert_eq!(complete["answer"], "All done.");
    browser.click(".turn .block-head").await;
    let shown = block(&browser, 0).await;
    let run_id = browser.run("return document.querySelector('.turn').dataset.runId;", json!([])).await;
    let whole = final_block(&server, ALPHA, run_id.as_str().unwrap()).await;
    let seqs: Vec<u64> = whole["steps"].as_array().unwrap().iter().map(|step| step["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        shown["steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(),
        seqs,
        "every step once, in order"
    );
    let events = browser.run("return document.querySelector('.turn').turn.events.map((e) => e.seq);", json!([])).await;
    let events: Vec<u64> = events.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=*events.last().unwrap()).collect();
    assert_eq!(events, expected, "each event once, none missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_run_is_not_reachable_from_the_page() {
    let Some(chromedriver) = chromedriver() else { return };
    let model = ScriptedModel::queue(vec![text("Alpha's secret answer.")]);
    let server = start_with(Arc::new(model), RuntimeConfig::default(), ServerConfig::default()).await;
    let run = server.send(Method::POST, "/v1/runs", Some(ALPHA), Some(json!({"input": "alpha's question"}))).await;
    let id = run.body["run_id"].as_str().unwrap().to_owned();
    let browser = Browser::start(&chromedriver, 1100, 800).await;
    browser.sign_in(&server.url(""), BETA).await;
    browser.until("the runs list", "return document.getElementById('runs').dataset.loaded == 'true';").await;
    let listed = browser.run("return document.getElementById('runs').textContent;", json!([])).await;
    assert!(!listed.as_str().unwrap().contains("alpha's question"), "{listed}");
    browser.goto(&server.url(&format!("/#/runs/{id}"))).await;
    let error = browser
        .until(
            "the not-found message",
            "const e = document.getElementById('view-error').textContent; return e || null;",
        )
        .await;
    assert!(error.as_str().unwrap().starts_with("Not found"), "{error}");
    let page = browser.run("return document.getElementById('view').textContent;", json!([])).await;
    assert!(!page.as_str().unwrap().contains("secret"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_answered_inline_and_a_run_is_cancelled_by_clicking() {
    let Some(chromedriver) = chromedriver() else { return };
    let model = Arc::new(ScriptedModel::queue(vec![
        calls(&[("ask_user", json!({"question": "Which shop, Acme or Bolt?"}))]),
        text("Acme's parcel arrives today."),
        Step::Hang,
    ]));
    let server = start_with(model.clone(), RuntimeConfig::default(), ServerConfig::default()).await;
    let browser = Browser::start(&chromedriver, 1100, 800).await;
    browser.sign_in(&server.url(""), ALPHA).await;

    send_message(&browser, "When does my parcel come?").await;
    let question = browser
        .until("the question", "const q = document.querySelector('.turn .ask.question'); return q && q.textContent;")
        .await;
    assert!(question.as_str().unwrap().contains("Which shop, Acme or Bolt?"), "{question}");
    let parked = browser.run("return document.querySelector('.turn').turn.block;", json!([])).await;
    assert_eq!(parked["waiting"], true, "the timer stands while the run waits for the user: {parked}");
    assert!(parked["reasoning_since"].is_null(), "{parked}");
    browser.type_into(".turn .ask.question input", "Acme").await;
    browser.click(".turn .ask.question button[type=submit]").await;
    let answered = wait_phase(&browser, 0, "complete").await;
    assert_eq!(answered["answer"], "Acme's parcel arrives today.");
    let prompt = &model.requests()[1].messages;
    assert!(prompt.iter().any(|message| message.content.contains("Acme")), "the model saw the answer");

    // The next message's model call never returns: cancel it.
    send_message(&browser, "And the other one?").await;
    wait_phase(&browser, 1, "reasoning").await;
    browser.click(".turn:nth-child(2) button.cancel").await;
    let cancelled = wait_phase(&browser, 1, "complete").await;
    let status = browser
        .run("return document.querySelectorAll('.turn')[1].querySelector('.run-status').textContent;", json!([]))
        .await;
    assert!(status.as_str().unwrap().starts_with("cancelled"), "{status} {cancelled}");
}
