//! The email agents end to end, on the shipped agent files (and their steps) and
//! the sample mailbox, with a scripted model: the assistant answers the delivery
//! question from the emails its opening search found, citing them; the triage
//! workflow checks the calendar for a meeting request, drafts a reply to the
//! sender and sends it without a human when the classification is confident
//! (below 0.8 it waits: a rejection sends nothing); a confident spam ends after
//! its classification; one whose classification keeps failing is filed in
//! needs_review; on the complaint, the sender's contact is looked up and every
//! side effect waits for a human.

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
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use troupe_actors::{Deps, RunInput, Runtime, SubmitRequest};

const SHIP_LUMEN: &str = "ship-lb55821@lumenbooks.example";
const SHIP_NORTHWIND: &str = "ship-a10482@northwind-shop.example";
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
    setup_with(script, analysis, None).await
}

/// [`setup`], with `stand_in` answering in place of the email tool of its name.
async fn setup_with(script: Vec<Step>, analysis: Arc<dyn ModelClient>, stand_in: Option<Arc<dyn Tool>>) -> Setup {
    let dir = std::env::temp_dir().join(format!("troupe-e2e-email-{}", uuid::Uuid::now_v7()));
    let mailboxes = Arc::new(EmailConfig::default().mailboxes(&dir));
    // Runs submitted without a tenant act for `default`.
    let mailbox = mailboxes.of("default");
    let mut tools = ToolRegistry::new();
    for tool in troupe::email::email_tools(mailboxes, analysis) {
        let tool = match &stand_in {
            Some(stand_in) if stand_in.name() == tool.name() => stand_in.clone(),
            _ => tool,
        };
        tools.register(tool).unwrap();
    }
    let agents = vec![
        parse_agent("email-assistant.toml", include_str!("../../config/agents/email-assistant.toml")).unwrap(),
        parse_agent("email-triage.toml", include_str!("../../config/agents/email-triage.toml")).unwrap(),
    ];
    // The model's turns come in order; the agents' steps take the others.
    let model = Arc::new(ScriptedModel::queue(script));
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools,
        hooks: Vec::new(),
        agents,
    };
    // A failed step is tried again at once: the pause is not what is tested here.
    let config = RuntimeConfig { step_retry_backoff: std::time::Duration::from_millis(5), ..RuntimeConfig::default() };
    let runtime = Runtime::start(config, deps).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_email_assistant_answers_the_delivery_question_from_the_right_emails() {
    let question = "Am I expecting any deliveries today? What's in the orders?";
    let answer = "Yes: Lumen Books order LB-55821 is out for delivery today [1], and Northwind Home order A-10482 \
        (UPS 1Z999AA10123456784) is due today between 10:00 and 14:00 [2].";
    let setup = setup(vec![text(answer)], Arc::new(ScriptedModel::queue(vec![]))).await;
    let run_id = setup.submit("email-assistant", question).await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);

    // The runtime searched in the request's words; the model only answered.
    let requests = setup.model.requests();
    assert_eq!(requests.len(), 1, "one model call: the answer");
    assert_eq!(requests[0].tool_choice, troupe_actors::llm::ToolChoice::None);
    assert!(requests[0].tools.is_empty(), "an answer before the model's first turn reads no tool definitions");
    let asked = requests[0].messages.last().unwrap();
    assert!(asked.role == Role::User && asked.content.contains(question), "the question, again: {}", asked.content);
    let results = setup.tool_results();
    assert_eq!(results.len(), 1, "{results:#?}");
    let found = &results[0];
    assert_eq!(found["today"], day(0));
    // The two emails that name today, best first; matches far weaker than them (a
    // scam, a complaint, orders that share one word) are left out.
    assert_eq!(ids(found), [SHIP_LUMEN, SHIP_NORTHWIND]);
    let body = |id: &str| found["emails"].as_array().unwrap().iter().find(|e| e["id"] == id).unwrap()["body"].clone();
    assert!(body(SHIP_NORTHWIND).as_str().unwrap().contains("1Z999AA10123456784"), "whole bodies");

    let cited: Vec<(usize, String)> =
        setup.citations(run_id).await.into_iter().map(|c| (c.marker, c.fragment.id)).collect();
    let expected = [(1, SHIP_LUMEN), (2, SHIP_NORTHWIND)];
    assert_eq!(cited, expected.map(|(marker, id)| (marker, id.to_owned())).to_vec());
}

/// The model's part of the triage workflow on the meeting request (found,
/// analysed and checked against the calendar by the workflow's steps): the draft
/// (addressed by the step, whatever the model writes there), then, after the
/// send, the report.
fn reply_to_the_meeting() -> Vec<Step> {
    let draft = json!({
        "to": "someone@else.example",
        "subject": "Re: Meeting request: Q3 roadmap review",
        "body": "Hi Priya, that works for me. See you in the small meeting room. Sam",
    });
    vec![
        calls(&[("create_draft", draft)]),
        text("Replied to Priya's meeting request: 14:00 is free, accepted and sent."),
    ]
}

