//! Maintenance: due delayed retries go back to their work streams (one atomic
//! script per shard), the ingest and work streams are trimmed up to the
//! oldest entry still pending or undelivered, so they never grow with input,
//! and every `gauge_interval` the streams are sampled into gauges.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::keys::Priority;
use crate::keys::{LOADERS_GROUP, OPERATORS_GROUP};
use crate::store::info::TrimMark;
use crate::store::{Store, StoreResult};
use crate::worker::Ctx;

/// How often due retries are looked for.
const PROMOTE_EVERY: Duration = Duration::from_millis(100);
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
    while !*shutdown.borrow() {
        let mut next_due: Option<u64> = None;
        for shard in 0..ctx.store.keys.shards() {
            // One cheap read tells whether anything is due: the promote
            // script (three commands and more) runs only when something is.
            match ctx.store.next_due(shard).await {
                Ok(Some(due)) if due > now_ms() => {
                    next_due = Some(next_due.map_or(due, |n| n.min(due)));
                    continue;
                }
                Ok(None) => continue,
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::warn!(shard, error = %e, "reading delayed retries failed");
                    continue;
                }
            }
            loop {
                match ctx.store.promote(shard, 500).await {
                    Ok(500) => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "promoting delayed retries failed");
                        break;
                    }
                }
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
        }
        if last_sample.is_none_or(|t| t.elapsed() >= ctx.config.gauge_interval) {
            last_sample = Some(Instant::now());
            sample_gauges(&ctx.store).await;
        }
        // Sleep until the next entry is due (at most PROMOTE_EVERY: new
        // entries may arrive with earlier due times).
        let pause = next_due
            .map(|d| Duration::from_millis(d.saturating_sub(now_ms())))
            .unwrap_or(PROMOTE_EVERY)
            .clamp(Duration::from_millis(5), PROMOTE_EVERY);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

/// Samples stream lengths (ingest, work, dead letters, reports), the
/// consumer groups' pending counts and lag, and the delayed retries into
/// gauges. Errors skip a sample; they are not worth a log line each time.
pub async fn sample_gauges(store: &Store) {
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
