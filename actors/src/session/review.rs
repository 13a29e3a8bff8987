//! The review and what follows it: every turn is reviewed exactly once (from
//! `request_review`), and the verdict decides the next step: answer, go on,
//! reflect once more, or the synthesis turn. `finish` ends the run.

use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef};
use tracing::{info, warn};

use crate::builtin::BuiltinTool;
use crate::config::ReviewerKind;
use crate::llm::Role;
use crate::metrics;
use crate::protocol::{EventKind, Recommendation, Review, RunStatus, ToolOutcome};
use crate::reviewer::{CallSummary, ReviewInput, ReviewReply, ReviewerMsg};
use crate::session::outbox::started_record;
use crate::session::prompt::{self, resolve_citations};
use crate::session::state::{Live, Phase};
use crate::session::{Session, SessionMsg};
use crate::store::StoreWrite;

/// The `step_end` event of the agent step `turn` took, if it took one: what
/// went in, what came out, how long it took.
fn trace_step(live: &mut Live, turn: u32, final_answer: Option<&str>, calls: &[CallSummary]) {
    let Some(step) = live.step.take_if(|step| step.turn == turn) else { return };
    let (output, status) = match final_answer {
        Some(answer) => (answer.to_owned(), "completed"),
        None => {
            let status = calls.iter().find(|call| call.tool == step.name).map_or("completed", |call| call.status);
            let result = live.conversation.iter().rev().take_while(|message| message.role == Role::Tool).last();
            (result.map(|message| message.content.clone()).unwrap_or_default(), status)
        }
    };
    let output: String = output.chars().take(500).collect();
    let latency_ms = u64::try_from(step.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    live.outbox.emit(EventKind::StepEnd {
        turn,
        order: step.order,
        name: step.name,
        input: step.input,
        output,
        status: status.to_owned(),
        latency_ms,
    });
}

/// A reviewed turn, what the next step is decided from.
pub(super) struct Verdict {
    /// The turn.
    pub(super) turn: u32,
    /// The turn's answer, if its reply had no tool calls.
    pub(super) final_answer: Option<String>,
    /// Whether it was the synthesis turn.
    pub(super) synthesis: bool,
    /// What the reviewer recommends.
    pub(super) recommendation: Recommendation,
    /// With `clarify_query`: the question for the user.
    pub(super) question: Option<String>,
}

impl Verdict {
    /// The verdict of `review` on `turn`.
    pub(super) fn of(turn: u32, final_answer: Option<String>, synthesis: bool, review: &Review) -> Self {
        let question = (review.recommendation == Recommendation::ClarifyQuery).then(|| match &review.question {
            Some(question) => question.clone(),
            None if review.gaps.is_empty() => "Could you say more about what you need?".to_owned(),
            None => format!("Could you say more about what you need? Unclear: {}.", review.gaps.join("; ")),
        });
        Self { turn, final_answer, synthesis, recommendation: review.recommendation, question }
    }
}

impl Session {
    /// Asks the reviewer about `turn`. Every turn of every run passes here exactly
    /// once; the verdict comes back as `Reviewed`.
    pub(super) async fn request_review(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        final_answer: Option<String>,
        synthesis: bool,
    ) -> Result<(), ActorProcessingErr> {
        // What ended the turn commits before a review that takes a model call, and
        // with an instant one (in `on_reviewed`, with the next turn's start or the
        // run's end): nothing acts on it in between but the reviewer.
        if !review_is_instant(live) {
            live.outbox.flush(&self.shared).await?;
        }
        let calls: Vec<CallSummary> = match &live.phase {
            Phase::Tools(tools) => tools.results.iter().flatten().cloned().collect(),
            _ => Vec::new(),
        };
        trace_step(live, turn, final_answer.as_deref(), &calls);
        let input =
            Arc::new(ReviewInput { final_answer: final_answer.clone(), synthesis, ..review_input(live, turn, calls) });
        live.phase = Phase::Review { turn, final_answer, synthesis };
        let session = myself.clone();
        let reply = ReviewReply::new(input.clone(), move |review| {
            let _ = session.cast(SessionMsg::Reviewed { turn, review });
        });
        let message = ReviewerMsg::Review {
            kind: live.agent.reviewer.clone(),
            agent_model: live.agent.model.clone(),
            input,
            reply,
            span: crate::spans::review(
                &live.turn_parent(),
                turn,
                live.agent.reviewer.name(),
                matches!(live.agent.reviewer, ReviewerKind::Model { .. }),
            ),
        };
        // If the reviewer is down, the message (and its reply) is dropped right here,
        // and the reply's drop sends the degraded rule-based review.
        let sent = self.shared.handles.reviewer().is_some_and(|reviewer| reviewer.cast(message).is_ok());
        if !sent {
            warn!(run_id = %live.run.run_id, "reviewer unreachable; using the rules");
        }
        Ok(())
    }

    pub(super) async fn on_reviewed(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        review: Review,
    ) -> Result<(), ActorProcessingErr> {
        let Phase::Review { turn: current, final_answer, synthesis } = std::mem::replace(&mut live.phase, Phase::Idle)
        else {
            return Ok(());
        };
        if current != turn {
            live.phase = Phase::Review { turn: current, final_answer, synthesis };
            return Ok(());
        }
        if let (Recommendation::Replan, Some(items)) = (review.recommendation, review.updated_plan.clone()) {
            self.replan(myself, live, items).await?;
        }
        if !review.usage.is_zero() {
            live.charge(turn, review.usage);
        }
        book_review(live, turn, &review);
        // A review that asks for nothing is not shown to the model: "go on" is what
        // the model does anyway, and a small model takes any text it reads last
        // for the request, or copies it.
        if review.recommendation != Recommendation::Proceed {
            live.append_message(turn, prompt::review_message(turn, &review));
        }
        end_turn(live, turn);
        let verdict = Verdict::of(turn, final_answer, synthesis, &review);
        self.next_step(myself, live, verdict).await
    }

    /// After a reviewed turn: answer, continue, or force the synthesis turn.
    pub(super) async fn next_step(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        verdict: Verdict,
    ) -> Result<(), ActorProcessingErr> {
        let Verdict { turn, final_answer, synthesis, recommendation, question } = verdict;
        let max_turns = live.run.limits.max_turns;
        // An unclear request: the next turn asks the user, as `ask_user` does (for
        // an agent that may ask).
        let may_ask = !live.agent.without_builtins.iter().any(|tool| tool == BuiltinTool::AskUser.name());
        if let Some(question) = question.filter(|_| may_ask && !synthesis && turn < max_turns) {
            live.clarify = Some(question);
            return self.start_turn(myself, live, turn + 1).await;
        }
        match final_answer {
            Some(answer) => {
                // Nor is the question it was last asked (an answer step's words) repeated.
                let asked = live.conversation.iter().rev().skip(1).find(|message| message.role == Role::User);
                let not_an_answer = crate::answer::not_an_answer_to(&live.run.input, &answer)
                    .or_else(|| asked.and_then(|asked| crate::answer::not_an_answer_to(&asked.content, &answer)));
                // A reflecting agent judges its answer itself (below); the review's
                // `gather_more` sends back the answers of the others, once.
                let gather_more = recommendation == Recommendation::GatherMore && !live.agent.reflect;
                let reflect = !synthesis
                    && (gather_more || not_an_answer.is_some())
                    && live.reflections < self.shared.config.max_reflections
                    && turn < max_turns;
                if reflect {
                    live.reflections += 1;
                    self.start_turn(myself, live, turn + 1).await
                } else if not_an_answer.is_none() && live.agent.reflect && !synthesis {
                    self.think(myself, live, turn, Some(answer));
                    Ok(())
                } else if let Some(why) = not_an_answer {
                    // Runtime text or a call written as text is never a final answer,
                    // whatever the review said.
                    let reason = format!("no_answer: the model's last reply was {why}");
                    live.outbox.emit(EventKind::Error { code: "no_answer".to_owned(), message: reason.clone() });
                    self.finish(myself, live, RunStatus::Failed, Some(reason), None).await
                } else {
                    self.finish(myself, live, RunStatus::Succeeded, None, Some(answer)).await
                }
            }
            // A tool turn at the limit is followed by the synthesis turn (max_turns + 1).
            None => self.start_turn(myself, live, turn + 1).await,
        }
    }

    /// Ends the run: final output, `run_end`, status; then stops the session.
    pub(super) async fn finish(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        status: RunStatus,
        reason: Option<String>,
        answer: Option<String>,
    ) -> Result<(), ActorProcessingErr> {
        live.model_task = None;
        live.cancel.cancel();
        let cut_short = match &live.phase {
            Phase::Model { turn, .. } | Phase::Think { turn, answer: None } => Some(*turn),
            Phase::Tools(tools) | Phase::WaitingInput(tools) => Some(tools.turn),
            _ => None,
        };
        if let Phase::Tools(tools) | Phase::WaitingInput(tools) = &live.phase {
            // Calls still running are cut off by the cancel; record them as interrupted.
            for index in 0..tools.next.min(tools.calls.len()) {
                let call = &tools.calls[index];
                // Calls the session answers itself leave no `started` record.
                let answered_here = BuiltinTool::from_name(&call.name).is_some_and(|tool| !tool.opt_in());
                if tools.results[index].is_none() && !answered_here {
                    let work = live.work(tools.turn, index, call.clone(), live.cancel.clone());
                    let record = started_record(&self.shared, &work).ended(&ToolOutcome::Interrupted);
                    live.outbox.writes.push(StoreWrite::ToolExecution(record));
                }
            }
        }
        // A turn cut short (a model error, a cancel) is reviewed too, before the run ends.
        if let Some(turn) = cut_short {
            let why = reason.clone().unwrap_or_else(|| status.as_str().to_owned());
            self.review_cut_short(live, turn, why).await;
        }
        if let Some(text) = answer {
            let citations = resolve_citations(&text, &live.ledger.documents());
            live.outbox.write(StoreWrite::FinalOutput(text.clone()));
            live.outbox.emit(EventKind::FinalOutput { text, citations });
        }
        live.outbox.emit(EventKind::RunEnd { status, reason: reason.clone() });
        live.outbox.write(StoreWrite::Status { status, reason: reason.clone() });
        live.run.status = status;
        live.phase = Phase::Finished;
        live.outbox.flush(&self.shared).await?;
        self.shared.hub.close(live.run.run_id);
        metrics::run_finished(&live.agent.name, status.as_str());
        info!(run_id = %live.run.run_id, status = status.as_str(), reason = reason.as_deref().unwrap_or(""), "run finished");
        // Stopping the session also stops its planner (a linked child).
        myself.stop(None);
        Ok(())
    }
}

impl Session {
    /// Reviews `turn`, which the run ends with before it finished: the reviewer
    /// judges it by the rules, at once (a reviewer that does not answer within
    /// [`CUT_SHORT_REVIEW_WAIT`] is replaced by the rules here).
    async fn review_cut_short(&self, live: &mut Live, turn: u32, why: String) {
        let calls = match &live.phase {
            Phase::Tools(tools) | Phase::WaitingInput(tools) => (0..tools.next.min(tools.calls.len()))
                .map(|index| {
                    tools.results[index].clone().unwrap_or_else(|| CallSummary {
                        tool: tools.calls[index].name.clone(),
                        status: "interrupted",
                        skip: None,
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let input = Arc::new(ReviewInput { ended: Some(why), ..review_input(live, turn, calls) });
        let (send, receive) = tokio::sync::oneshot::channel();
        let reply = ReviewReply::new(input.clone(), move |review| {
            let _ = send.send(review);
        });
        let message = ReviewerMsg::Review {
            kind: live.agent.reviewer.clone(),
            agent_model: live.agent.model.clone(),
            input: input.clone(),
            reply,
            span: crate::spans::review(&live.turn_parent(), turn, "rule_based", false),
        };
        // An unreachable reviewer drops the message, whose reply then sends the rules' review.
        if let Some(reviewer) = self.shared.handles.reviewer() {
            let _ = reviewer.cast(message);
        }
        let review = match tokio::time::timeout(CUT_SHORT_REVIEW_WAIT, receive).await {
            Ok(Ok(review)) => review,
            _ => crate::reviewer::degraded(&input, "the reviewer did not answer"),
        };
        book_review(live, turn, &review);
        end_turn(live, turn);
    }
}

/// What the reviewer sees of `turn` with `calls`: no answer, not the synthesis
/// turn, not cut short (callers set what differs).
fn review_input(live: &Live, turn: u32, calls: Vec<CallSummary>) -> ReviewInput {
    ReviewInput {
        turn,
        request: live.run.input.clone(),
        plan: live.plan.clone(),
        calls,
        final_answer: None,
        blocked_tools: live.ledger.blocked_tools(turn + 1),
        synthesis: false,
        ungrounded: live.agent.grounded && !live.ledger.any_success(&live.agent.tools),
        ended: None,
    }
}

/// How long the review of a turn cut short may take (it is the rules': microseconds).
const CUT_SHORT_REVIEW_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Records `review` of `turn`: metrics, the event, the store.
fn book_review(live: &mut Live, turn: u32, review: &Review) {
    metrics::review(
        review.recommendation.as_str(),
        review.status == crate::protocol::ReviewStatus::Degraded,
        review.quality_score,
        review.completeness,
        review.relevance,
    );
    live.outbox.emit(EventKind::Review { turn, review: Box::new(review.clone()) });
    live.outbox.write(StoreWrite::Review { turn, review: review.clone() });
}

/// `turn_end` of `turn`.
fn end_turn(live: &mut Live, turn: u32) {
    live.outbox.emit(EventKind::TurnEnd { turn });
    live.turn_span = tracing::Span::none();
    metrics::turn_finished(live.turn_clock.elapsed());
}

/// Whether the run's review is the rule-based one: the reviewer computes it in
/// microseconds, in this process, so what ends a turn can wait for it and commit
/// with it (one commit a turn fewer). A model-backed review takes a model call;
/// the turn commits before it is asked.
fn review_is_instant(live: &Live) -> bool {
    matches!(live.agent.reviewer, ReviewerKind::RuleBased)
}
