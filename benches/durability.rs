//! What durability costs per turn: the in-process workload of the core's bench
//! (`actors/benches/turns.rs`) on the memory store, SQLite and PostgreSQL.
//!
//! Each store runs a first round of RUNS runs on a fresh store in a fresh
//! process (cold: heaps, SQLite's page cache and the database all start empty),
//! then [`STEADY_ROUNDS`] more on the same store (steady: what a long-running
//! daemon pays); the steady figure is their median, with their range.
//!
//! `cargo bench --bench durability [-- RUNS] [STORE…]`; PostgreSQL from
//! `TROUPE_BENCH_PG_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`;
//! each run creates its own database and drops it at the end), skipped if
//! unreachable. Naming stores (`memory`, `sqlite`, `postgres`) runs only those, so
//! that an instruction count (`valgrind --tool=callgrind`) covers one store.

// A bench is a program of its own: it reads its settings from the environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::sync::Arc;

use tikv_jemallocator::Jemalloc;
use troupe::store::SqlStore;
use troupe_actors::protocol::RunId;
use troupe_actors::store::{MemoryStore, RunStore};
use troupe_actors::testing::bench::throughput;

#[global_allocator]
static ALLOCATOR: Jemalloc = Jemalloc;

/// Timed rounds after the cold one; the steady figure is their median.
const STEADY_ROUNDS: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let runs: usize = args.iter().find_map(|arg| arg.parse().ok()).unwrap_or(2000);
    let named: Vec<&str> = args.iter().filter(|arg| arg.parse::<usize>().is_err()).map(String::as_str).collect();
    let wanted = |name: &str| named.is_empty() || named.contains(&name);
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("troupe-bench-{}", RunId::new()));
    let sqlite_url = format!("sqlite://{}", dir.join("bench.db").display());
    let postgres = if wanted("postgres") { tokio.block_on(postgres()) } else { None };
    let stores: Vec<(&str, Option<Arc<dyn RunStore>>)> = tokio.block_on(async {
        let sqlite = if wanted("sqlite") { Some(SqlStore::connect(&sqlite_url).await.unwrap()) } else { None };
        vec![
            ("memory", Some(Arc::new(MemoryStore::new()) as Arc<dyn RunStore>)),
            ("sqlite", sqlite.map(|store| Arc::new(store) as Arc<dyn RunStore>)),
            ("postgres", postgres.as_ref().map(|bench| Arc::new(bench.store.clone()) as Arc<dyn RunStore>)),
        ]
    });
    println!("durability bench: {runs} runs x 3 turns each, unobserved; cold, then steady ({STEADY_ROUNDS} rounds)");
    for (name, store) in stores.into_iter().filter(|(name, _)| wanted(name)) {
        let Some(store) = store else {
            println!("{name:>8}: skipped (no server)");
            continue;
        };
        // Starts the runtime's threads and connections before anything is timed.
        tokio.block_on(throughput(store.clone(), 50, false)).unwrap();
        let (turns_per_second, cpu_per_turn) = tokio.block_on(throughput(store.clone(), runs, false)).unwrap();
        println!("{name:>8} cold:   {turns_per_second:>8.0} turns/s, {cpu_per_turn:>6.1} µs CPU per turn");
        let mut steady: Vec<(f64, f64)> =
            (0..STEADY_ROUNDS).map(|_| tokio.block_on(throughput(store.clone(), runs, false)).unwrap()).collect();
        steady.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (turns_per_second, cpu_per_turn) = steady[STEADY_ROUNDS / 2];
        let (low, high) = (steady[0].1, steady[STEADY_ROUNDS - 1].1);
        println!(
            "{name:>8} steady: {turns_per_second:>8.0} turns/s, {cpu_per_turn:>6.1} µs CPU per turn \
             (rounds {low:.1} – {high:.1})"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
    if let Some(bench) = postgres {
        tokio.block_on(bench.drop_database());
    }
}

/// The bench's own PostgreSQL database, and the admin connection that made it.
struct PgBench {
    store: SqlStore,
    admin: sqlx::PgPool,
    name: String,
}

impl PgBench {
    async fn drop_database(self) {
        drop(self.store);
        drop_database(&self.admin, &self.name).await;
    }
}

/// Drops a bench database (`FORCE`: the store's writer may still hold connections).
async fn drop_database(admin: &sqlx::PgPool, name: &str) {
    // The name is ours (a fixed prefix and a UUID's hex digits); identifiers
    // cannot be bound.
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    if let Err(error) = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(admin).await {
        eprintln!("could not drop the bench database {name}: {error}");
    }
}

async fn postgres() -> Option<PgBench> {
    let admin =
        std::env::var("TROUPE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = sqlx::PgPool::connect(&admin).await.ok()?;
    let name = format!("troupe_bench_{}", RunId::new().to_string().replace('-', ""));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&pool).await.ok()?;
    let (base, _) = admin.rsplit_once('/')?;
    match SqlStore::connect(&format!("{base}/{name}")).await {
        Ok(store) => Some(PgBench { store, admin: pool, name }),
        Err(error) => {
            eprintln!("postgres: {error}");
            drop_database(&pool, &name).await;
            None
        }
    }
}
