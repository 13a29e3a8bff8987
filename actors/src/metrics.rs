//! Every metric troupe exports, by name, and the helpers that record them through
//! the `metrics` facade. No other module spells a metric name. Labels are bounded
//! sets (agent, tool, model, status, reason); run ids never become labels.
#![allow(clippy::disallowed_macros)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, Recorder, counter, gauge, histogram};

/// Runs accepted, by agent.
pub const RUNS_STARTED_TOTAL: &str = "troupe_runs_started_total";
/// Runs that reached a terminal state, by agent and status.
pub const RUNS_FINISHED_TOTAL: &str = "troupe_runs_finished_total";
/// Runs with a live session.
pub const RUNS_ACTIVE: &str = "troupe_runs_active";
/// Runs waiting in the run queue for a slot.
pub const RUNS_QUEUED: &str = "troupe_runs_queued";
/// Runs resumed from the store after a restart.
pub const RUNS_RECOVERED_TOTAL: &str = "troupe_runs_recovered_total";
/// Submissions refused by admission control, by reason.
pub const ADMISSION_REJECTED_TOTAL: &str = "troupe_admission_rejected_total";
/// Turns completed.
pub const TURNS_TOTAL: &str = "troupe_turns_total";
/// Wall time of a turn.
pub const TURN_DURATION_SECONDS: &str = "troupe_turn_duration_seconds";
/// Tool calls, by tool and final status.
pub const TOOL_CALLS_TOTAL: &str = "troupe_tool_calls_total";
/// Wall time of a tool call, by tool.
pub const TOOL_CALL_DURATION_SECONDS: &str = "troupe_tool_call_duration_seconds";
/// Calls the hook chain skipped, by tool and reason.
pub const TOOL_CALLS_SKIPPED_TOTAL: &str = "troupe_tool_calls_skipped_total";
/// Times a tool became blocked by the failure rule, by tool.
pub const TOOLS_BLOCKED_TOTAL: &str = "troupe_tools_blocked_total";
/// Calls waiting in the tool pool's queue.
pub const TOOL_QUEUE_DEPTH: &str = "troupe_tool_queue_depth";
/// Model requests, by model and status.
pub const MODEL_REQUESTS_TOTAL: &str = "troupe_model_requests_total";
/// Wall time of a model request, by model.
pub const MODEL_REQUEST_DURATION_SECONDS: &str = "troupe_model_request_duration_seconds";
/// Model tokens, by model and direction (input, output).
pub const MODEL_TOKENS_TOTAL: &str = "troupe_model_tokens_total";
/// Money spent on models, by model, in millionths of a USD (counters are integers;
/// divide by 1e6 in queries).
pub const COST_MICRODOLLARS_TOTAL: &str = "troupe_cost_microdollars_total";
/// Review scores, by dimension (quality, completeness, relevance).
pub const REVIEW_SCORE: &str = "troupe_review_score";
/// Reviews, by recommendation and status.
pub const REVIEWS_TOTAL: &str = "troupe_reviews_total";
/// Finished runs deleted by retention.
pub const RETENTION_DELETED_RUNS_TOTAL: &str = "troupe_retention_deleted_runs_total";
/// The store's size in bytes, as of the last retention sweep.
pub const STORE_SIZE_BYTES: &str = "troupe_store_size_bytes";
/// Actor restarts by supervision, by actor kind.
pub const ACTOR_RESTARTS_TOTAL: &str = "troupe_actor_restarts_total";
/// Runs failed because their session crashed too often.
pub const SUPERVISOR_MELTDOWNS_TOTAL: &str = "troupe_supervisor_meltdowns_total";

/// Prompt tokens of the local model, by model and source (`cache`: served from
/// the KV cache of an earlier request; `computed`: processed).
pub const LOCAL_MODEL_PROMPT_TOKENS_TOTAL: &str = "troupe_local_model_prompt_tokens_total";
/// Tokens the local model generated, by model.
pub const LOCAL_MODEL_GENERATED_TOKENS_TOTAL: &str = "troupe_local_model_generated_tokens_total";
/// Requests waiting for a sequence of the local model, by model.
pub const LOCAL_MODEL_QUEUE_DEPTH: &str = "troupe_local_model_queue_depth";
/// Retries of model requests, by model and reason (`429`, `5xx`, `connect`, `timeout`).
pub const MODEL_RETRIES_TOTAL: &str = "troupe_model_retries_total";
/// OpenTelemetry GenAI: duration of a model call, streaming included, by model.
pub const GEN_AI_CLIENT_OPERATION_DURATION_SECONDS: &str = "gen_ai_client_operation_duration_seconds";
/// OpenTelemetry GenAI: tokens per model call, by model and token type (input, output).
pub const GEN_AI_CLIENT_TOKEN_USAGE: &str = "gen_ai_client_token_usage";

