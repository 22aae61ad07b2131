//! Chunks of a generation that has no group yet, waiting in this process for
//! it instead of each being parked in Redis.
//!
//! A batch's first chunks usually arrive together, before its first
//! generation has a group. Parked, each costs about seven Redis commands
//! (`park.lua` with its event and the parked hash, then a `load` work item
//! with the chunk copied into it, its read and its acknowledgement). The
//! group is asked for when the generation's first chunk with numbers is
//! accepted (`accept.lua`), so no chunk needs to park for that: each waits
//! here for at most [`hold_for`]. The first one in this process leads: a
//! watcher reads the group from the batch's state a few times (or hears it
//! from this process's own `create`), and the waiting chunks, the lead's
//! among them, then load as chunks that found their group at once. A chunk
//! whose wait runs out, or whose watcher ended without a group, is parked
//! after all.
//!
//! Nothing depends on the wait: it only delays a chunk's park, and a chunk
//! may be handled at any time while its ingest entry is pending (a crash
//! meanwhile redelivers the entry; its accept answers `duplicate`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::store::batch::BatchLog;
use crate::worker::WorkerConfig;

/// How long a chunk waits in this process for its generation's group: a
/// second, at most a quarter of the visibility timeout (the entry is held
/// meanwhile, like a limiter wait).
pub(crate) fn hold_for(config: &WorkerConfig) -> Duration {
    Duration::from_secs(1).min(config.visibility_timeout / 4)
}

/// The first delay between the watcher's reads; each next one is twice as
/// long, up to [`READ_EVERY_MAX`].
const READ_FIRST: Duration = Duration::from_millis(2);
/// The longest delay between the watcher's reads.
const READ_EVERY_MAX: Duration = Duration::from_millis(50);

/// A batch's generation: (batch id, generation).
type Generation = (String, u32);
/// Where a generation's waiting chunks hear of its group (None: not yet).
type News = watch::Sender<Option<String>>;

/// What a chunk that found no group does.
pub enum Role {
    /// It is the generation's first in this process: [`Lead::watch`], then
    /// wait with the others.
    Lead(Lead),
    /// Another chunk leads: wait for the group with [`wait`].
    Wait(watch::Receiver<Option<String>>),
}

/// The generations of this process's chunks waiting for a group.
#[derive(Default)]
pub struct GroupWaits {
    waiting: Mutex<HashMap<Generation, News>>,
}

impl GroupWaits {
    /// The role of a chunk of `batch` whose generation `gen` has no group.
    pub fn join(self: &Arc<Self>, batch: &str, gen: u32) -> Role {
        let key = (batch.to_string(), gen);
        let Ok(mut waiting) = self.waiting.lock() else {
            // A poisoned map only costs the wait: every chunk parks.
            return Role::Lead(Lead {
                waits: self.clone(),
                place: None,
            });
        };
        if let Some(tx) = waiting.get(&key) {
            return Role::Wait(tx.subscribe());
        }
        let (tx, _) = watch::channel(None);
        waiting.insert(key.clone(), tx.clone());
        Role::Lead(Lead {
            waits: self.clone(),
            place: Some((key, tx)),
        })
    }

    /// This process recorded `group` for `batch`'s generation `gen`: its
    /// waiting chunks go on at once.
    pub fn found(&self, batch: &str, gen: u32, group: &str) {
        if let Ok(waiting) = self.waiting.lock() {
            if let Some(tx) = waiting.get(&(batch.to_string(), gen)) {
                tx.send_replace(Some(group.to_string()));
            }
        }
    }

    fn end(&self, key: &Generation) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.remove(key);
        }
    }
}

/// The lead of a generation's waiting chunks in this process. Dropped
/// without [`Lead::watch`], it lets the waiting chunks park.
pub struct Lead {
    waits: Arc<GroupWaits>,
    /// Its place in [`GroupWaits`] (None: nobody waits with it).
    place: Option<(Generation, News)>,
}

