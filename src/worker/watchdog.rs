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
//! "Quiet" is measured against the Redis server's clock (`TIME`), the same
//! clock that stamped the heartbeat (on a cluster, the clock of the master
//! holding the shard), so a skewed worker clock cannot invent or hide a stall.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{AsyncCommands, Script};
use tokio::sync::watch;

use crate::events::{BatchStalled, Event};
use crate::projection::{self, Update};
use crate::store::batch::BatchLog;
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
    /// Entries removed from the active sets because their batch had
    /// reported (or was gone).
    pub healed: u64,
}

/// Takes or renews the lease: `1` when `ARGV[1]` holds it afterwards.
static LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
",
    )
});

/// Gives the lease up if `ARGV[1]` holds it.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Appends `batch_stalled` only if the batch is still quiet since the same
/// heartbeat (the later of `hb` and `alive`) and has no report: the check and the append are one step, so a
/// batch that reports (or wakes up) while the scan runs is never marked.
/// KEYS: state, events. ARGV: batch, key, type, data, expected hb, then
/// triples (op, field, value) as in `append.lua`.
/// Returns {'appended', id} | {'duplicate', id} | {'reported'} | {'fresh'}.
static STALLED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}\n{}",
        include_str!("../../streams/scripts/prelude.lua"),
        r"
local key = ARGV[2]
local f = redis.call('HMGET', STATE, 'k:' .. key, 'report', 'hb', 'alive')
if f[1] then
  return reply({'duplicate', f[1]})
end
if f[2] then
  return reply({'reported'})
end
local last = math.max(tonumber(f[3]) or 0, tonumber(f[4]) or 0)
if last ~= tonumber(ARGV[5]) then
  return reply({'fresh'})
end
local id = emit(key, ARGV[3], ARGV[4], false)
for i = 6, #ARGV, 3 do
  if ARGV[i] == 'incr' then
    redis.call('HINCRBY', STATE, ARGV[i + 1], ARGV[i + 2])
  else
    put(ARGV[i + 1], ARGV[i + 2])
  end
end
flush()
return reply({'appended', id})
"
    ))
});

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
    let got: i64 = LEASE
        .key(ctx.store.keys.watchdog_lock())
        .arg(&ctx.consumer)
        .arg(ttl)
        .invoke_async(&mut ctx.store.conn.clone())
        .await?;
    Ok(got == 1)
}

/// Gives the lease up if this process holds it.
pub async fn release(ctx: &Ctx) -> StoreResult<()> {
    let _: i64 = RELEASE
        .key(ctx.store.keys.watchdog_lock())
        .arg(&ctx.consumer)
        .invoke_async(&mut ctx.store.conn.clone())
        .await?;
    Ok(())
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
}

/// One scan, if this process holds the scanner lease (None otherwise).
pub async fn scan(ctx: &Ctx) -> StoreResult<Option<ScanReport>> {
    if !acquire(ctx).await? {
        return Ok(None);
    }
    let store = &ctx.store;
    let mut conn = store.conn.clone();
    let threshold = ctx.config.stall_after.as_millis() as u64;
    let mut report = ScanReport::default();
    for shard in 0..store.keys.shards() {
        let active_key = store.keys.active(shard);
        // The clock of the master holding the shard: it stamped the
        // heartbeats (on a cluster, masters' clocks may differ).
        let now = server_now_ms(store, &active_key).await?;
        let batches: Vec<String> = conn.smembers(&active_key).await?;
        for batch in batches {
            let log = store.batch(&batch);
            match check(store, &log, now, threshold).await? {
                Check::Healed => {
                    let _: i64 = conn.srem(&active_key, &batch).await?;
                    report.healed += 1;
                }
                Check::Fine => report.in_flight += 1,
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

async fn check(store: &Store, log: &BatchLog, now: u64, threshold: u64) -> StoreResult<Check> {
    let f = log
        .fields(&["hb".to_string(), "report".to_string(), "alive".to_string()])
        .await?;
    if f[1].is_some() {
        return Ok(Check::Healed);
    }
    let Some(hb_text) = f[0].as_deref() else {
        return heal_without_state(log).await;
    };
    let ms = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hb = ms(Some(hb_text)).max(ms(f[2].as_deref()));
    let hb_text = hb.to_string();
    let quiet = now.saturating_sub(hb);
    if quiet <= threshold {
        return Ok(Check::Fine);
    }
    let event = Event::BatchStalled(BatchStalled {
        quiet_since_ms: hb,
        quiet_for_ms: quiet,
    });
    let mut inv = STALLED.prepare_invoke();
    inv.key(&log.keys.state)
        .key(&log.keys.events)
        .arg(&log.batch)
        .arg(format!("stalled/{hb_text}"))
        .arg(event.type_name())
        .arg(event.encode_data())
        .arg(&hb_text);
    for u in projection::updates(&event) {
        match u {
            Update::Set(f, v) => inv.arg("set").arg(f).arg(v),
            Update::Incr(f, by) => inv.arg("incr").arg(f).arg(by),
            Update::Max(f, v) => inv.arg("set").arg(f).arg(v),
        };
    }
    let reply: redis::Value = inv.invoke_async(&mut store.conn.clone()).await?;
    let (r, _) = crate::store::batch::strings("stalled", reply)?;
    match r.first().map(String::as_str) {
        Some("appended") => {
            metrics::counter!("groupcast_batch_stalls_total").increment(1);
            tracing::warn!(
                batch = %log.batch,
                quiet_for = ?Duration::from_millis(quiet),
                "batch stalled before its report"
            );
            Ok(Check::Stalled(true))
        }
        Some("duplicate") => Ok(Check::Stalled(false)),
        Some("reported") => Ok(Check::Healed),
        Some("fresh") => Ok(Check::Fine),
        _ => Err(crate::store::StoreError::UnexpectedReply {
            script: "stalled",
            reply: r.join(" "),
        }),
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
