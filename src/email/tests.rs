//! The mailbox against real SQLite files (import, full-text search, threads,
//! drafts and the outbox) and the tools over it (arguments, errors, flags).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{Duration, Local};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use troupe_actors::protocol::RunId;
use troupe_actors::testing::{ScriptedModel, text};
use troupe_actors::tool::{Tool, ToolContext, ToolError};

use super::*;
use crate::email::mailbox::{Compose, SearchQuery};

/// A fresh mailbox file in the temp dir, removed when dropped.
struct TempMailbox {
    mailboxes: Arc<Mailboxes>,
    /// The `default` tenant's, which [`context`] acts for.
    mailbox: Arc<Mailbox>,
    dir: PathBuf,
}

impl Drop for TempMailbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp_mailbox(seed_sample: bool) -> TempMailbox {
    let dir = std::env::temp_dir().join(format!("troupe-mailbox-{}", uuid::Uuid::now_v7()));
    let config = EmailConfig { seed_sample, ..EmailConfig::default() };
    let mailboxes = Arc::new(config.mailboxes(&dir));
    TempMailbox { mailbox: mailboxes.of("default"), mailboxes, dir }
}

fn context(key: &str) -> ToolContext {
    ToolContext {
        run_id: RunId::new(),
        tenant: "default".into(),
        agent: "email-assistant".into(),
        turn: 1,
        call_id: "c".into(),
        idempotency_key: key.into(),
        cancel: CancellationToken::new(),
    }
}

fn query(text: &str) -> SearchQuery {
    SearchQuery { text: text.into(), limit: 20, ..SearchQuery::default() }
}

fn ids(emails: &[mailbox::Email]) -> Vec<&str> {
    emails.iter().map(|email| email.id.as_str()).collect()
}

#[tokio::test]
async fn the_sample_is_seeded_on_first_use_and_searched_with_stemming() {
    let temp = temp_mailbox(true);
    assert!(!temp.mailbox.path().exists(), "nothing is opened before first use");
    let found = temp.mailbox.search(&query("deliveries")).await.unwrap();
    assert_eq!(temp.mailbox.count().await.unwrap(), 17);
    assert!(ids(&found).contains(&"ship-lb55821@lumenbooks.example"), "{:?}", ids(&found));
    assert!(!ids(&found).contains(&"parcel-fee-2291@secure-delivery-alerts.example"), "spam is hidden by default");
    let spam = SearchQuery { folder: Some("spam".into()), ..query("delivery") };
    assert_eq!(ids(&temp.mailbox.search(&spam).await.unwrap()), vec!["parcel-fee-2291@secure-delivery-alerts.example"]);
    // An order number is one phrase; newest first.
    let orders = temp.mailbox.search(&query("A-10482")).await.unwrap();
    assert_eq!(ids(&orders), vec!["ship-a10482@northwind-shop.example", "order-a10482@northwind-shop.example"]);
    // Importing the sample again adds nothing: ids are kept once.
    assert_eq!(temp.mailbox.import_sample().await.unwrap(), 0);
}

#[tokio::test]
async fn a_query_that_names_an_email_by_its_id_finds_it_in_any_folder() {
    let temp = temp_mailbox(true);
    let named = temp.mailbox.search(&query("Triage the email <winner-5512@prize-center.example>, please.")).await;
    assert_eq!(ids(&named.unwrap()), vec!["winner-5512@prize-center.example"], "spam too, when named");
    let two = query("compare complaint-bd2291@mail.example with dinner-sat@mail.example");
    assert_eq!(
        ids(&temp.mailbox.search(&two).await.unwrap()),
        vec!["complaint-bd2291@mail.example", "dinner-sat@mail.example"],
        "in the order named"
    );
    let unknown = temp.mailbox.search(&query("nobody@nowhere.example lamp")).await.unwrap();
    assert!(!unknown.is_empty(), "an address that is no email's id is searched as words");
}

