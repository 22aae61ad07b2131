//! The watchdog: batches that went quiet before their report.
//!
//! Every event refreshes its batch's heartbeat (`hb` in the state hash, the
//! entry id's milliseconds; `batch_stalled` itself excepted). Waits that
//! append no event but show the batch progressing (a poll of a group the
//! provider is still sending, a rate-limiter or durability wait) stamp
//! `alive` instead, in the same step that schedules the retry; the batch's
//! last sign of life is the later of the two. One scanner at
//! a time goes over each shard's set of active batches: the scanner holds a
//! *lease* (a key with a TTL, renewed by its holder on every scan and released
//! on shutdown, so a crashed scanner's lease simply expires and another
//! worker takes over). For each batch:
//!
//! - a batch with a report is healed out of the set (a late retry may have
//!   revived it), as is one whose state and events are gone;
//! - a batch quiet for longer than `stall_after` gets one `batch_stalled`
//!   event per stall: its key `stalled/<hb>` names the heartbeat found stale,
//!   the event does not refresh the heartbeat, and the append re-checks, in
//!   the same script, that the heartbeat is still that one and that no report
//!   was decided meanwhile. A stall that lasts many scans is one event; a
//!   batch that wakes up and stalls again is a second one.
//!
//! - with `--give-up-after`, a batch quiet for longer than that is closed as
//!   `groupcast close` does (the seqs that never came are given up on).
//!
//! "Quiet" is measured against the Redis server's clock (`TIME`), the same
//! clock that stamped the heartbeat (on a cluster, the clock of the master
//! holding the shard), so a skewed worker clock cannot invent or hide a stall.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::events::{BatchStalled, Event};
use crate::projection::field;
use crate::store::batch::{BatchLog, Stalled};
use crate::store::{Store, StoreResult};
use crate::worker::Ctx;

/// What one scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Batches still in flight (no report yet).
    pub in_flight: u64,
    /// Of those, quiet past the threshold.
    pub stalled: Vec<String>,
    /// Stalls newly recorded by this scan.
    pub newly_stalled: Vec<String>,
    /// Batches this scan closed because they were quiet for longer than
    /// `--give-up-after`.
    pub closed: Vec<String>,
    /// Entries removed from the active sets because their batch had
    /// reported (or was gone).
    pub healed: u64,
}

/// How long the scanner's lease lasts without renewal: long enough to
/// outlive a scan and a missed tick, short enough for a quick takeover.
pub fn lease_ttl(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(1))
}

/// Runs scans every `watchdog_interval` until shutdown, then gives the lease
/// up so that another worker's watchdog takes over at once.
pub async fn run(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        match scan(&ctx).await {
            Ok(Some(r)) => {
                metrics::gauge!("groupcast_batches_in_flight").set(r.in_flight as f64);
                metrics::gauge!("groupcast_batches_stalled").set(r.stalled.len() as f64);
            }
            // Another worker scans: report nothing from here, so that a sum
            // over workers counts each batch once.
            Ok(None) => {
                metrics::gauge!("groupcast_batches_in_flight").set(0.0);
                metrics::gauge!("groupcast_batches_stalled").set(0.0);
            }
            Err(e) => tracing::warn!(error = %e, "watchdog scan failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(ctx.config.watchdog_interval) => {}
            _ = shutdown.changed() => {}
        }
    }
    if let Err(e) = release(&ctx).await {
        tracing::debug!(error = %e, "could not release the watchdog lease");
    }
}

/// Takes or renews the scanner lease for this process.
async fn acquire(ctx: &Ctx) -> StoreResult<bool> {
    let ttl = lease_ttl(ctx.config.watchdog_interval).as_millis() as u64;
    ctx.store
        .take_lease(&ctx.store.keys.watchdog_lock(), &ctx.consumer, ttl)
        .await
}

/// Gives the lease up if this process holds it.
pub async fn release(ctx: &Ctx) -> StoreResult<()> {
    ctx.store
        .release_lease(&ctx.store.keys.watchdog_lock(), &ctx.consumer)
        .await
}

/// The clock of the Redis server holding `key`, in ms since the epoch.
async fn server_now_ms(store: &Store, key: &str) -> StoreResult<u64> {
    store.time_ms_at(key).await
}

/// What checking one active batch found.
enum Check {
    /// Reported (or gone): removed from the active set.
    Healed,
    /// In flight and not quiet for long.
    Fine,
    /// In flight, quiet past the threshold; `true` when this check recorded
    /// the stall.
    Stalled(bool),
    /// Quiet past `--give-up-after`: closed by this check.
    Closed,
}