impl Lead {
    /// Watches for the group in the background for up to `hold`, then lets
    /// the waiting chunks go on (with the group, or to park themselves).
    /// Returns where the lead chunk itself waits for it, as the others do.
    pub fn watch(
        mut self,
        hold: Duration,
        log: BatchLog,
        gen: u32,
    ) -> watch::Receiver<Option<String>> {
        let Some((key, tx)) = self.place.take() else {
            // Nobody waits with it (the map was poisoned): nothing to watch.
            let (_, rx) = watch::channel(None);
            return rx;
        };
        let rx = tx.subscribe();
        let waits = self.waits.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut delay = READ_FIRST;
            loop {
                if tx.borrow().is_some() {
                    break;
                }
                let left = hold.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(delay.min(left)).await;
                delay = (delay * 2).min(READ_EVERY_MAX);
                // A failed read only ends the wait early: the chunks park.
                match log.group_of(gen).await {
                    Ok(Some(g)) => {
                        tx.send_replace(Some(g));
                        break;
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            waits.end(&key);
            // Dropping the sender tells the waiters still without a group
            // to park.
        });
        rx
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if let Some((key, _)) = self.place.take() {
            self.waits.end(&key);
        }
    }
}

/// Waits up to `hold` for the group: None when it did not come (the chunk
/// parks).
pub(crate) async fn wait(
    mut rx: watch::Receiver<Option<String>>,
    hold: Duration,
) -> Option<String> {
    match tokio::time::timeout(hold, rx.wait_for(Option::is_some)).await {
        Ok(Ok(g)) => g.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{wait, GroupWaits, Role};

    fn lead(waits: &Arc<GroupWaits>, batch: &str, gen: u32) -> super::Lead {
        match waits.join(batch, gen) {
            Role::Lead(l) => l,
            Role::Wait(_) => panic!("{batch}/{gen}: expected to lead"),
        }
    }

    fn waiter(
        waits: &Arc<GroupWaits>,
        batch: &str,
        gen: u32,
    ) -> tokio::sync::watch::Receiver<Option<String>> {
        match waits.join(batch, gen) {
            Role::Wait(rx) => rx,
            Role::Lead(_) => panic!("{batch}/{gen}: expected to wait"),
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn the_first_chunk_leads_and_the_next_ones_get_the_group_it_finds() {
        let waits = Arc::new(GroupWaits::default());
        let first = lead(&waits, "b", 0);
        let (a, b) = (waiter(&waits, "b", 0), waiter(&waits, "b", 0));
        // Another generation, another batch: their own leads.
        let _other_gen = lead(&waits, "b", 1);
        let _other_batch = lead(&waits, "c", 0);
        waits.found("b", 0, "G1");
        assert_eq!(wait(a, LONG).await.as_deref(), Some("G1"));
        assert_eq!(wait(b, LONG).await.as_deref(), Some("G1"));
        // Done: a later chunk that finds no group leads again.
        drop(first);
        let _again = lead(&waits, "b", 0);
    }

    #[tokio::test]
    async fn the_group_recorded_by_this_process_wakes_the_waiting_chunks() {
        let waits = Arc::new(GroupWaits::default());
        let first = lead(&waits, "b", 0);
        let rx = waiter(&waits, "b", 0);
        waits.found("b", 0, "G7");
        assert_eq!(wait(rx, LONG).await.as_deref(), Some("G7"));
        drop(first);
    }

    #[tokio::test]
    async fn a_lead_dropped_lets_the_waiting_chunks_park_at_once() {
        let waits = Arc::new(GroupWaits::default());
        let dropped = lead(&waits, "b", 0);
        let rx = waiter(&waits, "b", 0);
        drop(dropped);
        // Not the 60 s hold: the closed channel ends the wait.
        let got = tokio::time::timeout(Duration::from_secs(5), wait(rx, LONG)).await;
        assert_eq!(got, Ok(None));
    }

    #[tokio::test]
    async fn a_wait_without_news_ends_after_the_hold() {
        let waits = Arc::new(GroupWaits::default());
        let _first = lead(&waits, "b", 0);
        let rx = waiter(&waits, "b", 0);
        assert_eq!(wait(rx, Duration::from_millis(20)).await, None);
    }
}
