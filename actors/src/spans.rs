//! The spans of a run, named and attributed after the OpenTelemetry GenAI
//! semantic conventions, so a trace backend shows a run as the tree
//! `invoke_agent AGENT` → `turn` → `chat MODEL` / `execute_tool TOOL` / `review`
//! (→ `chat MODEL` of a model-backed review). They are `tracing` spans: the
//! binary decides where they go (a log line's context, an OTLP exporter). The
//! run's own span is made by its session (`session/mod.rs`).

use std::sync::OnceLock;

use tracing::{Span, field::Empty, info_span};

use crate::protocol::Usage;

/// How spans join traces outside the process (W3C trace context), given by the
/// binary that exports them; without it nothing is linked and no run has a
/// trace id.
#[derive(Debug, Clone, Copy)]
pub struct RemoteParents {
    /// Makes a span (not yet entered) the child of the span a `traceparent` names.
    pub adopt: fn(&Span, &str),
    /// The `traceparent` of a span, if it is traced.
    pub traceparent: fn(&Span) -> Option<String>,
    /// The trace id of a span (32 hex digits), if it is traced.
    pub trace_id: fn(&Span) -> Option<String>,
}

static REMOTE: OnceLock<RemoteParents> = OnceLock::new();

/// Installs `hooks` for this process (once; later calls change nothing).
pub fn set_remote_parents(hooks: RemoteParents) {
    let _ = REMOTE.set(hooks);
}

/// Makes `span` the child of the span `traceparent` names, where traces are exported.
pub fn adopt(span: &Span, traceparent: &str) {
    if let Some(hooks) = REMOTE.get() {
        (hooks.adopt)(span, traceparent);
    }
}

/// The `traceparent` of `span`, where traces are exported.
pub fn traceparent(span: &Span) -> Option<String> {
    REMOTE.get().and_then(|hooks| (hooks.traceparent)(span))
}

/// The trace id of `span`, where traces are exported.
pub fn trace_id(span: &Span) -> Option<String> {
    REMOTE.get().and_then(|hooks| (hooks.trace_id)(span))
}

/// Whether spans are exported (the hooks are installed). The OpenTelemetry
/// fields (names, GenAI attributes) are recorded only then: a log line shows a
/// span's fields, and those would bury it.
pub fn exporting() -> bool {
    REMOTE.get().is_some()
}

/// A model call of `model` (its provider's id), a child of `parent`. Record its
/// usage with [`record_usage`] once the reply is in.
pub fn chat(parent: &Span, model: &str) -> Span {
    let span = info_span!(
        parent: parent,
        "model_call",
        otel.name = Empty,
        otel.kind = Empty,
        gen_ai.operation.name = Empty,
        gen_ai.request.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
    );
    if exporting() {
        span.record("otel.name", format!("chat {model}"));
        span.record("otel.kind", "client");
        span.record("gen_ai.operation.name", "chat");
        span.record("gen_ai.request.model", model);
    }
    span
}

/// Records what a model call spent on its span.
pub fn record_usage(span: &Span, usage: &Usage) {
    if exporting() {
        span.record("gen_ai.usage.input_tokens", usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", usage.output_tokens);
    }
}

/// A tool call, a child of `parent` (its turn).
pub fn execute_tool(parent: &Span, run_id: crate::protocol::RunId, turn: u32, tool: &str, call_id: &str) -> Span {
    let span = info_span!(
        parent: parent,
        "tool_call",
        %run_id,
        turn,
        tool,
        otel.name = Empty,
        gen_ai.operation.name = Empty,
        gen_ai.tool.name = Empty,
        gen_ai.tool.call.id = Empty,
        gen_ai.tool.type = Empty,
    );
    if exporting() {
        span.record("otel.name", format!("execute_tool {tool}"));
        span.record("gen_ai.operation.name", "execute_tool");
        span.record("gen_ai.tool.name", tool);
        span.record("gen_ai.tool.call.id", call_id);
        span.record("gen_ai.tool.type", "function");
    }
    span
}

/// The review of a turn, a child of `parent` (the turn). A review by the rules
/// runs no model and logs nothing, so its span only shows in an exported trace:
/// where none is exported it is not made (two spans a run fewer to create,
/// format and close).
pub fn review(parent: &Span, turn: u32, reviewer: &str, by_model: bool) -> Span {
    if !by_model && !exporting() {
        return Span::none();
    }
    info_span!(parent: parent, "review", turn, reviewer)
}

/// A run's span, `invoke_agent AGENT` (its session's), not yet entered: it joins
/// the trace `traceparent` names, if given.
pub fn run(run_id: crate::protocol::RunId, run: Option<&crate::store::RunRecord>) -> Span {
    let span = info_span!(
        "run",
        %run_id,
        trace_id = Empty,
        otel.name = Empty,
        gen_ai.operation.name = Empty,
        gen_ai.agent.name = Empty,
        gen_ai.conversation.id = Empty,
        tenant = Empty,
    );
    let Some(run) = run.filter(|_| exporting()) else { return span };
    span.record("otel.name", format!("invoke_agent {}", run.agent));
    span.record("gen_ai.operation.name", "invoke_agent");
    span.record("gen_ai.agent.name", run.agent.as_str());
    span.record("tenant", run.tenant.as_str());
    if let Some(thread_id) = run.thread_id {
        span.record("gen_ai.conversation.id", thread_id.to_string());
    }
    if let Some(traceparent) = &run.traceparent {
        adopt(&span, traceparent);
    }
    if let Some(trace_id) = trace_id(&span) {
        span.record("trace_id", trace_id);
    }
    span
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::with_default;
    use tracing::{Event, Metadata, Subscriber};

    use super::*;

    /// A subscriber that takes every span and counts the ones made.
    #[derive(Default)]
    struct Counting {
        made: AtomicU64,
    }

    impl Subscriber for Counting {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(self.made.fetch_add(1, Ordering::Relaxed) + 1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn a_review_by_the_rules_has_a_span_only_where_traces_are_exported() {
        assert!(!exporting(), "no test of this crate installs the export hooks");
        let subscriber = std::sync::Arc::new(Counting::default());
        with_default(subscriber.clone(), || {
            let turn = info_span!("turn", turn = 1);
            let by_rules = review(&turn, 1, "rule_based", false);
            assert!(by_rules.is_none(), "nothing is logged in it and nothing exports it");
            let by_model = review(&turn, 1, "model", true);
            assert!(!by_model.is_none(), "a model review logs its failures in its span");
        });
        assert_eq!(subscriber.made.load(Ordering::Relaxed), 2, "the turn's span and the model review's");
    }
}
