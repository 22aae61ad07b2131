//! What the worker processes share to coordinate: the watchdog scanner's
//! lease, the per-shard sets of batches in flight, and the provider rate
//! limiter's reservations.

use redis::AsyncCommands;

use super::scripts::SCRIPTS;
use super::{Store, StoreResult};

impl Store {
    /// Takes or renews the lease at `key` for `holder` for `ttl_ms` (see
    /// `lease.lua`). Returns whether `holder` holds it now.
    pub async fn take_lease(&self, key: &str, holder: &str, ttl_ms: u64) -> StoreResult<bool> {
        let got: i64 = SCRIPTS
            .lease
            .call()
            .key("lease", key)
            .arg("holder", holder)
            .arg("ttl", ttl_ms)
            .invoke(&mut self.conn.clone())
            .await?;
        Ok(got == 1)
    }

    /// Gives the lease at `key` up if `holder` holds it (see `release.lua`).
    pub async fn release_lease(&self, key: &str, holder: &str) -> StoreResult<()> {
        let _: i64 = SCRIPTS
            .release
            .call()
            .key("lease", key)
            .arg("holder", holder)
            .invoke(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The batches of `shard` in flight (its active set), unordered.
    pub(crate) async fn active_batches(&self, shard: u32) -> StoreResult<Vec<String>> {
        Ok(self.conn.clone().smembers(self.keys.active(shard)).await?)
    }

    /// Removes `batch` from `shard`'s active set (it reported, or is gone).
    pub(crate) async fn forget_active(&self, shard: u32, batch: &str) -> StoreResult<()> {
        let _: i64 = self
            .conn
            .clone()
            .srem(self.keys.active(shard), batch)
            .await?;
        Ok(())
    }

    /// The provider pushed back (`429`): learns or lowers the rate at `key`
    /// every worker keeps to (see `learn_rate.lua`), and returns it.
    pub async fn learn_rate(&self, key: &str, learning: &RateLearning) -> StoreResult<u32> {
        let rate: i64 = SCRIPTS
            .learn_rate
            .call()
            .key("learned", key)
            .arg("first_rate", learning.first)
            .arg("lowest_rate", learning.lowest)
            .arg("keep", learning.kept.as_millis() as u64)
            .arg("period", learning.between.as_millis() as u64)
            .invoke(&mut self.conn.clone())
            .await?;
        Ok(u32::try_from(rate).unwrap_or(learning.first))
    }

    /// The rate learned at `key` (see [`learn_rate`](Self::learn_rate)), if
    /// the provider pushed back lately.
    pub async fn learned_rate(&self, key: &str) -> StoreResult<Option<u32>> {
        Ok(self.conn.clone().hget(key, "rate").await?)
    }

    /// Reserves `cost` requests from the shared rate limiter at `key`
    /// (`rate` per second, `burst`; see `rate_limit.lua`). Returns how many
    /// milliseconds to wait before they may go; with a `limit`, a wait
    /// longer than it allows reserves nothing and comes back negative
    /// (`-w`: come back in `w` ms).
    pub async fn reserve_rate(
        &self,
        key: &str,
        rate: u32,
        burst: u32,
        cost: u32,
        limit: Option<&LaneLimit>,
    ) -> StoreResult<i64> {
        let mut call = SCRIPTS.rate_limit.call();
        call.key("limiter", key)
            .arg("rate", rate)
            .arg("burst", burst)
            .arg("cost", cost);
        if let Some(l) = limit {
            call.arg("max_wait", l.max_wait_ms)
                .arg("horizon", l.horizon_ms);
            if l.share > 0.0 {
                call.key("owed", &l.share_key).arg("share", l.share);
            }
        }
        call.invoke(&mut self.conn.clone()).await
    }

    /// Like [`reserve_rate`](Self::reserve_rate), and books up to
    /// `ahead.slots` more slots for the caller's next requests, never on the
    /// lane's owed slot. While the schedule is past the burst, they come
    /// right after the cost's last one, `1 / rate` apart, each within the
    /// lane's limit. Below the burst (given `ahead.window_ms`), they may be
    /// used at once, any time within that many ms of the call: they are
    /// charged as if they went at its end, and only as many as go there
    /// without a wait. Returns the wait (as
    /// [`reserve_rate`](Self::reserve_rate)), how many slots were booked
    /// ahead (0 when nothing was reserved), and the window they were booked
    /// for (0: the slots after the cost's last).
    pub async fn reserve_rate_ahead(
        &self,
        key: &str,
        rate: u32,
        burst: u32,
        cost: u32,
        ahead: BookAhead,
        limit: Option<&LaneLimit>,
    ) -> StoreResult<(i64, u32, u64)> {
        let mut call = SCRIPTS.rate_limit.call();
        call.key("limiter", key)
            .arg("rate", rate)
            .arg("burst", burst)
            .arg("cost", cost);
        // Absent arguments are empty strings: `ahead` comes after them.
        match limit {
            Some(l) => {
                call.arg("max_wait", l.max_wait_ms)
                    .arg("horizon", l.horizon_ms);
                if l.share > 0.0 {
                    call.key("owed", &l.share_key).arg("share", l.share);
                } else {
                    call.arg("share", "");
                }
            }
            None => {
                call.arg("max_wait", "").arg("horizon", "").arg("share", "");
            }
        }
        call.arg("ahead", ahead.slots)
            .arg("window", ahead.window_ms);
        call.invoke(&mut self.conn.clone()).await
    }
}

/// How `learn_rate.lua` learns the provider's rate from its `429`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLearning {
    /// The rate set at the first `429` (requests per second).
    pub first: u32,
    /// Halving never goes below this.
    pub lowest: u32,
    /// How long after the last lowering the rate is forgotten.
    pub kept: std::time::Duration,
    /// The least time between two lowerings.
    pub between: std::time::Duration,
}

/// Slots a reservation books ahead for the caller's next requests (see
/// [`Store::reserve_rate_ahead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookAhead {
    /// At most this many.
    pub slots: u32,
    /// Below the burst, how long after the call they may be used, in ms
    /// (0: none booked below the burst).
    pub window_ms: u64,
}

/// How far ahead a lane's request may book the rate limiter (see
/// `rate_limit.lua` and `worker::limiter`).
#[derive(Debug, Clone, PartialEq)]
pub struct LaneLimit {
    /// The longest wait worth booking for (an owed lane's limit).
    pub max_wait_ms: u64,
    /// The lane's own limit, when it is not owed a slot.
    pub horizon_ms: u64,
    /// Requests per second guaranteed to the lane (0: none).
    pub share: f64,
    /// Where the lane's next owed slot is kept.
    pub share_key: String,
}
