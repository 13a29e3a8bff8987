//! The real binary killed with SIGKILL at seeded random moments while it runs
//! agent runs that write a journal (a side effect) and measure text (idempotent),
//! then restarted: no run is lost, every run ends, no journal entry is written
//! twice, and every run's events are gap-free. The triage workflow, killed the
//! same way, resumes at its next step and sends no reply twice.
//!
//! `TROUPE_CRASH_SEED` replays a schedule; `TROUPE_CRASH_KILLS` sets the kills (30).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use troupe::store::SqlStore;
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream};
use troupe_actors::protocol::{CallStatus, EventKind, RunStatus};
use troupe_actors::store::{RunQuery, RunStore};
use troupe_actors::testing::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_survive_repeated_kill_9_without_loss_or_repeated_side_effects() {
    let seed: u64 = std::env::var("TROUPE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261123);
    let kills: usize = std::env::var("TROUPE_CRASH_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    eprintln!("crash schedule: seed {seed}, {kills} kills (TROUPE_CRASH_SEED replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);

    let sandbox = Sandbox::new(&format!("crash-{seed}"), r#"["journal", "text_stats"]"#);
    let (dir, journal, store_url) = (&sandbox.dir, &sandbox.journal, &sandbox.store_url);

    // Turn 1: a journal entry (side effect) and a measurement (idempotent); turn 2:
    // the answer. Chunks are spaced so kills land inside model calls too.
    let mut act = tool_call_stream(
        &[("j", "journal", r#"{"text": "paid invoice"}"#), ("m", "text_stats", r#"{"text": "a b b"}"#)],
        4,
    );
    let mut answer = text_stream("All done.", 3);
    for reply in [&mut act, &mut answer] {
        if let FakeReply::Stream { delay_ms, .. } = reply {
            *delay_ms = 15;
        }
    }
    let server = FakeOpenAi::start(Vec::new(), Some(FakeReply::PerTurn { replies: vec![act, answer] })).await.unwrap();

    let troupe = |args: &[&str]| sandbox.troupe(&server, args);

    for round in 0..kills {
        let request = format!("request {round}");
        let mut child = troupe(&["demo", "--agent", "crash", &request]).spawn().unwrap();
        // The kill comes at a random moment after the run exists: its first model
        // request has arrived.
        eventually(Duration::from_secs(60), &format!("round {round}: the run never reached the model"), || async {
            server.requests().iter().any(|r| r.body.to_string().contains(&request))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // One last start without a kill drains every unfinished run.
    finish(troupe(&["resume"])).await;

    let store = SqlStore::connect(store_url).await.unwrap();
    let runs = store
        .list_runs(RunQuery { tenant: None, status: None, limit: 10_000, after: None, ..RunQuery::default() })
        .await
        .unwrap();
    assert_eq!(runs.len(), kills, "every submitted run is kept");
    let lines = std::fs::read_to_string(journal).unwrap_or_default();
    let mut written: HashMap<String, usize> = HashMap::new();
    for line in lines.lines() {
        let key = line.split('\t').nth(1).unwrap().to_owned();
        *written.entry(key).or_default() += 1;
    }
    assert!(written.values().all(|count| *count == 1), "a journal entry was written twice: {written:?}");

    let mut interrupted = 0;
    for run in &runs {
        assert_eq!(run.status, RunStatus::Succeeded, "run {} ended {:?}: {:?}", run.run_id, run.status, run.reason);
        let events = store.events_after(run.run_id, 0, 100_000).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free seq in run {}", run.run_id);
        assert!(matches!(events.last().map(|e| &e.kind), Some(EventKind::RunEnd { .. })));
        let snapshot = store.load(run.run_id).await.unwrap().unwrap();
        let journal_call = snapshot.tool_executions.iter().find(|r| r.tool == "journal").expect("the journal call");
        let key = format!("{}:1:0", run.run_id);
        match journal_call.status {
            CallStatus::Completed => assert_eq!(written.get(&key), Some(&1), "a completed call wrote exactly once"),
            CallStatus::Interrupted => interrupted += 1,
            other => panic!("journal call ended {other:?}"),
        }
    }
    eprintln!(
        "{} runs, {} journal entries, {interrupted} calls cut off by a kill and reported interrupted",
        runs.len(),
        written.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_model_reply_is_not_requested_again_after_kill_9() {
    let sandbox = Sandbox::new("reply", r#"["journal"]"#);
    let (dir, journal, store_url) = (&sandbox.dir, &sandbox.journal, &sandbox.store_url);
    // Turn 1 acts; the first ask for turn 2 never gets an answer (the process is
    // killed while it waits); the second does.
    let act = tool_call_stream(&[("j", "journal", r#"{"text": "paid"}"#)], 2);
    let server = FakeOpenAi::start(vec![act, FakeReply::Hang, text_stream("Done.", 1)], None).await.unwrap();
    let troupe = |args: &[&str]| sandbox.troupe(&server, args);

    let mut child = troupe(&["demo", "--agent", "crash", "pay"]).spawn().unwrap();
    // Turn 2's request means turn 1's reply and its tool call are committed.
    eventually(Duration::from_secs(30), "turn 2 was never requested", || async { server.requests().len() >= 2 }).await;
    child.kill().unwrap();
    child.wait().unwrap();
    finish(troupe(&["resume"])).await;

    let turns_asked: Vec<usize> = server
        .requests()
        .iter()
        .map(|r| r.body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "assistant").count())
        .collect();
    assert_eq!(turns_asked, vec![0, 1, 1], "turn 1 was asked once; only the unanswered turn 2 was asked again");
    assert_eq!(std::fs::read_to_string(journal).unwrap().lines().count(), 1);
    let store = SqlStore::connect(store_url).await.unwrap();
    let runs = store
        .list_runs(RunQuery { tenant: None, status: None, limit: 10, after: None, ..RunQuery::default() })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Succeeded);
    assert_eq!(runs[0].final_output.as_deref(), Some("Done."));
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `command` to its end, within a minute, and checks it succeeded.
async fn finish(mut command: Command) {
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{command:?} failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{command:?} did not finish within a minute");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A folder with a store, a journal, a config and a `crash` agent, for one test.
pub(crate) struct Sandbox {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) journal: std::path::PathBuf,
    pub(crate) store_url: String,
}

impl Sandbox {
    /// `tools`: the agent's tool list, as TOML.
    pub(crate) fn new(name: &str, tools: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("troupe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("agents")).unwrap();
        // The runs of `troupe demo` act for the tenant `default`.
        let journal = dir.join("tenants/default/journal.log");
        let store_url = format!("sqlite://{}", dir.join("troupe.db").display());
        let template = dir.join("tenants/{tenant}/journal.log");
        let config = format!("[tools]\njournal_path = {:?}\n", template.display().to_string());
        std::fs::write(dir.join("troupe.toml"), config).unwrap();
        let agent = format!("name = \"crash\"\ninstructions = \"Record, then measure.\"\ntools = {tools}\n");
        std::fs::write(dir.join("agents").join("crash.toml"), agent).unwrap();
        Self { dir, journal, store_url }
    }

    /// The binary, on this sandbox, with `server` as its model.
    pub(crate) fn troupe(&self, server: &FakeOpenAi, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
        command
            .args(args)
            .env("TROUPE_CONFIG", self.dir.join("troupe.toml"))
            .env("TROUPE_AGENTS", self.dir.join("agents"))
            .env("TROUPE_DATABASE_URL", &self.store_url)
            .env("OPENAI_BASE_URL", server.base_url())
            .env("TROUPE_MODEL", "fake")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }
}

/// The triage workflow killed with SIGKILL at random moments, then resumed: each
/// run goes on from the step where it stopped and ends, no step's side effect is
/// made twice, and each run whose draft was made sends it once (a confident
/// meeting request goes with no human).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_triage_run_killed_between_steps_resumes_without_sending_twice() {
    let seed: u64 = std::env::var("TROUPE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261127);
    let mut rng = fastrand::Rng::with_seed(seed);
    let sandbox = Sandbox::new(&format!("triage-{seed}"), r#"["journal"]"#);
    let dir = &sandbox.dir;
    let mailbox = dir.join("tenants/{tenant}/mailbox.db");
    let config = std::fs::read_to_string(dir.join("troupe.toml")).unwrap()
        + &format!("[email]\nmailbox_path = {:?}\n", mailbox.display().to_string());
    std::fs::write(dir.join("troupe.toml"), config).unwrap();
    std::fs::write(dir.join("agents/email-triage.toml"), include_str!("../../config/agents/email-triage.toml"))
        .unwrap();

    // By the assistant messages a request holds: 0 the analysis (a separate
    // prompt), 4 the draft the model writes (after the search, analysis, entities
    // and calendar steps), then the report.
    let analysis = r#"{"classification": "meeting_request", "sentiment": "positive", "urgency": "medium", "confidence": 0.9, "summary": "A meeting.", "requested_action": "meet"}"#;
    let draft = r#"{"subject": "Re: Q3 roadmap review", "body": "Hi Priya, 14:00 works. Sam"}"#;
    let mut replies = vec![text_stream(analysis, 4)];
    replies.extend((1..4).map(|_| text_stream("Replied to Priya.", 2)));
    replies.push(tool_call_stream(&[("d", "create_draft", draft)], 3));
    replies.push(text_stream("Replied to Priya: 14:00 is free, accepted and sent.", 3));
    for reply in &mut replies {
        if let FakeReply::Stream { delay_ms, .. } = reply {
            *delay_ms = 10;
        }
    }
    let server = FakeOpenAi::start(Vec::new(), Some(FakeReply::PerTurn { replies })).await.unwrap();
    let troupe = |args: &[&str]| sandbox.troupe(&server, args);

    let rounds = 12;
    for round in 0..rounds {
        let asked = server.requests().len();
        let mut child =
            troupe(&["demo", "--agent", "email-triage", "Triage the email roadmap-meeting@brightdesk.example"])
                .spawn()
                .unwrap();
        eventually(Duration::from_secs(60), &format!("round {round}: the run never reached the model"), || async {
            server.requests().len() > asked
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
        child.kill().unwrap();
        child.wait().unwrap();
    }
    finish(troupe(&["resume"])).await;

    let store = SqlStore::connect(&sandbox.store_url).await.unwrap();
    let runs = store
        .list_runs(RunQuery { tenant: None, status: None, limit: 100, after: None, ..RunQuery::default() })
        .await
        .unwrap();
    assert_eq!(runs.len(), rounds);
    let outbox = troupe::email::Mailbox::new(troupe::email::MailboxOptions {
        path: dir.join("tenants/default/mailbox.db"),
        seed_sample: false,
        address: "sam@brightdesk.example".into(),
    });
    let sent = outbox.outbox().await.unwrap();
    let (mut sends, mut cut) = (0, 0);
    for run in &runs {
        assert_eq!(run.status, RunStatus::Succeeded, "run {} ended {:?}: {:?}", run.run_id, run.status, run.reason);
        let snapshot = store.load(run.run_id).await.unwrap().unwrap();
        let calls = |tool: &str| snapshot.tool_executions.iter().filter(|call| call.tool == tool).count();
        let send: Vec<_> = snapshot.tool_executions.iter().filter(|call| call.tool == "send_email").collect();
        let draft = snapshot.tool_executions.iter().find(|call| call.tool == "create_draft").expect("a draft call");
        assert_eq!(calls("create_draft"), 1, "the draft is never made twice");
        // A draft cut off by a kill is not made again (it may have been made): the
        // run reports without sending.
        match draft.status {
            CallStatus::Completed => assert_eq!(send.len(), 1, "one send call per run: {send:?}"),
            CallStatus::Interrupted => assert!(send.is_empty(), "{send:?}"),
            other => panic!("the draft ended {other:?}"),
        }
        if send.first().is_some_and(|call| call.status == CallStatus::Interrupted) {
            cut += 1;
        }
        let events = store.events_after(run.run_id, 0, 100_000).await.unwrap();
        let steps: Vec<u32> = events
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::StepEnd { order, status, .. } if status == "completed" => Some(*order),
                _ => None,
            })
            .collect();
        assert!(steps.windows(2).all(|pair| pair[0] < pair[1]), "steps in order, none done twice: {steps:?}");
        if send.first().is_some_and(|call| call.status == CallStatus::Completed) {
            sends += 1;
        }
    }
    // A send cut off by a kill may have queued its message before it died.
    assert!(sends <= sent.len() && sent.len() <= sends + cut, "{sends} sends completed, {cut} cut off: {sent:?}");
    let keys: std::collections::HashSet<_> = sent.iter().map(|message| message.draft_id).collect();
    assert_eq!(keys.len(), sent.len(), "no draft was sent twice");
    let _ = std::fs::remove_dir_all(dir);
}