#[tokio::test]
async fn filters_narrow_by_sender_folder_and_local_day() {
    let temp = temp_mailbox(true);
    let today = Local::now().date_naive();
    let todays = SearchQuery { date_from: Some(today), date_to: Some(today), ..query("") };
    let found = temp.mailbox.search(&todays).await.unwrap();
    assert_eq!(found.len(), 4, "{:?}", ids(&found));
    assert!(found.iter().all(|email| email.date.date_naive() == today));
    let yesterday =
        SearchQuery { date_to: Some(today - Duration::days(1)), from: Some("NORTHWIND".into()), ..query("") };
    let found = temp.mailbox.search(&yesterday).await.unwrap();
    assert_eq!(ids(&found), vec!["ship-a10482@northwind-shop.example", "order-a10482@northwind-shop.example"]);
    let sent = SearchQuery { folder: Some("sent".into()), ..query("") };
    assert_eq!(ids(&temp.mailbox.search(&sent).await.unwrap()), vec!["quote-request@brightdesk.example"]);
    let nothing = temp.mailbox.search(&query("the and of")).await.unwrap();
    assert_eq!(nothing.len(), 15, "stop words alone match everything but spam, like an empty query");
}

#[tokio::test]
async fn replies_join_the_thread_of_what_they_answer() {
    let temp = temp_mailbox(true);
    let thread = temp.mailbox.thread("quote-followup@lindqvist-metal.example").await.unwrap();
    assert_eq!(
        ids(&thread),
        vec![
            "quote-request@brightdesk.example",
            "quote-reply@lindqvist-metal.example",
            "quote-followup@lindqvist-metal.example"
        ]
    );
    assert!(thread.iter().all(|email| email.thread_id == "quote-request@brightdesk.example"));
    assert_eq!(temp.mailbox.thread("quote-request@brightdesk.example").await.unwrap().len(), 3, "by thread id too");
    assert!(matches!(temp.mailbox.thread("nope@x").await, Err(MailboxError::UnknownEmail(_))));
}

#[tokio::test]
async fn an_mbox_import_threads_by_references_across_files() {
    let temp = temp_mailbox(false);
    let first = "From a@x Thu May  1 10:00:00 2025\nMessage-ID: <one@x>\nFrom: A <a@x>\nSubject: plans\n\
        Date: Thu, 01 May 2025 10:00:00 +0000\n\nLet us plan the launch.\n";
    let second = "From b@x Thu May  1 11:00:00 2025\nMessage-ID: <two@x>\nFrom: B <b@x>\nSubject: Re: plans\n\
        References: <one@x>\nDate: Thu, 01 May 2025 11:00:00 +0000\n\nThe launch is on.\n";
    assert_eq!(temp.mailbox.import(first).await.unwrap(), 1);
    assert_eq!(temp.mailbox.import(second).await.unwrap(), 1);
    assert_eq!(temp.mailbox.count().await.unwrap(), 2, "an explicit import never seeds the sample");
    assert_eq!(ids(&temp.mailbox.thread("two@x").await.unwrap()), vec!["one@x", "two@x"]);
    assert_eq!(temp.mailbox.search(&query("launching")).await.unwrap().len(), 2);
    assert!(matches!(temp.mailbox.import("{}").await, Err(MailboxError::Import(_))));
}

#[tokio::test]
async fn drafts_and_the_outbox_write_once_per_idempotency_key() {
    let temp = temp_mailbox(true);
    let reply = Compose {
        to: "daniel.okafor@mail.example".into(),
        subject: "Re: your order".into(),
        body: "We are sorry.".into(),
        in_reply_to: Some("complaint-bd2291@mail.example".into()),
        ..Compose::default()
    };
    let draft = temp.mailbox.create_draft(&reply, "run:1:0").await.unwrap();
    assert_eq!(temp.mailbox.create_draft(&reply, "run:1:0").await.unwrap().id, draft.id, "a repeat is the same draft");
    let sent = temp.mailbox.send(Some(draft.id), None, "run:2:0").await.unwrap();
    assert_eq!(temp.mailbox.send(Some(draft.id), None, "run:2:0").await.unwrap(), sent, "a repeat is not resent");
    assert_eq!(temp.mailbox.outbox().await.unwrap().len(), 1);
    assert!(matches!(temp.mailbox.send(Some(draft.id), None, "run:3:0").await, Err(MailboxError::AlreadySent(_))));
    assert!(matches!(temp.mailbox.send(Some(999), None, "run:4:0").await, Err(MailboxError::UnknownDraft(999))));
    let thread = temp.mailbox.thread("complaint-bd2291@mail.example").await.unwrap();
    assert_eq!(thread.len(), 2, "the sent copy joins the thread");
    assert_eq!(thread[1].folder, "sent");
    assert_eq!(temp.mailbox.draft(draft.id).await.unwrap().status, "sent");
}

