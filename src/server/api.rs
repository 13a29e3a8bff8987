//! The JSON routes of runs, agents, tools and health (DESIGN §8), and what the
//! thread routes share with them. Every run route looks the run up through
//! [`owned_run`], which answers 404 for another tenant's run exactly as for a
//! missing one.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use troupe_actors::protocol::{Limits, RunSpec, RunStatus};
use troupe_actors::runtime::ThreadRun;
use troupe_actors::store::{Idempotency, Metadata, RunQuery, RunRecord, filterable_key};
use troupe_actors::threads::MultitaskStrategy;
use troupe_actors::{RunInput, SubmitRequest};
use utoipa::{IntoParams, ToSchema};

use super::auth::Tenant;
use super::error::{ApiError, ErrorBody};
use super::forward::{self, Command};
use super::incidents;
use super::quota::tighter;
use super::state::{AppState, owned_run};

/// Longest listing.
const MAX_LIST: usize = 500;

/// Middleware: a request that gets no response head within `request_timeout`
/// is answered 503 `timeout` (an event stream's head comes at once; its body is
/// not limited). Every 429 and 503 leaves with a `Retry-After`. A refusal (413,
/// 429, 503) is logged.
pub(super) async fn deadline(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit = state.inner.timing.request_timeout;
    let seen = incidents::RequestSeen::of(&request);
    let mut response = match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", "the request took too long").into_response()
        }
    };
    if matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)
        && !response.headers().contains_key(axum::http::header::RETRY_AFTER)
    {
        let seconds = axum::http::HeaderValue::from(state.inner.config.retry_after);
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds);
    }
    incidents::log_refusal(&state, &seen, &response);
    response
}

/// A run to start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The agent; when left out, `default` (or, with `thread_id`, the thread's).
    #[serde(default)]
    #[schema(default = "default")]
    pub agent: Option<String>,
    /// The request.
    pub input: String,
    /// Limits for this run instead of the agent's.
    #[serde(default)]
    pub limits: Option<LimitsBody>,
    /// Labels: a JSON object, returned with the run and filterable in
    /// `GET /v1/runs` (`metadata.KEY=VALUE`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
    /// The thread this run is a message of (as `POST /v1/threads/{id}/runs`).
    #[serde(default)]
    pub thread_id: Option<String>,
    /// With `thread_id`: what happens if the thread has an active run.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "reject")]
    pub multitask_strategy: Option<MultitaskStrategy>,
}

/// Most keys a metadata object may have.
const MAX_METADATA_KEYS: usize = 64;

/// Most bytes of a metadata object as JSON.
const MAX_METADATA_BYTES: usize = 16 * 1024;

/// Checks a request's metadata: an object of at most 64 keys and 16 KiB.
pub(super) fn checked_metadata(metadata: Option<Metadata>) -> Result<Metadata, ApiError> {
    let metadata = metadata.unwrap_or_default();
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(ApiError::invalid(format!("metadata may have at most {MAX_METADATA_KEYS} keys")));
    }
    if serde_json::to_string(&metadata).map_or(0, |text| text.len()) > MAX_METADATA_BYTES {
        return Err(ApiError::invalid(format!("metadata may be at most {MAX_METADATA_BYTES} bytes of JSON")));
    }
    Ok(metadata)
}

/// The request's `Idempotency-Key`, with a fingerprint of what it asks (`route`
/// and the body as canonical JSON): `None` without the header.
pub(super) fn idempotency(
    headers: &axum::http::HeaderMap,
    route: &str,
    body: &Value,
) -> Result<Option<Idempotency>, ApiError> {
    use sha2::{Digest, Sha256};
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|key| !key.is_empty() && key.len() <= 255)
        .ok_or_else(|| ApiError::invalid("Idempotency-Key must be 1 to 255 visible ASCII characters"))?;
    let mut digest = Sha256::new();
    digest.update(route.as_bytes());
    digest.update(b"\n");
    digest.update(troupe_actors::hooks::canonical_json(body).as_bytes());
    let fingerprint = digest.finalize().iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(Some(Idempotency { key: key.to_owned(), fingerprint }))
}