/// Runs this node owns in a cluster (several daemons on one PostgreSQL).
pub const CLUSTER_LEASES_HELD: &str = "troupe_cluster_leases_held";
/// Runs this node claimed, by kind (`orphaned`: its owner stopped renewing its
/// lease or gave it up; `start`: left by this node's earlier process).
pub const CLUSTER_CLAIMS_TOTAL: &str = "troupe_cluster_claims_total";
/// Runs this node took over from a node that stopped without giving them up.
pub const CLUSTER_TAKEOVERS_TOTAL: &str = "troupe_cluster_takeovers_total";
/// Commits refused because another node owns their run now.
pub const CLUSTER_FENCED_COMMITS_TOTAL: &str = "troupe_cluster_fenced_commits_total";

/// HTTP requests answered, by method, route template and status code.
pub const HTTP_REQUESTS_TOTAL: &str = "troupe_http_requests_total";
/// Time to answer an HTTP request (to the response head), by method and route.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "troupe_http_request_duration_seconds";
/// HTTP requests being answered.
pub const HTTP_REQUESTS_IN_FLIGHT: &str = "troupe_http_requests_in_flight";
/// Open SSE event streams.
pub const SSE_CLIENTS: &str = "troupe_sse_clients";
/// SSE streams refused because of the stream limits, by scope (global, tenant).
pub const SSE_REJECTED_TOTAL: &str = "troupe_sse_rejected_total";

/// Buckets (seconds) for every duration histogram.
pub const DURATION_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Buckets for token counts per model call.
pub const TOKEN_BUCKETS: &[f64] =
    &[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0];

/// Buckets for review scores in 0..=1.
pub const SCORE_BUCKETS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// A run was accepted.
pub fn run_started(agent: &str) {
    with_counter(RUNS_STARTED_TOTAL, &[("agent", agent)], |counter| counter.increment(1));
}

/// A run ended with `status`.
pub fn run_finished(agent: &str, status: &'static str) {
    with_counter(RUNS_FINISHED_TOTAL, &[("agent", agent), ("status", status)], |counter| counter.increment(1));
}

/// The number of live sessions.
pub fn runs_active(count: usize) {
    with_gauge(RUNS_ACTIVE, &[], |gauge| gauge.set(count as f64));
}

/// The number of runs waiting for a slot.
pub fn runs_queued(count: usize) {
    with_gauge(RUNS_QUEUED, &[], |gauge| gauge.set(count as f64));
}

/// A run was resumed from the store.
pub fn run_recovered() {
    counter!(RUNS_RECOVERED_TOTAL).increment(1);
}

/// A submission was refused.
pub fn admission_rejected(reason: &'static str) {
    counter!(ADMISSION_REJECTED_TOTAL, "reason" => reason).increment(1);
}

/// A turn finished after `elapsed`.
pub fn turn_finished(elapsed: Duration) {
    with_counter(TURNS_TOTAL, &[], |counter| counter.increment(1));
    with_histogram(TURN_DURATION_SECONDS, &[], |histogram| histogram.record(elapsed.as_secs_f64()));
}

/// The `tool` label of a call to a tool that is not registered.
pub const UNKNOWN_TOOL: &str = "unknown";

/// A tool call ended with `status` after `elapsed`.
pub fn tool_call(tool: &str, status: &'static str, elapsed: Duration) {
    with_counter(TOOL_CALLS_TOTAL, &[("tool", tool), ("status", status)], |counter| counter.increment(1));
    with_histogram(TOOL_CALL_DURATION_SECONDS, &[("tool", tool)], |histogram| {
        histogram.record(elapsed.as_secs_f64());
    });
}

/// The hook chain skipped a call.
pub fn tool_skipped(tool: &str, reason: &'static str) {
    counter!(TOOL_CALLS_SKIPPED_TOTAL, "tool" => tool.to_owned(), "reason" => reason).increment(1);
}

