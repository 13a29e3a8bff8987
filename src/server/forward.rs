//! Input, approvals and cancels for a run that another node drives (several
//! daemons on one PostgreSQL store). The node that took the request stores it as
//! a row of `run_commands` and notifies; the run's owner takes the row, applies
//! it through its runtime as if the request had come to it, and writes the
//! outcome, which the first node answers with. A command waits in the table while
//! its run changes hands (the next owner applies it).

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use troupe_actors::Runtime;
use troupe_actors::protocol::RunId;
use troupe_actors::runtime::RunInput;

use super::error::ApiError;
use crate::store::Membership;

/// The channel that tells owners a command waits.
pub const COMMAND_CHANNEL: &str = "troupe_command";

/// How long the node that took a request waits for the run's owner to take it;
/// past it, a command nobody took is withdrawn and the client gets 503.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the waiting node looks for the outcome.
const POLL: Duration = Duration::from_millis(20);

/// What a client asked of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// `POST /v1/runs/{id}/cancel`.
    Cancel,
    /// `POST /v1/runs/{id}/input` with an answer.
    Text {
        /// The answer.
        text: String,
    },
    /// `POST /v1/runs/{id}/input` with a decision on a call.
    Approval {
        /// The call.
        call_id: Option<String>,
        /// Run it, or not.
        approved: bool,
        /// Why.
        reason: Option<String>,
    },
}

impl From<RunInput> for Command {
    fn from(input: RunInput) -> Self {
        match input {
            RunInput::Text(text) => Self::Text { text },
            RunInput::Approval { call_id, approved, reason } => Self::Approval { call_id, approved, reason },
        }
    }
}

impl Command {
    /// Applies the command to a run this node drives.
    async fn apply(self, runtime: &Runtime, run_id: RunId) -> Result<(), ApiError> {
        match self {
            Self::Cancel => Ok(runtime.cancel(run_id).await?),
            Self::Text { text } => Ok(runtime.input(run_id, RunInput::Text(text)).await?),
            Self::Approval { call_id, approved, reason } => {
                Ok(runtime.input(run_id, RunInput::Approval { call_id, approved, reason }).await?)
            }
        }
    }
}

/// How a command went, as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    status: u16,
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Whether a request about `run_id` goes to another node: in a cluster, for a
/// run this node does not drive.
pub(super) fn elsewhere(cluster: Option<&Membership>, run_id: RunId) -> Option<&Membership> {
    cluster.filter(|membership| !membership.node.owns(run_id))
}

/// Hands `command` to the node that drives `run_id` and returns its outcome.
pub(super) async fn forward(membership: &Membership, run_id: RunId, command: Command) -> Result<(), ApiError> {
    let store_failed = |error: sqlx::Error| {
        tracing::error!(%error, "cannot forward a command to the run's node");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", "the run store failed; try again")
    };
    let body = serde_json::to_string(&command).map_err(|error| ApiError::invalid(error.to_string()))?;
    let mut tx = membership.pool.begin().await.map_err(store_failed)?;
    let id: i64 = sqlx::query_scalar("INSERT INTO run_commands (run_id, body) VALUES ($1, $2) RETURNING id")
        .bind(run_id.to_string())
        .bind(&body)
        .fetch_one(&mut *tx)
        .await
        .map_err(store_failed)?;
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(COMMAND_CHANNEL)
        .bind(run_id.to_string())
        .execute(&mut *tx)
        .await
        .map_err(store_failed)?;
    tx.commit().await.map_err(store_failed)?;
    let started = Instant::now();
    loop {
        tokio::time::sleep(POLL).await;
        let row: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT outcome, taken_by FROM run_commands WHERE id = $1")
                .bind(id)
                .fetch_optional(&membership.pool)
                .await
                .map_err(store_failed)?;
        let taken = match row {
            Some((Some(outcome), _)) => {
                let _ = sqlx::query("DELETE FROM run_commands WHERE id = $1").bind(id).execute(&membership.pool).await;
                return answer(&outcome);
            }
            Some((None, taken)) => taken.is_some(),
            None => false,
        };
        // Withdrawn only if nobody took it; a command being applied is waited for.
        if started.elapsed() >= FORWARD_TIMEOUT && !taken {
            let withdrawn = sqlx::query("DELETE FROM run_commands WHERE id = $1 AND taken_by IS NULL")
                .bind(id)
                .execute(&membership.pool)
                .await
                .map_err(store_failed)?;
            if withdrawn.rows_affected() == 1 {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "no node took the request for this run in time (it may be changing hands); try again",
                )
                .retry_after(1));
            }
        }
    }
}

/// The stored outcome as the answer to the client.
fn answer(outcome: &str) -> Result<(), ApiError> {
    let outcome: Outcome = serde_json::from_str(outcome).map_err(|_| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", "a bad command outcome was stored")
    })?;
    if outcome.status < 300 {
        return Ok(());
    }
    let status = StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    Err(ApiError::new(status, known_code(&outcome.code), outcome.message))
}

/// The error codes input and cancel answer with, as the static strings an
/// [`ApiError`] holds.
fn known_code(code: &str) -> &'static str {
    const CODES: &[&str] = &[
        "not_found",
        "not_waiting",
        "invalid_input",
        "already_ended",
        "unavailable",
        "store_error",
        "invalid_request",
    ];
    CODES.iter().find(|known| **known == code).copied().unwrap_or("unavailable")
}

/// Takes the waiting commands for runs this node owns, applies them in order, and
/// stores their outcomes.
pub async fn apply_commands(membership: &Membership, runtime: &Runtime) -> Result<(), sqlx::Error> {
    let taken: Vec<(i64, String, String)> = sqlx::query_as(
        "UPDATE run_commands SET taken_by = $1 WHERE id IN (SELECT c.id FROM run_commands c \
         JOIN runs r ON r.run_id = c.run_id WHERE c.taken_by IS NULL AND r.owner = $1 \
         ORDER BY c.id LIMIT 64 FOR UPDATE OF c SKIP LOCKED) RETURNING id, run_id, body",
    )
    .bind(&membership.node.id)
    .fetch_all(&membership.pool)
    .await?;
    let mut taken = taken;
    taken.sort_by_key(|(id, _, _)| *id);
    for (id, run_id, body) in taken {
        let result = match (run_id.parse::<RunId>(), serde_json::from_str::<Command>(&body)) {
            (Ok(run_id), Ok(command)) => command.apply(runtime, run_id).await,
            _ => Err(ApiError::invalid("a malformed command was stored")),
        };
        let outcome = match result {
            Ok(()) => Outcome { status: 200, code: String::new(), message: String::new() },
            Err(error) => {
                Outcome { status: error.status.as_u16(), code: error.code.to_owned(), message: error.message }
            }
        };
        let outcome = serde_json::to_string(&outcome).unwrap_or_default();
        sqlx::query("UPDATE run_commands SET outcome = $2 WHERE id = $1")
            .bind(id)
            .bind(outcome)
            .execute(&membership.pool)
            .await?;
    }
    Ok(())
}