/// A JSON body as a value (what an idempotency key's fingerprint is taken of)
/// and as `T`.
pub(super) fn typed_body<T: serde::de::DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(Value, T), ApiError> {
    let Json(value) = body?;
    let typed = serde_json::from_value(value.clone())
        .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", error.to_string()))?;
    Ok((value, typed))
}

/// A created resource's answer: 201, and `Idempotent-Replayed: true` when an
/// earlier request under the same idempotency key created it.
pub(super) fn created<T: Serialize>(view: T, replayed: bool) -> Response {
    let mut response = (StatusCode::CREATED, Json(view)).into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    }
    response
}

fn default_agent() -> String {
    "default".to_owned()
}

/// A run's limits. In a request, each may only lower the agent's own limit; one
/// left out keeps the agent's.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsBody {
    /// Turns before one last tool-free synthesis call.
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// Tool calls of one turn that run at the same time.
    #[serde(default)]
    pub max_parallel_tools: Option<usize>,
    /// Tokens (input + output) the run may spend.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// USD the run may spend.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

/// A run.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    /// The id (a UUID).
    pub run_id: String,
    /// The run that started this one, for sub-runs.
    pub parent_run_id: Option<String>,
    /// The agent.
    pub agent: String,
    /// The request.
    pub input: String,
    /// `queued`, `running`, `waiting_input`, `succeeded`, `failed` or `cancelled`.
    pub status: String,
    /// Why it ended, for anything but success.
    pub reason: Option<String>,
    /// The limits in force.
    pub limits: LimitsBody,
    /// The last turn started.
    pub turn: u32,
    /// Tokens and cost so far.
    pub usage: UsageView,
    /// The final answer.
    pub final_output: Option<String>,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The thread it is a message of, if any.
    pub thread_id: Option<String>,
    /// The client's labels.
    #[schema(value_type = Object)]
    #[serde(default)]
    pub metadata: Metadata,
    /// The OpenTelemetry trace the run's spans are in (32 hex digits), where the
    /// daemon exports traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// Tokens and cost.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageView {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// USD.
    pub cost_usd: f64,
}

impl From<RunRecord> for RunView {
    fn from(run: RunRecord) -> Self {
        Self {
            run_id: run.run_id.to_string(),
            parent_run_id: run.parent_run_id.map(|id| id.to_string()),
            agent: run.agent,
            input: run.input,
            status: run.status.as_str().to_owned(),
            reason: run.reason,
            limits: LimitsBody::from(&run.limits),
            turn: run.turn,
            usage: UsageView {
                input_tokens: run.usage.input_tokens,
                output_tokens: run.usage.output_tokens,
                cost_usd: run.usage.cost_usd,
            },
            final_output: run.final_output,
            created_at: run.created_at,
            updated_at: run.updated_at,
            thread_id: run.thread_id.map(|id| id.to_string()),
            metadata: run.metadata,
            // `00-TRACE_ID-SPAN_ID-FLAGS`.
            trace_id: run.traceparent.as_deref().and_then(|parent| parent.split('-').nth(1)).map(str::to_owned),
        }
    }
}

/// Starts a run. Answers once the run is durable; follow it at
/// `/v1/runs/{id}/events`.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Retrying with the same key and body within 24 h returns the run the first request created.")),
    responses(
        (status = 201, body = RunView, description = "Accepted and stored (or, with `Idempotent-Replayed: true`, created by an earlier request with the same Idempotency-Key)."),
        (status = 400, body = ErrorBody, description = "Malformed JSON or invalid limits."),
        (status = 404, body = ErrorBody, description = "Unknown agent or thread."),
        (status = 409, body = ErrorBody, description = "`thread_busy`: the thread has an active run (its id in `active_run_id`) and the strategy is `reject`."),
        (status = 422, body = ErrorBody, description = "`idempotency_key_reused`: the key was used for a different request."),
        (status = 413, body = ErrorBody, description = "Body over server.max_body_bytes."),
        (status = 429, body = ErrorBody, description = "Too many active runs (globally or for this tenant), or the tenant's daily quota is spent (`quota_exceeded`, until `reset_at`); see Retry-After."),
        (status = 503, body = ErrorBody, description = "Shutting down, or the store failed."),
    ),
    security(("bearer" = [])))]
