//! Retention: finished runs older than `store.retention_days` are deleted in
//! batches, by `troupe gc` and by the daemon every `store.gc_interval` seconds,
//! then the store gives the space back ([`RunStore::compact`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use troupe_actors::metrics;
use troupe_actors::store::RunStore;

use crate::config::StoreConfig;

/// Deletes the finished runs that ended more than `days` ago, `batch` at a
/// time; returns how many.
pub async fn sweep(store: &dyn RunStore, days: f64, batch: usize) -> anyhow::Result<usize> {
    let age = chrono::Duration::try_seconds((days * 86_400.0) as i64)
        .filter(|_| days.is_finite() && days >= 0.0)
        .context("the retention period must be a non-negative number of days")?;
    let before = chrono::Utc::now()
        .checked_sub_signed(age)
        .context("the retention period reaches past the earliest representable date")?;
    let batch = batch.max(1);
    let mut deleted = 0;
    loop {
        let count = store.delete_finished(before, batch).await?;
        deleted += count;
        if count < batch {
            return Ok(deleted);
        }
    }
}

/// The daemon's retention: a sweep at start, then every `gc_interval` seconds,
/// until `shutdown`; each counted in the metrics, with the store's size after.
pub async fn run_periodically(store: Arc<dyn RunStore>, config: StoreConfig, shutdown: CancellationToken) {
    let Some(interval) = Duration::try_from_secs_f64(config.gc_interval).ok().filter(|every| !every.is_zero()) else {
        return;
    };
    loop {
        match sweep(store.as_ref(), config.retention_days, config.gc_batch).await {
            Ok(deleted) => {
                metrics::retention_deleted(deleted);
                if deleted > 0 {
                    tracing::info!(deleted, days = config.retention_days, "retention deleted finished runs");
                }
                match store.compact().await {
                    Ok(Some(bytes)) => metrics::store_size(bytes),
                    Ok(None) => {}
                    Err(error) => tracing::warn!(%error, "the store could not give deleted rows' space back"),
                }
            }
            Err(error) => tracing::warn!(error = format!("{error:#}"), "retention failed; it tries again next time"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
