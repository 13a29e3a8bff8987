//! The email agents end to end, on the shipped agent files and the sample mailbox,
//! with a scripted model: the assistant answers the delivery question from the
//! right emails and entities, citing them; `send_email` waits for a human (approve:
//! one message in the outbox; reject: none); the triage agent, on the complaint,
//! sends every side effect to a human.

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{Duration, Local};
use futures::StreamExt;
use serde_json::{Value, json};
use troupe::config::parse_agent;
use troupe::email::{EmailConfig, Mailbox};
use troupe_actors::config::RuntimeConfig;
use troupe_actors::llm::{ModelClient, ModelRegistry, Role};
use troupe_actors::protocol::{Citation, EventKind, RunId, RunStatus};
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{ScriptedModel, Step, calls, text};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, RunInput, Runtime, SubmitRequest};

const SHIP_LUMEN: &str = "ship-lb55821@lumenbooks.example";
const SHIP_HUB: &str = "ship-112-4456789-1234567@marketplace.example";
const SHIP_NORTHWIND: &str = "ship-a10482@northwind-shop.example";
const ORDER_NORTHWIND: &str = "order-a10482@northwind-shop.example";
const ORDER_LUMEN: &str = "order-lb55821@lumenbooks.example";
const MEETING: &str = "roadmap-meeting@brightdesk.example";
const COMPLAINT: &str = "complaint-bd2291@mail.example";

/// A runtime with the email tools over a fresh sample mailbox, the agents of
/// `config/agents/email-*.toml`, `model` driving the runs and `analysis`
/// answering `analyze_email_content`.
struct Setup {
    runtime: Runtime,
    mailbox: Arc<Mailbox>,
    model: Arc<ScriptedModel>,
    dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn setup(script: Vec<Step>, analysis: Arc<dyn ModelClient>) -> Setup {
    let dir = std::env::temp_dir().join(format!("troupe-e2e-email-{}", uuid::Uuid::now_v7()));
    let mailbox = Arc::new(EmailConfig::default().mailbox(&dir));
    let mut tools = ToolRegistry::new();
    troupe::email::register(&mut tools, mailbox.clone(), analysis).unwrap();
    let agents = vec![
        parse_agent("email-assistant.toml", include_str!("../../config/agents/email-assistant.toml")).unwrap(),
        parse_agent("email-triage.toml", include_str!("../../config/agents/email-triage.toml")).unwrap(),
    ];
    let model = Arc::new(ScriptedModel::per_turn(script));
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools,
        hooks: Vec::new(),
        agents,
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    Setup { runtime, mailbox, model, dir }
}

impl Setup {
    async fn submit(&self, agent: &str, input: &str) -> RunId {
        self.runtime.submit(SubmitRequest::new(agent, input)).await.unwrap()
    }

    /// Every tool result the model was shown, in order, parsed.
    fn tool_results(&self) -> Vec<Value> {
        let last = self.model.requests().pop().unwrap();
        last.messages
            .iter()
            .filter(|message| message.role == Role::Tool)
            .map(|message| serde_json::from_str(&message.content).unwrap_or(Value::String(message.content.clone())))
            .collect()
    }

    /// Waits until the `count`-th call waiting for approval has parked the run;
    /// returns that call's (id, tool, reason).
    async fn parked_on(&self, run_id: RunId, count: usize) -> (String, String, String) {
        let mut events = self.runtime.subscribe(run_id, 0);
        let mut requested = Vec::new();
        while let Some(event) = events.next().await {
            match &event.unwrap().kind {
                EventKind::ApprovalRequested { call_id, tool, reason, .. } => {
                    requested.push((call_id.clone(), tool.clone(), reason.clone()));
                }
                EventKind::WaitingInput { .. } if requested.len() == count => return requested.pop().unwrap(),
                EventKind::RunEnd { status, reason } => panic!("the run ended ({status:?}, {reason:?}) unparked"),
                _ => {}
            }
        }
        panic!("the event stream ended");
    }

    async fn decide(&self, run_id: RunId, approved: bool, reason: Option<&str>) {
        let decision = RunInput::Approval { call_id: None, approved, reason: reason.map(str::to_owned) };
        self.runtime.input(run_id, decision).await.unwrap();
    }

