//! The provider rate limiter, shared by every worker process through Redis.
//!
//! A GCRA reservation (`streams/scripts/rate_limit.lua`): one round trip tells
//! the caller how long to wait before its request may go, and reserves the
//! slot; no retry loop, no thundering herd.

use std::time::{Duration, Instant};

use crate::store::{Store, StoreResult};

/// The shared limiter.
#[derive(Clone)]
pub struct Limiter {
    store: Store,
    key: String,
    rate: u32,
    burst: u32,
}

impl Limiter {
    /// A limiter of `rate` requests per second (0 = unlimited) with `burst`.
    pub fn new(store: Store, rate: u32, burst: u32) -> Limiter {
        let key = store.keys.limiter();
        Limiter {
            store,
            key,
            rate,
            burst: burst.max(1),
        }
    }

    /// Waits until `requests` provider requests may go.
    pub async fn acquire(&self, requests: u32) -> StoreResult<Duration> {
        if self.rate == 0 || requests == 0 {
            return Ok(Duration::ZERO);
        }
        let started = Instant::now();
        let wait_ms = self
            .store
            .reserve_rate(&self.key, self.rate, self.burst, requests)
            .await?;
        if wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        let waited = started.elapsed();
        metrics::histogram!("groupcast_rate_limiter_wait_seconds").record(waited.as_secs_f64());
        Ok(waited)
    }
}
