//! Reviewer: judges every turn of every run. The session asks it from exactly one
//! place after each turn, always. The default review is deterministic
//! ([`rule_based`]); a model-backed review is available per agent and falls back to
//! the rules, marked `degraded`, on any error. A reply that is never sent (the
//! reviewer crashed mid-review) also falls back: [`ReviewReply`] sends the degraded
//! rule-based review when dropped, so no turn ever waits forever for its review.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;
use tracing::warn;

use crate::config::ReviewerKind;
use crate::llm::{ChatRequest, Message, ModelChunk, ModelClient, ModelRegistry, Role, ToolChoice};
use crate::metrics;
use crate::protocol::{
    Plan, Recommendation, Review, ReviewStatus, SkipReason, SuggestedAction, TaskStatus, TodoItem, Usage,
};

/// How one call of the turn ended, as the reviewer sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CallSummary {
    /// The tool.
    pub tool: String,
    /// `completed`, `failed`, `skipped` or `interrupted`.
    pub status: &'static str,
    /// For skips: why.
    pub skip: Option<SkipReason>,
}

/// What the reviewer sees of a turn.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReviewInput {
    /// The turn.
    pub turn: u32,
    /// The user's request.
    pub request: String,
    /// The plan after the turn.
    pub plan: Plan,
    /// The turn's tool calls.
    pub calls: Vec<CallSummary>,
    /// The answer, when the turn gave one.
    pub final_answer: Option<String>,
    /// Tools blocked after this turn.
    pub blocked_tools: Vec<String>,
    /// Whether this is the forced synthesis turn (the run ends after it).
    pub synthesis: bool,
    /// The agent answers only from what its tools return (`grounded`), and no
    /// call of its own tools has succeeded in this run yet.
    pub ungrounded: bool,
    /// The turn was cut short and the run ends with it: why (a model error, a
    /// cancel). Such a turn is reviewed by the rules, at once, whatever the agent's
    /// reviewer.
    pub ended: Option<String>,
}

/// Where a review goes. Dropped unsent, it sends the degraded rule-based review.
pub struct ReviewReply {
    input: Arc<ReviewInput>,
    send: Option<Box<dyn FnOnce(Review) + Send + 'static>>,
}

impl ReviewReply {
    /// A reply for `input` that calls `send` exactly once.
    pub fn new(input: Arc<ReviewInput>, send: impl FnOnce(Review) + Send + 'static) -> Self {
        Self { input, send: Some(Box::new(send)) }
    }

    /// Sends `review`.
    pub fn send(mut self, review: Review) {
        if let Some(send) = self.send.take() {
            send(review);
        }
    }
}

impl Drop for ReviewReply {
    fn drop(&mut self) {
        if let Some(send) = self.send.take() {
            send(degraded(&self.input, "the reviewer failed"));
        }
    }
}

/// Messages the reviewer takes.
pub enum ReviewerMsg {
    /// Review a turn.
    Review {
        /// Which reviewer the agent wants.
        kind: ReviewerKind,
        /// The agent's model, for `ReviewerKind::Model { model: None }`.
        agent_model: Option<String>,
        /// The turn.
        input: Arc<ReviewInput>,
        /// Where the verdict goes.
        reply: ReviewReply,
        /// The review's span (a child of its turn's); a model-backed review's call
        /// is its child.
        span: tracing::Span,
    },
}

/// The reviewer; read-only.
pub struct Reviewer {
    /// Models for model-backed reviews.
    pub models: ModelRegistry,
    /// Time limit of a model-backed review.
    pub timeout: Duration,
}

