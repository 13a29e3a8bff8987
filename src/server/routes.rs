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
use super::{body, sse, telemetry, threads, web};

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

/// The OpenAPI 3.1 document of the API: what the handlers' annotations generate,
/// completed (see [`complete`]).
pub fn openapi() -> serde_json::Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    complete(&mut document);
    document
}

/// What the handlers' annotations leave out but the server does, written into
/// the document so that strict validators and client generators take it: a
/// description for every response, the answers every route can give (401, 503;
/// 413 and 415 where a body is read; 429 where a run or stream is opened), the
/// values the server accepts (`enum`s, minima).
fn complete(document: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let error = |description: &str| {
        json!({"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    };
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, operations) in paths.iter_mut() {
            let Some(operations) = operations.as_object_mut() else { continue };
            for (method, operation) in operations.iter_mut() {
                let has_body = operation.get("requestBody").is_some();
                let opens = method == "post" && !path.ends_with("/cancel") && !path.ends_with("/input")
                    || path.ends_with("/events");
                let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else { continue };
                for (status, response) in responses.iter_mut() {
                    if response.get("description").and_then(Value::as_str).is_none_or(str::is_empty) {
                        response["description"] = json!(default_description(status));
                    }
                }
                if path.starts_with("/v1/") {
                    responses.entry("401").or_insert_with(|| error("`unauthorized`: no valid bearer token."));
                }
                if has_body {
                    responses
                        .entry("413")
                        .or_insert_with(|| error("`payload_too_large`: body over server.max_body_bytes."));
                    responses
                        .entry("415")
                        .or_insert_with(|| error("`invalid_json`: the body is not sent as `application/json`."));
                }
                if opens {
                    responses.entry("429").or_insert_with(|| {
                        error("`overloaded`, `tenant_overloaded`, `too_many_streams`, `thread_queue_full` or `quota_exceeded` (with `reset_at`); see `Retry-After`.")
                    });
                }
                if path != "/healthz" && path != "/openapi.json" {
                    responses.entry("503").or_insert_with(|| {
                        error("`unavailable` (shutting down), `store_error` or `timeout` (server.request_timeout); see `Retry-After`.")
                    });
                }
            }
        }
    }
    // Every event kind, as the event streams send them (`data:` of each SSE event).
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.definitions_path = "/components/schemas".into();
            settings.meta_schema = None;
        })
        .for_serialize()
        .into_generator();
    let event = generator.subschema_for::<troupe_actors::protocol::RunEvent>().to_value();
    let definitions = generator.take_definitions(true);
    for path in ["/v1/runs/{id}/events", "/v1/threads/{id}/events"] {
        let pointer = format!("/paths/{}/get/responses/200/content/text~1event-stream", path.replace('/', "~1"));
        if let Some(content) = document.pointer_mut(&pointer) {
            content["schema"] = event.clone();
        }
    }
    let Some(schemas) = document.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    for (name, schema) in definitions {
        schemas.entry(name).or_insert(schema);
    }
    let mut set = |schema: &str, property: &str, key: &str, value: Value| {
        if let Some(property) =
            schemas.get_mut(schema).and_then(|schema| schema.pointer_mut(&format!("/properties/{property}")))
        {
            property[key] = value;
        }
    };
    let statuses = json!(["queued", "running", "waiting_input", "succeeded", "failed", "cancelled"]);
    set("RunView", "status", "enum", statuses);
    set("ThreadDetail", "status", "enum", json!(["busy", "idle"]));
    let strategies = json!(["reject", "enqueue", "interrupt", "rollback", null]);
    set("CreateRun", "multitask_strategy", "enum", strategies.clone());
    set("CreateThreadRun", "multitask_strategy", "enum", strategies);
    set("CreateRun", "input", "minLength", json!(1));
    set("CreateThreadRun", "input", "minLength", json!(1));
    for limit in ["max_turns", "max_parallel_tools", "max_tokens"] {
        set("LimitsBody", limit, "minimum", json!(1));
    }
    set("LimitsBody", "max_cost_usd", "exclusiveMinimum", json!(0));
}

/// A response's description when its annotation gives none.
fn default_description(status: &str) -> &'static str {
    match status {
        "200" => "OK.",
        "201" => "Created.",
        "204" => "Done; no body.",
        "400" => "`invalid_request`, `invalid_json` or `invalid_limits`: the request is malformed.",
        "404" => "`not_found`: no such resource for this tenant (another tenant's is not found either).",
        "409" => "The resource is not in a state that allows this.",
        _ => "See the error's `code`.",
    }
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
        // Inside `deadline`, which logs refusals: an oversized body is one.
        .layer(middleware::from_fn_with_state(state.clone(), body::reject_oversized))
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
        .layer(DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), web::cors))
        .layer(middleware::from_fn(telemetry::measure))
        .with_state(state)
}