/// A tool became blocked.
pub fn tool_blocked(tool: &str) {
    counter!(TOOLS_BLOCKED_TOTAL, "tool" => tool.to_owned()).increment(1);
}

/// The tool pool's queue depth.
pub fn tool_queue_depth(depth: usize) {
    with_gauge(TOOL_QUEUE_DEPTH, &[], |gauge| gauge.set(depth as f64));
}

/// A model request ended with `status` after `elapsed`.
pub fn model_request(model: &str, status: &'static str, elapsed: Duration) {
    with_counter(MODEL_REQUESTS_TOTAL, &[("model", model), ("status", status)], |counter| counter.increment(1));
    with_histogram(MODEL_REQUEST_DURATION_SECONDS, &[("model", model)], |histogram| {
        histogram.record(elapsed.as_secs_f64());
    });
}

/// Tokens and cost of one model request.
pub fn model_usage(model: &str, input_tokens: u64, output_tokens: u64, cost_usd: f64) {
    with_counter(MODEL_TOKENS_TOTAL, &[("model", model), ("direction", "input")], |counter| {
        counter.increment(input_tokens);
    });
    with_counter(MODEL_TOKENS_TOTAL, &[("model", model), ("direction", "output")], |counter| {
        counter.increment(output_tokens);
    });
    with_counter(COST_MICRODOLLARS_TOTAL, &[("model", model)], |counter| {
        counter.increment((cost_usd * 1e6).round() as u64);
    });
}

/// A model request is retried.
pub fn model_retry(model: &str, reason: &'static str) {
    counter!(MODEL_RETRIES_TOTAL, "model" => model.to_owned(), "reason" => reason).increment(1);
}

/// The local model took a prompt: `cached` tokens came from the KV cache,
/// `computed` were processed.
pub fn local_model_prompt(model: &str, cached: u64, computed: u64) {
    counter!(LOCAL_MODEL_PROMPT_TOKENS_TOTAL, "model" => model.to_owned(), "source" => "cache").increment(cached);
    counter!(LOCAL_MODEL_PROMPT_TOKENS_TOTAL, "model" => model.to_owned(), "source" => "computed").increment(computed);
}

/// The local model generated `tokens` tokens for one request.
pub fn local_model_generated(model: &str, tokens: u64) {
    counter!(LOCAL_MODEL_GENERATED_TOKENS_TOTAL, "model" => model.to_owned()).increment(tokens);
}

/// Requests waiting for a sequence of the local model.
pub fn local_model_queue_depth(model: &str, depth: usize) {
    gauge!(LOCAL_MODEL_QUEUE_DEPTH, "model" => model.to_owned()).set(depth as f64);
}

/// A model call ended (OpenTelemetry GenAI names).
pub fn gen_ai_operation(model: &str, elapsed: Duration, input_tokens: u64, output_tokens: u64) {
    with_histogram(GEN_AI_CLIENT_OPERATION_DURATION_SECONDS, &[("model", model)], |histogram| {
        histogram.record(elapsed.as_secs_f64());
    });
    with_histogram(GEN_AI_CLIENT_TOKEN_USAGE, &[("model", model), ("token_type", "input")], |histogram| {
        histogram.record(input_tokens as f64);
    });
    with_histogram(GEN_AI_CLIENT_TOKEN_USAGE, &[("model", model), ("token_type", "output")], |histogram| {
        histogram.record(output_tokens as f64);
    });
}

/// A review was made.
pub fn review(recommendation: &'static str, degraded: bool, quality: f64, completeness: f64, relevance: f64) {
    let status = if degraded { "degraded" } else { "ok" };
    with_counter(REVIEWS_TOTAL, &[("recommendation", recommendation), ("status", status)], |counter| {
        counter.increment(1);
    });
    with_histogram(REVIEW_SCORE, &[("dimension", "quality")], |histogram| histogram.record(quality));
    with_histogram(REVIEW_SCORE, &[("dimension", "completeness")], |histogram| histogram.record(completeness));
    with_histogram(REVIEW_SCORE, &[("dimension", "relevance")], |histogram| histogram.record(relevance));
}

/// Retention deleted `count` finished runs.
pub fn retention_deleted(count: usize) {
    counter!(RETENTION_DELETED_RUNS_TOTAL).increment(count as u64);
}

