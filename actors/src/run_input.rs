//! What a client sends a parked run ([`RunInput`]) and why it may be refused
//! ([`InputError`]): shared by the runtime, which takes it, and the session,
//! which answers it.

use crate::store::StoreError;

/// What a client sends a parked run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunInput {
    /// The answer to the run's `ask_user` question.
    Text(String),
    /// A decision on a call waiting for approval.
    Approval {
        /// The call; may be left out when only one call waits.
        call_id: Option<String>,
        /// Run it, or not.
        approved: bool,
        /// Why; the model sees it on a rejection.
        reason: Option<String>,
    },
}

impl From<String> for RunInput {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<&str> for RunInput {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

/// Why input was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    /// No such run.
    #[error("run not found")]
    NotFound,
    /// The run is not waiting for input.
    #[error("the run is not waiting for input")]
    NotWaiting,
    /// The input does not fit what the run waits for (no question is open, no
    /// such call waits for approval, several calls wait and none was named).
    #[error("{0}")]
    Invalid(String),
    /// The runtime is stopping or broken.
    #[error("the runtime is not accepting input")]
    Unavailable,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