impl Actor for Reviewer {
    type Msg = ReviewerMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<ReviewerMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ReviewerMsg>,
        message: ReviewerMsg,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReviewerMsg::Review { kind: ReviewerKind::RuleBased, input, reply, .. } => reply.send(rule_based(&input)),
            // A turn cut short is judged by the rules whatever the agent's reviewer.
            ReviewerMsg::Review { input, reply, .. } if input.ended.is_some() => reply.send(rule_based(&input)),
            ReviewerMsg::Review { kind: ReviewerKind::Model { model }, agent_model, input, reply, span } => {
                let name = model.or(agent_model);
                let Some(client) = self.models.get(name.as_deref()) else {
                    reply.send(degraded(&input, "the reviewer's model is not configured"));
                    return Ok(());
                };
                let timeout = self.timeout;
                let span = crate::spans::chat(&span, client.model_id());
                // The model call is slow: it runs off the mailbox and answers the reply itself.
                tokio::spawn(
                    async move {
                        let mut spent = Usage::default();
                        let review = match tokio::time::timeout(
                            timeout,
                            model_review(client.as_ref(), &input, &mut spent),
                        )
                        .await
                        {
                            Ok(Ok(review)) => review,
                            Ok(Err(why)) => {
                                warn!(turn = input.turn, %why, "model review failed; using the rules");
                                degraded(&input, &why)
                            }
                            Err(_) => degraded(&input, "the model review timed out"),
                        };
                        // A reply that was not a usable review was paid for all the same.
                        let model_id = client.model_id();
                        metrics::model_usage(model_id, spent.input_tokens, spent.output_tokens, spent.cost_usd);
                        crate::spans::record_usage(&tracing::Span::current(), &spent);
                        reply.send(Review { usage: spent, ..review });
                    }
                    .instrument(span),
                );
            }
        }
        Ok(())
    }
}

/// The rule-based review, marked degraded, with `why` in its notes.
pub fn degraded(input: &ReviewInput, why: &str) -> Review {
    let mut review = rule_based(input);
    review.status = ReviewStatus::Degraded;
    review.notes = format!("{why}; rule-based review: {}", review.notes);
    review
}

/// The deterministic review. Rules, in order:
///
/// - **quality** = 1 − (0.5 × failed, interrupted, invalid or denied calls + 0.25 ×
///   duplicate or blocked calls) ÷ calls; 1 for a turn without calls.
/// - **completeness** = completed tasks ÷ tasks; without a plan, 1 when the turn
///   answered and 0 otherwise.
/// - **relevance**: for an answer, 0.5 + 0.5 × the share of the request's words (4+
///   letters) that the answer uses, 0 for an empty answer; for a tool turn, 1 if a
///   call completed, 0.5 if none did; 1 for a turn with neither.
/// - **gaps**: unfinished and failed tasks, blocked tools; for a turn cut short
///   (`ended`), why it ended.
/// - **recommendation**: `proceed` for the synthesis turn; `gather_more` for an
///   answer that is empty, is runtime text or a tool call written as text, or (for
///   a `grounded` agent) comes before any of its tools returned a result; `replan`
///   for a tool turn where no call completed and one failed; `proceed` otherwise
///   (a turn that only repeated calls that had succeeded is followed by a turn
///   that must answer). An unfinished plan does not hold back an answer: the
///   answer is judged, not the model's bookkeeping. A turn cut short: `proceed`
///   (the run ends with it).
pub fn rule_based(input: &ReviewInput) -> Review {
    let total = input.calls.len();
    let count = |pred: &dyn Fn(&CallSummary) -> bool| input.calls.iter().filter(|c| pred(c)).count();
    let completed = count(&|c| c.status == "completed");
    let hard = count(&|c| {
        matches!(c.status, "failed" | "interrupted")
            || matches!(c.skip, Some(SkipReason::InvalidArgs | SkipReason::Denied))
    });
    let soft = count(&|c| matches!(c.skip, Some(SkipReason::Duplicate | SkipReason::Blocked)));
    let quality = if total == 0 { 1.0 } else { 1.0 - (0.5 * hard as f64 + 0.25 * soft as f64) / total as f64 };

    let plan = &input.plan;
    let unfinished: Vec<&TodoItem> =
        plan.items.iter().filter(|i| matches!(i.status, TaskStatus::Pending | TaskStatus::InProgress)).collect();
    let completeness = if plan.items.is_empty() {
        if input.final_answer.is_some() { 1.0 } else { 0.0 }
    } else {
        plan.count(TaskStatus::Completed) as f64 / plan.items.len() as f64
    };
    let relevance = match &input.final_answer {
        Some(answer) if answer.trim().is_empty() => 0.0,
        Some(answer) => 0.5 + 0.5 * word_overlap(&input.request, answer),
        None if total == 0 => 1.0,
        None if completed > 0 => 1.0,
        None => 0.5,
    };

    let mut gaps: Vec<String> =
        unfinished.iter().map(|item| format!("task {} ({}) is not finished", item.id, item.content)).collect();
    for item in plan.items.iter().filter(|i| matches!(i.status, TaskStatus::Failed | TaskStatus::Blocked)) {
        gaps.push(format!(
            "task {} ({}) failed{}",
            item.id,
            item.content,
            item.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        ));
    }
    for tool in &input.blocked_tools {
        gaps.push(format!("tool {tool} is blocked after repeated failures"));
    }

    let (recommendation, mut actions) = match &input.ended {
        // Nothing comes after a turn the run ends with.
        Some(why) => {
            gaps.push(format!("the turn was cut short: {why}"));
            (Recommendation::Proceed, Vec::new())
        }
        None => recommend(input, completed, hard),
    };
    for tool in &input.blocked_tools {
        actions.push(SuggestedAction::about(tool, format!("do not call {tool} for now: it failed repeatedly")));
    }
    let needs_more_data = recommendation != Recommendation::Proceed;
    let verdict = match &input.ended {
        Some(why) => format!("ended early ({why}); the run ends"),
        None => recommendation.as_str().to_owned(),
    };
    let notes = format!(
        "turn {}: {total} calls ({completed} completed); plan {}/{} done; {verdict}",
        input.turn,
        plan.count(TaskStatus::Completed),
        plan.items.len(),
    );
    Review {
        status: ReviewStatus::Ok,
        quality_score: quality.clamp(0.0, 1.0),
        completeness,
        relevance,
        needs_more_data,
        gaps,
        suggested_actions: actions,
        recommendation,
        question: None,
        updated_plan: None,
        notes,
        usage: Usage::default(),
    }
}