pub(super) async fn create_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    headers: axum::http::HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (value, body): (Value, CreateRun) = typed_body(body)?;
    let idempotency = idempotency(&headers, "POST /v1/runs", &value)?;
    let thread = match body.thread_id.as_deref() {
        Some(id) => Some(ThreadRun {
            thread_id: id.parse().map_err(|_| ApiError::thread_not_found())?,
            strategy: body.multitask_strategy.unwrap_or_default(),
        }),
        None if body.multitask_strategy.is_some() => {
            return Err(ApiError::invalid("multitask_strategy applies to a run of a thread: give thread_id"));
        }
        None => None,
    };
    let run = RunBody { agent: body.agent, input: body.input, limits: body.limits, metadata: body.metadata };
    submit(&state, tenant, run, thread, idempotency).await
}

/// What a request to start a run asks, whichever route it came by.
pub(super) struct RunBody {
    /// `None`: the thread's agent.
    pub agent: Option<String>,
    pub input: String,
    pub limits: Option<LimitsBody>,
    pub metadata: Option<Metadata>,
}

/// Starts a run (of a thread, with `thread`): 201 with the run as created.
pub(super) async fn submit(
    state: &AppState,
    tenant: String,
    body: RunBody,
    thread: Option<ThreadRun>,
    idempotency: Option<Idempotency>,
) -> Result<Response, ApiError> {
    if body.input.trim().is_empty() {
        return Err(ApiError::invalid("input must not be empty"));
    }
    let metadata = checked_metadata(body.metadata)?;
    let agent = match (&body.agent, thread) {
        (Some(agent), _) => agent.clone(),
        (None, Some(thread)) => match state.inner.runtime.store().threads().get_thread(thread.thread_id).await? {
            Some(stored) if stored.tenant == tenant => stored.agent,
            _ => return Err(ApiError::thread_not_found()),
        },
        (None, None) => default_agent(),
    };
    let agent_limits = state.inner.runtime.agent(&agent).map(|agent| agent.limits.clone());
    let mut limits = match (body.limits, &agent_limits) {
        (Some(wanted), Some(agent)) => Some(lowered(agent, &wanted)),
        _ => None,
    };
    // A client's budget must be one a run can spend (within the runtime, a
    // sub-run's budget may be what is left, down to nothing).
    if let Some(limits) = &limits {
        limits.check().map_err(|message| ApiError::new(StatusCode::BAD_REQUEST, "invalid_limits", message))?;
    }
    // The tenant's daily quotas: refused once spent, else the run's budget is at
    // most what is left of them. A retry of a request that already created its run
    // (same Idempotency-Key) gets that run, quota or not.
    if let Some(agent_limits) = agent_limits {
        let store = state.inner.runtime.store();
        let wanted = limits.clone().unwrap_or(agent_limits);
        match state.inner.quotas.admit(store.as_ref(), &tenant, wanted, Utc::now()).await {
            Ok(None) => {}
            Ok(Some(admitted)) => limits = Some(admitted),
            Err(refused) => {
                let since = Utc::now() - troupe_actors::runtime::IDEMPOTENCY_WINDOW;
                let replay = match &idempotency {
                    Some(key) => store.threads().run_by_idempotency_key(&tenant, &key.key, since).await?,
                    None => None,
                };
                if replay.is_none() {
                    return Err(refused);
                }
            }
        }
    }
    let spec = RunSpec { agent, input: body.input, limits };
    // The run joins the request's trace: its spans are children of the request's.
    let traceparent = troupe_actors::spans::traceparent(&tracing::Span::current());
    let request = SubmitRequest { spec, tenant, parent_run_id: None, thread, metadata, idempotency, traceparent };
    // The submission runs to its end even if the client goes away or the request
    // times out: a run half-accepted would be stored but never started.
    let runtime = state.inner.runtime.clone();
    let submitted = tokio::spawn(async move { runtime.submit_with(request).await });
    let submitted = submitted
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the submission failed"))??;
    Ok(created(RunView::from(submitted.run), submitted.replayed))
}