/// The store's size after a retention sweep.
pub fn store_size(bytes: u64) {
    gauge!(STORE_SIZE_BYTES).set(bytes as f64);
}

/// Supervision restarted an actor of kind `actor`.
pub fn actor_restarted(actor: &'static str) {
    counter!(ACTOR_RESTARTS_TOTAL, "actor" => actor).increment(1);
}

/// A run failed because its session crashed too often.
pub fn supervisor_meltdown(level: &'static str) {
    counter!(SUPERVISOR_MELTDOWNS_TOTAL, "level" => level).increment(1);
}

/// An HTTP request was answered.
pub fn http_request(method: &str, route: &str, status: &str, elapsed: Duration) {
    with_counter(HTTP_REQUESTS_TOTAL, &[("method", method), ("route", route), ("status", status)], |counter| {
        counter.increment(1);
    });
    with_histogram(HTTP_REQUEST_DURATION_SECONDS, &[("method", method), ("route", route)], |histogram| {
        histogram.record(elapsed.as_secs_f64());
    });
}

/// HTTP requests being answered: +1 when one starts, -1 when it is answered.
pub fn http_in_flight(delta: f64) {
    with_gauge(HTTP_REQUESTS_IN_FLIGHT, &[], |gauge| gauge.increment(delta));
}

/// Open SSE streams: +1 when one opens, -1 when it ends.
pub fn sse_clients(delta: f64) {
    with_gauge(SSE_CLIENTS, &[], |gauge| gauge.increment(delta));
}

/// An SSE stream was refused by its `scope`'s limit.
pub fn sse_rejected(scope: &'static str) {
    counter!(SSE_REJECTED_TOTAL, "scope" => scope).increment(1);
}

/// Runs this node owns now.
pub fn cluster_leases_held(count: usize) {
    gauge!(CLUSTER_LEASES_HELD).set(count as f64);
}

/// This node claimed `count` runs; `takeovers` of them were held by a node whose
/// lease had expired.
pub fn cluster_claimed(count: usize, takeovers: usize) {
    counter!(CLUSTER_CLAIMS_TOTAL).increment(count as u64);
    counter!(CLUSTER_TAKEOVERS_TOTAL).increment(takeovers as u64);
}

/// Commits of `count` runs were refused: another node owns them now.
pub fn cluster_fenced(count: usize) {
    counter!(CLUSTER_FENCED_COMMITS_TOTAL).increment(count as u64);
}

/// Whether handles are kept (see [`Handles`]): set by [`describe`], once a
/// recorder is installed.
static KEEP_HANDLES: AtomicBool = AtomicBool::new(false);

/// At most this many series' handles a thread keeps; past it, it starts over
/// (labels are bounded sets, so a daemon stays far below it).
const MAX_KEPT: usize = 1024;

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
}

/// The handles of the series recorded on this thread, by name and label values.
/// Registering a series through the `metrics` macros builds its key (allocating
/// every label value) and looks it up in the recorder's registry on every call:
/// about 50 times a run. A kept handle is an `Arc` of the series' value, so
/// recording through it is an atomic add. Handles belong to the recorder that
/// made them: they are kept only for the recorder current when they were made,
/// and dropped when another one is current.
#[derive(Default)]
struct Handles {
    /// The recorder the handles belong to (its address).
    recorder: usize,
    /// The name and label values of the series looked up last (reused buffer).
    key: String,
    counters: HashMap<String, Counter, Quick>,
    gauges: HashMap<String, Gauge, Quick>,
    histograms: HashMap<String, Histogram, Quick>,
}

/// The kept handles' hash: their keys are short and come from bounded label
/// sets, not from clients, so a multiply-rotate hash (Fx, as in rustc) does; the
/// standard SipHash cost more than the lookup it serves.
type Quick = BuildHasherDefault<Fx>;

