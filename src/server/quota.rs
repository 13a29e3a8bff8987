//! Per-tenant daily quotas of tokens and cost (`[quotas]`). A tenant's spend is
//! read from the store (its runs created since the UTC day began, sub-runs counted
//! in their callers), so it holds across restarts and needs no counter of its
//! own. Over a quota, a new run is refused 429 `quota_exceeded` until the next
//! UTC midnight; under it, the run's budget is lowered to what is left, so a run
//! overshoots by at most the model call that crosses the line.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use troupe_actors::protocol::{Limits, Usage};
use troupe_actors::store::RunStore;

use super::error::ApiError;

/// `[quotas]`: what a tenant may spend per UTC day.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaConfig {
    /// Tokens (input + output) per tenant per day; 0: no quota.
    pub daily_tokens: u64,
    /// USD per tenant per day; 0: no quota.
    pub daily_cost_usd: f64,
    /// Tenants with quotas of their own (a key left out takes the one above).
    pub tenants: BTreeMap<String, TenantQuota>,
}

/// One tenant's quotas.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantQuota {
    /// Tokens per day; 0: no quota.
    pub daily_tokens: Option<u64>,
    /// USD per day; 0: no quota.
    pub daily_cost_usd: Option<f64>,
}

/// A tenant's quotas: `None` where it has none.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Quota {
    tokens: Option<u64>,
    cost_usd: Option<f64>,
}

impl QuotaConfig {
    /// Whether the quotas are usable numbers.
    pub fn check(&self) -> Result<(), String> {
        let costs = std::iter::once(("quotas.daily_cost_usd".to_owned(), Some(self.daily_cost_usd))).chain(
            self.tenants
                .iter()
                .map(|(tenant, quota)| (format!("quotas.tenants.{tenant}.daily_cost_usd"), quota.daily_cost_usd)),
        );
        for (key, cost) in costs {
            if cost.is_some_and(|cost| !(cost.is_finite() && cost >= 0.0)) {
                return Err(format!("{key} must be a number of USD, 0 (no quota) or more"));
            }
        }
        Ok(())
    }

    fn of(&self, tenant: &str) -> Quota {
        let own = self.tenants.get(tenant);
        let tokens = own.and_then(|own| own.daily_tokens).unwrap_or(self.daily_tokens);
        let cost_usd = own.and_then(|own| own.daily_cost_usd).unwrap_or(self.daily_cost_usd);
        Quota { tokens: (tokens > 0).then_some(tokens), cost_usd: (cost_usd > 0.0).then_some(cost_usd) }
    }

    /// Checks `tenant`'s spend today against its quotas: 429 `quota_exceeded` (with
    /// the reset time) when one is spent, else `limits` lowered to what is left;
    /// `None` for a tenant without quotas (which costs no store read).
    pub async fn admit(
        &self,
        store: &dyn RunStore,
        tenant: &str,
        limits: Limits,
        now: DateTime<Utc>,
    ) -> Result<Option<Limits>, ApiError> {
        let quota = self.of(tenant);
        if quota.tokens.is_none() && quota.cost_usd.is_none() {
            return Ok(None);
        }
        let day = now.date_naive().and_time(chrono::NaiveTime::MIN).and_utc();
        let spent = store.tenant_usage(tenant, day).await?;
        let reset = day + Duration::days(1);
        if let Some(spent_what) = spent_quota(quota, &spent) {
            let seconds = u64::try_from((reset - now).num_seconds()).unwrap_or(0).max(1);
            let reset_at = reset.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            return Err(ApiError {
                reset_at: Some(reset_at.clone()),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "quota_exceeded",
                    format!("the tenant's daily {spent_what} quota is spent; it resets at {reset_at}"),
                )
                .retry_after(seconds)
            });
        }
        let left_tokens = quota.tokens.map(|max| max.saturating_sub(spent.total_tokens()));
        let left_cost = quota.cost_usd.map(|max| max - spent.cost_usd);
        Ok(Some(Limits {
            max_tokens: tighter(limits.max_tokens, left_tokens),
            max_cost_usd: tighter(limits.max_cost_usd, left_cost),
            ..limits
        }))
    }
}

