//! Threads over HTTP: a follow-up sees the earlier exchange, each
//! `multitask_strategy` with two messages sent close together, the thread's
//! event stream and its resumption, idempotency keys, metadata filters, and
//! tenant isolation on every thread route.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use troupe::cli::client::SseParser;
use troupe::server::ServerConfig;
use troupe_actors::config::RuntimeConfig;
use troupe_actors::llm::Role;
use troupe_actors::testing::{ScriptedModel, Step, eventually, text};

use crate::server::{ALPHA, Answer, BETA, TestServer, start_with};

async fn server(model: &Arc<ScriptedModel>) -> TestServer {
    start_with(model.clone(), RuntimeConfig::default(), ServerConfig::default()).await
}

impl TestServer {
    async fn new_thread(&self, token: &str, metadata: Value) -> String {
        let answer = self.send(Method::POST, "/v1/threads", Some(token), Some(json!({"metadata": metadata}))).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body["thread_id"].as_str().unwrap().to_owned()
    }

    async fn message(&self, thread: &str, input: &str, strategy: &str) -> Answer {
        let body = json!({"input": input, "multitask_strategy": strategy});
        self.send(Method::POST, &format!("/v1/threads/{thread}/runs"), Some(ALPHA), Some(body)).await
    }

    pub(crate) async fn run(&self, id: &str) -> Value {
        self.send(Method::GET, &format!("/v1/runs/{id}"), Some(ALPHA), None).await.body
    }

    /// Waits until the run has ended; its record.
    pub(crate) async fn ended(&self, id: &str) -> Value {
        let what = format!("run {id} to end");
        eventually(Duration::from_secs(30), &what, || async {
            let run = self.run(id).await;
            let status = run["status"].as_str().unwrap_or_default().to_owned();
            ["succeeded", "failed", "cancelled"].contains(&status.as_str()).then_some(run)
        })
        .await
    }

    /// The thread's conversation as (role, content, interrupted).
    async fn conversation(&self, thread: &str) -> Vec<(String, String, bool)> {
        let detail = self.send(Method::GET, &format!("/v1/threads/{thread}"), Some(ALPHA), None).await;
        assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
        detail.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let text = |key: &str| m[key].as_str().unwrap().to_owned();
                (text("role"), text("content"), m["interrupted"].as_bool().unwrap_or(false))
            })
            .collect()
    }
}

fn said(role: &str, content: &str) -> (String, String, bool) {
    (role.to_owned(), content.to_owned(), false)
}