fn meeting_analysis(confidence: f64) -> Arc<dyn ModelClient> {
    let analysis = json!({"classification": "meeting_request", "sentiment": "positive", "urgency": "medium",
        "confidence": confidence, "summary": "Priya asks to meet about the Q3 roadmap."});
    Arc::new(ScriptedModel::queue(vec![text(&analysis.to_string())]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confident_meeting_request_is_checked_against_the_calendar_drafted_and_sent_without_a_human() {
    let setup = setup(reply_to_the_meeting(), meeting_analysis(0.9)).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {MEETING}")).await;
    let record = setup.runtime.wait(run_id).await.unwrap();
    assert_eq!(record.status, RunStatus::Succeeded, "{:?}", record.reason);

    let outbox = setup.mailbox.outbox().await.unwrap();
    assert_eq!(outbox.len(), 1, "sent once, with no approval asked");
    assert!(outbox[0].to.contains("priya@brightdesk.example"), "to the sender, as the step says: {}", outbox[0].to);
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "sent");
    assert_eq!(setup.mailbox.thread(MEETING).await.unwrap().len(), 2, "the reply joins the thread");
    let results = setup.tool_results();
    let calendar = results.iter().find(|result| result.get("free").is_some()).expect("the calendar was checked");
    assert_eq!(calendar["free"], true, "the draft was written knowing 14:00 is free: {calendar}");
    assert_eq!((&calendar["date"], &calendar["conflicts"]), (&json!(day(2)), &json!([])), "the day the email asks for");

    let events: Vec<_> = setup.runtime.subscribe(run_id, 0).collect().await;
    let kinds: Vec<String> = events.iter().map(|event| event.as_ref().unwrap().kind.name().to_owned()).collect();
    assert!(!kinds.iter().any(|kind| kind == "approval_requested"), "{kinds:?}");
    // Each step's trace, in order.
    let steps: Vec<(u32, String)> = events
        .iter()
        .filter_map(|event| match &event.as_ref().unwrap().kind {
            EventKind::StepEnd { order, name, .. } => Some((*order, name.clone())),
            _ => None,
        })
        .collect();
    let names =
        ["search_emails", "analyze_email_content", "extract_entities", "check_calendar", "create_draft", "send_email"];
    let expected: Vec<(u32, String)> = [1, 2, 6, 7, 9, 10]
        .into_iter()
        .zip(names)
        .chain([(12, "answer")])
        .map(|(order, name)| (order, name.to_owned()))
        .collect();
    assert_eq!(steps, expected, "skipped steps leave no trace; the others in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meeting_request_classified_with_little_confidence_waits_for_a_human_and_a_rejection_sends_nothing() {
    let setup = setup(reply_to_the_meeting(), meeting_analysis(0.6)).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {MEETING}")).await;
    let (_, tool, reason) = setup.parked_on(run_id, 1).await;
    assert_eq!(tool, "create_draft", "below 0.8 even the draft waits");
    assert!(reason.contains("below 0.80"), "{reason}");
    setup.decide(run_id, true, None).await;
    let (_, tool, _) = setup.parked_on(run_id, 2).await;
    assert_eq!(tool, "send_email");
    setup.decide(run_id, false, Some("I am away that day")).await;
    assert_eq!(setup.runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
    assert!(setup.mailbox.outbox().await.unwrap().is_empty());
    assert_eq!(setup.mailbox.draft(1).await.unwrap().status, "draft");
    let results = setup.tool_results();
    let rejection = results.last().unwrap().to_string();
    assert!(rejection.contains("I am away that day"), "{rejection}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spam_email_classified_with_confidence_ends_the_run_after_its_classification() {
    let analysis = json!({"classification": "spam", "sentiment": "neutral", "urgency": "low", "confidence": 0.97,
        "summary": "A prize scam."});
    let setup = setup(Vec::new(), Arc::new(ScriptedModel::queue(vec![text(&analysis.to_string())]))).await;
    let run_id = setup.submit("email-triage", "Triage the email winner-5512@prize-center.example").await;
    let record = setup.runtime.wait(run_id).await.unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    let answer = record.final_output.unwrap_or_default();
    assert!(answer.starts_with("This email is spam (confidence 0.9"), "{answer}");
    assert!(setup.model.requests().is_empty(), "the agent's model is never asked");
    assert!(setup.mailbox.draft(1).await.is_err() && setup.mailbox.outbox().await.unwrap().is_empty());
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
        calls(&[("create_draft", draft)]),
        text("Complaint from Daniel Okafor about order BD-2291: drafted an apology, sent after approval."),
    ];
    // The built-in offline model cannot classify: the tool's rules do, deterministically.
    let setup = setup(script, Arc::new(troupe::llm::offline::OfflineModel)).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {COMPLAINT}")).await;

    let (_, tool, reason) = setup.parked_on(run_id, 1).await;
    assert_eq!((tool.as_str(), reason.as_str()), ("create_draft", "the run is classified as complaint"));
    let results = setup.tool_results();
    assert_eq!(ids(&results[0]), vec![COMPLAINT], "the email the request names");
    let analysis = &results[1];
    assert_eq!((analysis["classification"].as_str(), analysis["method"].as_str()), (Some("complaint"), Some("rules")));
    assert_eq!(results[2]["name"], "Daniel Okafor", "the sender's contact, looked up before the draft");
    assert!(setup.mailbox.draft(1).await.is_err(), "even the draft waits for the human");

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

/// An `analyze_email_content` whose model is down: every call fails.
struct DownAnalysis;

#[async_trait::async_trait]
impl Tool for DownAnalysis {
    fn name(&self) -> &str {
        "analyze_email_content"
    }
    fn description(&self) -> &str {
        "Classifies an email (its model is down)."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _context: ToolContext, _args: Value) -> Result<ToolOutput, ToolError> {
        Err(ToolError::failed("model_unavailable", "the analysis model does not answer"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_whose_classification_keeps_failing_is_filed_for_a_person() {
    let setup = setup_with(Vec::new(), Arc::new(ScriptedModel::queue(vec![])), Some(Arc::new(DownAnalysis))).await;
    let run_id = setup.submit("email-triage", &format!("Triage the email {MEETING}")).await;
    let record = setup.runtime.wait(run_id).await.unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    let answer = record.final_output.unwrap_or_default();
    assert!(answer.starts_with("The email could not be classified, so it is filed in needs_review"), "{answer}");
    assert_eq!(setup.mailbox.get(MEETING).await.unwrap().folder, "needs_review");
    let events: Vec<_> = setup.runtime.subscribe(run_id, 0).collect().await;
    let analyses = events
        .iter()
        .filter(|event| {
            matches!(&event.as_ref().unwrap().kind, EventKind::ToolMetric { record } if record.tool == "analyze_email_content")
        })
        .count();
    assert_eq!(analyses, 3, "tried three times");
    assert!(setup.model.requests().is_empty() && setup.mailbox.draft(1).await.is_err(), "no draft, no model");
}

/// Two tenants' runs through the same tools: each searches and journals in its own
/// files. Tenant A's agent, told to look for tenant B's subject, finds nothing of B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_searches_its_own_mail_and_writes_its_own_journal() {
    let dir = std::env::temp_dir().join(format!("troupe-e2e-tenants-{}", uuid::Uuid::now_v7()));
    let email = EmailConfig { seed_sample: false, ..EmailConfig::default() };
    let mailboxes = Arc::new(email.mailboxes(&dir));
    let mail = |id: &str, subject: &str| {
        json!([{ "id": id, "from": "someone@example.com", "subject": subject, "body": subject, "day_offset": 0 }])
            .to_string()
    };
    mailboxes.of("acme").import(&mail("acme-1@example.com", "Acme quarterly numbers")).await.unwrap();
    mailboxes.of("globex").import(&mail("globex-1@example.com", "Globex merger plans")).await.unwrap();
    let journal =
        troupe::tools::TenantPath::new(dir.join("tenants/{tenant}/journal.log").display().to_string()).unwrap();
    let mut tools = ToolRegistry::new();
    troupe::email::register(&mut tools, mailboxes, Arc::new(ScriptedModel::queue(vec![]))).unwrap();
    tools.register(Arc::new(troupe::tools::Journal { path: journal.clone() })).unwrap();
    let agent = "name = \"finder\"\ninstructions = \"Search, note, answer.\"\ntools = [\"search_emails\", \"journal\"]";
    // Each run: a search for Globex's subject in every folder and a journal entry, then the answer.
    let turn = |entry: &str| {
        calls(&[
            ("search_emails", json!({ "query": "Globex merger", "folder": "all" })),
            ("journal", json!({ "text": entry })),
        ])
    };
    let model =
        Arc::new(ScriptedModel::queue(vec![turn("acme entry"), text("done"), turn("globex entry"), text("done")]));
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools,
        hooks: Vec::new(),
        agents: vec![parse_agent("finder.toml", agent).unwrap()],
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    let mut found = Vec::new();
    for tenant in ["acme", "globex"] {
        let request = SubmitRequest { tenant: tenant.to_owned(), ..SubmitRequest::new("finder", "find the merger") };
        let run_id = runtime.submit(request).await.unwrap();
        assert_eq!(runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
        let shown = model.requests().pop().unwrap();
        let result = shown.messages.iter().find(|m| m.role == Role::Tool).unwrap().content.clone();
        found.push(serde_json::from_str::<Value>(&result).unwrap());
    }
    assert_eq!(found[0]["count"], 0, "acme sees nothing of globex's mail: {}", found[0]);
    assert_eq!(ids(&found[1]), ["globex-1@example.com"], "globex finds its own");
    let read = |tenant: &str| std::fs::read_to_string(journal.of(tenant)).unwrap();
    let (acme, globex) = (read("acme"), read("globex"));
    assert!(acme.contains("acme entry") && !acme.contains("globex entry"), "{acme}");
    assert!(globex.contains("globex entry") && !globex.contains("acme entry"), "{globex}");
    runtime.shutdown(std::time::Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&dir);
}
