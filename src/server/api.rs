//! The JSON routes of DESIGN §8, and the OpenAPI document generated from them.
//! Every run route looks the run up through [`owned_run`], which answers 404 for
//! another tenant's run exactly as for a missing one.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use troupe_actors::protocol::{Limits, RunSpec, RunStatus};
use troupe_actors::store::{RunQuery, RunRecord};
use troupe_actors::{RunInput, SubmitRequest};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use super::auth::Tenant;
use super::error::{ApiError, ErrorBody};
use super::state::{AppState, owned_run, require_tenant};
use super::{incidents, sse, telemetry};

/// Longest listing.
const MAX_LIST: usize = 500;

#[derive(OpenApi)]
#[openapi(
    info(title = "troupe", description = "An actor-based multi-agent runtime: submit runs, follow their events, answer and cancel them."),
    paths(create_run, list_runs, get_run, delete_run, sse::run_events, run_input, cancel_run, list_agents, list_tools, healthz, readyz),
    components(schemas(ErrorBody, CreateRun, LimitsBody, RunView, UsageView, RunList, InputBody, AgentView, ToolView)),
    modifiers(&BearerAuth),
    tags((name = "runs", description = "Runs and their events"), (name = "catalog", description = "Agents and tools"),
        (name = "ops", description = "Health"))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3.1 document of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub(super) fn router(state: AppState) -> Router {
    let protected = Router::new()
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{id}", get(get_run).delete(delete_run))
        .route("/v1/runs/{id}/events", get(sse::run_events))
        .route("/v1/runs/{id}/input", post(run_input))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/agents", get(list_agents))
        .route("/v1/tools", get(list_tools))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_tenant));
    let document = openapi();
    Router::new()
        .merge(protected)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(move || async move { Json(document) }))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
        })
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
        .layer(DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        .layer(middleware::from_fn(telemetry::measure))
        .with_state(state)
}

/// Middleware: a request that gets no response head within `request_timeout`
/// is answered 503 `timeout` (an event stream's head comes at once; its body is
/// not limited). Every 429 and 503 leaves with a `Retry-After`. A refusal (413,
/// 429, 503) is logged.
async fn deadline(State(state): State<AppState>, request: Request, next: Next) -> Response {
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
    /// The agent; `default` when left out.
    #[serde(default = "default_agent")]
    #[schema(default = "default")]
    pub agent: String,
    /// The request.
    pub input: String,
    /// Limits for this run instead of the agent's.
    #[serde(default)]
    pub limits: Option<LimitsBody>,
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
        }
    }
}

/// Starts a run. Answers once the run is durable; follow it at
/// `/v1/runs/{id}/events`.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    responses(
        (status = 201, body = RunView, description = "Accepted and stored."),
        (status = 400, body = ErrorBody, description = "Malformed JSON or invalid limits."),
        (status = 404, body = ErrorBody, description = "Unknown agent."),
        (status = 413, body = ErrorBody, description = "Body over server.max_body_bytes."),
        (status = 429, body = ErrorBody, description = "Too many active runs (globally or for this tenant); see Retry-After."),
        (status = 503, body = ErrorBody, description = "Shutting down, or the store failed."),
    ),
    security(("bearer" = [])))]
async fn create_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    body: Result<Json<CreateRun>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    if body.input.trim().is_empty() {
        return Err(ApiError::invalid("input must not be empty"));
    }
    let limits = match (body.limits, state.inner.runtime.agent(&body.agent)) {
        (Some(wanted), Some(agent)) => Some(lowered(&agent.limits, &wanted)),
        _ => None,
    };
    let spec = RunSpec { agent: body.agent, input: body.input, limits };
    let request = SubmitRequest { spec, tenant, parent_run_id: None };
    // The submission runs to its end even if the client goes away or the request
    // times out: a run half-accepted would be stored but never started.
    let runtime = state.inner.runtime.clone();
    let submitted = tokio::spawn(async move { runtime.submit_record(request).await });
    let run = submitted
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the submission failed"))??;
    Ok((StatusCode::CREATED, Json(RunView::from(run))).into_response())
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
    let min_option = |agent: Option<f64>, wanted: Option<f64>| match (agent, wanted) {
        (Some(a), Some(w)) => Some(a.min(w)),
        (a, w) => a.or(w),
    };
    Limits {
        max_turns: wanted.max_turns.map_or(agent.max_turns, |turns| turns.min(agent.max_turns)),
        max_parallel_tools: wanted
            .max_parallel_tools
            .map_or(agent.max_parallel_tools, |parallel| parallel.min(agent.max_parallel_tools)),
        max_tokens: match (agent.max_tokens, wanted.max_tokens) {
            (Some(a), Some(w)) => Some(a.min(w)),
            (a, w) => a.or(w),
        },
        max_cost_usd: min_option(agent.max_cost_usd, wanted.max_cost_usd),
    }
}

/// A listing filter.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
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
async fn list_runs(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Query(query) = query?;
    let limit = query.limit.unwrap_or(50).clamp(1, MAX_LIST);
    let after = match query.after.as_deref() {
        Some(id) => Some(id.parse().map_err(|_| ApiError::invalid("after must be a run id (from a previous page)"))?),
        None => None,
    };
    // One run more than asked for tells whether another page follows.
    let wanted = RunQuery { tenant: Some(tenant), status: query.status, limit: limit + 1, after };
    let mut runs = state.inner.runtime.store().list_runs(wanted).await?;
    let has_more = runs.len() > limit;
    runs.truncate(limit);
    Ok(Json(RunList { runs: runs.into_iter().map(RunView::from).collect(), has_more }))
}

/// One run.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path, description = "The run id.")),
    responses((status = 200, body = RunView), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn get_run(
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
async fn run_input(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<InputBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let run = owned_run(&state, &tenant, &id).await?;
    let Json(body) = body?;
    state.inner.runtime.input(run.run_id, body.into_input()?).await?;
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
async fn delete_run(
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
async fn cancel_run(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RunView>, ApiError> {
    let Path(id) = path?;
    let run = owned_run(&state, &tenant, &id).await?;
    state.inner.runtime.cancel(run.run_id).await?;
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
async fn list_agents(State(state): State<AppState>) -> Json<Vec<AgentView>> {
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
async fn list_tools(State(state): State<AppState>) -> Json<Vec<ToolView>> {
    let tools = state.inner.runtime.tools().into_iter().map(|tool| ToolView {
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters: tool.parameters.clone(),
    });
    Json(tools.collect())
}

/// Alive.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "The process serves.")))]
async fn healthz() -> Json<Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Ready: the store answers and the runtime takes runs.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, description = "Ready."), (status = 503, body = ErrorBody, description = "Not ready.")))]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let runtime = &state.inner.runtime;
    if !runtime.accepting() || state.inner.shutdown.is_cancelled() {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the runtime is not taking runs"));
    }
    // Any read answers whether the store is reachable; this one finds nothing.
    let probe = RunQuery { tenant: Some(String::new()), status: None, limit: 1, after: None };
    match tokio::time::timeout(Duration::from_secs(5), runtime.store().list_runs(probe)).await {
        Ok(Ok(_)) => Ok(Json(serde_json::json!({"status": "ready"}))),
        Ok(Err(error)) => Err(ApiError::from(error)),
        Err(_) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", "the store did not answer")),
    }
}

/// Prometheus exposition; with `metrics_token_sha256` set, only for its bearer.
async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
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
