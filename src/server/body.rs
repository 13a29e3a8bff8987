//! A body over `server.max_body_bytes` is answered 413 in a way every client can
//! read. Many clients (Python's urllib and requests, most scripts) send the whole
//! body before they read anything: a server that answers at once and closes the
//! connection with the body unread makes the kernel reset it, and such a client
//! sees a broken pipe instead of the 413. So a request whose `Content-Length` is
//! over the limit has its body read and dropped first (up to [`DRAIN_LIMIT`],
//! within the request's deadline), then gets the 413 and `Connection: close`.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::error::ApiError;
use super::state::AppState;

/// At most this many bytes of an oversized body are read to answer it; a larger
/// one is cut off (its client may then see a reset, as before).
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Middleware: 413 for a declared body over the limit, once the body is read.
pub async fn reject_oversized(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit = state.inner.config.max_body_bytes as u64;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    let Some(length) = declared.filter(|length| *length > limit) else {
        return next.run(request).await;
    };
    if length <= DRAIN_LIMIT {
        let deadline = state.inner.timing.request_timeout;
        let _ = tokio::time::timeout(deadline, drain(request.into_body())).await;
    }
    let message = format!("the request body is {length} bytes; at most {limit} are accepted (server.max_body_bytes)");
    let mut response = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message).into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Reads `body` to its end, keeping nothing.
async fn drain(body: Body) {
    let mut frames = body.into_data_stream();
    while let Some(Ok(_)) = frames.next().await {}
}