impl From<&Limits> for LimitsBody {
    fn from(limits: &Limits) -> Self {
        Self {
            max_turns: Some(limits.max_turns),
            max_parallel_tools: Some(limits.max_parallel_tools),
            max_tokens: limits.max_tokens,
            max_cost_usd: limits.max_cost_usd,
        }
    }
}

/// The agent's limits, each lowered to the request's where it asks for less.
fn lowered(agent: &Limits, wanted: &LimitsBody) -> Limits {
    Limits {
        max_turns: wanted.max_turns.map_or(agent.max_turns, |turns| turns.min(agent.max_turns)),
        max_parallel_tools: wanted
            .max_parallel_tools
            .map_or(agent.max_parallel_tools, |parallel| parallel.min(agent.max_parallel_tools)),
        max_tokens: tighter(agent.max_tokens, wanted.max_tokens),
        max_cost_usd: tighter(agent.max_cost_usd, wanted.max_cost_usd),
    }
}

/// A listing filter.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only runs with this status.
    #[param(value_type = Option<String>)]
    pub status: Option<RunStatus>,
    /// At most this many (newest first); 50 by default, 500 at most.
    pub limit: Option<usize>,
    /// The next page: only runs older than this run id (the last run of the
    /// previous page).
    pub after: Option<String>,
    /// Only runs of this thread.
    pub thread_id: Option<String>,
    /// `metadata.KEY=VALUE` (repeatable): only runs whose metadata has KEY with
    /// the string VALUE.
    #[serde(skip)]
    #[param(rename = "metadata.KEY", value_type = Option<String>)]
    pub metadata: Vec<(String, String)>,
}

impl ListQuery {
    /// The query from its parameters: the known ones and `metadata.KEY`; any
    /// other is refused.
    fn parse(pairs: Vec<(String, String)>) -> Result<Self, ApiError> {
        let mut query = ListQuery { status: None, limit: None, after: None, thread_id: None, metadata: Vec::new() };
        for (name, value) in pairs {
            match name.as_str() {
                "status" => {
                    let status = serde_json::from_value(Value::String(value.clone()));
                    query.status = Some(status.map_err(|_| ApiError::invalid(format!("unknown status {value:?}")))?);
                }
                "limit" => {
                    query.limit = Some(value.parse().map_err(|_| ApiError::invalid("limit must be a number"))?);
                }
                "after" => query.after = Some(value),
                "thread_id" => query.thread_id = Some(value),
                _ => match name.strip_prefix("metadata.") {
                    Some(key) if filterable_key(key) => query.metadata.push((key.to_owned(), value)),
                    Some(_) => {
                        return Err(ApiError::invalid(
                            "a metadata key in a filter is 1 to 64 letters, digits, '_' or '-'",
                        ));
                    }
                    None => return Err(ApiError::invalid(format!("unknown query parameter {name:?}"))),
                },
            }
        }
        Ok(query)
    }
}

/// Runs, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The runs.
    pub runs: Vec<RunView>,
    /// Whether older runs follow: ask again with `after` = the last run's id.
    #[serde(default)]
    pub has_more: bool,
}

