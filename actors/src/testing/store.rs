//! A store with a hook before every commit, to make commits panic, watch them,
//! or hold them.

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use crate::protocol::RunId;
use crate::store::{Commit, MemoryStore, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError};

/// A memory store that runs a hook before every commit and waits for the future
/// it returns: a test makes a commit panic there (the caller's actor crashes
/// mid-turn as on a real fault), looks at it, or holds it.
pub struct FaultyStore {
    inner: MemoryStore,
    before_commit: CommitHook,
}

type CommitHook = Box<dyn Fn(&Commit) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl FaultyStore {
    /// Panics on the first `times` commits for which `predicate` holds.
    pub fn new(times: usize, predicate: impl Fn(&Commit) -> bool + Send + Sync + 'static) -> Self {
        let remaining = AtomicUsize::new(times);
        Self::before_commit(move |commit| {
            if predicate(commit)
                && remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_ok()
            {
                panic!("injected store fault");
            }
            Box::pin(async {})
        })
    }

    /// Calls `hook` before each commit, and writes the commit once the future it
    /// returns is done.
    pub fn before_commit(
        hook: impl Fn(&Commit) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        Self { inner: MemoryStore::new(), before_commit: Box::new(hook) }
    }
}

#[async_trait]
impl RunStore for FaultyStore {
    async fn create_run(&self, run: RunRecord, events: Vec<crate::protocol::RunEvent>) -> Result<(), StoreError> {
        self.inner.create_run(run, events).await
    }
    async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
        (self.before_commit)(commit).await;
        self.inner.commit(commit).await
    }
    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        self.inner.get_run(run_id).await
    }
    async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError> {
        self.inner.load(run_id).await
    }
    async fn events_after(
        &self,
        run_id: RunId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::protocol::RunEvent>, StoreError> {
        self.inner.events_after(run_id, after, limit).await
    }
    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(query).await
    }
    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
        self.inner.unfinished_runs().await
    }
    async fn tenant_usage(
        &self,
        tenant: &str,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::protocol::Usage, StoreError> {
        self.inner.tenant_usage(tenant, since).await
    }
    async fn delete_finished(&self, before: chrono::DateTime<chrono::Utc>, limit: usize) -> Result<usize, StoreError> {
        self.inner.delete_finished(before, limit).await
    }
    async fn delete_ended(&self, run_id: crate::protocol::RunId) -> Result<bool, StoreError> {
        self.inner.delete_ended(run_id).await
    }
    fn threads(&self) -> &dyn crate::store::ThreadStore {
        self.inner.threads()
    }
}
