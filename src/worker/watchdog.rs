//! The watchdog: batches that went quiet before their report.
//!
//! Every event refreshes its batch's heartbeat (`hb` in the state hash). One
//! scanner at a time (a lock with a TTL, so a crashed scanner's lock expires)
//! goes over each shard's set of active batches: a batch with a report is
//! healed out of the set (a late retry may have revived it); a batch quiet for
//! longer than the threshold gets one `batch_stalled` event per stall (its key
//! names the heartbeat it found stale, and it does not refresh the heartbeat).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use tokio::sync::watch;

use crate::events::{BatchStalled, Event};
use crate::store::batch::Appended;
use crate::store::StoreResult;
use crate::worker::Ctx;

/// What one scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Batches still in flight.
    pub in_flight: u64,
    /// Of those, quiet past the threshold.
    pub stalled: Vec<String>,
    /// Stalls newly recorded by this scan.
    pub newly_stalled: Vec<String>,
    /// Entries removed because their batch had reported.
    pub healed: u64,
}

/// Runs scans until shutdown.
pub async fn run(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        match scan(&ctx).await {
            Ok(Some(r)) => {
                metrics::gauge!("groupcast_batches_in_flight").set(r.in_flight as f64);
                metrics::gauge!("groupcast_batches_stalled").set(r.stalled.len() as f64);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "watchdog scan failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(ctx.config.watchdog_interval) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One scan, if this process holds the scanner lock (None otherwise).
pub async fn scan(ctx: &Ctx) -> StoreResult<Option<ScanReport>> {
    let store = &ctx.store;
    let mut conn = store.conn.clone();
    let lock_ms = ctx
        .config
        .watchdog_interval
        .max(Duration::from_millis(100))
        .as_millis() as u64;
    let got: Option<String> = redis::cmd("SET")
        .arg(store.keys.watchdog_lock())
        .arg(&ctx.consumer)
        .arg("NX")
        .arg("PX")
        .arg(lock_ms)
        .query_async(&mut conn)
        .await?;
    if got.is_none() {
        return Ok(None);
    }
    let mut report = ScanReport::default();
    let threshold = ctx.config.stall_after.as_millis() as u64;
    let now = now_ms();
    for shard in 0..store.keys.shards() {
        let active_key = store.keys.active(shard);
        let batches: Vec<String> = conn.smembers(&active_key).await?;
        for batch in batches {
            let log = store.batch(&batch);
            let f = log
                .fields(&["hb".to_string(), "report".to_string()])
                .await?;
            if f[1].is_some() {
                let _: i64 = conn.srem(&active_key, &batch).await?;
                report.healed += 1;
                continue;
            }
            report.in_flight += 1;
            let hb: u64 = f[0].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
            let quiet = now.saturating_sub(hb);
            if quiet <= threshold {
                continue;
            }
            report.stalled.push(batch.clone());
            let e = Event::BatchStalled(BatchStalled {
                quiet_since_ms: hb,
                quiet_for_ms: quiet,
            });
            if let Appended::New(_) = log.append(&format!("stalled/{hb}"), &e).await? {
                metrics::counter!("groupcast_batch_stalls_total").increment(1);
                tracing::warn!(%batch, quiet_for = ?Duration::from_millis(quiet), "batch stalled before its report");
                report.newly_stalled.push(batch);
            }
        }
    }
    Ok(Some(report))
}