fn tools(temp: &TempMailbox, model: ScriptedModel) -> Vec<Arc<dyn Tool>> {
    email_tools(temp.mailboxes.clone(), Arc::new(model))
}

fn tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a Arc<dyn Tool> {
    tools.iter().find(|tool| tool.name() == name).unwrap()
}

async fn call(tools: &[Arc<dyn Tool>], name: &str, args: Value) -> Result<Value, ToolError> {
    tool(tools, name).call(context("run:1:0"), args).await.map(|output| output.value)
}

fn code(result: Result<Value, ToolError>) -> String {
    match result {
        Err(ToolError::Failed { code, .. }) => code,
        Err(ToolError::InvalidArgs(_)) => "invalid_args".into(),
        Ok(value) => panic!("expected a failure, got {value}"),
    }
}

#[tokio::test]
async fn reads_are_idempotent_writes_are_not_and_sending_needs_approval() {
    let temp = temp_mailbox(false);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    for tool in &tools {
        let write = matches!(tool.name(), "create_draft" | "send_email");
        assert_eq!(tool.idempotent(), !write, "{}", tool.name());
        assert_eq!(tool.requires_approval(), tool.name() == "send_email", "{}", tool.name());
    }
}

#[tokio::test]
async fn bad_arguments_and_unknown_ids_are_typed_failures() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    assert_eq!(code(call(&tools, "search_emails", json!({"date_from": "yesterday"})).await), "invalid_args");
    let backwards = json!({"date_from": "2025-05-02", "date_to": "2025-05-01"});
    assert_eq!(code(call(&tools, "search_emails", backwards).await), "invalid_args");
    assert_eq!(code(call(&tools, "get_email_thread", json!({"email_id": "nope@x"})).await), "unknown_email");
    assert_eq!(code(call(&tools, "extract_entities", json!({"email_id": "nope@x"})).await), "unknown_email");
    assert_eq!(code(call(&tools, "extract_entities", json!({})).await), "invalid_args");
    assert_eq!(code(call(&tools, "analyze_email_content", json!({"email_id": "nope@x"})).await), "unknown_email");
    let no_address = json!({"to": "Daniel", "subject": "x", "body": "y"});
    assert_eq!(code(call(&tools, "create_draft", no_address).await), "invalid_args");
    let orphan = json!({"to": "a@b.example", "subject": "x", "body": "y", "in_reply_to": "nope@x"});
    assert_eq!(code(call(&tools, "create_draft", orphan).await), "unknown_email");
    assert_eq!(code(call(&tools, "send_email", json!({"draft_id": 41})).await), "unknown_draft");
    assert_eq!(code(call(&tools, "send_email", json!({"draft_id": 1, "to": "a@b.example"})).await), "invalid_args");
}

#[tokio::test]
async fn analysis_comes_from_the_model_or_else_from_the_rules() {
    let temp = temp_mailbox(true);
    let answer = r#"{"classification": "complaint", "sentiment": "negative", "urgency": "high", "confidence": 0.96,
        "summary": "A second broken lamp; wants a refund.", "requested_action": "refund"}"#;
    let tools = tools(&temp, ScriptedModel::queue(vec![text(answer), text("I cannot classify that.")]));
    let complaint = json!({"email_id": "complaint-bd2291@mail.example"});
    let analysis = call(&tools, "analyze_email_content", complaint.clone()).await.unwrap();
    assert_eq!(
        (analysis["classification"].as_str(), analysis["confidence"].as_f64(), analysis["method"].as_str()),
        (Some("complaint"), Some(0.96), Some("model"))
    );
    let fallback = call(&tools, "analyze_email_content", complaint).await.unwrap();
    assert_eq!((fallback["classification"].as_str(), fallback["method"].as_str()), (Some("complaint"), Some("rules")));
    assert!(fallback["note"].as_str().unwrap().contains("not a usable analysis"), "{fallback}");
}