#[derive(Default)]
struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut buffer = [0; 8];
            buffer.copy_from_slice(word);
            self.add(u64::from_le_bytes(buffer));
        }
        let rest = words.remainder();
        let mut buffer = [0; 8];
        buffer[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(buffer) ^ rest.len() as u64);
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Handles {
    /// Fills `key` with the series' name and label values; forgets every handle
    /// if the current recorder is not the one they belong to, or if there are too
    /// many.
    fn prepare(&mut self, name: &str, labels: &[(&'static str, &str)]) {
        let recorder =
            metrics::with_recorder(|recorder| std::ptr::from_ref::<dyn Recorder>(recorder).cast::<()>() as usize);
        let kept = self.counters.len() + self.gauges.len() + self.histograms.len();
        if recorder != self.recorder || kept >= MAX_KEPT {
            self.recorder = recorder;
            self.counters.clear();
            self.gauges.clear();
            self.histograms.clear();
        }
        self.key.clear();
        self.key.push_str(name);
        for (_, value) in labels {
            // A separator no label value or metric name holds in practice; a
            // value holding it cannot match another series' key anyway, since
            // each metric has a fixed number of labels.
            self.key.push('\u{1f}');
            self.key.push_str(value);
        }
    }
}

/// The labels of a series, owned, for its registration.
fn owned_labels(labels: &[(&'static str, &str)]) -> Vec<Label> {
    labels.iter().map(|(key, value)| Label::new(*key, (*value).to_owned())).collect()
}

/// A kind of series handle: how one is registered, and where a thread keeps them.
trait Kept: Sized {
    fn register(name: &'static str, labels: Vec<Label>) -> Self;
    /// The key prepared last, and the handles of this kind.
    fn kept(handles: &mut Handles) -> (&str, &mut HashMap<String, Self, Quick>);
}

impl Kept for Counter {
    fn register(name: &'static str, labels: Vec<Label>) -> Self {
        counter!(name, labels)
    }
    fn kept(handles: &mut Handles) -> (&str, &mut HashMap<String, Self, Quick>) {
        (&handles.key, &mut handles.counters)
    }
}

impl Kept for Gauge {
    fn register(name: &'static str, labels: Vec<Label>) -> Self {
        gauge!(name, labels)
    }
    fn kept(handles: &mut Handles) -> (&str, &mut HashMap<String, Self, Quick>) {
        (&handles.key, &mut handles.gauges)
    }
}

impl Kept for Histogram {
    fn register(name: &'static str, labels: Vec<Label>) -> Self {
        histogram!(name, labels)
    }
    fn kept(handles: &mut Handles) -> (&str, &mut HashMap<String, Self, Quick>) {
        (&handles.key, &mut handles.histograms)
    }
}

/// Runs `record` on the series `name` with `labels`, through a kept handle where
/// handles are kept.
fn with_series<H: Kept>(name: &'static str, labels: &[(&'static str, &str)], record: impl FnOnce(&H)) {
    if !KEEP_HANDLES.load(Ordering::Relaxed) {
        return record(&H::register(name, owned_labels(labels)));
    }
    HANDLES.with_borrow_mut(|handles| {
        handles.prepare(name, labels);
        let (key, kept) = H::kept(handles);
        if let Some(handle) = kept.get(key) {
            return record(handle);
        }
        let handle = H::register(name, owned_labels(labels));
        record(&handle);
        kept.insert(key.to_owned(), handle);
    });
}

fn with_counter(name: &'static str, labels: &[(&'static str, &str)], record: impl FnOnce(&Counter)) {
    with_series(name, labels, record);
}

fn with_gauge(name: &'static str, labels: &[(&'static str, &str)], record: impl FnOnce(&Gauge)) {
    with_series(name, labels, record);
}

fn with_histogram(name: &'static str, labels: &[(&'static str, &str)], record: impl FnOnce(&Histogram)) {
    with_series(name, labels, record);
}

/// Keeps the handles of the series recorded from now on, per thread (see
/// [`Handles`]). Call once a process-wide recorder is installed; [`describe`]
/// does.
pub fn keep_handles() {
    KEEP_HANDLES.store(true, Ordering::Relaxed);
}