/// Which quota `spent` has used up, if one.
fn spent_quota(quota: Quota, spent: &Usage) -> Option<&'static str> {
    if quota.tokens.is_some_and(|max| spent.total_tokens() >= max) {
        Some("token")
    } else if quota.cost_usd.is_some_and(|max| spent.cost_usd >= max) {
        Some("cost")
    } else {
        None
    }
}

/// The tighter of two optional bounds (`None`: unbounded).
pub(super) fn tighter<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b < a { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use troupe_actors::protocol::RunId;
    use troupe_actors::store::{MemoryStore, RunRecord};

    use super::*;

    fn config() -> QuotaConfig {
        QuotaConfig {
            daily_tokens: 1_000,
            daily_cost_usd: 0.0,
            tenants: BTreeMap::from([
                ("rich".to_owned(), TenantQuota { daily_tokens: Some(0), daily_cost_usd: Some(1.0) }),
                ("free".to_owned(), TenantQuota::default()),
            ]),
        }
    }

    #[test]
    fn a_tenant_takes_its_own_quota_else_the_default_and_zero_means_none() {
        let config = config();
        assert_eq!(config.of("anyone"), Quota { tokens: Some(1_000), cost_usd: None });
        assert_eq!(config.of("rich"), Quota { tokens: None, cost_usd: Some(1.0) });
        assert_eq!(config.of("free"), Quota { tokens: Some(1_000), cost_usd: None });
        assert_eq!(QuotaConfig::default().of("anyone"), Quota { tokens: None, cost_usd: None });
    }

    #[test]
    fn a_negative_or_infinite_cost_quota_is_refused() {
        let mut config = config();
        assert!(config.check().is_ok());
        config.tenants.get_mut("rich").unwrap().daily_cost_usd = Some(-1.0);
        assert!(config.check().unwrap_err().contains("quotas.tenants.rich.daily_cost_usd"));
        let config = QuotaConfig { daily_cost_usd: f64::INFINITY, ..QuotaConfig::default() };
        assert!(config.check().unwrap_err().contains("quotas.daily_cost_usd"));
    }

    async fn spent(store: &MemoryStore, tenant: &str, tokens: u64, at: DateTime<Utc>) {
        let mut run = RunRecord::accepted(RunId::new(), tenant.into(), "a".into(), "q".into(), Limits::default(), at);
        run.usage = Usage { input_tokens: tokens, output_tokens: 0, cost_usd: 0.0 };
        store.create_run(run, Vec::new()).await.unwrap();
    }

    #[tokio::test]
    async fn spend_of_today_lowers_the_budget_then_refuses_until_midnight() {
        let store = MemoryStore::new();
        let now: DateTime<Utc> = "2026-03-04T22:00:00Z".parse().unwrap();
        let config = config();
        spent(&store, "acme", 5_000, now - Duration::days(1)).await; // yesterday: not counted
        spent(&store, "acme", 600, now - Duration::hours(1)).await;
        let limits = config.admit(&store, "acme", Limits::default(), now).await.unwrap().unwrap();
        assert_eq!(limits.max_tokens, Some(400), "what is left of the day");
        spent(&store, "acme", 400, now).await;
        let refused = config.admit(&store, "acme", Limits::default(), now).await.unwrap_err();
        assert_eq!((refused.status, refused.code), (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"));
        assert_eq!(refused.retry_after, Some(2 * 3600));
        assert_eq!(refused.reset_at.as_deref(), Some("2026-03-05T00:00:00Z"));
        // Another tenant, and a tenant without quotas, are not held back.
        assert!(config.admit(&store, "globex", Limits::default(), now).await.is_ok());
        let none = QuotaConfig::default().admit(&store, "acme", Limits::default(), now).await.unwrap();
        assert_eq!(none, None, "no quota, no store read, limits as they were");
    }
}