#[tokio::test]
async fn an_email_filed_as_spam_is_spam_whatever_a_model_would_say() {
    let temp = temp_mailbox(true);
    let model = Arc::new(ScriptedModel::queue(vec![text(r#"{"classification": "delivery", "confidence": 0.9}"#)]));
    let tools = email_tools(temp.mailboxes.clone(), model.clone());
    let spam = json!({"email_id": "parcel-fee-2291@secure-delivery-alerts.example"});
    let analysis = call(&tools, "analyze_email_content", spam).await.unwrap();
    assert_eq!((analysis["classification"].as_str(), analysis["method"].as_str()), (Some("spam"), Some("folder")));
    assert!(analysis["confidence"].as_f64().unwrap() >= 0.9);
    assert_eq!(model.request_count(), 0, "the model is not asked");
}

#[tokio::test]
async fn the_offline_model_gets_the_deterministic_rule_based_analysis() {
    let temp = temp_mailbox(true);
    let tools = email_tools(temp.mailboxes.clone(), Arc::new(crate::llm::offline::OfflineModel));
    let spam = json!({"email_id": "parcel-fee-2291@secure-delivery-alerts.example"});
    let first = call(&tools, "analyze_email_content", spam.clone()).await.unwrap();
    assert_eq!(first["classification"], "spam");
    assert_eq!(first["model"], "offline");
    assert_eq!(call(&tools, "analyze_email_content", spam).await.unwrap(), first, "the same answer every time");
}

#[tokio::test]
async fn search_results_are_citable_fragments_with_todays_date() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    let output = tool(&tools, "search_emails").call(context("k"), json!({"query": "LB-55821"})).await.unwrap();
    assert_eq!(output.value["today"], Local::now().format("%Y-%m-%d").to_string());
    let fragment_ids: Vec<&str> = output.fragments.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(fragment_ids, vec!["ship-lb55821@lumenbooks.example", "order-lb55821@lumenbooks.example"]);
    assert_eq!(output.fragments[1].source, "mailbox:inbox/order-lb55821@lumenbooks.example");
    assert!(output.value["emails"][0].get("body").is_none(), "snippets unless bodies are asked for");
}

#[test]
fn every_email_tool_has_a_complete_guide_entry() {
    let guide = crate::tools::guide::parse(crate::tools::guide::DEFAULT_GUIDE);
    let temp = temp_mailbox(false);
    for tool in tools(&temp, ScriptedModel::queue(vec![])) {
        let entry =
            guide.get(tool.name()).unwrap_or_else(|| panic!("config/tools.md has no entry for {}", tool.name()));
        for section in crate::tools::guide::SECTIONS {
            assert!(entry.contains(section), "the entry for {} lacks {section}", tool.name());
        }
    }
}

#[tokio::test]
async fn a_question_about_today_ranks_the_emails_that_name_today_first() {
    let temp = temp_mailbox(true);
    let question = SearchQuery {
        text: "Am I expecting any deliveries today?".into(),
        folder: Some("all".into()),
        by_relevance: true,
        limit: 6,
        ..SearchQuery::default()
    };
    let found = temp.mailbox.search(&question).await.unwrap();
    let mut found = ids(&found);
    found.sort_unstable();
    // Both name today's date: one is out for delivery today, one is due today (it
    // was sent yesterday). Matches far weaker than the best are left out.
    assert_eq!(found, ["ship-a10482@northwind-shop.example", "ship-lb55821@lumenbooks.example"]);
    let by_date = temp.mailbox.search(&SearchQuery { by_relevance: false, ..question.clone() }).await.unwrap();
    assert!(by_date.len() > found.len(), "newest first, no match left out: {}", by_date.len());
    let scam = SearchQuery {
        text: "I got an email saying a parcel is on hold until I pay a customs fee. Is it legitimate?".into(),
        ..question.clone()
    };
    // Spam counts half: real mail that names today comes first, but a scam that
    // matches the question best still leads.
    let scam = temp.mailbox.search(&scam).await.unwrap();
    assert_eq!(ids(&scam)[0], "parcel-fee-2291@secure-delivery-alerts.example");
    // The model reads the verdict with the email; an email alone in its thread
    // does not repeat its id as the thread's.
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    let args = json!({"query": "parcel customs fee on hold", "folder": "all", "sort": "relevance"});
    let shown = call(&tools, "search_emails", args).await.unwrap();
    assert_eq!(shown["emails"][0]["warning"], "filed as spam: not real mail, most likely a scam");
    assert!(shown["emails"][0].get("thread_id").is_none(), "{}", shown["emails"][0]);
    let real = call(&tools, "search_emails", json!({"query": "LB-55821"})).await.unwrap();
    assert!(real["emails"][0].get("warning").is_none());
    let terms = super::mailbox::day_terms_for_test(
        "what came yesterday?",
        chrono::NaiveDate::from_ymd_opt(2026, 3, 1).unwrap(),
    );
    assert_eq!(terms, ["\"28 February 2026\"", "\"2026 02 28\""]);
}

#[tokio::test]
async fn a_tenant_whose_name_climbs_folders_gets_its_own_mailbox_inside_the_data_dir() {
    let temp = temp_mailbox(true);
    let odd = temp.mailboxes.of("../../etc");
    assert_eq!(odd.count().await.unwrap(), 17, "opened and seeded");
    assert!(odd.path().starts_with(temp.dir.join("tenants")), "{}", odd.path().display());
    assert!(odd.path().exists(), "the file is where its path says, not where a decoded URL would put it");
}

/// The day `offset` days from today, as `check_calendar` takes it.
fn day(offset: i64) -> String {
    (Local::now().date_naive() + Duration::days(offset)).format("%Y-%m-%d").to_string()
}

fn titles(events: &Value) -> Vec<&str> {
    events.as_array().unwrap().iter().map(|event| event["title"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn the_sample_calendar_leaves_the_requested_meeting_slot_free_and_reports_conflicts() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    // The meeting request asks for day +2 at 14:00 for an hour.
    let asked =
        call(&tools, "check_calendar", json!({"date": day(2), "start": "14:00", "end": "15:00"})).await.unwrap();
    assert_eq!(asked["date"], day(2));
    assert_eq!(asked["free"], true, "{asked}");
    assert_eq!(asked["conflicts"], json!([]));
    let events = asked["events"].as_array().unwrap();
    assert_eq!(events.len(), 4, "{asked}");
    assert!(events.iter().any(|event| event["end"] == "13:00"), "{asked}");
    assert!(events.iter().all(|event| event["start"].as_str().unwrap() < "14:00" || event["start"] == "16:00"));
    let summary = asked["summary"].as_str().unwrap();
    assert!(summary.starts_with(&format!("On {} (", day(2))), "{summary}");
    assert!(summary.contains("Sam has 4 events") && summary.ends_with("14:00–15:00 is free."), "{summary}");
    // The day as the email writes it names the same day.
    let written = chrono::NaiveDate::parse_from_str(&day(2), "%Y-%m-%d").unwrap().format("%A, %-d %B %Y").to_string();
    let same = call(&tools, "check_calendar", json!({"date": written, "start": "14:00"})).await.unwrap();
    assert_eq!((&same["date"], &same["free"]), (&json!(day(2)), &json!(true)), "{same}");
    // 16:00 is taken: a slot given by its start alone lasts an hour.
    let late = call(&tools, "check_calendar", json!({"date": day(2), "start": "16:00"})).await.unwrap();
    assert_eq!(late["free"], false, "{late}");
    assert_eq!(titles(&late["conflicts"]), ["Warehouse stock count"]);
    assert_eq!(
        (late["conflicts"][0]["start"].as_str(), late["conflicts"][0]["end"].as_str()),
        (Some("16:00"), Some("17:00"))
    );
    assert!(late["summary"].as_str().unwrap().contains("16:00–17:00 is not free: it overlaps Warehouse stock count"));
    // A slot that only touches an event's end is free.
    let touching = call(&tools, "check_calendar", json!({"date": day(2), "start": "13:00", "end": "14:00"})).await;
    assert_eq!(touching.unwrap()["free"], true);
    // Tomorrow has an event at 14:00; without a slot there is no verdict.
    let tomorrow = call(&tools, "check_calendar", json!({"date": "Tomorrow"})).await.unwrap();
    assert_eq!(tomorrow["date"], day(1));
    assert!(tomorrow["events"].as_array().unwrap().iter().any(|event| event["start"] == "14:00"), "{tomorrow}");
    assert!(tomorrow.get("free").is_none() && tomorrow.get("conflicts").is_none(), "{tomorrow}");
    let empty =
        call(&tools, "check_calendar", json!({"date": day(40), "start": "09:00", "end": "24:00"})).await.unwrap();
    assert_eq!((empty["events"].clone(), empty["free"].clone()), (json!([]), json!(true)));
    assert!(empty["summary"].as_str().unwrap().contains("Sam has no events. 09:00–"), "{empty}");
}

#[tokio::test]
async fn get_contact_finds_a_sender_by_name_and_address_and_says_when_it_knows_nobody() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    let daniel = call(&tools, "get_contact", json!({"email": "Daniel Okafor <Daniel.Okafor@mail.example>"})).await;
    let daniel = daniel.unwrap();
    assert_eq!(daniel["found"], true);
    assert_eq!(
        (daniel["email"].as_str(), daniel["name"].as_str(), daniel["relation"].as_str()),
        (Some("daniel.okafor@mail.example"), Some("Daniel Okafor"), Some("customer"))
    );
    let summary = daniel["summary"].as_str().unwrap();
    assert!(summary.starts_with("Daniel Okafor, a customer. Order BD-2291"), "{summary}");
    assert!(summary.contains("second broken lamp") && summary.contains("+1 (312) 555-0199"), "{summary}");
    // The supplier's phone is the one her emails give.
    let marta = call(&tools, "get_contact", json!({"email": "marta@lindqvist-metal.example"})).await.unwrap();
    assert_eq!((marta["relation"].as_str(), marta["phone"].as_str()), (Some("supplier"), Some("+46 8 555 012 34")));
    let nobody = call(&tools, "get_contact", json!({"email": "nobody@nowhere.example"})).await.unwrap();
    assert_eq!(nobody, json!({"found": false, "summary": "No contact is known for nobody@nowhere.example."}));
}

#[tokio::test]
async fn calendar_and_contact_arguments_that_name_no_day_time_or_address_are_invalid() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    for args in [
        json!({"date": "next friday"}),
        json!({"date": "2026-13-01"}),
        json!({"date": "today", "start": "2pm"}),
        json!({"date": "today", "end": "15:00"}),
        json!({"date": "today", "start": "15:00", "end": "14:00"}),
        json!({"date": "today", "duration": 60}),
        json!({}),
    ] {
        assert_eq!(code(call(&tools, "check_calendar", args.clone()).await), "invalid_args", "{args}");
    }
    for args in [json!({"email": "Daniel Okafor"}), json!({"email": "a@b@c"}), json!({"name": "Daniel"})] {
        assert_eq!(code(call(&tools, "get_contact", args.clone()).await), "invalid_args", "{args}");
    }
}

#[tokio::test]
async fn each_tenant_has_its_own_contacts_and_calendar() {
    let temp = temp_mailbox(false);
    let (acme, globex) = (temp.mailboxes.of("acme"), temp.mailboxes.of("globex"));
    let contact =
        r#"[{"email": "Wile E. Coyote <WILE@acme.example>", "name": "Wile E. Coyote", "relation": "customer"}]"#;
    assert_eq!(acme.import_contacts(contact).await.unwrap(), 1);
    assert_eq!(acme.import_contacts(contact).await.unwrap(), 0, "a known address is kept once");
    let event =
        r#"[{"id": "launch@acme", "title": "Rocket launch", "day_offset": 1, "start": "10:00", "end": "11:00"}]"#;
    assert_eq!(acme.import_calendar(event).await.unwrap(), 1);
    let wile = acme.contact("wile@acme.example").await.unwrap().unwrap();
    assert_eq!((wile.email.as_str(), wile.relation.as_str()), ("wile@acme.example", "customer"));
    assert_eq!(globex.contact("wile@acme.example").await.unwrap(), None, "globex does not see acme's contacts");
    let tomorrow = Local::now().date_naive() + Duration::days(1);
    let span = (tomorrow.and_hms_opt(0, 0, 0).unwrap(), tomorrow.and_hms_opt(23, 59, 0).unwrap());
    assert_eq!(acme.events(span.0, span.1).await.unwrap().len(), 1);
    assert!(globex.events(span.0, span.1).await.unwrap().is_empty(), "nor its calendar");
    assert_eq!(acme.count().await.unwrap(), 0, "contacts and events are no emails");
    let bad = r#"[{"id": "x", "title": "Backwards", "day_offset": 0, "start": "11:00", "end": "10:00"}]"#;
    assert!(matches!(acme.import_calendar(bad).await, Err(MailboxError::Records(_))));
    assert!(matches!(acme.import_contacts(r#"[{"email": "no address"}]"#).await, Err(MailboxError::Records(_))));
}

#[tokio::test]
async fn clear_empties_contacts_and_events_and_the_sample_import_brings_them_back() {
    let temp = temp_mailbox(true);
    let week = (
        Local::now().date_naive().and_hms_opt(0, 0, 0).unwrap(),
        (Local::now().date_naive() + Duration::days(7)).and_hms_opt(0, 0, 0).unwrap(),
    );
    assert_eq!(temp.mailbox.events(week.0, week.1).await.unwrap().len(), 11, "seeded with the mailbox");
    assert!(temp.mailbox.contact("priya@brightdesk.example").await.unwrap().is_some());
    temp.mailbox.clear().await.unwrap();
    assert_eq!(temp.mailbox.count().await.unwrap(), 0);
    assert!(temp.mailbox.events(week.0, week.1).await.unwrap().is_empty());
    assert_eq!(temp.mailbox.contact("priya@brightdesk.example").await.unwrap(), None);
    assert_eq!(temp.mailbox.import_sample().await.unwrap(), 17);
    assert_eq!(temp.mailbox.events(week.0, week.1).await.unwrap().len(), 11);
    assert!(temp.mailbox.contact("ALEX.RIVERA@mail.example").await.unwrap().is_some(), "any case finds it");
}

#[tokio::test]
async fn an_unseeded_mailbox_has_no_contacts_or_events() {
    let temp = temp_mailbox(false);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    let today = call(&tools, "check_calendar", json!({"date": "today"})).await.unwrap();
    assert_eq!(today["events"], json!([]));
    let priya = call(&tools, "get_contact", json!({"email": "priya@brightdesk.example"})).await.unwrap();
    assert_eq!(priya["found"], false);
}

#[tokio::test]
async fn file_email_moves_an_email_to_a_folder_and_refuses_bad_folders() {
    let temp = temp_mailbox(true);
    let tools = tools(&temp, ScriptedModel::queue(vec![]));
    let id = "complaint-bd2291@mail.example";
    let filed = call(&tools, "file_email", json!({"email_id": id, "folder": "needs_review"})).await.unwrap();
    assert_eq!(filed["folder"], "needs_review");
    assert!(filed["summary"].as_str().unwrap().contains("in needs_review"), "{filed}");
    let found = call(&tools, "search_emails", json!({"query": "refund", "folder": "needs_review"})).await.unwrap();
    assert_eq!(found["emails"][0]["id"], id, "{found}");
    let again = call(&tools, "file_email", json!({"email_id": id, "folder": "needs_review"})).await.unwrap();
    assert_eq!(again["folder"], "needs_review", "the same folder twice changes nothing");
    let bad = call(&tools, "file_email", json!({"email_id": id, "folder": "Needs Review!"})).await.unwrap_err();
    assert!(bad.to_string().contains("lower-case"), "{bad}");
    let unknown = call(&tools, "file_email", json!({"email_id": "nope@x", "folder": "archive"})).await.unwrap_err();
    assert!(unknown.to_string().contains("unknown_email") || unknown.to_string().contains("no email"), "{unknown}");
}
