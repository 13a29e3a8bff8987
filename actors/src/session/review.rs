//! The review and what follows it: every turn is reviewed exactly once (from
//! `request_review`), and the verdict decides the next step: answer, go on,
//! reflect once more, or the synthesis turn. `finish` ends the run.

use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef};
use tracing::{info, warn};

use crate::builtin::BuiltinTool;
use crate::config::ReviewerKind;
use crate::metrics;
use crate::protocol::{CallStatus, EventKind, Recommendation, Review, RunStatus};
use crate::reviewer::{ReviewInput, ReviewReply, ReviewerMsg};
use crate::session::outbox::started_record;
use crate::session::prompt::{self, resolve_citations};
use crate::session::state::{Live, Phase};
use crate::session::{Session, SessionMsg};
use crate::store::StoreWrite;
use crate::tool_pool::WorkItem;

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
        let calls = match &live.phase {
            Phase::Tools(tools) => tools.results.iter().flatten().cloned().collect(),
            _ => Vec::new(),
        };
        let input = Arc::new(ReviewInput {
            turn,
            request: live.run.input.clone(),
            plan: live.plan.clone(),
            calls,
            final_answer: final_answer.clone(),
            blocked_tools: live.ledger.blocked_tools(turn + 1),
            synthesis,
            ungrounded: live.agent.grounded && !live.ledger.any_success(&live.agent.tools),
        });
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
        metrics::review(
            review.recommendation.as_str(),
            review.status == crate::protocol::ReviewStatus::Degraded,
            review.quality_score,
            review.completeness,
            review.relevance,
        );
        if let (Recommendation::Replan, Some(items)) = (review.recommendation, review.updated_plan.clone()) {
            self.replan(myself, live, items).await?;
        }
        live.outbox.emit(EventKind::Review { turn, review: Box::new(review.clone()) });
        live.outbox.write(StoreWrite::Review { turn, review: review.clone() });
        // A review that asks for nothing is not shown to the model: "go on" is what
        // the model does anyway, and a small model takes any text it reads last
        // for the request, or copies it.
        if review.recommendation != Recommendation::Proceed {
            live.append_message(turn, prompt::review_message(turn, &review));
        }
        live.outbox.emit(EventKind::TurnEnd { turn });
        metrics::turn_finished(live.turn_clock.elapsed());
        let verdict = Verdict { turn, final_answer, synthesis, recommendation: review.recommendation };
        self.next_step(myself, live, verdict).await
    }

    /// After a reviewed turn: answer, continue, or force the synthesis turn.
    pub(super) async fn next_step(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        verdict: Verdict,
    ) -> Result<(), ActorProcessingErr> {
        let Verdict { turn, final_answer, synthesis, recommendation } = verdict;
        let max_turns = live.run.limits.max_turns;
        match final_answer {
            Some(answer) => {
                let not_an_answer = crate::answer::not_an_answer(&answer);
                let reflect = !synthesis
                    && (recommendation == Recommendation::GatherMore || not_an_answer.is_some())
                    && live.reflections < self.shared.config.max_reflections
                    && turn < max_turns;
                if reflect {
                    live.reflections += 1;
                    self.start_turn(myself, live, turn + 1).await
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
        if let Phase::Tools(tools) | Phase::WaitingInput(tools) = &live.phase {
            // Calls still running are cut off by the cancel; record them as interrupted.
            for index in 0..tools.next.min(tools.calls.len()) {
                let call = &tools.calls[index];
                // Calls the session answers itself leave no `started` record.
                let answered_here = BuiltinTool::from_name(&call.name).is_some_and(|tool| !tool.opt_in());
                if tools.results[index].is_none() && !answered_here {
                    let mut record = started_record(&WorkItem {
                        run_id: live.run.run_id,
                        turn: tools.turn,
                        index,
                        call: call.clone(),
                        ledger: live.ledger.clone(),
                        cancel: live.cancel.clone(),
                    });
                    record.status = CallStatus::Interrupted;
                    record.error = Some("interrupted".to_owned());
                    live.outbox.writes.push(StoreWrite::ToolExecution(record));
                }
            }
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

/// Whether the run's review is the rule-based one: the reviewer computes it in
/// microseconds, in this process, so what ends a turn can wait for it and commit
/// with it (one commit a turn fewer). A model-backed review takes a model call;
/// the turn commits before it is asked.
fn review_is_instant(live: &Live) -> bool {
    matches!(live.agent.reviewer, ReviewerKind::RuleBased)
}
