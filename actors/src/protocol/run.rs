//! Runs: ids, what a client asks for (`RunSpec`, `Limits`), where a run stands
//! (`RunStatus`) and what it spent (`Usage`).

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An id that is a UUID v7 (so ids sort by creation time), with its display,
/// parsing and serde as the UUID's text.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A new, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"type": "string", "format": "uuid"})
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(text).map(Self)
            }
        }
    };
}

uuid_id!(
    /// A run's id: a UUID v7, so ids sort by creation time.
    RunId
);

uuid_id!(
    /// A thread's id (a conversation: runs that follow each other), a UUID v7.
    ThreadId
);

/// Per-run bounds. Every loop of a run ends on one of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Turns before the run is forced into one last tool-free synthesis call.
    pub max_turns: u32,
    /// Tool calls of one turn that run at the same time.
    pub max_parallel_tools: usize,
    /// Total tokens (input + output) the run may spend; `None` means unbounded.
    pub max_tokens: Option<u64>,
    /// Total cost in USD the run may spend; `None` means unbounded.
    pub max_cost_usd: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_turns: 15, max_parallel_tools: 4, max_tokens: None, max_cost_usd: None }
    }
}

impl Limits {
    /// Why these limits cannot be asked for, if they cannot: a run needs a turn
    /// and a tool slot, and a budget is a positive amount (a budget of 0 or below
    /// would stop the run before its first call). Checked where a client or an
    /// agent file sets limits; a sub-run's budget, what is left of its caller's,
    /// may be spent already.
    pub fn check(&self) -> Result<(), String> {
        if self.max_turns == 0 || self.max_parallel_tools == 0 {
            return Err("max_turns and max_parallel_tools must be at least 1".to_owned());
        }
        if self.max_tokens == Some(0) {
            return Err("max_tokens must be at least 1 (leave it out for no bound)".to_owned());
        }
        if let Some(cost) = self.max_cost_usd
            && !(cost.is_finite() && cost > 0.0)
        {
            return Err(format!(
                "max_cost_usd must be a positive number of USD, not {cost} (leave it out for no bound)"
            ));
        }
        Ok(())
    }
}

/// What a client asks for: one request to one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunSpec {
    /// The configured agent that answers.
    pub agent: String,
    /// The user's request.
    pub input: String,
    /// Overrides of the agent's limits; `None` keeps the agent's.
    #[serde(default)]
    pub limits: Option<Limits>,
}

/// Where a run is in its life. Terminal states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Accepted, its session not started yet.
    Queued,
    /// A session is driving it.
    Running,
    /// Parked until `input` arrives (an `ask_user` call).
    WaitingInput,
    /// Finished with a final answer.
    Succeeded,
    /// Ended by an error, a budget or a supervision meltdown.
    Failed,
    /// Ended by a client.
    Cancelled,
}

impl RunStatus {
    /// Whether the run can never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }

    /// The snake_case name, as used in metrics labels and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingInput => "waiting_input",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Tokens and money spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost in USD.
    pub cost_usd: f64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Nothing spent.
    pub fn is_zero(&self) -> bool {
        self.input_tokens == 0 && self.output_tokens == 0 && self.cost_usd == 0.0
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}
