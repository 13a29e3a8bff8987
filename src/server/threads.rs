//! The thread routes: conversations whose runs follow each other. Every route
//! looks the thread up through [`owned_thread`], which answers 404 for another
//! tenant's thread exactly as for a missing one. A message is a run of the
//! thread (`POST /v1/threads/{id}/runs`); what happens when one arrives while the
//! thread has an active run is the request's `multitask_strategy`.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use troupe_actors::protocol::ThreadId;
use troupe_actors::runtime::ThreadRun;
use troupe_actors::store::{Metadata, RunQuery, ThreadQuery, ThreadRecord};
use troupe_actors::threads::{self as conversation, MultitaskStrategy};
use utoipa::{IntoParams, ToSchema};

use super::api::{
    LimitsBody, RunBody, RunList, RunView, checked_metadata, created, idempotency, page_of_runs, submit, typed_body,
};
use super::auth::Tenant;
use super::error::{ApiError, ErrorBody};
use super::state::AppState;

/// Longest listing.
const MAX_LIST: usize = 500;

/// A thread to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateThread {
    /// The agent its messages go to; `default` when left out.
    #[serde(default)]
    pub agent: Option<String>,
    /// Labels: a JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

/// A change of a thread's metadata.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateThread {
    /// Merged into the thread's metadata; a key set to `null` is removed.
    #[schema(value_type = Object)]
    pub metadata: Metadata,
}

/// A thread.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ThreadView {
    /// The id (a UUID).
    pub thread_id: String,
    /// The agent its messages go to.
    pub agent: String,
    /// The client's labels.
    #[schema(value_type = Object)]
    pub metadata: Metadata,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When its metadata last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<ThreadRecord> for ThreadView {
    fn from(thread: ThreadRecord) -> Self {
        Self {
            thread_id: thread.thread_id.to_string(),
            agent: thread.agent,
            metadata: thread.metadata,
            created_at: thread.created_at,
            updated_at: thread.updated_at,
        }
    }
}

/// One message of a thread.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ThreadMessageView {
    /// The run it belongs to.
    pub run_id: String,
    /// `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
    /// For an answer: the run was interrupted by a newer message before it answered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// A thread with its conversation.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ThreadDetail {
    /// The thread.
    #[serde(flatten)]
    pub thread: ThreadView,
    /// `busy` while one of its runs has not ended, else `idle`.
    #[schema(example = "idle")]
    pub status: String,
    /// The conversation, oldest first: each run's input and answer (a rolled
    /// back run's are left out).
    pub messages: Vec<ThreadMessageView>,
    /// Its newest run.
    pub last_run: Option<RunView>,
    /// The plan of its newest run (its `todo_write` task list).
    #[schema(value_type = Object)]
    pub plan: Value,
}

/// Threads, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ThreadList {
    /// The threads.
    pub threads: Vec<ThreadView>,
    /// Whether older threads follow: ask again with `after` = the last thread's id.
    pub has_more: bool,
}

/// A page.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most this many (newest first); 50 by default, 500 at most.
    pub limit: Option<usize>,
    /// The next page: only items older than this id (the last of the previous page).
    pub after: Option<String>,
}

/// A message to a thread.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateThreadRun {
    /// The message.
    pub input: String,
    /// Another agent for this run than the thread's.
    #[serde(default)]
    pub agent: Option<String>,
    /// Limits for this run instead of the agent's.
    #[serde(default)]
    pub limits: Option<LimitsBody>,
    /// Labels of the run: a JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
    /// If the thread has an active run: `reject` (409, the default), `enqueue`
    /// (runs after it and the runs waiting), `interrupt` (this one runs next: the
    /// active run and those waiting are cancelled, and stay in the history marked
    /// interrupted) or `rollback` (the same, but they are removed from the history).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "enqueue")]
    pub multitask_strategy: Option<MultitaskStrategy>,
}