/// Lists the tenant's runs, newest first.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListQuery),
    responses((status = 200, body = RunList), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_runs(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Query(pairs) = query?;
    let query = ListQuery::parse(pairs)?;
    let thread_id = match query.thread_id.as_deref() {
        Some(id) => Some(id.parse().map_err(|_| ApiError::invalid("thread_id must be a thread id"))?),
        None => None,
    };
    let filter = RunQuery {
        tenant: Some(tenant),
        status: query.status,
        thread_id,
        metadata: query.metadata,
        ..RunQuery::default()
    };
    page_of_runs(&state, filter, query.limit, query.after.as_deref()).await.map(Json)
}

/// A page of runs matching `filter`, newest first, after run `after` (the last
/// of the previous page).
pub(super) async fn page_of_runs(
    state: &AppState,
    mut filter: RunQuery,
    limit: Option<usize>,
    after: Option<&str>,
) -> Result<RunList, ApiError> {
    let limit = limit.unwrap_or(50).clamp(1, MAX_LIST);
    filter.after = match after {
        Some(id) => Some(id.parse().map_err(|_| ApiError::invalid("after must be a run id (from a previous page)"))?),
        None => None,
    };
    // One run more than asked for tells whether another page follows.
    filter.limit = limit + 1;
    let mut runs = state.inner.runtime.store().list_runs(filter).await?;
    let has_more = runs.len() > limit;
    runs.truncate(limit);
    Ok(RunList { runs: runs.into_iter().map(RunView::from).collect(), has_more })
}

/// One run.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path, description = "The run id.")),
    responses((status = 200, body = RunView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn get_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RunView>, ApiError> {
    let Path(id) = path?;
    Ok(Json(owned_run(&state, &tenant, &id).await?.into()))
}

/// What a parked run is sent: the answer to its question (`text`), or a decision
/// on a call waiting for approval (`approve`, with `call_id` when several wait,
/// and an optional `reason` the model sees on a rejection).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    /// The answer to the run's question.
    #[serde(default)]
    pub text: Option<String>,
    /// Approve (true) or reject (false) a call waiting for approval.
    #[serde(default)]
    pub approve: Option<bool>,
    /// The call decided on (from its `approval_requested` event).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Why; the model sees it on a rejection.
    #[serde(default)]
    pub reason: Option<String>,
}

impl InputBody {
    fn into_input(self) -> Result<RunInput, ApiError> {
        match (self.text, self.approve) {
            (Some(text), None) => Ok(RunInput::Text(text)),
            // The call is always named: a retried decision must not land on a
            // call the human has not seen.
            (None, Some(_)) if self.call_id.is_none() => {
                Err(ApiError::invalid("a decision names its call: \"call_id\""))
            }
            (None, Some(approved)) => Ok(RunInput::Approval { call_id: self.call_id, approved, reason: self.reason }),
            _ => Err(ApiError::invalid("send either \"text\" (an answer) or \"approve\" (a decision on a call)")),
        }
    }
}

/// Answers a run's question, or approves or rejects a call waiting for approval.
#[utoipa::path(post, path = "/v1/runs/{id}/input", tag = "runs", request_body = InputBody,
    params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 202, body = RunView, description = "Taken; the run goes on."),
        (status = 404, body = ErrorBody),
        (status = 400, body = ErrorBody, description = "Neither or both of text and approve; no such call waits."),
        (status = 409, body = ErrorBody, description = "The run is not waiting for input."),
    ),
    security(("bearer" = [])))]
pub(super) async fn run_input(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<InputBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let run = owned_run(&state, &tenant, &id).await?;
    let Json(body) = body?;
    let input = body.into_input()?;
    match forward::elsewhere(state.inner.cluster.as_ref(), run.run_id) {
        Some(cluster) if !run.status.is_terminal() => forward::forward(cluster, run.run_id, input.into()).await?,
        _ => state.inner.runtime.input(run.run_id, input).await?,
    }
    let run = state.inner.runtime.get(run.run_id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok((StatusCode::ACCEPTED, Json(RunView::from(run))).into_response())
}

/// Deletes a run that has ended, with its events, messages, tool calls, plans,
/// reviews and documents (its sub-runs are runs of their own, kept).
#[utoipa::path(delete, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The run has not ended (`not_ended`): cancel it first."),
    ),
    security(("bearer" = [])))]
pub(super) async fn delete_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path?;
    let run = owned_run(&state, &tenant, &id).await?;
    match state.inner.runtime.delete(run.run_id).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_ended",
            "the run has not ended; cancel it first, then delete it",
        )),
        // Deleted by another request in between.
        Err(troupe_actors::store::StoreError::NotFound(_)) => Err(ApiError::run_not_found()),
        Err(error) => Err(error.into()),
    }
}

/// Cancels a run; answers once its end is stored.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 200, body = RunView, description = "Cancelled."),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The run had already ended."),
    ),
    security(("bearer" = [])))]
