//! The Redis clock, as this process reads it.
//!
//! Every instant groupcast keeps was stamped by Redis: due times of delayed
//! entries (`TIME` in `retry_later.lua`), heartbeats and entry ids. So every
//! comparison with "now" is made on the clock of the server that stamped
//! it (on a cluster, the master holding the shard), never on this machine's
//! wall clock: a worker whose clock is ahead or behind would otherwise
//! promote late, spin, or see stalls that are not there.

use std::time::{Duration, Instant};

use super::{Store, StoreResult};

/// One reading of a server's clock, carried forward on this process's
/// monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The server's clock (ms since the epoch), as `TIME` answered.
    pub server_ms: u64,
    /// When the answer arrived, on the monotonic clock.
    pub taken: Instant,
}

impl Reading {
    /// The server's clock at `at`: the reading plus the monotonic time
    /// elapsed since it arrived. The server read its clock before the answer
    /// arrived, so the estimate is never ahead of the server's clock (drift
    /// and steps of either clock aside) and at most a round trip behind: a
    /// time it calls due is due.
    pub(crate) fn server_ms_at(&self, at: Instant) -> u64 {
        let elapsed = at.saturating_duration_since(self.taken).as_millis();
        self.server_ms
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// The clock of the server holding one key, read with `TIME` now and then
/// and carried forward on the monotonic clock in between (see
/// [`Reading`]).
///
/// Why not one `TIME` per look: the maintenance loop looks at every shard's
/// delayed set ten times a second, and a `TIME` each time would double the
/// commands an idle worker sends. Why read it again at all: the monotonic
/// clock drifts from the server's wall clock, and the server's clock may be
/// stepped (NTP); the estimate follows within `refresh`.
#[derive(Debug, Clone)]
pub struct RedisClock {
    key: String,
    refresh: Duration,
    reading: Option<Reading>,
}

impl RedisClock {
    /// The clock of the server holding `key`, read again when the last
    /// reading is `refresh` old.
    pub fn new(key: impl Into<String>, refresh: Duration) -> Self {
        RedisClock {
            key: key.into(),
            refresh,
            reading: None,
        }
    }

    /// The server's clock now (ms since the epoch) and the monotonic instant
    /// that estimate is for. Sends one `TIME` when there is no reading yet or
    /// the last one is `refresh` old; otherwise none.
    pub async fn now(&mut self, store: &Store) -> StoreResult<(u64, Instant)> {
        let now = Instant::now();
        if let Some(r) = self.reading {
            if now.saturating_duration_since(r.taken) < self.refresh {
                return Ok((r.server_ms_at(now), now));
            }
        }
        let server_ms = store.time_ms_at(&self.key).await?;
        let r = Reading {
            server_ms,
            taken: Instant::now(),
        };
        self.reading = Some(r);
        Ok((server_ms, r.taken))
    }
}

impl Store {
    /// The clock of the server holding `shard` (ms since the epoch): the
    /// clock that stamped its entry ids, heartbeats and due times.
    pub async fn shard_time_ms(&self, shard: u32) -> StoreResult<u64> {
        self.time_ms_at(&self.keys.delayed(shard)).await
    }

    /// [`shard_time_ms`](Self::shard_time_ms) of every shard, in shard
    /// order (one `TIME` each).
    pub(crate) async fn shard_times_ms(&self) -> StoreResult<Vec<u64>> {
        let mut out = Vec::new();
        for shard in 0..self.keys.shards() {
            out.push(self.shard_time_ms(shard).await?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_carried_forward_on_the_monotonic_clock() {
        let before = Instant::now();
        let taken = before + Duration::from_secs(1);
        let r = Reading {
            server_ms: 1_000,
            taken,
        };
        assert_eq!(r.server_ms_at(taken), 1_000);
        assert_eq!(r.server_ms_at(taken + Duration::from_millis(250)), 1_250);
        // An instant before the reading is not extrapolated backwards: the
        // estimate never goes below what the server said.
        assert_eq!(r.server_ms_at(before), 1_000);
    }
}