/// What the turn calls for, judged on the answer rather than on the model's own
/// bookkeeping (an unfinished plan does not hold back a right answer), with the
/// action to take.
fn recommend(input: &ReviewInput, completed: usize, hard: usize) -> (Recommendation, Vec<SuggestedAction>) {
    let action = |text: &str| vec![SuggestedAction::reason(text)];
    if input.synthesis {
        return (Recommendation::Proceed, Vec::new());
    }
    match input.final_answer.as_deref() {
        Some(answer) if answer.trim().is_empty() => {
            (Recommendation::GatherMore, action("write a non-empty answer to the request"))
        }
        Some(answer) => match crate::answer::not_an_answer_to(&input.request, answer) {
            Some(why) => (
                Recommendation::GatherMore,
                action(&format!("that reply is {why}, not an answer: answer the request in plain words")),
            ),
            None if input.ungrounded => (
                Recommendation::GatherMore,
                action("nothing was looked up yet: call a tool and answer from its result, never from memory"),
            ),
            None => (Recommendation::Proceed, Vec::new()),
        },
        None if input.calls.is_empty() || completed > 0 => (Recommendation::Proceed, Vec::new()),
        None if hard > 0 => (
            Recommendation::Replan,
            action("no call of this turn succeeded: fix the arguments as the results say, or use another tool"),
        ),
        // Only repeats of calls that already succeeded (or of blocked tools): the
        // next turn answers from what the run has (the session asks for it).
        None => (Recommendation::Proceed, action("that call already ran and its result is above: answer from it")),
    }
}

/// The share of `request`'s distinct words of 4+ letters that appear in `answer`.
fn word_overlap(request: &str, answer: &str) -> f64 {
    let words = |text: &str| -> HashSet<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|word| word.chars().count() >= 4)
            .map(str::to_lowercase)
            .collect()
    };
    let asked = words(request);
    if asked.is_empty() {
        return 1.0;
    }
    let answered = words(answer);
    asked.intersection(&answered).count() as f64 / asked.len() as f64
}

/// The JSON a model reviewer must produce.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelVerdict {
    quality_score: f64,
    completeness: f64,
    relevance: f64,
    needs_more_data: bool,
    #[serde(default)]
    gaps: Vec<String>,
    #[serde(default)]
    suggested_actions: Vec<SuggestedAction>,
    recommendation: Recommendation,
    #[serde(default)]
    question: Option<String>,
    #[serde(default)]
    updated_plan: Option<Vec<TodoItem>>,
    #[serde(default)]
    notes: String,
}