/// Registers the help text of every metric with the installed recorder, so the
/// exposition carries `# HELP` lines, and keeps handles from then on
/// ([`keep_handles`]). Call once after installing a process-wide recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(RUNS_STARTED_TOTAL, "Runs accepted, by agent.");
    describe_gauge!(CLUSTER_LEASES_HELD, "Runs this node owns (several daemons on one PostgreSQL).");
    describe_counter!(CLUSTER_CLAIMS_TOTAL, "Unfinished runs this node claimed from a stopped or departed node.");
    describe_counter!(CLUSTER_TAKEOVERS_TOTAL, "Runs this node took over from a node whose lease expired.");
    describe_counter!(CLUSTER_FENCED_COMMITS_TOTAL, "Commits refused because another node owns their run now.");
    describe_counter!(RUNS_FINISHED_TOTAL, "Runs that reached a terminal state, by agent and status.");
    describe_gauge!(RUNS_ACTIVE, "Runs with a live session.");
    describe_gauge!(RUNS_QUEUED, "Runs waiting in the run queue for a slot.");
    describe_counter!(RUNS_RECOVERED_TOTAL, "Runs resumed from the store after a restart.");
    describe_counter!(ADMISSION_REJECTED_TOTAL, "Submissions refused by admission control, by reason.");
    describe_counter!(TURNS_TOTAL, "Turns completed.");
    describe_histogram!(TURN_DURATION_SECONDS, Unit::Seconds, "Duration of a turn.");
    describe_counter!(TOOL_CALLS_TOTAL, "Tool calls that ran, by tool and status.");
    describe_histogram!(TOOL_CALL_DURATION_SECONDS, Unit::Seconds, "Duration of a tool call, by tool.");
    describe_counter!(TOOL_CALLS_SKIPPED_TOTAL, "Tool calls the hook chain skipped, by tool and reason.");
    describe_counter!(TOOLS_BLOCKED_TOTAL, "Times a tool was blocked in a run after repeated failures, by tool.");
    describe_gauge!(TOOL_QUEUE_DEPTH, "Tool calls waiting for a worker.");
    describe_counter!(MODEL_REQUESTS_TOTAL, "Model requests, by model and status.");
    describe_histogram!(MODEL_REQUEST_DURATION_SECONDS, Unit::Seconds, "Duration of a model request, by model.");
    describe_counter!(MODEL_TOKENS_TOTAL, "Model tokens, by model and direction.");
    describe_counter!(COST_MICRODOLLARS_TOTAL, "Model cost in millionths of a US dollar, by model.");
    describe_histogram!(REVIEW_SCORE, "Review scores in 0..1, by dimension.");
    describe_counter!(REVIEWS_TOTAL, "Reviews, by recommendation.");
    describe_counter!(ACTOR_RESTARTS_TOTAL, "Actors restarted by supervision, by actor kind.");
    describe_counter!(SUPERVISOR_MELTDOWNS_TOTAL, "Supervisors that gave up after too many restarts, by level.");
    describe_counter!(MODEL_RETRIES_TOTAL, "Retried model requests, by model and reason.");
    describe_counter!(
        LOCAL_MODEL_PROMPT_TOKENS_TOTAL,
        "Prompt tokens of the local model, by source: cache (reused KV cache) or computed."
    );
    describe_counter!(LOCAL_MODEL_GENERATED_TOKENS_TOTAL, "Tokens generated by the local model.");
    describe_gauge!(LOCAL_MODEL_QUEUE_DEPTH, "Requests waiting for a sequence of the local model.");
    describe_histogram!(
        GEN_AI_CLIENT_OPERATION_DURATION_SECONDS,
        Unit::Seconds,
        "GenAI operation duration (OpenTelemetry semantic conventions)."
    );
    describe_histogram!(GEN_AI_CLIENT_TOKEN_USAGE, "GenAI tokens per operation (OpenTelemetry semantic conventions).");
    describe_counter!(HTTP_REQUESTS_TOTAL, "HTTP requests answered, by method, route and status.");
    describe_histogram!(HTTP_REQUEST_DURATION_SECONDS, Unit::Seconds, "Time to answer an HTTP request.");
    describe_gauge!(HTTP_REQUESTS_IN_FLIGHT, "HTTP requests being answered.");
    describe_gauge!(SSE_CLIENTS, "Open SSE event streams.");
    describe_counter!(SSE_REJECTED_TOTAL, "SSE streams refused by the stream limits, by scope.");
    describe_counter!(RETENTION_DELETED_RUNS_TOTAL, "Finished runs deleted by retention.");
    describe_gauge!(STORE_SIZE_BYTES, Unit::Bytes, "The store's size, as of the last retention sweep.");
    zero_known_series();
    keep_handles();
}

