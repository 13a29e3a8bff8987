//! The web page at `/`: a person signs in with an API token, sees the tenant's
//! threads and runs, talks to an agent and watches each answer's reasoning block
//! live. Its three files are embedded in the binary and served with a strict
//! Content-Security-Policy (nothing from another origin, no inline script or
//! style); the page calls the same API as any client. Also CORS, for pages of
//! other origins named in `server.cors_origins` (none by default).

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;

const INDEX: &str = include_str!("../../web/index.html");
const SCRIPT: &str = include_str!("../../web/app.js");
const STYLE: &str = include_str!("../../web/app.css");

/// No script, style, image or connection but the daemon's own; no frames, no
/// forms posted elsewhere, no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`.
pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

/// `GET /app.js`.
pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// `GET /app.css`.
pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}

/// Request headers a page of an allowed origin may send.
const ALLOWED_HEADERS: &str = "authorization, content-type, last-event-id, idempotency-key";
/// Response headers it may read.
const EXPOSED_HEADERS: &str = "retry-after, idempotent-replayed, location";

/// CORS: a request from an origin in `server.cors_origins` gets the headers
/// that let its page read the answer, and a preflight (`OPTIONS` with
/// `Access-Control-Request-Method`) is answered here, before authentication.
/// Any other origin gets no CORS header, so its page cannot read the answer.
pub async fn cors(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let origins = &state.inner.config.cors_origins;
    let origin = request.headers().get(header::ORIGIN).cloned();
    let allowed = origin.as_ref().filter(|origin| {
        let text = origin.to_str().unwrap_or_default();
        origins.iter().any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(text))
    });
    let Some(origin) = allowed.cloned() else {
        return next.run(request).await;
    };
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight { StatusCode::NO_CONTENT.into_response() } else { next.run(request).await };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    if preflight {
        allow(headers, header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, PATCH, DELETE");
        allow(headers, header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOWED_HEADERS);
        allow(headers, header::ACCESS_CONTROL_MAX_AGE, "600");
    } else {
        allow(headers, header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED_HEADERS);
    }
    response
}

fn allow(headers: &mut HeaderMap, name: HeaderName, value: &'static str) {
    headers.insert(name, HeaderValue::from_static(value));
}
