//! Detecting acknowledged writes that Redis lost.
//!
//! Every guarantee groupcast gives rests on one assumption: what Redis
//! acknowledged stays written. With `appendfsync always` it does (a crash
//! loses nothing acknowledged). With `appendfsync everysec` an OS crash or a
//! power loss can take the last second or so of acknowledged writes with it,
//! and without an AOF a restart takes everything since the last snapshot.
//! Redis comes back with an older, consistent state (a prefix of its history)
//! and nothing in it says that anything is missing, while the provider already
//! acted on the lost part: a group was created and filled but its record is
//! gone (so the generation gets a second one), a group was sent but its
//! `send` event is gone, and so on.
//!
//! The only ones who know are the processes that got the acknowledgements.
//! So each process remembers, for a while, every event it appended (the event
//! key and the entry id the batch script answered, see `reply()` in
//! `streams/scripts/prelude.lua`), and once an event is older than
//! [`WINDOW`] (when Redis must have made it durable) it reads it back once. An
//! event that is gone, or that is there under another entry id (appended
//! again after the loss), proves that Redis lost acknowledged writes. The
//! worker then records it on the shard's lost-writes stream
//! ([`crate::keys::Keyspace::lost_writes`]), logs an error and counts
//! `groupcast_redis_writes_lost_total`; [`crate::verify::verify_batch`] fails
//! every batch named there. Detection needs the process that appended the lost
//! event to outlive the crash by a few seconds; any process that appended an
//! event of the batch in the lost second will do.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::projection::field;
use crate::store::{Store, StoreResult};

/// How old an acknowledged event must be before it is read back: longer than
/// `appendfsync everysec` may take to make it durable (one second, two more
/// when an fsync is slow).
pub const WINDOW: Duration = Duration::from_secs(4);

/// Most events remembered at once; the oldest are forgotten beyond it (a
/// process that appends faster than it checks, which the worker never does).
const MAX_REMEMBERED: usize = 200_000;

/// One acknowledged event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    /// Its batch.
    pub batch: String,
    /// The batch's state hash.
    pub state: String,
    /// The event's idempotency key.
    pub key: String,
    /// The entry id Redis answered.
    pub id: String,
    /// When the answer came.
    pub at: Instant,
    /// The same, as epoch milliseconds (for the record).
    pub at_ms: u64,
}

/// The last event appended while one entry was handled: its
/// acknowledgement waits on it ([`crate::store::Store::ack_recorded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastAppended {
    /// Its batch's state hash.
    pub state: String,
    /// The event's idempotency key.
    pub key: String,
    /// The entry id Redis answered.
    pub id: String,
}

tokio::task_local! {
    /// The last event appended by the handling running in this task, when
    /// it runs inside [`noting_appended`].
    static APPENDED: std::cell::Cell<Option<LastAppended>>;
}

/// Runs `handling`, and answers with its output the last event it appended
/// through a batch script (None: it appended nothing). Events are appended
/// one after another, each once the previous one was answered, so Redis
/// has the last one only if it has them all.
pub async fn noting_appended<F: std::future::Future>(
    handling: F,
) -> (F::Output, Option<LastAppended>) {
    APPENDED
        .scope(std::cell::Cell::new(None), async move {
            let out = handling.await;
            let last = APPENDED.try_with(std::cell::Cell::take).ok().flatten();
            (out, last)
        })
        .await
}

