//! Several daemons on one PostgreSQL: who drives which run.
//!
//! Each process is a node with an id of its own (a new one at every start) and a
//! row in `cluster_nodes` whose `lease_until` it pushes forward every heartbeat,
//! on the database's clock. A run is driven by the node named in its `owner`
//! column, under the `epoch` the node claimed it at. A node claims a run it
//! creates (epoch 1), and an unfinished run whose owner's lease has expired or
//! that nobody owns (`claim`: one `UPDATE … FOR UPDATE SKIP LOCKED`, so two nodes
//! never claim the same run, and each claim raises the epoch).
//!
//! Fencing: every group commit checks, in its transaction and under a share lock
//! on each run's row, that this node still owns each run at the epoch it claimed
//! and that its own lease has not expired (`fence`). A commit that fails the
//! check writes nothing and returns [`StoreError::Fenced`]; its session stops.
//! A claim takes the same rows `FOR UPDATE`, so a claim and a commit of one run
//! never interleave: a run's commits land under one owner at a time. A node whose
//! lease expired (by the database's clock) takes it back with the runs no other
//! node claimed meanwhile (`reacquire`); the others are fenced off.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use troupe_actors::metrics;
use troupe_actors::protocol::RunId;
use troupe_actors::store::StoreError;

use crate::store::sql::{Text, backend};

/// The statuses of a run that a node drives.
const UNFINISHED: &str = "('queued', 'running', 'waiting_input')";

/// The channel on which a node announces each commit (`NODE RUN_ID`), for the
/// streams other nodes serve.
pub const RUN_CHANNEL: &str = "troupe_run";
/// The channel on which a node announces that it gave its runs up.
pub const ORPHANS_CHANNEL: &str = "troupe_orphans";

/// At most this many runs are claimed per call of `claim`.
pub const CLAIM_BATCH: i64 = 64;

/// How a store joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The node's name in logs and `cluster_nodes` (the host name by default).
    pub node_name: String,
    /// How long the node holds its runs without renewing (a dead node's runs are
    /// claimed by others after it).
    pub lease: Duration,
}

/// This process as a node of the cluster.
pub struct Node {
    /// Its id, new at every start.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its lease.
    pub lease: Duration,
    /// The epoch at which it owns each run it drives.
    epochs: Mutex<HashMap<RunId, i64>>,
    /// Set once it left the cluster: its heartbeat stops.
    left: std::sync::atomic::AtomicBool,
    /// Runs claimed since the writer last looked: what it remembers of them may
    /// be stale (another node may have driven them).
    claimed: Mutex<Vec<RunId>>,
}