/// The thread `id` if it exists and belongs to `tenant`; 404 otherwise (also for
/// an id that is not a thread id).
pub(super) async fn owned_thread(state: &AppState, tenant: &str, id: &str) -> Result<ThreadRecord, ApiError> {
    let thread_id: ThreadId = id.parse().map_err(|_| ApiError::thread_not_found())?;
    match state.inner.runtime.store().threads().get_thread(thread_id).await? {
        Some(thread) if thread.tenant == tenant => Ok(thread),
        _ => Err(ApiError::thread_not_found()),
    }
}

/// Creates a thread.
#[utoipa::path(post, path = "/v1/threads", tag = "threads", request_body = CreateThread,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Retrying with the same key and body within 24 h returns the thread the first request created.")),
    responses(
        (status = 201, body = ThreadView, description = "Created (or, with `Idempotent-Replayed: true`, created by an earlier request with the same Idempotency-Key)."),
        (status = 400, body = ErrorBody, description = "Malformed JSON or metadata."),
        (status = 404, body = ErrorBody, description = "Unknown agent."),
        (status = 422, body = ErrorBody, description = "`idempotency_key_reused`: the key was used for a different request."),
    ),
    security(("bearer" = [])))]
pub(super) async fn create_thread(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (value, body): (Value, CreateThread) = typed_body(body)?;
    let idempotency = idempotency(&headers, "POST /v1/threads", &value)?;
    let metadata = checked_metadata(body.metadata)?;
    let agent = body.agent.unwrap_or_else(|| "default".to_owned());
    let (thread, replayed) = state.inner.runtime.create_thread(tenant, agent, metadata, idempotency).await?;
    Ok(created(ThreadView::from(thread), replayed))
}