/// The (role, content) pairs of the model's `index`th request after its system prompt.
fn prompt(model: &ScriptedModel, index: usize) -> Vec<(Role, String)> {
    model.requests()[index].messages.iter().skip(1).map(|m| (m.role, m.content.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_sees_the_earlier_exchange_and_the_thread_shows_both_runs() {
    let model = Arc::new(ScriptedModel::queue(vec![
        text("Two parcels arrive today, from DHL and UPS."),
        text("The DHL parcel comes before noon."),
    ]));
    let server = server(&model).await;
    let thread = server.new_thread(ALPHA, json!({"user": "ada"})).await;
    let first = server.message(&thread, "Am I expecting deliveries today?", "reject").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(first.body["thread_id"], json!(thread));
    let first = first.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(server.ended(&first).await["status"], "succeeded");
    let second = server.message(&thread, "Which one comes first?", "reject").await;
    let second = second.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(server.ended(&second).await["final_output"], "The DHL parcel comes before noon.");

    assert_eq!(
        prompt(&model, 1),
        vec![
            (Role::User, "Am I expecting deliveries today?".to_owned()),
            (Role::Assistant, "Two parcels arrive today, from DHL and UPS.".to_owned()),
            (Role::User, "Which one comes first?".to_owned()),
        ],
        "the follow-up's prompt holds the earlier exchange"
    );
    assert_eq!(
        server.conversation(&thread).await,
        vec![
            said("user", "Am I expecting deliveries today?"),
            said("assistant", "Two parcels arrive today, from DHL and UPS."),
            said("user", "Which one comes first?"),
            said("assistant", "The DHL parcel comes before noon."),
        ]
    );
    let detail = server.send(Method::GET, &format!("/v1/threads/{thread}"), Some(ALPHA), None).await.body;
    assert_eq!((detail["status"].as_str(), detail["last_run"]["run_id"].as_str()), (Some("idle"), Some(&*second)));
    assert_eq!(detail["metadata"], json!({"user": "ada"}));

    let runs = server.send(Method::GET, &format!("/v1/threads/{thread}/runs"), Some(ALPHA), None).await.body;
    let ids: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|run| run["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![second.as_str(), first.as_str()], "newest first");
    let filtered = server.send(Method::GET, &format!("/v1/runs?thread_id={thread}"), Some(ALPHA), None).await.body;
    assert_eq!(filtered["runs"].as_array().unwrap().len(), 2);

    let patched = server
        .send(
            Method::PATCH,
            &format!("/v1/threads/{thread}"),
            Some(ALPHA),
            Some(json!({"metadata": {"user": null, "topic": "parcels"}})),
        )
        .await;
    assert_eq!(patched.body["metadata"], json!({"topic": "parcels"}), "merged; null removes a key");
    let listed = server.send(Method::GET, "/v1/threads", Some(ALPHA), None).await.body;
    assert_eq!(listed["threads"][0]["thread_id"], json!(thread));
    assert_eq!(listed["has_more"], false);

    let deleted = server.send(Method::DELETE, &format!("/v1/threads/{thread}"), Some(ALPHA), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        server.send(Method::GET, &format!("/v1/runs/{first}"), Some(ALPHA), None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.send(Method::GET, &format!("/v1/threads/{thread}"), Some(ALPHA), None).await.status,
        StatusCode::NOT_FOUND
    );
}

/// Two messages sent close together, the second with `strategy`, while the first
/// run waits on its model call. Returns the server, thread and both run ids (the
/// second `None` if refused) and the second message's answer.
async fn double_text(strategy: &str) -> (TestServer, Arc<ScriptedModel>, String, String, Answer) {
    let model = Arc::new(ScriptedModel::queue(vec![Step::Hang, text("Here is the answer to the second message.")]));
    let server = server(&model).await;
    let thread = server.new_thread(ALPHA, json!({})).await;
    let first = server.message(&thread, "First message", "reject").await;
    let first = first.body["run_id"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(10), "the first run to ask the model", || async { model.request_count() >= 1 })
        .await;
    let second = server.message(&thread, "Second message", strategy).await;
    (server, model, thread, first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_answers_409_with_the_active_run() {
    let (server, _model, thread, first, second) = double_text("reject").await;
    assert_eq!(second.status, StatusCode::CONFLICT, "{}", second.body);
    assert_eq!(second.code(), "thread_busy");
    assert_eq!(second.body["error"]["active_run_id"], json!(first));
    assert_eq!(server.conversation(&thread).await, vec![said("user", "First message")], "nothing was added");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_runs_the_second_message_after_the_first_ends() {
    let (server, model, thread, first, second) = double_text("enqueue").await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.body);
    assert_eq!(second.body["status"], "queued");
    let second = second.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(model.request_count(), 1, "the second run waits");
    server.send(Method::POST, &format!("/v1/runs/{first}/cancel"), Some(ALPHA), None).await;
    assert_eq!(server.ended(&second).await["status"], "succeeded");
    assert_eq!(
        server.conversation(&thread).await,
        vec![
            said("user", "First message"),
            said("assistant", "(cancelled before answering)"),
            said("user", "Second message"),
            said("assistant", "Here is the answer to the second message."),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_cancels_the_first_run_which_stays_marked_in_the_thread() {
    let (server, model, thread, first, second) = double_text("interrupt").await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.body);
    let second = second.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(server.ended(&first).await["status"], "cancelled");
    assert_eq!(server.ended(&second).await["status"], "succeeded");
    let conversation = server.conversation(&thread).await;
    assert_eq!(conversation.len(), 4);
    assert!(conversation[1].2, "the first answer is marked interrupted: {conversation:?}");
    assert_eq!(prompt(&model, 1).first(), Some(&(Role::User, "First message".to_owned())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_cancels_the_first_run_and_removes_it_from_the_thread() {
    let (server, model, thread, first, second) = double_text("rollback").await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.body);
    let second = second.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(server.ended(&first).await["status"], "cancelled");
    assert_eq!(server.ended(&second).await["status"], "succeeded");
    assert_eq!(
        server.conversation(&thread).await,
        vec![said("user", "Second message"), said("assistant", "Here is the answer to the second message.")]
    );
    assert_eq!(prompt(&model, 1), vec![(Role::User, "Second message".to_owned())], "the model never sees it");
}

/// `(id, kind, data)` of every frame of a thread stream until `run_ends` runs ended.
async fn read_thread_events(
    server: &TestServer,
    thread: &str,
    last: Option<&str>,
    run_ends: usize,
) -> Vec<(String, String, Value)> {
    let response = server.open_stream(ALPHA, &format!("/v1/threads/{thread}/events"), last).await;
    let mut body = response.bytes_stream();
    let mut parser = SseParser::default();
    let mut frames = Vec::new();
    let read = async {
        while frames.iter().filter(|(_, kind, _): &&(String, String, Value)| kind == "run_end").count() < run_ends {
            let chunk = body.next().await.expect("the stream ended").unwrap();
            for frame in parser.push(&chunk) {
                frames.push((frame.id.unwrap(), frame.event.unwrap(), serde_json::from_str(&frame.data).unwrap()));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the thread's runs did not end");
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_stream_follows_every_run_and_resumes_after_last_event_id() {
    let model = Arc::new(ScriptedModel::queue(vec![text("First answer."), text("Second answer.")]));
    let server = Arc::new(server(&model).await);
    let thread = server.new_thread(ALPHA, json!({})).await;
    let reader = {
        let (server, thread) = (server.clone(), thread.clone());
        tokio::spawn(async move { read_thread_events(&server, &thread, None, 2).await })
    };
    let first = server.message(&thread, "one", "enqueue").await.body["run_id"].as_str().unwrap().to_owned();
    let second = server.message(&thread, "two", "enqueue").await.body["run_id"].as_str().unwrap().to_owned();
    let frames = reader.await.unwrap();

    // Every event of the first run, then every event of the second, each run's
    // seqs gap-free from 1, ids `RUN_ID:SEQ`.
    let runs: Vec<&str> = frames.iter().map(|(_, _, data)| data["run_id"].as_str().unwrap()).collect();
    let switch = runs.iter().position(|run| *run == second).unwrap();
    assert!(runs[..switch].iter().all(|run| *run == first) && runs[switch..].iter().all(|run| *run == second));
    for (index, (id, kind, data)) in frames.iter().enumerate() {
        let seq = data["seq"].as_u64().unwrap();
        assert_eq!(*id, format!("{}:{seq}", data["run_id"].as_str().unwrap()));
        let expected = if index < switch { index + 1 } else { index - switch + 1 };
        assert_eq!(seq, expected as u64, "{kind}");
    }
    assert_eq!(frames[switch - 1].1, "run_end");

    // Resumed from an event in the middle of the first run: exactly the rest.
    let middle = &frames[2].0;
    let rest = read_thread_events(&server, &thread, Some(middle), 2).await;
    assert_eq!(
        rest.iter().map(|frame| &frame.0).collect::<Vec<_>>(),
        frames[3..].iter().map(|frame| &frame.0).collect::<Vec<_>>()
    );
    let bad = server
        .http
        .get(server.url(&format!("/v1/threads/{thread}/events")))
        .bearer_auth(ALPHA)
        .header("Last-Event-ID", "12")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_creates_one_run_and_one_thread() {
    let model = Arc::new(ScriptedModel::queue(vec![Step::Hang]));
    let server = server(&model).await;
    let post = |path: &'static str, key: &'static str, body: Value| {
        let request = server.http.post(server.url(path)).bearer_auth(ALPHA).header("Idempotency-Key", key).json(&body);
        async move {
            let response = request.send().await.unwrap();
            let replayed = response.headers().get("idempotent-replayed").is_some();
            (response.status(), replayed, response.json::<Value>().await.unwrap())
        }
    };
    let body = json!({"input": "Send the weekly report", "metadata": {"source": "cron"}});
    let (status, replayed, first) = post("/v1/runs", "report-2026-48", body.clone()).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let (status, replayed, again) = post("/v1/runs", "report-2026-48", body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again["run_id"], first["run_id"]);
    let (status, _, refused) = post("/v1/runs", "report-2026-48", json!({"input": "Something else"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused["error"]["code"], "idempotency_key_reused");
    let listed = server.send(Method::GET, "/v1/runs?metadata.source=cron", Some(ALPHA), None).await.body;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1, "one run in all: {listed}");
    assert_eq!(listed["runs"][0]["metadata"], json!({"source": "cron"}));
    let none = server.send(Method::GET, "/v1/runs?metadata.source=manual", Some(ALPHA), None).await.body;
    assert_eq!(none["runs"], json!([]));
    let bad = server.send(Method::GET, "/v1/runs?metadata.a$b=1", Some(ALPHA), None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    let (_, _, thread) = post("/v1/threads", "chat-1", json!({"metadata": {"user": "ada"}})).await;
    let (status, replayed, same) = post("/v1/threads", "chat-1", json!({"metadata": {"user": "ada"}})).await;
    assert_eq!((status, replayed, &same["thread_id"]), (StatusCode::CREATED, true, &thread["thread_id"]));
    let threads = server.send(Method::GET, "/v1/threads", Some(ALPHA), None).await.body;
    assert_eq!(threads["threads"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_gets_404_on_every_thread_route_and_changes_nothing() {
    let model = Arc::new(ScriptedModel::queue(vec![Step::Hang]));
    let server = server(&model).await;
    let thread = server.new_thread(ALPHA, json!({"secret": "private"})).await;
    let run = server.message(&thread, "private work", "reject").await.body["run_id"].as_str().unwrap().to_owned();
    let routes = [
        (Method::GET, format!("/v1/threads/{thread}"), None),
        (Method::PATCH, format!("/v1/threads/{thread}"), Some(json!({"metadata": {"secret": null}}))),
        (
            Method::POST,
            format!("/v1/threads/{thread}/runs"),
            Some(json!({"input": "hijack", "multitask_strategy": "interrupt"})),
        ),
        (Method::GET, format!("/v1/threads/{thread}/runs"), None),
        (Method::GET, format!("/v1/threads/{thread}/events"), None),
        (Method::DELETE, format!("/v1/threads/{thread}"), None),
    ];
    for (method, path, body) in &routes {
        let answer = server.send(method.clone(), path, Some(BETA), body.clone()).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}: {}", answer.body);
        assert!(!answer.body.to_string().contains("private"), "no data leaks: {}", answer.body);
        let missing = path.replace(&thread, "01a20750-0000-7000-8000-000000000000");
        let unknown = server.send(method.clone(), &missing, Some(BETA), body.clone()).await;
        assert_eq!((unknown.status, unknown.body.clone()), (answer.status, answer.body.clone()));
        assert_eq!(server.send(method.clone(), path, None, body.clone()).await.status, StatusCode::UNAUTHORIZED);
    }
    let listed = server.send(Method::GET, "/v1/threads", Some(BETA), None).await.body;
    assert_eq!(listed["threads"], json!([]));
    let by_thread = server.send(Method::GET, &format!("/v1/runs?thread_id={thread}"), Some(BETA), None).await.body;
    assert_eq!(by_thread["runs"], json!([]));
    assert_eq!(server.run(&run).await["status"], "running", "beta's interrupt and delete changed nothing");
    let detail = server.send(Method::GET, &format!("/v1/threads/{thread}"), Some(ALPHA), None).await.body;
    assert_eq!(detail["metadata"], json!({"secret": "private"}));
}

/// `troupe chat` as a person uses it: two messages typed on stdin (the second a
/// follow-up), an approval answered inline, the answers on stdout, and the
/// conversation on the daemon's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_chat_holds_a_conversation_and_answers_an_approval_inline() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use troupe_actors::testing::calls;

    let model = Arc::new(ScriptedModel::queue(vec![
        text("You have one invoice from ACME, for 120 EUR."),
        calls(&[("pay", json!({"entry": "ACME 120 EUR"}))]),
        text("I paid the ACME invoice of 120 EUR."),
    ]));
    let server = server(&model).await;
    let mut chat = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["chat", "--url", &server.url(""), "--token", ALPHA])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Each line is read when the chat asks for it: the messages, then the decision.
    let mut stdin = chat.stdin.take().unwrap();
    stdin.write_all(b"What invoices do I have?\nPay it please\ny\n").unwrap();
    drop(stdin);
    let output = tokio::task::spawn_blocking(move || chat.wait_with_output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("You have one invoice from ACME, for 120 EUR."), "{stdout}");
    assert!(stdout.contains("approve pay"), "the approval is asked inline: {stdout}");
    assert!(stdout.contains("I paid the ACME invoice of 120 EUR."), "{stdout}");

    let listed = server.send(Method::GET, "/v1/threads", Some(ALPHA), None).await.body;
    let thread = listed["threads"][0]["thread_id"].as_str().unwrap().to_owned();
    assert!(stdout.contains(&format!("troupe chat --thread {thread}")), "{stdout}");
    assert_eq!(
        server.conversation(&thread).await,
        vec![
            said("user", "What invoices do I have?"),
            said("assistant", "You have one invoice from ACME, for 120 EUR."),
            said("user", "Pay it please"),
            said("assistant", "I paid the ACME invoice of 120 EUR."),
        ]
    );
    assert_eq!(
        prompt(&model, 1)[..2],
        [
            (Role::User, "What invoices do I have?".to_owned()),
            (Role::Assistant, "You have one invoice from ACME, for 120 EUR.".to_owned()),
        ]
    );
}