/// The events this process appended and has not read back yet.
#[derive(Debug, Default)]
pub struct Witnesses {
    queue: Mutex<VecDeque<Witness>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Witnesses {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Witness>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `key` of `batch` was appended as entry `id`.
    pub fn record(&self, batch: &str, state: &str, key: &str, id: &str) {
        // Outside `noting_appended` (the CLI, the watchdog) nothing notes it.
        let _ = APPENDED.try_with(|last| {
            last.set(Some(LastAppended {
                state: state.to_string(),
                key: key.to_string(),
                id: id.to_string(),
            }))
        });
        let mut q = self.queue();
        if q.len() >= MAX_REMEMBERED {
            q.pop_front();
        }
        q.push_back(Witness {
            batch: batch.to_string(),
            state: state.to_string(),
            key: key.to_string(),
            id: id.to_string(),
            at: Instant::now(),
            at_ms: now_ms(),
        });
    }

    /// Takes the events acknowledged at least `age` ago.
    pub fn due(&self, age: Duration) -> Vec<Witness> {
        let mut q = self.queue();
        let mut out = Vec::new();
        while q.front().is_some_and(|w| w.at.elapsed() >= age) {
            if let Some(w) = q.pop_front() {
                out.push(w);
            }
        }
        out
    }

    /// Puts events back (Redis could not be asked); they are checked next time.
    pub(crate) fn put_back(&self, mut ws: Vec<Witness>) {
        let mut q = self.queue();
        while let Some(w) = ws.pop() {
            q.push_front(w);
        }
    }

    /// How many are waiting.
    pub fn len(&self) -> usize {
        self.queue().len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What reading an event back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The event that was acknowledged.
    pub witness: Witness,
    /// The entry id its key holds now (None: the key is gone).
    pub now: Option<String>,
}

/// Reads `witnesses` back (one `HMGET` per batch, read again with an
/// `EXISTS` of the batch's state when something differs) and returns those that are
/// gone or hold another entry id. A batch whose whole state is gone is only
/// counted when `expiry_possible` is false (a short retention can expire a
/// reported batch's state legitimately).
pub async fn check(
    store: &Store,
    witnesses: &[Witness],
    expiry_possible: bool,
) -> StoreResult<Vec<Lost>> {
    let mut by_state: BTreeMap<&str, Vec<&Witness>> = BTreeMap::new();
    for w in witnesses {
        by_state.entry(w.state.as_str()).or_default().push(w);
    }
    let mut lost = Vec::new();
    for (state, ws) in by_state {
        let fields: Vec<String> = ws.iter().map(|w| field::key(&w.key)).collect();
        // The usual answer, every event still there, needs no `EXISTS`:
        // only a mismatch is read again with it.
        let found: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(state)
            .arg(&fields)
            .query_async(&mut store.conn.clone())
            .await?;
        if ws
            .iter()
            .zip(&found)
            .all(|(w, now)| now.as_deref() == Some(w.id.as_str()))
        {
            continue;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(state).arg(&fields);
        pipe.cmd("EXISTS").arg(state);
        let (found, exists): (Vec<Option<String>>, bool) =
            pipe.query_async(&mut store.conn.clone()).await?;
        if !exists && expiry_possible {
            continue;
        }
        for (w, now) in ws.into_iter().zip(found) {
            if now.as_deref() != Some(w.id.as_str()) {
                lost.push(Lost {
                    witness: w.clone(),
                    now,
                });
            }
        }
    }
    Ok(lost)
}

/// Records lost events on their shards' lost-writes streams: one entry per
/// batch, with how many of its events were lost and the first of them.
pub(crate) async fn record_lost(store: &Store, lost: &[Lost], consumer: &str) -> StoreResult<()> {
    let mut by_batch: BTreeMap<&str, Vec<&Lost>> = BTreeMap::new();
    for l in lost {
        by_batch
            .entry(l.witness.batch.as_str())
            .or_default()
            .push(l);
    }
    for (batch, ls) in by_batch {
        let first = ls[0];
        let stream = store.keys.lost_writes(store.keys.shard_of(batch));
        redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("batch")
            .arg(batch)
            .arg("events")
            .arg(ls.len())
            .arg("key")
            .arg(&first.witness.key)
            .arg("id")
            .arg(&first.witness.id)
            .arg("now")
            .arg(first.now.as_deref().unwrap_or("-"))
            .arg("acked_ms")
            .arg(first.witness.at_ms)
            .arg("consumer")
            .arg(consumer)
            .query_async::<String>(&mut store.conn.clone())
            .await?;
    }
    Ok(())
}

/// The lost-write records of `batch`: (entry id, field/value pairs).
pub(crate) async fn lost_records(store: &Store, batch: &str) -> StoreResult<Vec<(String, String)>> {
    let stream = store.keys.lost_writes(store.keys.shard_of(batch));
    Ok(store
        .entries(&stream)
        .await?
        .into_iter()
        .filter(|e| e.get("batch") == Some(batch.as_bytes()))
        .map(|e| {
            let detail = format!(
                "{} event(s) acknowledged to {} and then lost, e.g. `{}` (entry {}, now {})",
                e.text("events").unwrap_or_default(),
                e.text("consumer").unwrap_or_default(),
                e.text("key").unwrap_or_default(),
                e.text("id").unwrap_or_default(),
                e.text("now").unwrap_or_default(),
            );
            (e.id, detail)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_takes_only_old_enough_and_put_back_keeps_order() {
        let w = Witnesses::default();
        w.record("b", "s", "k1", "1-0");
        w.record("b", "s", "k2", "2-0");
        assert!(w.due(Duration::from_secs(60)).is_empty());
        let due = w.due(Duration::ZERO);
        assert_eq!(due.len(), 2);
        assert!(w.is_empty());
        w.put_back(due);
        let again = w.due(Duration::ZERO);
        assert_eq!(
            again.iter().map(|x| x.key.as_str()).collect::<Vec<_>>(),
            ["k1", "k2"]
        );
    }
}

/// Whether the event an operator's command recorded is on disk (see
/// [`Store::command_on_disk`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommandOnDisk {
    /// No wait: every acknowledged write is on disk (`appendfsync always`),
    /// or nothing survives a restart anyway (no AOF).
    NoWait,
    /// Its event has been in Redis longer than the fsync window, and is
    /// still there: on disk.
    OnDisk,
    /// Its event is gone (or was appended again): Redis restarted and lost
    /// it. The command must be given again.
    Lost,
}

impl Store {
    /// Waits until the event that an operator's command (`groupcast close`,
    /// `cancel`, the board's buttons) recorded under event key `key` is on
    /// disk.
    /// A worker's entry is redone when Redis loses what its handling wrote;
    /// an operator's command is not an entry anyone redoes, so it is only
    /// acknowledged once it is durable: under `appendfsync everysec`, once
    /// the event has been in Redis for [`WINDOW`] by the server's clock,
    /// read back then (a restart meanwhile can have taken it). Unreadable
    /// settings count as `everysec`.
    pub(crate) async fn command_on_disk(
        &self,
        log: &crate::store::batch::BatchLog,
        key: &str,
    ) -> StoreResult<CommandOnDisk> {
        let field = crate::projection::field::key(key);
        let recorded = log.fields(std::slice::from_ref(&field)).await?;
        let Some(id) = recorded.into_iter().next().flatten() else {
            // Reported at once and expired with a retention of 0: the
            // tombstone remembers it.
            return Ok(match self.is_tombstoned(&log.batch).await? {
                true => CommandOnDisk::NoWait,
                false => CommandOnDisk::Lost,
            });
        };
        let id = id.as_str();
        let weakest = |values: Vec<(String, Option<String>)>, weak: &str| {
            values
                .into_iter()
                .map(|(_, v)| v)
                .find(|v| v.as_deref() != Some(weak))
                .map_or(Some(weak.to_string()), |v| v)
        };
        let aof = weakest(self.config_everywhere("appendonly").await, "yes");
        let fsync = weakest(self.config_everywhere("appendfsync").await, "always");
        if aof.as_deref() == Some("no") || fsync.as_deref() == Some("always") {
            return Ok(CommandOnDisk::NoWait);
        }
        let born = crate::events::entry_millis(id);
        let now = log.server_time_ms().await?;
        let age = Duration::from_millis(now.saturating_sub(born));
        if age < WINDOW {
            // A sleep never ends early: after it the event is older than
            // the window by real time, which the fsync schedule runs on.
            tokio::time::sleep(WINDOW - age + Duration::from_millis(50)).await;
        }
        let now = log.fields(std::slice::from_ref(&field)).await?;
        Ok(if now.first().and_then(|v| v.as_deref()) == Some(id) {
            CommandOnDisk::OnDisk
        } else {
            CommandOnDisk::Lost
        })
    }
}