/// One scan, if this process holds the scanner lease (None otherwise).
pub async fn scan(ctx: &Ctx) -> StoreResult<Option<ScanReport>> {
    if !acquire(ctx).await? {
        return Ok(None);
    }
    let store = &ctx.store;
    let threshold = ctx.config.stall_after.as_millis() as u64;
    let mut report = ScanReport::default();
    for shard in 0..store.keys.shards() {
        let active_key = store.keys.active(shard);
        // The clock of the master holding the shard: it stamped the
        // heartbeats (on a cluster, masters' clocks may differ).
        let now = server_now_ms(store, &active_key).await?;
        let batches = store.active_batches(shard).await?;
        for batch in batches {
            let log = store.batch(&batch);
            match check(store, &log, now, threshold, ctx.config.give_up_after).await? {
                Check::Healed => {
                    store.forget_active(shard, &batch).await?;
                    report.healed += 1;
                }
                Check::Fine => report.in_flight += 1,
                Check::Closed => {
                    report.in_flight += 1;
                    report.closed.push(batch);
                }
                Check::Stalled(new) => {
                    report.in_flight += 1;
                    if new {
                        report.newly_stalled.push(batch.clone());
                    }
                    report.stalled.push(batch);
                }
            }
        }
    }
    Ok(Some(report))
}

async fn check(
    store: &Store,
    log: &BatchLog,
    now: u64,
    threshold: u64,
    give_up_after: Option<Duration>,
) -> StoreResult<Check> {
    let p = log
        .read(&[
            field::HEARTBEAT.into(),
            field::REPORT.into(),
            field::ALIVE.into(),
            field::CLOSED.into(),
        ])
        .await?;
    if p.report().is_some() {
        return Ok(Check::Healed);
    }
    let Some(hb_text) = p.heartbeat() else {
        return heal_without_state(log).await;
    };
    let ms = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // The last sign of life: an event, or a wait that showed progress.
    let hb = ms(Some(hb_text)).max(ms(p.get(field::ALIVE)));
    let hb_text = hb.to_string();
    let quiet = now.saturating_sub(hb);
    if let Some(limit) = give_up_after {
        if quiet > limit.as_millis() as u64 && p.get(field::CLOSED).is_none() {
            let reason = format!(
                "no event for {} (--give-up-after {})",
                crate::human::duration(Duration::from_millis(quiet / 1000 * 1000)),
                crate::human::duration(limit)
            );
            // Its work (the sends a close makes ready) goes to its lane.
            let log = store.batch_in(&log.batch, log.stored_lane().await?);
            let closing = log.close(&reason).await?;
            tracing::warn!(batch = %log.batch, %reason, ?closing, "batch closed: gave up waiting");
            return Ok(Check::Closed);
        }
    }
    if quiet <= threshold {
        return Ok(Check::Fine);
    }
    let event = Event::BatchStalled(BatchStalled {
        quiet_since_ms: hb,
        quiet_for_ms: quiet,
    });
    match log.append_stalled(&hb_text, &event).await? {
        Stalled::Appended(_) => {
            metrics::counter!("groupcast_batch_stalls_total").increment(1);
            tracing::warn!(
                batch = %log.batch,
                quiet_for = ?Duration::from_millis(quiet),
                "batch stalled before its report"
            );
            Ok(Check::Stalled(true))
        }
        Stalled::Duplicate(_) => Ok(Check::Stalled(false)),
        Stalled::Reported => Ok(Check::Healed),
        Stalled::Fresh => Ok(Check::Fine),
    }
}

/// An active batch without a heartbeat has lost its state: remove it when
/// its events are gone too or show a report; otherwise keep it (it is in
/// flight, and `groupcast replay` rebuilds its state) and say so.
async fn heal_without_state(log: &BatchLog) -> StoreResult<Check> {
    let events = log.events().await?;
    if events.is_empty() {
        tracing::warn!(batch = %log.batch, "active batch has neither state nor events: dropped from the watch list");
        return Ok(Check::Healed);
    }
    let reported = events
        .iter()
        .any(|e| matches!(e, Ok(r) if matches!(r.event, Event::BatchReported(_))));
    if reported {
        return Ok(Check::Healed);
    }
    tracing::warn!(batch = %log.batch, "active batch has events but no state: rebuild it with `groupcast replay`");
    Ok(Check::Fine)
}
