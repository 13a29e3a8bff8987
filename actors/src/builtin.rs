//! Built-in tools: the closed set of tools the runtime answers itself, without
//! the tool pool. Their names are known here and nowhere else; the session routes
//! a call to its built-in in one place (`session/tools.rs`).

/// A tool the runtime answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinTool {
    /// `todo_write`: replaces the run's plan, through its planner. Offered to
    /// every agent.
    TodoWrite,
    /// `ask_user`: parks the run until the user answers. Offered to every agent.
    AskUser,
    /// `list_agents`: the configured agents. Offered to agents that name it.
    ListAgents,
    /// `run_agent`: a sub-run of another agent. Offered to agents that name it.
    RunAgent,
}

impl BuiltinTool {
    /// Every built-in tool.
    pub const ALL: [Self; 4] = [Self::TodoWrite, Self::AskUser, Self::ListAgents, Self::RunAgent];

    /// The built-in tool called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|tool| tool.name() == name)
    }

    /// The tool's name, as the model calls it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::TodoWrite => "todo_write",
            Self::AskUser => "ask_user",
            Self::ListAgents => "list_agents",
            Self::RunAgent => "run_agent",
        }
    }

    /// Whether an agent has it only by naming it among its tools (`list_agents`,
    /// `run_agent`); the others are offered to every agent, and the session
    /// answers them without a `started` record.
    pub const fn opt_in(self) -> bool {
        matches!(self, Self::ListAgents | Self::RunAgent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_found_by_its_name_and_nothing_else_is() {
        for tool in BuiltinTool::ALL {
            assert_eq!(BuiltinTool::from_name(tool.name()), Some(tool));
        }
        assert_eq!(BuiltinTool::from_name("echo"), None);
    }
}
