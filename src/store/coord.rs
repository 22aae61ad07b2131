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
            .key(key)
            .arg(holder)
            .arg(ttl_ms)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(got == 1)
    }

    /// Gives the lease at `key` up if `holder` holds it (see `release.lua`).
    pub async fn release_lease(&self, key: &str, holder: &str) -> StoreResult<()> {
        let _: i64 = SCRIPTS
            .release
            .key(key)
            .arg(holder)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The batches of `shard` in flight (its active set), unordered.
    pub async fn active_batches(&self, shard: u32) -> StoreResult<Vec<String>> {
        Ok(self.conn.clone().smembers(self.keys.active(shard)).await?)
    }

    /// Removes `batch` from `shard`'s active set (it reported, or is gone).
    pub async fn forget_active(&self, shard: u32, batch: &str) -> StoreResult<()> {
        let _: i64 = self
            .conn
            .clone()
            .srem(self.keys.active(shard), batch)
            .await?;
        Ok(())
    }

    /// Reserves `cost` requests from the shared rate limiter at `key`
    /// (`rate` per second, `burst`; see `rate_limit.lua`). Returns how many
    /// milliseconds to wait before they may go; with `max_wait_ms`, a wait
    /// longer than that reserves nothing and comes back negative (`-wait`).
    pub async fn reserve_rate(
        &self,
        key: &str,
        rate: u32,
        burst: u32,
        cost: u32,
        max_wait_ms: Option<u64>,
    ) -> StoreResult<i64> {
        let mut inv = SCRIPTS.rate_limit.prepare_invoke();
        inv.key(key).arg(rate).arg(burst).arg(cost);
        if let Some(max) = max_wait_ms {
            inv.arg(max);
        }
        Ok(inv.invoke_async(&mut self.conn.clone()).await?)
    }
}
