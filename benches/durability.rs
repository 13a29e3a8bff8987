//! What durability costs per turn: the in-process workload of the core's bench
//! (`actors/benches/turns.rs`) on the memory store, SQLite and PostgreSQL.
//!
//! `cargo bench --bench durability [-- RUNS]`; PostgreSQL from `TROUPE_BENCH_PG_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`; each run creates its
//! own database), skipped if unreachable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use tikv_jemallocator::Jemalloc;
use troupe::store::SqlStore;
use troupe_actors::protocol::RunId;
use troupe_actors::store::{MemoryStore, RunStore};
use troupe_actors::testing::bench::throughput;

#[global_allocator]
static ALLOCATOR: Jemalloc = Jemalloc;

fn main() {
    let runs: usize =
        std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|n| n.parse().ok()).unwrap_or(2000);
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("troupe-bench-{}", RunId::new()));
    let sqlite_url = format!("sqlite://{}", dir.join("bench.db").display());
    let stores: Vec<(&str, Option<Arc<dyn RunStore>>)> = tokio.block_on(async {
        vec![
            ("memory", Some(Arc::new(MemoryStore::new()) as Arc<dyn RunStore>)),
            ("sqlite", Some(Arc::new(SqlStore::connect(&sqlite_url).await.unwrap()) as Arc<dyn RunStore>)),
            ("postgres", postgres().await.map(|store| Arc::new(store) as Arc<dyn RunStore>)),
        ]
    });
    println!("durability bench: {runs} runs x 3 turns each, unobserved");
    for (name, store) in stores {
        let Some(store) = store else {
            println!("{name:>8}: skipped (no server)");
            continue;
        };
        tokio.block_on(throughput(store.clone(), 50, false)).unwrap();
        let (turns_per_second, cpu_per_turn) = tokio.block_on(throughput(store, runs, false)).unwrap();
        println!("{name:>8}: {turns_per_second:>8.0} turns/s, {cpu_per_turn:>6.1} µs CPU per turn");
    }
    let _ = std::fs::remove_dir_all(dir);
}

async fn postgres() -> Option<SqlStore> {
    let admin =
        std::env::var("TROUPE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = sqlx::PgPool::connect(&admin).await.ok()?;
    let name = format!("troupe_bench_{}", RunId::new().to_string().replace('-', ""));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&pool).await.ok()?;
    let (base, _) = admin.rsplit_once('/')?;
    SqlStore::connect(&format!("{base}/{name}")).await.ok()
}