    async fn citations(&self, run_id: RunId) -> Vec<Citation> {
        let events: Vec<_> = self.runtime.subscribe(run_id, 0).collect().await;
        events
            .into_iter()
            .find_map(|event| match &event.unwrap().kind {
                EventKind::FinalOutput { citations, .. } => Some(citations.clone()),
                _ => None,
            })
            .unwrap()
    }
}

fn ids(result: &Value) -> Vec<&str> {
    result["emails"].as_array().unwrap().iter().map(|email| email["id"].as_str().unwrap()).collect()
}

fn day(offset: i64) -> String {
    (Local::now().date_naive() + Duration::days(offset)).format("%Y-%m-%d").to_string()
}

fn dates(result: &Value) -> Vec<&str> {
    result["entities"]["dates"].as_array().unwrap().iter().map(|date| date["value"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_email_assistant_answers_the_delivery_question_from_the_right_emails() {
    let answer = "Yes, two deliveries are due today.\n\
        - Northwind Home order A-10482, UPS 1Z999AA10123456784, between 10:00 and 14:00 [3]: an ErgoFlex office \
        chair and a memory-foam seat cushion, €278.90 [4].\n\
        - Lumen Books order LB-55821, USPS 9400111899223197428490, out for delivery now [1]: The Pragmatic \
        Programmer and Designing Data-Intensive Applications, $89.48 [5].\n\
        Your USB-C hub has shipped too but arrives later [2].";
    let script = vec![
        calls(&[("search_emails", json!({"query": "shipped tracking delivery", "date_from": day(-1)}))]),
        calls(&[
            ("extract_entities", json!({"email_id": SHIP_LUMEN})),
            ("extract_entities", json!({"email_id": SHIP_HUB})),
            ("extract_entities", json!({"email_id": SHIP_NORTHWIND})),
        ]),
        calls(&[("search_emails", json!({"query": "A-10482 LB-55821", "include_body": true}))]),
        text(answer),
    ];
    let setup = setup(script, Arc::new(ScriptedModel::queue(vec![]))).await;
    let run_id = setup.submit("email-assistant", "Am I expecting any deliveries today? What's in the orders?").await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);

    let results = setup.tool_results();
    assert_eq!(results.len(), 5, "{results:#?}");
    let (shipments, orders) = (&results[0], &results[4]);
    assert_eq!(shipments["today"], day(0));
    assert_eq!(ids(shipments), vec![SHIP_LUMEN, SHIP_HUB, SHIP_NORTHWIND], "the shipping notices, and no spam");

    let (lumen, hub, northwind) = (&results[1], &results[2], &results[3]);
    assert_eq!(northwind["entities"]["tracking_numbers"], json!([{"value": "1Z999AA10123456784", "carrier": "UPS"}]));
    assert_eq!(northwind["entities"]["order_numbers"], json!(["A-10482"]));
    assert_eq!(lumen["entities"]["tracking_numbers"], json!([{"value": "9400111899223197428490", "carrier": "USPS"}]));
    assert_eq!(lumen["entities"]["order_numbers"], json!(["LB-55821"]));
    assert!(dates(northwind).contains(&day(0).as_str()) && dates(lumen).contains(&day(0).as_str()), "due today");
    assert_eq!(dates(hub), vec![day(3)], "the hub is due in three days, not today");
    assert_eq!(hub["entities"]["order_numbers"], json!(["112-4456789-1234567"]));

    assert_eq!(ids(orders), vec![SHIP_LUMEN, SHIP_NORTHWIND, ORDER_NORTHWIND, ORDER_LUMEN]);
    let bodies: Vec<&str> = orders["emails"].as_array().unwrap().iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert!(bodies[2].contains("ErgoFlex office chair") && bodies[2].contains("€278.90"), "{}", bodies[2]);
    assert!(bodies[3].contains("Designing Data-Intensive Applications") && bodies[3].contains("$89.48"));

    let cited: Vec<(usize, String)> =
        setup.citations(run_id).await.into_iter().map(|c| (c.marker, c.fragment.id)).collect();
    let expected = [(3, SHIP_NORTHWIND), (4, ORDER_NORTHWIND), (1, SHIP_LUMEN), (5, ORDER_LUMEN), (2, SHIP_HUB)];
    assert_eq!(cited, expected.map(|(marker, id)| (marker, id.to_owned())).to_vec());
}

/// The triage agent on the meeting request: analysed, drafted, then sent once a
/// human decides.
fn reply_to_the_meeting() -> Vec<Step> {
    let draft = json!({
        "to": "priya@brightdesk.example",
        "subject": "Re: Meeting request: Q3 roadmap review",
        "body": "Hi Priya, that works for me. See you in the small meeting room. Sam",
        "in_reply_to": MEETING,
    });
    vec![
        calls(&[("analyze_email_content", json!({"email_id": MEETING}))]),
        calls(&[("create_draft", draft)]),
        calls(&[("send_email", json!({"draft_id": 1}))]),
        text("Replied to Priya's meeting request."),
    ]
}

fn meeting_analysis() -> Arc<dyn ModelClient> {
    let analysis = r#"{"classification": "meeting_request", "sentiment": "positive", "urgency": "medium",
        "confidence": 0.93, "summary": "Priya asks to meet about the Q3 roadmap."}"#;
    Arc::new(ScriptedModel::queue(vec![text(analysis)]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_send_lands_in_the_outbox_exactly_once() {
    let setup = setup(reply_to_the_meeting(), meeting_analysis()).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {MEETING}")).await;
    let (_, tool, reason) = setup.parked_on(run_id, 1).await;
    assert_eq!((tool.as_str(), reason.as_str()), ("send_email", "send_email always needs approval"));
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "draft", "a confident analysis lets the draft through");
    assert!(setup.mailbox.outbox().await.unwrap().is_empty(), "nothing is sent before the approval");

    setup.decide(run_id, true, None).await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
    let outbox = setup.mailbox.outbox().await.unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!((outbox[0].to.as_str(), outbox[0].draft_id), ("priya@brightdesk.example", Some(1)));
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "sent");
    assert_eq!(setup.mailbox.thread(MEETING).await.unwrap().len(), 2, "the reply joins the thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_send_sends_nothing_and_the_model_reads_why() {
    let setup = setup(reply_to_the_meeting(), meeting_analysis()).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {MEETING}")).await;
    setup.parked_on(run_id, 1).await;
    setup.decide(run_id, false, Some("I am away that day")).await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
    assert!(setup.mailbox.outbox().await.unwrap().is_empty());
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "draft");
    let results = setup.tool_results();
    let rejection = results.last().unwrap().to_string();
    assert!(rejection.contains("I am away that day"), "{rejection}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_triage_agent_sends_the_complaints_side_effects_to_a_human() {
    let draft = json!({
        "to": "daniel.okafor@mail.example",
        "subject": "Re: Second broken lamp - I want a refund (order BD-2291)",
        "body": "Dear Daniel, I am very sorry that both lamps for order BD-2291 arrived broken. ...",
        "in_reply_to": COMPLAINT,
    });
    let script = vec![
        calls(&[("analyze_email_content", json!({"email_id": COMPLAINT}))]),
        calls(&[
            ("get_email_thread", json!({"email_id": COMPLAINT})),
            ("extract_entities", json!({"email_id": COMPLAINT})),
        ]),
        calls(&[("create_draft", draft)]),
        calls(&[("send_email", json!({"draft_id": 1}))]),
        text("Complaint from Daniel Okafor about order BD-2291: drafted an apology, sent after approval."),
    ];
    // The built-in offline model cannot classify: the tool's rules do, deterministically.
    let setup = setup(script, Arc::new(troupe::llm::offline::OfflineModel)).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {COMPLAINT}")).await;

    let (_, tool, reason) = setup.parked_on(run_id, 1).await;
    assert_eq!((tool.as_str(), reason.as_str()), ("create_draft", "the run is classified as complaint"));
    let analysis = &setup.tool_results()[0];
    assert_eq!((analysis["classification"].as_str(), analysis["method"].as_str()), (Some("complaint"), Some("rules")));
    assert!(setup.mailbox.draft(1).await.is_err(), "even the draft waits for the human");
    let entities = &setup.tool_results()[2];
    assert_eq!(entities["entities"]["order_numbers"], json!(["BD-2291"]));
    assert_eq!(entities["entities"]["amounts"][0]["value"], 129.0);

    setup.decide(run_id, true, None).await;
    let (_, tool, reason) = setup.parked_on(run_id, 2).await;
    assert_eq!(tool, "send_email");
    assert!(reason == "send_email always needs approval" || reason.contains("complaint"), "{reason}");
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "draft");
    assert!(setup.mailbox.outbox().await.unwrap().is_empty());

    setup.decide(run_id, true, None).await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
    assert_eq!(setup.mailbox.outbox().await.unwrap().len(), 1);
}