/// The model's review of `input`; what its call spent goes to `spent` (also when
/// the reply is not a usable review).
async fn model_review(model: &dyn ModelClient, input: &ReviewInput, spent: &mut Usage) -> Result<Review, String> {
    let system = "You review one turn of an AI agent's run. Reply with one JSON object and nothing else: \
        {\"quality_score\": 0..1, \"completeness\": 0..1, \"relevance\": 0..1, \"needs_more_data\": bool, \
        \"gaps\": [string], \"suggested_actions\": [{\"tool\": string or null, \"arguments\": object or null, \
        \"reason\": string}], \"recommendation\": \"proceed\"|\"gather_more\"|\"clarify_query\"|\"replan\", \
        \"question\": the question for the user with clarify_query (the request is unclear), else null, \
        \"updated_plan\": null or [{\"id\", \"content\", \"status\"}], \"notes\": string}";
    let request = ChatRequest {
        messages: vec![
            Message::text(Role::System, system),
            Message::text(Role::User, json!({"turn": input}).to_string()),
        ],
        tools: Vec::new(),
        tool_choice: ToolChoice::None,
        max_tokens: Some(800),
        temperature: Some(0.0),
    };
    let mut stream = model.chat(request).await.map_err(|error| error.to_string())?;
    let mut reply = None;
    while let Some(chunk) = stream.next().await {
        if let ModelChunk::Done(done) = chunk.map_err(|error| error.to_string())? {
            reply = Some(done);
        }
    }
    let reply = reply.ok_or("the model stream ended without a reply")?;
    *spent = reply.usage;
    let content = reply.content;
    let start = content.find('{').ok_or("the reply has no JSON object")?;
    let end = content.rfind('}').filter(|end| *end > start).ok_or("the reply has no JSON object")?;
    let verdict: ModelVerdict = serde_json::from_str(&content[start..=end])
        .map_err(|error| format!("the reply does not match the review schema: {error}"))?;
    for (name, score) in [
        ("quality_score", verdict.quality_score),
        ("completeness", verdict.completeness),
        ("relevance", verdict.relevance),
    ] {
        if !(0.0..=1.0).contains(&score) {
            return Err(format!("{name} {score} is outside 0..1"));
        }
    }
    Ok(Review {
        status: ReviewStatus::Ok,
        quality_score: verdict.quality_score,
        completeness: verdict.completeness,
        relevance: verdict.relevance,
        needs_more_data: verdict.needs_more_data,
        gaps: verdict.gaps,
        suggested_actions: verdict.suggested_actions,
        recommendation: verdict.recommendation,
        question: verdict.question.filter(|question| !question.trim().is_empty()),
        updated_plan: verdict.updated_plan,
        notes: verdict.notes,
        usage: Usage::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, status: TaskStatus) -> TodoItem {
        TodoItem { id: id.into(), content: format!("task {id}"), status, tools: vec![], result: None, error: None }
    }

    fn input(calls: Vec<CallSummary>, final_answer: Option<&str>, plan: Vec<TodoItem>) -> ReviewInput {
        ReviewInput {
            turn: 1,
            request: "summarize delivery emails".into(),
            plan: Plan { version: 1, items: plan },
            calls,
            final_answer: final_answer.map(str::to_owned),
            blocked_tools: vec![],
            synthesis: false,
            ungrounded: false,
            ended: None,
        }
    }

    fn call(status: &'static str) -> CallSummary {
        CallSummary { tool: "t".into(), status, skip: None }
    }

    #[test]
    fn an_answer_is_judged_not_the_plan_bookkeeping() {
        let review = rule_based(&input(
            vec![],
            Some("delivery emails: two"),
            vec![item("1", TaskStatus::Completed), item("2", TaskStatus::Pending)],
        ));
        assert_eq!(review.recommendation, Recommendation::Proceed);
        assert_eq!(review.completeness, 0.5);
        assert!(review.gaps[0].contains("task 2"), "the gap is still reported");
    }

    #[test]
    fn runtime_text_or_a_call_as_text_is_sent_back() {
        for reply in [
            "The run so far (updated every turn; todo_write changes the plan):\n<plan version=\"1\">",
            r#"{"name": "todo_write", "arguments": {"todos": []}}"#,
        ] {
            let review = rule_based(&input(vec![], Some(reply), vec![]));
            assert_eq!(review.recommendation, Recommendation::GatherMore, "{reply}");
            assert!(review.suggested_actions[0].reason.contains("not an answer"), "{:?}", review.suggested_actions);
        }
    }

    #[test]
    fn a_grounded_agent_answering_before_any_tool_result_is_sent_back() {
        let mut turn = input(vec![], Some("You have two deliveries today."), vec![]);
        turn.ungrounded = true;
        let review = rule_based(&turn);
        assert_eq!(review.recommendation, Recommendation::GatherMore);
        assert!(review.suggested_actions[0].reason.contains("call a tool"));
        turn.ungrounded = false;
        assert_eq!(rule_based(&turn).recommendation, Recommendation::Proceed);
    }

    #[test]
    fn repeating_a_call_that_succeeded_points_at_its_result_instead_of_a_replan() {
        let duplicate = CallSummary { tool: "t".into(), status: "skipped", skip: Some(SkipReason::Duplicate) };
        let review = rule_based(&input(vec![duplicate], None, vec![]));
        assert_eq!(review.recommendation, Recommendation::Proceed, "the session asks for the answer next");
        assert!(review.suggested_actions[0].reason.contains("already ran"));
        assert!(!review.suggested_actions.iter().any(|action| action.reason.contains("todo_write")));
    }

    #[test]
    fn turn_where_every_call_failed_replans_with_low_quality() {
        let review = rule_based(&input(vec![call("failed"), call("failed")], None, vec![]));
        assert_eq!(review.recommendation, Recommendation::Replan);
        assert_eq!(review.quality_score, 0.5);
        assert!(review.needs_more_data);
    }

    #[test]
    fn finished_plan_and_answer_proceeds() {
        let review = rule_based(&input(
            vec![call("completed")],
            Some("Two delivery emails arrived"),
            vec![item("1", TaskStatus::Completed)],
        ));
        assert_eq!(review.recommendation, Recommendation::Proceed);
        assert_eq!(review.completeness, 1.0);
        assert!(review.relevance > 0.5);
    }

    async fn model_verdict(reply: &str) -> Review {
        let model = Arc::new(crate::testing::ScriptedModel::queue(vec![crate::testing::text(reply)]));
        let reviewer = Reviewer { models: ModelRegistry::new(model), timeout: Duration::from_secs(5) };
        let (reviewer, _) = Actor::spawn(None, reviewer, ()).await.unwrap();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let input = Arc::new(input(vec![call("completed")], None, vec![]));
        let reply = ReviewReply::new(input.clone(), move |review| drop(sender.send(review)));
        let kind = ReviewerKind::Model { model: None };
        reviewer
            .cast(ReviewerMsg::Review { kind, agent_model: None, input, reply, span: tracing::Span::none() })
            .unwrap();
        receiver.await.unwrap()
    }

    #[tokio::test]
    async fn a_model_review_is_validated_against_the_schema() {
        let review = model_verdict(
            r#"Verdict: {"quality_score": 0.9, "completeness": 0.4, "relevance": 1.0, "needs_more_data": true,
               "gaps": ["dates"], "suggested_actions": [{"tool": "search", "arguments": {"q": "dates"},
               "reason": "find the dates"}, "then answer"], "recommendation": "gather_more", "notes": "check dates"}"#,
        )
        .await;
        assert_eq!(review.status, ReviewStatus::Ok);
        assert_eq!(review.recommendation, Recommendation::GatherMore);
        assert_eq!(review.gaps, vec!["dates".to_owned()]);
        let search = SuggestedAction {
            tool: Some("search".into()),
            arguments: Some(serde_json::json!({"q": "dates"})),
            reason: "find the dates".into(),
        };
        assert_eq!(review.suggested_actions, [search, SuggestedAction::reason("then answer")], "typed, or a string");
    }

    #[tokio::test]
    async fn a_bad_model_review_falls_back_to_the_rules_marked_degraded() {
        for reply in [
            "no json here",
            r#"{"quality_score": 3, "completeness": 0, "relevance": 0, "needs_more_data": false, "recommendation": "proceed"}"#,
            r#"{"recommendation": "panic"}"#,
        ] {
            let review = model_verdict(reply).await;
            assert_eq!(review.status, ReviewStatus::Degraded, "{reply}");
            assert_eq!(review.usage, crate::testing::usage(), "the failed review's call is paid for");
            assert_eq!(
                Review { usage: Usage::default(), ..review.clone() },
                degraded(
                    &input(vec![call("completed")], None, vec![]),
                    &review.notes[..review.notes.find(';').unwrap()]
                )
            );
        }
    }

    #[test]
    fn dropped_reply_sends_a_degraded_review() {
        let (sender, receiver) = std::sync::mpsc::channel();
        let reply = ReviewReply::new(Arc::new(input(vec![], None, vec![])), move |review| sender.send(review).unwrap());
        drop(reply);
        assert_eq!(receiver.recv().unwrap().status, ReviewStatus::Degraded);
    }
}