/// Writes every series whose labels are known in advance at zero, so that a
/// healthy daemon's dashboard reads 0, not "No data", for what has not happened
/// yet (restarts, meltdowns, refusals, retries of nothing).
fn zero_known_series() {
    counter!(RUNS_RECOVERED_TOTAL).increment(0);
    counter!(RETENTION_DELETED_RUNS_TOTAL).increment(0);
    counter!(TURNS_TOTAL).increment(0);
    for reason in ["overloaded", "tenant_overloaded", "unknown_agent"] {
        counter!(ADMISSION_REJECTED_TOTAL, "reason" => reason).increment(0);
    }
    for actor in ["session", "planner", "tool_worker", "tool_pool", "reviewer"] {
        counter!(ACTOR_RESTARTS_TOTAL, "actor" => actor).increment(0);
    }
    for level in ["run", "root"] {
        counter!(SUPERVISOR_MELTDOWNS_TOTAL, "level" => level).increment(0);
    }
    for scope in ["global", "tenant"] {
        counter!(SSE_REJECTED_TOTAL, "scope" => scope).increment(0);
    }
    for recommendation in ["proceed", "gather_more", "clarify_query", "replan"] {
        for status in ["ok", "degraded"] {
            counter!(REVIEWS_TOTAL, "recommendation" => recommendation, "status" => status).increment(0);
        }
    }
    for gauge in [RUNS_ACTIVE, RUNS_QUEUED, TOOL_QUEUE_DEPTH, HTTP_REQUESTS_IN_FLIGHT, SSE_CLIENTS] {
        gauge!(gauge).increment(0.0);
    }
}

#[cfg(test)]
mod tests {
    use metrics::with_local_recorder;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use super::*;
    use crate::testing::series_name;

    /// The counters and the number of histogram values `snapshotter` holds, as
    /// `name{label=value,…}` sorted by label.
    fn series(snapshotter: &Snapshotter) -> HashMap<String, u64> {
        let mut series = HashMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let count = match value {
                DebugValue::Counter(value) => value,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(value) => value.into_inner() as u64,
            };
            let labels = key.key().labels().map(|label| (label.key(), label.value()));
            series.insert(series_name(key.key().name(), labels), count);
        }
        series
    }

    #[test]
    fn kept_handles_record_into_the_series_of_their_labels() {
        keep_handles();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        with_local_recorder(&recorder, || {
            tool_call("text_stats", "completed", Duration::from_millis(5));
            tool_call("text_stats", "completed", Duration::from_millis(7));
            tool_call("text_stats", "failed", Duration::from_millis(1));
            tool_call("journal", "completed", Duration::from_millis(2));
            http_request("POST", "/v1/runs", "201", Duration::from_millis(3));
            http_request("POST", "/v1/runs", "201", Duration::from_millis(4));
            http_request("GET", "/v1/runs/{run_id}/events", "200", Duration::from_millis(4));
            runs_active(3);
            runs_active(2);
        });
        let series = series(&snapshotter);
        assert_eq!(series["troupe_tool_calls_total{status=completed,tool=text_stats}"], 2);
        assert_eq!(series["troupe_tool_calls_total{status=failed,tool=text_stats}"], 1);
        assert_eq!(series["troupe_tool_calls_total{status=completed,tool=journal}"], 1);
        assert_eq!(series["troupe_tool_call_duration_seconds{tool=text_stats}"], 3);
        assert_eq!(series["troupe_http_requests_total{method=POST,route=/v1/runs,status=201}"], 2);
        assert_eq!(series["troupe_http_requests_total{method=GET,route=/v1/runs/{run_id}/events,status=200}"], 1);
        assert_eq!(series["troupe_http_request_duration_seconds{method=POST,route=/v1/runs}"], 2);
        assert_eq!(series["troupe_runs_active{}"], 2, "a gauge holds its last value");
    }

    #[test]
    fn handles_belong_to_the_recorder_that_made_them() {
        keep_handles();
        let first = DebuggingRecorder::new();
        let second = DebuggingRecorder::new();
        let (first_view, second_view) = (first.snapshotter(), second.snapshotter());
        with_local_recorder(&first, || run_started("bench"));
        with_local_recorder(&second, || run_started("bench"));
        with_local_recorder(&first, || {
            run_started("bench");
            run_started("other");
        });
        let (first, second) = (series(&first_view), series(&second_view));
        assert_eq!(first["troupe_runs_started_total{agent=bench}"], 2);
        assert_eq!(first["troupe_runs_started_total{agent=other}"], 1);
        assert_eq!(second["troupe_runs_started_total{agent=bench}"], 1);
    }
}