/// Lists the tenant's threads, newest first.
#[utoipa::path(get, path = "/v1/threads", tag = "threads", params(PageQuery),
    responses((status = 200, body = ThreadList), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_threads(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<ThreadList>, ApiError> {
    let Query(query) = query?;
    let limit = query.limit.unwrap_or(50).clamp(1, MAX_LIST);
    let after = match query.after.as_deref() {
        Some(id) => {
            Some(id.parse().map_err(|_| ApiError::invalid("after must be a thread id (from a previous page)"))?)
        }
        None => None,
    };
    let wanted = ThreadQuery { tenant: Some(tenant), limit: limit + 1, after };
    let mut threads = state.inner.runtime.store().threads().list_threads(wanted).await?;
    let has_more = threads.len() > limit;
    threads.truncate(limit);
    Ok(Json(ThreadList { threads: threads.into_iter().map(ThreadView::from).collect(), has_more }))
}

/// One thread with its conversation, its newest run and that run's plan.
#[utoipa::path(get, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, description = "The thread id.")),
    responses((status = 200, body = ThreadDetail), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn get_thread(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ThreadDetail>, ApiError> {
    let Path(id) = path?;
    let thread = owned_thread(&state, &tenant, &id).await?;
    let runs = state.inner.runtime.thread_runs(thread.thread_id).await?;
    let busy = runs.iter().any(|run| !run.status.is_terminal());
    let messages = conversation::messages(&runs)
        .into_iter()
        .map(|message| ThreadMessageView {
            run_id: message.run_id.to_string(),
            role: serde_json::to_value(message.role)
                .ok()
                .and_then(|role| role.as_str().map(str::to_owned))
                .unwrap_or_default(),
            content: message.content,
            interrupted: message.interrupted,
        })
        .collect();
    let last = runs.into_iter().last();
    let plan = match &last {
        Some(run) => {
            state.inner.runtime.store().load(run.run_id).await?.map(|snapshot| snapshot.plan).unwrap_or_default()
        }
        None => Default::default(),
    };
    Ok(Json(ThreadDetail {
        thread: thread.into(),
        status: if busy { "busy" } else { "idle" }.to_owned(),
        messages,
        last_run: last.map(RunView::from),
        plan: serde_json::to_value(plan).unwrap_or(Value::Null),
    }))
}

/// Changes a thread's metadata (merged; a key set to `null` is removed).
#[utoipa::path(patch, path = "/v1/threads/{id}", tag = "threads", request_body = UpdateThread,
    params(("id" = String, Path, description = "The thread id.")),
    responses((status = 200, body = ThreadView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn update_thread(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<UpdateThread>, JsonRejection>,
) -> Result<Json<ThreadView>, ApiError> {
    let Path(id) = path?;
    let thread = owned_thread(&state, &tenant, &id).await?;
    let Json(body) = body?;
    let mut metadata = thread.metadata;
    for (key, value) in body.metadata {
        if value.is_null() {
            metadata.remove(&key);
        } else {
            metadata.insert(key, value);
        }
    }
    let metadata = checked_metadata(Some(metadata))?;
    let updated = state.inner.runtime.store().threads().update_thread(thread.thread_id, metadata, Utc::now()).await?;
    Ok(Json(updated.ok_or_else(ApiError::thread_not_found)?.into()))
}

/// Deletes a thread with its runs (their events, messages, tool calls, plans,
/// reviews and documents); runs that have not ended are cancelled first.
#[utoipa::path(delete, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, description = "The thread id.")),
    responses((status = 204, description = "Deleted."), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn delete_thread(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path?;
    let thread = owned_thread(&state, &tenant, &id).await?;
    state.inner.runtime.delete_thread(thread.thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends a message to a thread: a run whose conversation is the thread's so far
/// plus this message; its answer joins the thread. Follow it at
/// `/v1/runs/{run_id}/events` or `/v1/threads/{id}/events`.
#[utoipa::path(post, path = "/v1/threads/{id}/runs", tag = "threads", request_body = CreateThreadRun,
    params(("id" = String, Path, description = "The thread id."),
        ("Idempotency-Key" = Option<String>, Header,
        description = "Retrying with the same key and body within 24 h returns the run the first request created.")),
    responses(
        (status = 201, body = RunView, description = "Accepted and stored: running, or queued behind the thread's runs."),
        (status = 400, body = ErrorBody, description = "Malformed JSON, empty input or invalid limits."),
        (status = 404, body = ErrorBody, description = "No such thread, or unknown agent."),
        (status = 409, body = ErrorBody, description = "`thread_busy`: the thread has an active run (its id in `active_run_id`) and the strategy is `reject`."),
        (status = 422, body = ErrorBody, description = "`idempotency_key_reused`: the key was used for a different request."),
        (status = 429, body = ErrorBody, description = "Too many runs active, or waiting on this thread, or the tenant's daily quota is spent (`quota_exceeded`, until `reset_at`)."),
    ),
    security(("bearer" = [])))]
pub(super) async fn create_thread_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let thread = owned_thread(&state, &tenant, &id).await?;
    let (value, body): (Value, CreateThreadRun) = typed_body(body)?;
    let idempotency = idempotency(&headers, &format!("POST /v1/threads/{}/runs", thread.thread_id), &value)?;
    let strategy = body.multitask_strategy.unwrap_or_default();
    let run = RunBody {
        agent: Some(body.agent.unwrap_or(thread.agent)),
        input: body.input,
        limits: body.limits,
        metadata: body.metadata,
    };
    submit(&state, tenant, run, Some(ThreadRun { thread_id: thread.thread_id, strategy }), idempotency).await
}

/// The thread's runs, newest first.
#[utoipa::path(get, path = "/v1/threads/{id}/runs", tag = "threads",
    params(("id" = String, Path, description = "The thread id."), PageQuery),
    responses((status = 200, body = RunList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_thread_runs(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Path(id) = path?;
    let thread = owned_thread(&state, &tenant, &id).await?;
    let Query(query) = query?;
    let filter = RunQuery { tenant: Some(tenant), thread_id: Some(thread.thread_id), ..RunQuery::default() };
    page_of_runs(&state, filter, query.limit, query.after.as_deref()).await.map(Json)
}
