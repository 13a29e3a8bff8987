//! `troupe demo` runs a whole agent run on the offline model.

use std::process::Command;

use serde_json::Value;

/// A store of its own for each invocation, in the temp dir.
fn scratch_store() -> String {
    let name = format!("troupe-e2e-{}-{}", std::process::id(), fastrand::u64(..));
    format!("sqlite://{}", std::env::temp_dir().join(name).join("troupe.db").display())
}

fn troupe_on(store: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(args)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_MODEL")
        .env("TROUPE_DEFAULT_MODEL", "offline")
        .env("TROUPE_DATABASE_URL", store)
        .output()
        .expect("troupe runs")
}

fn troupe(args: &[&str]) -> std::process::Output {
    troupe_on(&scratch_store(), args)
}

#[test]
fn the_demo_streams_a_complete_reviewed_run_as_json_lines() {
    let output = troupe(&["demo", "--json", "the cat saw the dog and the bird"]);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let events: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON event"))
        .collect();

    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free seq from 1");
    let kind = |e: &Value| e["kind"].as_str().unwrap().to_owned();
    assert_eq!(kind(&events[0]), "run_started");
    assert_eq!(kind(events.last().unwrap()), "run_end");
    assert_eq!(events.last().unwrap()["status"], "succeeded");

    let turns = events.iter().filter(|e| kind(e) == "turn_start").count();
    let reviews = events.iter().filter(|e| kind(e) == "review").count();
    assert!(turns >= 2);
    assert_eq!(turns, reviews, "the reviewer ran once per turn");
    let measured =
        events.iter().find(|e| kind(e) == "tool_call_end" && e["tool"] == "text_stats").expect("the tool ran");
    assert_eq!(measured["status"], "completed");
    assert!(events.iter().any(|e| kind(e) == "plan_updated"));
    let answer = events.iter().find(|e| kind(e) == "final_output").expect("an answer");
    assert!(answer["text"].as_str().unwrap().contains("8 words"), "{answer}");
}

#[test]
fn the_human_view_shows_plan_tools_steps_and_the_answer() {
    let output = troupe(&["demo", "one two two"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in
        ["plan v1:", "✓ text_stats", "· Measuring a text of 3 words", "▸ Thought for", "3 words", "■ succeeded"]
    {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    for mechanical in ["· turn 1", "review: proceed"] {
        assert!(!text.contains(mechanical), "{mechanical:?} is the runtime's bookkeeping, not a step:\n{text}");
    }
}

#[test]
fn arithmetic_is_worked_out_by_the_calculate_step() {
    let output = troupe(&["demo", "What is 17 times 23?"]);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in ["✓ calculate", "17 × 23 = 391", "■ succeeded"] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("text_stats"), "arithmetic is not measured as a text:\n{text}");
}

#[test]
fn a_config_file_with_an_unknown_key_is_refused_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("troupe-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[runtime]\nmax_active_run = 3\n").unwrap();
    let output = troupe(&["demo", "--config", path.to_str().unwrap(), "hi"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.toml") && stderr.contains("max_active_run"), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_environment_reaches_a_real_provider_and_never_leaks_its_key() {
    use troupe::testing::fake_openai::{FakeOpenAi, FakeReply};
    let canary = "sk-CANARY-e2e-81c3";
    // The provider rejects the key and echoes it back, as a careless server might.
    let echo = FakeReply::Status { status: 401, retry_after: None, body: "{\"error\": \"bad key: {auth}\"}".into() };
    let server = FakeOpenAi::start(Vec::new(), Some(echo)).await.unwrap();
    let base_url = server.base_url();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(["demo", "--json", "hello"])
            .env("TROUPE_DATABASE_URL", scratch_store())
            .env("OPENAI_BASE_URL", base_url)
            .env("OPENAI_API_KEY", canary)
            .env("TROUPE_MODEL", "gpt-fake")
            .env("TROUPE_LOG", "debug")
            .env_remove("TROUPE_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();

    assert_eq!(output.status.code(), Some(1), "the run failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("model returned status 401"), "{stdout}");
    assert!(!stdout.contains(canary) && !stderr.contains(canary), "the key leaked:\n{stdout}\n{stderr}");
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
    assert_eq!(server.requests()[0].authorization.as_deref(), Some(format!("Bearer {canary}").as_str()));
}

#[test]
fn runs_are_kept_in_the_sqlite_store_until_gc_deletes_them() {
    let store = scratch_store();
    assert!(troupe_on(&store, &["demo", "one"]).status.success());
    assert!(troupe_on(&store, &["demo", "two"]).status.success());
    let kept = troupe_on(&store, &["gc"]);
    assert!(kept.status.success());
    assert_eq!(String::from_utf8_lossy(&kept.stdout).trim(), "deleted 0 finished run(s) older than 30 day(s)");
    let gone = troupe_on(&store, &["gc", "--older-than-days", "0"]);
    assert_eq!(String::from_utf8_lossy(&gone.stdout).trim(), "deleted 2 finished run(s) older than 0 day(s)");
}

#[test]
fn a_store_that_cannot_be_reached_is_a_clear_error_without_the_password() {
    let output = troupe_on("postgres://troupe:hunter2@127.0.0.1:1/none", &["demo", "hi"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot open the store at postgres://troupe:***@127.0.0.1:1/none"), "{stderr}");
    assert!(!stderr.contains("hunter2"));
}

#[test]
fn config_check_passes_a_valid_configuration_and_names_the_first_problem_of_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("troupe-e2e-check-{}", std::process::id()));
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, "[server]\nbind = \"127.0.0.1:9999\"\n").unwrap();
    std::fs::write(agents.join("helper.toml"), "name = \"helper\"\ninstructions = \"Help.\"\n").unwrap();
    let agents_arg = agents.to_str().unwrap();

    let output = troupe(&["config", "check", good.to_str().unwrap(), "--agents", agents_arg]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text} {}", String::from_utf8_lossy(&output.stderr));
    assert!(text.starts_with("configuration OK") && text.contains("agents   default, helper"), "{text}");

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\nrequest_timeout = -1.0\n").unwrap();
    let output = troupe(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("request_timeout"), "{output:?}");

    let output = troupe_on("sqlite::memory:", &["config", "check", good.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("in-memory SQLite database"), "{output:?}");

    std::fs::write(
        agents.join("spender.toml"),
        "name = \"spender\"\ninstructions = \"x\"\n[limits]\nmax_cost_usd = -1.0\n",
    )
    .unwrap();
    let output = troupe(&["config", "check", good.to_str().unwrap(), "--agents", agents_arg]);
    assert_eq!(output.status.code(), Some(2));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("spender.toml") && errors.contains("max_cost_usd"), "{errors}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let output = troupe(&["completions", shell]);
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        assert!(script.contains("serve") && script.contains("threads") && script.contains("reasoning"), "{shell}");
    }
    let output = troupe(&["completions", "nushell-ish"]);
    assert_eq!(output.status.code(), Some(2), "an unknown shell is refused");
}