impl Node {
    pub(super) fn new(options: &ClusterOptions) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            name: options.node_name.clone(),
            lease: options.lease,
            epochs: Mutex::new(HashMap::new()),
            left: Default::default(),
            claimed: Mutex::new(Vec::new()),
        }
    }

    /// The runs claimed since the last call (for the writer to forget).
    pub(super) fn take_claimed(&self) -> Vec<RunId> {
        std::mem::take(&mut *self.claimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn epochs(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, i64>> {
        self.epochs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this node drives `run_id` (it created or claimed it, and has not
    /// been fenced off it since).
    pub fn owns(&self, run_id: RunId) -> bool {
        self.epochs().contains_key(&run_id)
    }

    fn owned(&self, run_id: RunId, epoch: i64) {
        let mut epochs = self.epochs();
        epochs.insert(run_id, epoch);
        metrics::cluster_leases_held(epochs.len());
    }

    fn forget(&self, run_ids: impl IntoIterator<Item = RunId>) {
        let mut epochs = self.epochs();
        for run_id in run_ids {
            epochs.remove(&run_id);
        }
        metrics::cluster_leases_held(epochs.len());
    }

    /// Registers the node with a fresh lease.
    pub(super) async fn join(&self, pool: &sqlx::PgPool) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO cluster_nodes (node_id, name, lease_until) VALUES ($1, $2, now() + make_interval(secs => $3))",
        )
        .bind(&self.id)
        .bind(&self.name)
        .bind(self.lease.as_secs_f64())
        .execute(pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    /// Pushes the node's lease forward, taking it again if it had expired
    /// (`reacquire`); `false` if the node is no longer known (it must stop). Now and then also
    /// forgets nodes gone for an hour and commands nobody read.
    pub async fn renew(&self, pool: &sqlx::PgPool) -> Result<bool, StoreError> {
        let renewed = sqlx::query(
            "UPDATE cluster_nodes SET lease_until = now() + make_interval(secs => $2) \
             WHERE node_id = $1 AND lease_until > now()",
        )
        .bind(&self.id)
        .bind(self.lease.as_secs_f64())
        .execute(pool)
        .await
        .map_err(backend)?;
        if renewed.rows_affected() == 0 {
            return self.reacquire(pool).await;
        }
        // Tidying, about once a minute at the default heartbeat.
        if fastrand::u32(..60) != 0 {
            return Ok(true);
        }
        sqlx::query("DELETE FROM cluster_nodes WHERE lease_until < now() - interval '1 hour'")
            .execute(pool)
            .await
            .map_err(backend)?;
        // Commands whose sender went away before reading the outcome.
        sqlx::query("DELETE FROM run_commands WHERE created_at < now() - interval '1 hour'")
            .execute(pool)
            .await
            .map_err(backend)?;
        Ok(true)
    }

    /// After the lease expired (the database was unreachable for longer than the
    /// lease, as in a restart of PostgreSQL, or the node was paused): takes the
    /// lease again, keeping the runs no other node claimed meanwhile; `false` if
    /// the node's row is gone (it must stop).
    async fn reacquire(&self, pool: &sqlx::PgPool) -> Result<bool, StoreError> {
        let mut tx = pool.begin().await.map_err(backend)?;
        let renewed = self.reacquire_in(&mut tx).await?;
        tx.commit().await.map_err(backend)?;
        if renewed {
            tracing::warn!(node = %self.name, "this node's lease had expired: renewed");
        }
        Ok(renewed)
    }

    /// [`Node::reacquire`] inside `tx`: the node's runs' rows are locked while it
    /// checks, so no claim passes in between (a claim that read the expired lease
    /// before and lands after only fences this node off that run).
    async fn reacquire_in(&self, tx: &mut sqlx::PgConnection) -> Result<bool, StoreError> {
        let held: Vec<(String, i64)> =
            self.epochs().iter().map(|(run_id, epoch)| (run_id.to_string(), *epoch)).collect();
        let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
        let stored: Vec<(String, Option<String>, i64)> =
            sqlx::query_as("SELECT run_id, owner, epoch FROM runs WHERE run_id = ANY($1) FOR UPDATE")
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(backend)?;
        let kept = |(id, epoch): &(String, i64)| {
            stored.iter().any(|(stored, owner, at)| stored == id && owner.as_deref() == Some(&self.id) && at == epoch)
        };
        // Runs another node took meanwhile are its now: their sessions here are
        // refused at their next commit, and stopped if this node claims them again.
        let taken: Vec<RunId> = held.iter().filter(|run| !kept(run)).filter_map(|(id, _)| id.parse().ok()).collect();
        if !taken.is_empty() {
            tracing::warn!(node = %self.name, runs = taken.len(), "other nodes took runs of this node while its lease had expired");
            self.forget(taken);
        }
        let renewed =
            sqlx::query("UPDATE cluster_nodes SET lease_until = now() + make_interval(secs => $2) WHERE node_id = $1")
                .bind(&self.id)
                .bind(self.lease.as_secs_f64())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        Ok(renewed.rows_affected() == 1)
    }

    /// Claims up to [`CLAIM_BATCH`] unfinished runs that no live node owns, oldest
    /// first, and returns their ids, oldest first. Nothing while this node's own
    /// lease has expired.
    pub(super) async fn claim(&self, pool: &sqlx::PgPool) -> Result<Vec<RunId>, StoreError> {
        let sql = format!(
            "WITH orphans AS (SELECT r.run_key, r.owner FROM runs r LEFT JOIN cluster_nodes n ON n.node_id = r.owner \
             WHERE r.status IN {UNFINISHED} AND (n.node_id IS NULL OR n.lease_until < now()) \
             AND EXISTS (SELECT 1 FROM cluster_nodes me WHERE me.node_id = $1 AND me.lease_until > now()) \
             ORDER BY r.run_key LIMIT $2 FOR UPDATE OF r SKIP LOCKED) \
             UPDATE runs SET owner = $1, epoch = runs.epoch + 1 FROM orphans WHERE runs.run_key = orphans.run_key \
             RETURNING runs.run_id, runs.epoch, orphans.owner IS NOT NULL AS taken"
        );
        let rows: Vec<(String, i64, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(&self.id)
            .bind(CLAIM_BATCH)
            .fetch_all(pool)
            .await
            .map_err(backend)?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut takeovers = 0;
        for (id, epoch, taken) in rows {
            let run_id: RunId = id.parse().map_err(|_| StoreError::Backend("bad stored run id".to_owned()))?;
            self.owned(run_id, epoch);
            takeovers += usize::from(taken);
            claimed.push(run_id);
        }
        claimed.sort();
        self.claimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(claimed.iter().copied());
        if !claimed.is_empty() {
            metrics::cluster_claimed(claimed.len(), takeovers);
            tracing::info!(node = %self.name, runs = claimed.len(), takeovers, "claimed runs no live node drives");
        }
        Ok(claimed)
    }

    /// Gives up one run the node stopped driving without ending it: any node
    /// (this one too) claims it at once, woken on [`ORPHANS_CHANNEL`].
    pub(super) async fn release(&self, pool: &sqlx::PgPool, run_id: RunId) -> Result<(), StoreError> {
        self.give_up(pool, Some(run_id)).await?;
        self.forget([run_id]);
        Ok(())
    }

    /// Sets `owner = NULL` on `run` (or on every unfinished run of the node, and
    /// then it leaves) and wakes the other nodes' claims, in one transaction.
    async fn give_up(&self, pool: &sqlx::PgPool, run: Option<RunId>) -> Result<u64, StoreError> {
        let mut tx = pool.begin().await.map_err(backend)?;
        let sql = format!(
            "UPDATE runs SET owner = NULL WHERE owner = $1 AND ($2::text IS NULL OR run_id = $2) AND status IN {UNFINISHED}"
        );
        let released = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&self.id)
            .bind(run.map(|run| run.to_string()))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        if run.is_none() {
            sqlx::query("DELETE FROM cluster_nodes WHERE node_id = $1")
                .bind(&self.id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(ORPHANS_CHANNEL)
            .bind(&self.id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(released.rows_affected())
    }

    /// Gives up every run the node owns and leaves the cluster (graceful
    /// shutdown, after its sessions committed what they held): other nodes claim
    /// them at once, woken on [`ORPHANS_CHANNEL`].
    pub async fn leave(&self, pool: &sqlx::PgPool) -> Result<u64, StoreError> {
        let released = self.give_up(pool, None).await?;
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        let held: Vec<RunId> = self.epochs().keys().copied().collect();
        self.forget(held);
        Ok(released)
    }
}

/// Renews the node's lease every `every` until the store is dropped
/// (`dropped`). The database's clock decides: while renewals fail (it is
/// unreachable), the node's commits fail too; once it answers, the lease is taken
/// again with the runs nobody claimed meanwhile. If the node's row is gone,
/// cancels `lost` and stops: the node must stop.
pub(super) async fn heartbeat(
    node: std::sync::Arc<Node>,
    pool: sqlx::PgPool,
    every: Duration,
    lost: tokio_util::sync::CancellationToken,
    dropped: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = dropped.cancelled() => return,
        }
        if node.left.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // A renewal slower than the lease could not have kept it anyway.
        match tokio::time::timeout(node.lease, node.renew(&pool)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) if node.left.load(std::sync::atomic::Ordering::SeqCst) => return,
            Ok(Ok(false)) => {
                tracing::error!(node = %node.id, "this node is no longer known to the cluster (gone for over an hour)");
                lost.cancel();
                return;
            }
            Ok(Err(error)) => tracing::warn!(node = %node.id, %error, "could not renew this node's lease"),
            Err(_) => tracing::warn!(node = %node.id, "renewing this node's lease timed out"),
        }
    }
}

/// Which of `runs` (id, key) this node may no longer write: those it does not own
/// at the epoch it claimed them, or all of them if its lease has expired. The
/// rows it still owns are share-locked until the transaction ends, so no claim
/// passes in between.
pub(super) async fn fence(
    tx: &mut sqlx::PgConnection,
    node: &Node,
    runs: &[(RunId, i64)],
) -> Result<Vec<RunId>, StoreError> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let (keys, epochs): (Vec<i64>, Vec<i64>) = {
        let held = node.epochs();
        runs.iter().map(|(run_id, key)| (*key, held.get(run_id).copied().unwrap_or(-1))).unzip()
    };
    let mut kept = still_held(&mut *tx, node, &keys, &epochs).await?;
    if kept.len() < runs.len() {
        // The node's own lease may have run out (the database was away for
        // longer than the lease): it takes it again, and the runs nobody took
        // meanwhile are still its own.
        let alive: Option<bool> =
            sqlx::query_scalar("SELECT lease_until > now() FROM cluster_nodes WHERE node_id = $1")
                .bind(&node.id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        if alive == Some(false) && node.reacquire_in(&mut *tx).await? {
            tracing::warn!(node = %node.name, "this node's lease had expired: renewed");
            kept = still_held(&mut *tx, node, &keys, &epochs).await?;
        }
    }
    let fenced: Vec<RunId> = runs.iter().filter(|(_, key)| !kept.contains(key)).map(|(run_id, _)| *run_id).collect();
    if !fenced.is_empty() {
        metrics::cluster_fenced(fenced.len());
        node.forget(fenced.iter().copied());
    }
    Ok(fenced)
}

/// The keys among `keys` this node owns at the matching `epochs`, while its lease
/// holds, share-locked.
async fn still_held(
    tx: &mut sqlx::PgConnection,
    node: &Node,
    keys: &[i64],
    epochs: &[i64],
) -> Result<Vec<i64>, StoreError> {
    sqlx::query_scalar(
        "SELECT r.run_key FROM runs r JOIN unnest($1::bigint[], $2::bigint[]) AS f (k, e) \
         ON r.run_key = f.k AND r.epoch = f.e WHERE r.owner = $3 \
         AND EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.node_id = $3 AND n.lease_until > now()) \
         FOR SHARE OF r",
    )
    .bind(keys)
    .bind(epochs)
    .bind(&node.id)
    .fetch_all(tx)
    .await
    .map_err(backend)
}

/// Makes the runs a group creates this node's (epoch 1), in its transaction.
pub(super) async fn own_created(
    tx: &mut sqlx::PgConnection,
    node: &Node,
    created: &[(RunId, i64)],
) -> Result<(), StoreError> {
    if created.is_empty() {
        return Ok(());
    }
    let keys: Vec<i64> = created.iter().map(|(_, key)| *key).collect();
    sqlx::query("UPDATE runs SET owner = $1, epoch = 1 WHERE run_key = ANY($2)")
        .bind(&node.id)
        .bind(&keys)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// After the group committed: remembers the runs it created as owned at epoch 1,
/// and forgets those that ended.
pub(super) fn committed(node: &Node, created: &[(RunId, i64)], ended: impl IntoIterator<Item = RunId>) {
    for (run_id, _) in created {
        node.owned(*run_id, 1);
    }
    node.forget(ended);
}

/// Announces the runs a group wrote on [`RUN_CHANNEL`], in its transaction (a
/// notification is delivered only if the transaction commits).
pub(super) async fn announce(tx: &mut sqlx::PgConnection, node: &Node, runs: &[&Text]) -> Result<(), StoreError> {
    if runs.is_empty() {
        return Ok(());
    }
    let payloads: Vec<String> = runs.iter().map(|id| format!("{} {id}", node.id)).collect();
    sqlx::query("SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload")
        .bind(RUN_CHANNEL)
        .bind(&payloads)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// The run a notification on [`RUN_CHANNEL`] names, unless this node sent it.
pub fn announced_run(node_id: &str, payload: &str) -> Option<RunId> {
    let (sender, run) = payload.split_once(' ')?;
    (sender != node_id).then(|| run.parse().ok()).flatten()
}
