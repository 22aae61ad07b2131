//! How long an add or a send waits for `WAITAOF` to confirm the events it
//! relies on, on a private Redis 8 or Valkey with `appendfsync everysec`:
//! the figures of `docs/durability.md`.
//!
//! ```text
//! cargo run --release --example fsync_wait -- [--waiters N] [--seconds S] [--fsync everysec|always] [--server redis8|valkey]
//! ```
//!
//! Defaults: 16 waiters for 20 s. Each waiter, in a loop, appends an event
//! (a real batch script, on the process's shared connection) and waits for
//! it through the process's one `WAITAOF` waiter, as a loader or operator
//! does before an add or a send; the latency of every wait is kept. Prints
//! the percentiles, the waits per `WAITAOF` call (the group commit) and the
//! events appended per second. Needs the server (default `redis8`: Redis
//! 8.0, whose `WAITAOF` waits for the fsync; `valkey`: Valkey 8.1.8, whose
//! `WAITAOF` confirms before it), from `scripts/ensure-deps --tests`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use groupcast::events::{BatchStalled, Event};
use groupcast::keys::Keyspace;
use groupcast::store::batch::Appended;
use groupcast::store::durability::aof::{Fact, Fsync};
use groupcast::store::Store;
use groupcast_rigs::redis_server::RedisServer;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn waitaof_calls(store: &Store) -> u64 {
    let info = store.info("commandstats").await.unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_waitaof:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let waiters: usize = arg(&args, "--waiters").map_or(Ok(16), |v| v.parse())?;
    let seconds: u64 = arg(&args, "--seconds").map_or(Ok(20), |v| v.parse())?;
    let fsync = arg(&args, "--fsync").unwrap_or_else(|| "everysec".into());
    let kind = arg(&args, "--server").unwrap_or_else(|| "redis8".into());
    let server = match kind.as_str() {
        "redis8" => RedisServer::start_redis8(&fsync, &[])?,
        "valkey" => RedisServer::start_valkey(&fsync, &[])?,
        other => return Err(format!("--server {other}: expected redis8 or valkey").into()),
    };
    let store = Store::connect(&server.url(), Keyspace::new("fsync", 1)).await?;
    let waiter = Arc::new(store.aof_waiter(0));
    let before = waitaof_calls(&store).await;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for w in 0..waiters {
        let (store, waiter) = (store.clone(), waiter.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let log = store.batch(&format!("fsync-{w}"));
            let e = Event::BatchStalled(BatchStalled {
                quiet_since_ms: 1,
                quiet_for_ms: 2,
            });
            let mut k = 0u64;
            while Instant::now() < until {
                k += 1;
                let key = format!("stalled/{k}");
                let Ok(Appended::New(id)) = log.append(&key, &e).await else {
                    continue;
                };
                let fact = Fact {
                    state: log.keys.state.clone(),
                    field: format!("k:{key}"),
                    id,
                };
                let started = Instant::now();
                if let Ok(Fsync::Durable) = waiter.wait(vec![fact]).await {
                    lat.push(started.elapsed());
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    all.sort();
    let calls = waitaof_calls(&store).await - before;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{kind} appendfsync {fsync}, {waiters} waiters, {seconds} s: {} waits, {calls} WAITAOF calls ({:.1} waits per call), {:.0} events/s",
        all.len(),
        all.len() as f64 / calls.max(1) as f64,
        all.len() as f64 / seconds as f64
    );
    println!(
        "wait ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
        ms(percentile(&all, 0.5)),
        ms(percentile(&all, 0.9)),
        ms(percentile(&all, 0.99)),
        ms(all.last().copied().unwrap_or_default())
    );
    Ok(())
}
