//! Maintenance: due delayed retries go back to their work streams (one atomic
//! script per shard), the ingest and work streams are trimmed up to the
//! oldest entry still pending or undelivered, so they never grow with input,
//! and every `gauge_interval` the streams are sampled into gauges.
//!
//! "Due" is decided on the shard's Redis clock, the one that stamped the
//! due times (`retry_later.lua`) and that `promote.lua` compares them with:
//! never on this machine's wall clock, which may be ahead (promote.lua then
//! finds nothing due and the loop spins on it) or behind (due entries wait).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::keys::Priority;
use crate::keys::{LOADERS_GROUP, OPERATORS_GROUP};
use crate::store::clock::RedisClock;
use crate::store::info::TrimMark;
use crate::store::{Store, StoreResult};
use crate::worker::Ctx;

/// How often due retries are looked for.
const PROMOTE_EVERY: Duration = Duration::from_millis(100);
/// The shortest pause between looks.
const PROMOTE_PAUSE_MIN: Duration = Duration::from_millis(5);
/// How often a shard's Redis clock is read again (see [`RedisClock`]): a
/// step of the server's clock delays a promotion by at most this much.
const CLOCK_REFRESH: Duration = Duration::from_secs(1);
/// Most entries one promote.lua call moves.
const PROMOTE_LIMIT: usize = 500;
/// How often streams are trimmed. Often, because the entries read and
/// acknowledged since the last trim stay in Redis until it: with producers
/// held back to a bound of unread chunks (`producer::Producer`), those are
/// what would grow with the input (a 10 M recipient batch peaked at 426 MB of
/// Redis memory with a 30 s interval). A trim is three commands per stream;
/// one for a stream whose group is as the last trim left it (an idle lane).
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Runs until shutdown.
pub async fn run(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<bool>) {
    let mut last_trim = Instant::now();
    let mut trims = Trims::default();
    // Sample once at start, so that a fresh worker's gauges exist at once.
    let mut last_sample: Option<Instant> = None;
    let mut clocks: Vec<RedisClock> = (0..ctx.store.keys.shards())
        .map(|shard| RedisClock::new(ctx.store.keys.delayed(shard), CLOCK_REFRESH))
        .collect();
    while !*shutdown.borrow() {
        let mut wake: Option<Instant> = None;
        for (shard, clock) in (0..).zip(clocks.iter_mut()) {
            match promote_due(&ctx.store, shard, clock).await {
                Ok(Some(at)) => wake = Some(wake.map_or(at, |w| w.min(at))),
                Ok(None) => {}
                Err(e) => tracing::warn!(shard, error = %e, "promoting delayed retries failed"),
            }
        }
        if last_trim.elapsed() >= TRIM_EVERY {
            last_trim = Instant::now();
            if let Err(e) = trims.trim_all(&ctx.store).await {
                tracing::warn!(error = %e, "trimming failed");
            }
            if let Err(e) = forget_old_tombstones(&ctx.store, ctx.config.remember).await {
                tracing::warn!(error = %e, "forgetting old tombstones failed");
            }
            if let Err(e) = forget_old_dead_letters(&ctx.store, ctx.config.retention).await {
                tracing::warn!(error = %e, "forgetting old dead letters failed");
            }
        }
        if last_sample.is_none_or(|t| t.elapsed() >= ctx.config.gauge_interval) {
            last_sample = Some(Instant::now());
            sample_gauges(&ctx.store).await;
        }
        let pause = pause_until(wake, Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Moves a shard's due delayed entries back to their work streams, due by
/// the shard's Redis `clock`. One cheap read tells whether anything is due:
/// the promote script (three commands and more) runs only when something
/// is. Returns when to look again, on this process's monotonic clock, when
/// an entry waits (None: nothing waits, or some were just moved).
pub async fn promote_due(
    store: &Store,
    shard: u32,
    clock: &mut RedisClock,
) -> StoreResult<Option<Instant>> {
    let Some(due) = store.next_due(shard).await? else {
        return Ok(None);
    };
    // The estimate trails the server's clock by up to a round trip, never
    // leads it: what it calls due is due (promote.lua moves it), and what it
    // calls not due yet is looked at again when it should be.
    let (now, at) = clock.now(store).await?;
    if let Some(wait) = due_in(due, now) {
        // New entries may arrive with earlier due times: look again within
        // PROMOTE_EVERY in any case.
        return Ok(Some(at + wait.min(PROMOTE_EVERY)));
    }
    while store.promote(shard, PROMOTE_LIMIT).await? == PROMOTE_LIMIT {}
    Ok(None)
}

/// How long until an entry due at `due` is, the shard's Redis clock reading
/// `now` (both ms since the epoch): None when it is due. `promote.lua` moves
/// the entries due at or before its own clock's now.
pub(crate) fn due_in(due: u64, now: u64) -> Option<Duration> {
    (due > now).then(|| Duration::from_millis(due - now))
}

/// The loop's pause at `now`: until `wake` when a shard asked for it, but at
/// least [`PROMOTE_PAUSE_MIN`] and at most [`PROMOTE_EVERY`].
fn pause_until(wake: Option<Instant>, now: Instant) -> Duration {
    wake.map_or(PROMOTE_EVERY, |w| w.saturating_duration_since(now))
        .clamp(PROMOTE_PAUSE_MIN, PROMOTE_EVERY)
}

/// Trims every shard's ingest and work streams, of every lane.
pub async fn trim_all(store: &Store) -> StoreResult<()> {
    let keys = &store.keys;
    for shard in 0..keys.shards() {
        for lane in Priority::ALL {
            store
                .trim_acknowledged(&keys.ingest_in(shard, lane), LOADERS_GROUP)
                .await?;
            store
                .trim_acknowledged(&keys.work_in(shard, lane), OPERATORS_GROUP)
                .await?;
        }
    }
    Ok(())
}

/// Trims every stream like [`trim_all`], skipping the work of a stream
/// whose consumer group is as this trimmer's last trim of it left it
/// ([`Store::trim_acknowledged_since`]).
#[derive(Default)]
struct Trims {
    seen: HashMap<String, TrimMark>,
}

impl Trims {
    async fn trim_all(&mut self, store: &Store) -> StoreResult<()> {
        let keys = &store.keys;
        for shard in 0..keys.shards() {
            for lane in Priority::ALL {
                for (stream, group) in [
                    (keys.ingest_in(shard, lane), LOADERS_GROUP),
                    (keys.work_in(shard, lane), OPERATORS_GROUP),
                ] {
                    let mark = store
                        .trim_acknowledged_since(&stream, group, self.seen.get(&stream))
                        .await?;
                    match mark {
                        Some(m) => self.seen.insert(stream, m),
                        None => self.seen.remove(&stream),
                    };
                }
            }
        }
        Ok(())
    }
}

/// Forgets the ids of batches reported longer than `remember` ago (their
/// tombstones), by each shard's own clock.
pub async fn forget_old_tombstones(store: &Store, remember: Duration) -> StoreResult<u64> {
    let mut forgotten = 0;
    for shard in 0..store.keys.shards() {
        forgotten += store.forget_tombstones(shard, remember).await?;
    }
    Ok(forgotten)
}

/// Removes every shard's dead letters older than `keep` (the retention of
/// a finished batch's events: recipient data in a dead letter lives no
/// longer than the batch's own); returns how many.
pub async fn forget_old_dead_letters(store: &Store, keep: Duration) -> StoreResult<u64> {
    let mut forgotten = 0;
    for shard in 0..store.keys.shards() {
        forgotten += store.forget_dead_letters(shard, keep).await?;
    }
    if forgotten > 0 {
        metrics::counter!("groupcast_dead_letters_expired_total").increment(forgotten);
        tracing::info!(forgotten, "dead letters older than the retention removed");
    }
    Ok(forgotten)
}

/// Samples stream lengths (ingest, work, dead letters, reports), the
/// consumer groups' pending counts and lag, and the delayed retries into
/// gauges. Errors skip a sample; they are not worth a log line each time.
pub(crate) async fn sample_gauges(store: &Store) {
    let keys = &store.keys;
    for shard in 0..keys.shards() {
        let shard_label = shard.to_string();
        let lanes = Priority::ALL.into_iter().flat_map(|lane| {
            [
                (
                    keys.ingest_in(shard, lane),
                    Some(LOADERS_GROUP),
                    "ingest",
                    lane,
                ),
                (
                    keys.work_in(shard, lane),
                    Some(OPERATORS_GROUP),
                    "work",
                    lane,
                ),
            ]
        });
        let others = [
            (keys.dead_letters(shard), None, "dlq", Priority::Normal),
            (keys.reports(shard), None, "reports", Priority::Normal),
        ];
        for (stream, group, label, lane) in lanes.chain(others) {
            let lane = lane.name();
            if let Ok(len) = store.stream_len(&stream).await {
                metrics::gauge!("groupcast_stream_length", "stream" => label, "shard" => shard_label.clone(), "lane" => lane).set(len as f64);
            }
            let Some(group) = group else { continue };
            if let Ok(Some(info)) = store.group_info(&stream, group).await {
                for (value, metric) in [
                    (info.pending, "groupcast_stream_pending"),
                    (info.lag, "groupcast_stream_lag"),
                ] {
                    if let Some(v) = value {
                        metrics::gauge!(metric, "stream" => label, "shard" => shard_label.clone(), "group" => group, "lane" => lane).set(v as f64);
                    }
                }
            }
        }
        if let Ok(n) = store.delayed_len(shard).await {
            metrics::gauge!("groupcast_delayed_retries", "shard" => shard_label).set(n as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's wall clock, ms since the epoch: what the decision
    /// must not look at.
    fn wall_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    #[test]
    fn due_is_decided_on_the_redis_clock_alone() {
        let hour = 3_600_000;
        let wall = wall_ms();
        // The Redis clock an hour behind this machine's: an entry due in a
        // second by Redis is not due, though this machine's clock passed
        // it long ago (the old comparison promoted it at once, and
        // promote.lua moved nothing: a spin).
        let redis_now = wall - hour;
        assert_eq!(
            due_in(redis_now + 1_000, redis_now),
            Some(Duration::from_millis(1_000))
        );
        // An hour ahead: an entry due a second ago by Redis is due, though
        // this machine's clock is an hour short of it (the old comparison
        // left it waiting for an hour).
        let redis_now = wall + hour;
        assert_eq!(due_in(redis_now - 1_000, redis_now), None);
        // promote.lua moves entries due at its clock's now too.
        assert_eq!(due_in(redis_now, redis_now), None);
        assert_eq!(
            due_in(redis_now + 1, redis_now),
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn the_pause_runs_to_the_earliest_wake_within_bounds() {
        let now = Instant::now();
        assert_eq!(pause_until(None, now), PROMOTE_EVERY);
        assert_eq!(
            pause_until(Some(now + Duration::from_millis(40)), now),
            Duration::from_millis(40)
        );
        assert_eq!(pause_until(Some(now), now), PROMOTE_PAUSE_MIN);
        assert_eq!(
            pause_until(Some(now + Duration::from_secs(60)), now),
            PROMOTE_EVERY
        );
    }
}
