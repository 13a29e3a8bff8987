//! The one error type of the API. Every failure answers JSON
//! `{"error": {"code": "...", "message": "..."}}` with a stable `code`.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use troupe_actors::store::StoreError;
use troupe_actors::{CancelError, InputError, SubmitError};
use utoipa::ToSchema;

/// An API failure.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// Stable, machine-readable.
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// For `thread_busy`: the thread's active run.
    pub active_run_id: Option<String>,
    /// For `quota_exceeded`: when the quota resets (RFC 3339).
    pub reset_at: Option<String>,
}

/// The JSON body of an error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code: `unauthorized`, `not_found`, `invalid_json`, `invalid_request`,
    /// `payload_too_large`, `invalid_input`, `unknown_agent`, `invalid_limits`, `overloaded`,
    /// `tenant_overloaded`, `too_many_streams`, `not_waiting`, `already_ended`,
    /// `not_ended`, `thread_busy`, `thread_queue_full`, `quota_exceeded`, `idempotency_key_reused`,
    /// `unavailable`, `timeout`, `store_error`.
    pub code: String,
    /// A description.
    pub message: String,
    /// For `thread_busy`: the run the thread is busy with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_run_id: Option<String>,
    /// For `quota_exceeded`: when the tenant's daily quota resets (RFC 3339, UTC
    /// midnight); `Retry-After` says the same in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<String>,
}

impl ApiError {
    /// An error with no `Retry-After`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after: None, active_run_id: None, reset_at: None }
    }

    /// 404 `not_found`: no such run for this tenant (another tenant's runs are
    /// indistinguishable from missing ones).
    pub fn run_not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "run not found")
    }

    /// 404 `not_found` for a thread (another tenant's looks missing too).
    pub fn thread_not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "thread not found")
    }

    /// 401 `unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "a valid bearer token is required")
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// With a `Retry-After`.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = ErrorDetail {
            code: self.code.to_owned(),
            message: self.message.clone(),
            active_run_id: self.active_run_id.clone(),
            reset_at: self.reset_at.clone(),
        };
        let body = ErrorBody { error };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // For the line the server logs about a refusal (`incidents.rs`).
        response.extensions_mut().insert(self);
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(_) => Self::run_not_found(),
            StoreError::ThreadNotFound(_) => Self::thread_not_found(),
            // The detail goes to the log, not to the client.
            other => {
                tracing::error!(error = %other, "store error");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", "the run store failed; try again")
            }
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        let message = error.to_string();
        match error {
            SubmitError::UnknownAgent(_) => Self::new(StatusCode::NOT_FOUND, "unknown_agent", message),
            SubmitError::InvalidLimits(_) => Self::new(StatusCode::BAD_REQUEST, "invalid_limits", message),
            SubmitError::Overloaded { .. } => Self::new(StatusCode::TOO_MANY_REQUESTS, "overloaded", message),
            SubmitError::TenantOverloaded { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "tenant_overloaded", message)
            }
            SubmitError::Unavailable => Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
            SubmitError::UnknownThread => Self::thread_not_found(),
            SubmitError::ThreadBusy { active_run_id } => Self {
                active_run_id: Some(active_run_id.to_string()),
                ..Self::new(StatusCode::CONFLICT, "thread_busy", message)
            },
            SubmitError::ThreadQueueFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "thread_queue_full", message)
            }
            SubmitError::IdempotencyKeyReused => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused", message)
            }
            SubmitError::Store(error) => error.into(),
        }
    }
}

impl From<InputError> for ApiError {
    fn from(error: InputError) -> Self {
        let message = error.to_string();
        match error {
            InputError::NotFound => Self::run_not_found(),
            InputError::NotWaiting => Self::new(StatusCode::CONFLICT, "not_waiting", message),
            InputError::Invalid(_) => Self::new(StatusCode::BAD_REQUEST, "invalid_input", message),
            InputError::Unavailable => Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
            InputError::Store(error) => error.into(),
        }
    }
}

impl From<CancelError> for ApiError {
    fn from(error: CancelError) -> Self {
        let message = error.to_string();
        match error {
            CancelError::NotFound => Self::run_not_found(),
            CancelError::AlreadyEnded(_) => Self::new(StatusCode::CONFLICT, "already_ended", message),
            CancelError::Unavailable => Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
            CancelError::Store(error) => error.into(),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is too large")
            }
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_json",
                "send the body as JSON with Content-Type: application/json",
            ),
            _ => Self::new(StatusCode::BAD_REQUEST, "invalid_json", rejection.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::invalid(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::invalid(rejection.body_text())
    }
}
