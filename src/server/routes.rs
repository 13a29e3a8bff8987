//! The router: every route with its middleware, and the OpenAPI 3.1 document
//! generated from the handlers' annotations.

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::api::{
    self, AgentView, CreateRun, InputBody, LimitsBody, RunList, RunView, ToolView, UsageView, cancel_run, create_run,
    deadline, delete_run, get_run, healthz, list_agents, list_runs, list_tools, metrics, readyz, run_input,
};
use super::error::{ApiError, ErrorBody};
use super::state::{AppState, require_tenant};
use super::{sse, telemetry, threads, web};

#[derive(OpenApi)]
#[openapi(
    info(title = "troupe", description = "An actor-based multi-agent runtime: submit runs, follow their events, answer and cancel them."),
    paths(api::create_run, api::list_runs, api::get_run, api::delete_run, sse::run_events, api::run_input, api::cancel_run,
        threads::create_thread, threads::list_threads, threads::get_thread, threads::update_thread, threads::delete_thread,
        threads::create_thread_run, threads::list_thread_runs, sse::thread_events,
        api::list_agents, api::list_tools, api::healthz, api::readyz),
    components(schemas(ErrorBody, CreateRun, LimitsBody, RunView, UsageView, RunList, InputBody, AgentView, ToolView,
        threads::CreateThread, threads::UpdateThread, threads::ThreadView, threads::ThreadDetail, threads::ThreadList,
        threads::ThreadMessageView, threads::CreateThreadRun)),
    modifiers(&BearerAuth),
    tags((name = "runs", description = "Runs and their events"),
        (name = "threads", description = "Conversations: runs that follow each other"),
        (name = "catalog", description = "Agents and tools"),
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
        .route("/v1/threads", post(threads::create_thread).get(threads::list_threads))
        .route(
            "/v1/threads/{id}",
            get(threads::get_thread).patch(threads::update_thread).delete(threads::delete_thread),
        )
        .route("/v1/threads/{id}/runs", post(threads::create_thread_run).get(threads::list_thread_runs))
        .route("/v1/threads/{id}/events", get(sse::thread_events))
        .route("/v1/agents", get(list_agents))
        .route("/v1/tools", get(list_tools))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_tenant));
    let document = openapi();
    let mut router = Router::new().merge(protected);
    if state.inner.config.web {
        router =
            router.route("/", get(web::index)).route("/app.js", get(web::script)).route("/app.css", get(web::style));
    }
    router
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
        .layer(middleware::from_fn_with_state(state.clone(), web::cors))
        .layer(middleware::from_fn(telemetry::measure))
        .with_state(state)
}
