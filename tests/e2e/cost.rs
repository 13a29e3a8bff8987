//! What a run costs, as an operator reads it from a running daemon: every model
//! call charged to its run (the agent's, the model-backed reviewer's, a tool's
//! that asks a model), priced by the built-in list price of the quick-start
//! model's id; the cost budget stopping a run; a tenant's daily quota refusing
//! its next run, across a restart, while another tenant goes on.

use std::process::Command;

use serde_json::{Value, json};
use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream, tool_call_stream};

use crate::daemon::{Served, TOKEN};

/// gpt-4o-mini's list price, USD per million tokens (input, output).
const PRICE: (f64, f64) = (0.15, 0.60);

const OTHER_TOKEN: &str = "other-tenant-token";

const REVIEW: &str = r#"{"quality_score": 1, "completeness": 1, "relevance": 1, "needs_more_data": false,
    "gaps": [], "suggested_actions": [], "recommendation": "proceed", "question": null, "updated_plan": null,
    "notes": "fine"}"#;

const ANALYSIS: &str = r#"{"classification": "complaint", "sentiment": "negative", "urgency": "high",
    "confidence": 0.9, "summary": "A parcel never arrived.", "requested_action": "refund"}"#;

/// A data dir with the agent `priced` (analyze_email_content, a model reviewer)
/// and `config` as its config file.
fn sandbox(name: &str, config: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("troupe-cost-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    let agent = "name = \"priced\"\ninstructions = \"Classify the message, then say what it is.\"\n\
                 tools = [\"analyze_email_content\"]\n[reviewer]\nkind = \"model\"\n";
    std::fs::write(dir.join("agents/priced.toml"), agent).unwrap();
    std::fs::write(dir.join("troupe.toml"), config).unwrap();
    dir
}

/// `troupe serve` on `dir`, its model the quick start's `gpt-4o-mini` at `model`.
fn serve(dir: &std::path::Path, model: &FakeOpenAi) -> Served {
    let mut command = Command::new(env!("CARGO_BIN_EXE_troupe"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .env("TROUPE_CONFIG", dir.join("troupe.toml"))
        .env("TROUPE_AGENTS", dir.join("agents"))
        .env("OPENAI_BASE_URL", model.base_url())
        .env("TROUPE_MODEL", "gpt-4o-mini")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TROUPE_DEFAULT_MODEL")
        .env_remove("TROUPE_DATABASE_URL");
    Served::start(command)
}

/// One run of `priced`: the call of analyze_email_content, its model's analysis,
/// the review, the answer, its review.
fn one_run() -> Vec<FakeReply> {
    let args = r#"{"text": "My parcel never arrived. I want a refund."}"#;
    vec![
        tool_call_stream(&[("c1", "analyze_email_content", args)], 1),
        text_stream(ANALYSIS, 1),
        text_stream(REVIEW, 1),
        text_stream("It is a complaint: the parcel never arrived and they want a refund.", 1),
        text_stream(REVIEW, 1),
    ]
}

async fn post(daemon: &Served, token: &str, body: Value) -> (u16, Option<String>, Value) {
    let response =
        reqwest::Client::new().post(daemon.url("/v1/runs")).bearer_auth(token).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|value| value.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.unwrap())
}

async fn run_view(daemon: &Served, id: &str) -> Value {
    let response = reqwest::Client::new().get(daemon.url(&format!("/v1/runs/{id}"))).bearer_auth(TOKEN).send();
    response.await.unwrap().json().await.unwrap()
}

fn cost(input: u64, output: u64) -> f64 {
    (input as f64 * PRICE.0 + output as f64 * PRICE.1) / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_model_call_is_charged_to_its_run_and_a_spent_daily_quota_refuses_the_tenant() {
    let other = troupe::server::hash_token(OTHER_TOKEN);
    let config = format!(
        "[quotas.tenants.e2e]\ndaily_tokens = 100\n[[auth.tokens]]\ntenant = \"other\"\nsha256 = \"{other}\"\n"
    );
    let dir = sandbox("quota", &config);
    // After the scripted run, every request (the other tenant's run) gets a review-like text.
    let model = FakeOpenAi::start(one_run(), Some(text_stream(REVIEW, 1))).await.unwrap();
    let daemon = serve(&dir, &model);

    let (status, _, created) =
        post(&daemon, TOKEN, json!({"agent": "priced", "input": "Classify: my parcel never arrived."})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["run_id"].as_str().unwrap();
    let events = daemon.events(id).await;
    let run = run_view(&daemon, id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(model.requests().len(), 5, "the agent twice, the tool's model once, the reviewer twice");

    // Usage of the agent's calls (20 + 9 with tool calls, 12 + 7 with text), the
    // tool's analysis and both reviews (12 + 7 each).
    let (input, output) = (20 + 4 * 12, 9 + 4 * 7);
    assert_eq!(
        (run["usage"]["input_tokens"].as_u64(), run["usage"]["output_tokens"].as_u64()),
        (Some(input), Some(output))
    );
    let charged = run["usage"]["cost_usd"].as_f64().unwrap();
    assert!((charged - cost(input, output)).abs() < 1e-12, "priced at gpt-4o-mini's list price: {charged}");
    let charges: Vec<&Value> = events.iter().filter(|event| event["kind"] == "token_usage").collect();
    assert_eq!(charges.len(), 5, "one token_usage per model call");
    assert_eq!(charges.last().unwrap()["total"], run["usage"], "the last one carries the run's total");
    let reviews: Vec<&Value> = events.iter().filter(|event| event["kind"] == "review").collect();
    assert_eq!(reviews.len(), 2);
    for review in reviews {
        assert_eq!(review["review"]["status"], "ok", "{review}");
        assert_eq!(review["review"]["usage"]["input_tokens"], 12, "the review says what it cost: {review}");
    }

    // 105 tokens today: the quota of 100 is spent. The next run is refused until
    // midnight UTC, also after a restart; another tenant is not held back.
    let refused = |(status, retry_after, body): (u16, Option<String>, Value)| {
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
        let reset_at: chrono::DateTime<chrono::Utc> = body["error"]["reset_at"].as_str().unwrap().parse().unwrap();
        let midnight = (chrono::Utc::now().date_naive() + chrono::Days::new(1)).and_time(chrono::NaiveTime::MIN);
        assert_eq!(reset_at.naive_utc(), midnight, "{body}");
        let seconds: i64 = retry_after.unwrap().parse().unwrap();
        let left = (reset_at - chrono::Utc::now()).num_seconds();
        assert!((left - 5..=left + 5).contains(&seconds), "Retry-After {seconds} s, {left} s to midnight");
    };
    refused(post(&daemon, TOKEN, json!({"agent": "priced", "input": "And this one?"})).await);
    daemon.terminate();
    let daemon = serve(&dir, &model);
    refused(post(&daemon, TOKEN, json!({"agent": "priced", "input": "And after a restart?"})).await);
    let (status, _, body) = post(&daemon, OTHER_TOKEN, json!({"agent": "priced", "input": "Classify this."})).await;
    assert_eq!(status, 201, "another tenant has no quota: {body}");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_cost_budget_stops_the_run_before_its_next_model_call() {
    let dir = sandbox("budget", "");
    let model = FakeOpenAi::start(one_run(), None).await.unwrap();
    let daemon = serve(&dir, &model);
    // The first turn costs the agent's call, the analysis and the review:
    // (20·0.15 + 9·0.6 + 2·(12·0.15 + 7·0.6)) / 1e6 = $0.0000204.
    let budget = 0.00002;
    let body =
        json!({"agent": "priced", "input": "Classify: my parcel never arrived.", "limits": {"max_cost_usd": budget}});
    let (status, _, created) = post(&daemon, TOKEN, body).await;
    assert_eq!(status, 201, "{created}");
    let id = created["run_id"].as_str().unwrap();
    let events = daemon.events(id).await;
    let run = run_view(&daemon, id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(run["reason"].as_str().unwrap().starts_with("budget_exceeded"), "{run}");
    assert!(run["usage"]["cost_usd"].as_f64().unwrap() >= budget, "{run}");
    assert!(events.iter().any(|event| event["kind"] == "error" && event["code"] == "budget_exceeded"));
    assert_eq!(model.requests().len(), 3, "no model call after the budget was spent");

    let negative = json!({"agent": "priced", "input": "x", "limits": {"max_cost_usd": -1.0}});
    let (status, _, body) = post(&daemon, TOKEN, negative).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_limits")), "{body}");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