pub(super) async fn cancel_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RunView>, ApiError> {
    let Path(id) = path?;
    let run = owned_run(&state, &tenant, &id).await?;
    match forward::elsewhere(state.inner.cluster.as_ref(), run.run_id) {
        Some(cluster) if !run.status.is_terminal() => forward::forward(cluster, run.run_id, Command::Cancel).await?,
        _ => state.inner.runtime.cancel(run.run_id).await?,
    }
    let run = state.inner.runtime.get(run.run_id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok(Json(run.into()))
}

/// An agent.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AgentView {
    /// Its name, for `POST /v1/runs`.
    pub name: String,
    /// Its model; `null` for the default model.
    pub model: Option<String>,
    /// Tools it may call beyond `todo_write` and `ask_user`.
    pub tools: Vec<String>,
    /// Default limits of its runs.
    pub limits: LimitsBody,
    /// `rule_based` or `model`.
    pub reviewer: String,
}

/// The configured agents.
#[utoipa::path(get, path = "/v1/agents", tag = "catalog",
    responses((status = 200, body = Vec<AgentView>)), security(("bearer" = [])))]
pub(super) async fn list_agents(State(state): State<AppState>) -> Json<Vec<AgentView>> {
    let agents = state.inner.runtime.agents().into_iter().map(|agent| AgentView {
        name: agent.name,
        model: agent.model,
        tools: agent.tools,
        limits: LimitsBody::from(&agent.limits),
        reviewer: match agent.reviewer {
            troupe_actors::config::ReviewerKind::RuleBased => "rule_based".to_owned(),
            troupe_actors::config::ReviewerKind::Model { .. } => "model".to_owned(),
        },
    });
    Json(agents.collect())
}

/// A tool.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolView {
    /// Its name.
    pub name: String,
    /// What the model is told it does.
    pub description: String,
    /// JSON Schema of its arguments.
    #[schema(value_type = Object)]
    pub parameters: Value,
}

/// The registered tools.
#[utoipa::path(get, path = "/v1/tools", tag = "catalog",
    responses((status = 200, body = Vec<ToolView>)), security(("bearer" = [])))]
pub(super) async fn list_tools(State(state): State<AppState>) -> Json<Vec<ToolView>> {
    let tools = state.inner.runtime.tools().into_iter().map(|tool| ToolView {
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters: tool.parameters.clone(),
    });
    Json(tools.collect())
}

/// Alive.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "The process serves.")))]
pub(super) async fn healthz() -> Json<Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Ready: the store answers and the runtime takes runs (in a cluster: while the node holds its lease).
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, description = "Ready."), (status = 503, body = ErrorBody, description = "Not ready.")))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let runtime = &state.inner.runtime;
    if !runtime.accepting() || state.inner.shutdown.is_cancelled() {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the runtime is not taking runs"));
    }
    if state.inner.cluster.as_ref().is_some_and(|cluster| cluster.lost.is_cancelled()) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this node lost its lease on the store",
        ));
    }
    // Any read answers whether the store is reachable; this one finds nothing.
    let probe = RunQuery { tenant: Some(String::new()), limit: 1, ..RunQuery::default() };
    match tokio::time::timeout(Duration::from_secs(5), runtime.store().list_runs(probe)).await {
        Ok(Ok(_)) => Ok(Json(serde_json::json!({"status": "ready"}))),
        Ok(Err(error)) => Err(ApiError::from(error)),
        Err(_) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", "the store did not answer")),
    }
}

/// Prometheus exposition; with `metrics_token_sha256` set, only for its bearer.
pub(super) async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(token) = &state.inner.metrics_token {
        let authorization = headers.get(axum::http::header::AUTHORIZATION).and_then(|value| value.to_str().ok());
        if !token.admits(authorization) {
            return ApiError::unauthorized().into_response();
        }
    }
    match &state.inner.prometheus {
        Some(handle) => {
            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render())
                .into_response()
        }
        None => ApiError::new(StatusCode::NOT_FOUND, "not_found", "metrics are not enabled").into_response(),
    }
}
