//! What every handler shares ([`AppState`]), and the lookups every route makes
//! through it: the request's tenant ([`require_tenant`]) and a tenant's run
//! ([`owned_run`]).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use tokio_util::sync::CancellationToken;
use troupe_actors::Runtime;
use troupe_actors::protocol::RunId;
use troupe_actors::store::RunRecord;

use super::auth::{Auth, HashedToken, Tenant};
use super::config::{ServeError, ServerConfig, Timing};
use super::error::ApiError;
use super::quota::QuotaConfig;
use super::slots::StreamSlots;
use super::throttle::LogThrottle;
use crate::store::Membership;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub(super) inner: Arc<Inner>,
}

/// What [`AppState`] holds; the handlers of `server` read its fields.
pub(super) struct Inner {
    pub(super) runtime: Arc<Runtime>,
    pub(super) auth: Auth,
    pub(super) config: ServerConfig,
    pub(super) quotas: QuotaConfig,
    pub(super) timing: Timing,
    pub(super) prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The token `/metrics` asks for, if any.
    pub(super) metrics_token: Option<HashedToken>,
    pub(super) streams: StreamSlots,
    pub(super) shutdown: CancellationToken,
    /// The lines about refused requests and cut streams a client can cause.
    pub(super) throttle: LogThrottle,
    /// This daemon as a node of a cluster: requests about runs other nodes
    /// drive go to them (see `forward.rs`).
    pub(super) cluster: Option<Membership>,
}

impl AppState {
    /// The state of a server over `runtime`, with tenants' daily `quotas`.
    /// `prometheus` renders `/metrics` (404 without it); cancelling `shutdown`
    /// ends every event stream.
    pub fn new(
        runtime: Arc<Runtime>,
        auth: Auth,
        config: ServerConfig,
        quotas: QuotaConfig,
        prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
        shutdown: CancellationToken,
    ) -> Result<Self, ServeError> {
        let timing = config.timing()?;
        quotas.check().map_err(ServeError::Config)?;
        let metrics_token = metrics_token(&config)?;
        let streams = StreamSlots::new(config.max_sse_clients, config.max_sse_clients_per_tenant);
        let throttle = LogThrottle::default();
        let inner = Inner {
            runtime,
            auth,
            config,
            quotas,
            timing,
            prometheus,
            metrics_token,
            streams,
            shutdown,
            throttle,
            cluster: None,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The same state for a node of a cluster.
    pub fn in_cluster(mut self, membership: Option<Membership>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.cluster = membership;
        }
        self
    }
}

/// The token `/metrics` asks for, if one is set.
fn metrics_token(config: &ServerConfig) -> Result<Option<HashedToken>, ServeError> {
    match &config.metrics_token_sha256 {
        Some(hex) => Ok(Some(HashedToken::from_hex(hex).ok_or_else(|| {
            ServeError::Config("metrics_token_sha256 must be 64 hex digits (`troupe hash-token TOKEN`)".to_owned())
        })?)),
        None => Ok(None),
    }
}

/// Whether `config` is one a server can start with (`troupe config check`).
pub fn check_config(config: &ServerConfig) -> Result<(), ServeError> {
    config.timing()?;
    metrics_token(config)?;
    Ok(())
}

/// Middleware: 401 unless the request carries a known token; the tenant goes in
/// the request's extensions.
pub async fn require_tenant(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let header = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
    match state.inner.auth.tenant(header) {
        Some(tenant) => {
            request.extensions_mut().insert(Tenant(tenant));
            next.run(request).await
        }
        None => axum::response::IntoResponse::into_response(ApiError::unauthorized()),
    }
}

/// The run `id` if it exists and belongs to `tenant`; 404 otherwise (also for
/// an id that is not a run id).
pub async fn owned_run(state: &AppState, tenant: &str, id: &str) -> Result<RunRecord, ApiError> {
    let run_id: RunId = id.parse().map_err(|_| ApiError::run_not_found())?;
    match state.inner.runtime.get(run_id).await? {
        Some(run) if run.tenant == tenant => Ok(run),
        _ => Err(ApiError::run_not_found()),
    }
}
