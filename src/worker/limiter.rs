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
        // Without a longest wait, every reservation is taken.
        Ok(self
            .reserve(requests, None)
            .await?
            .unwrap_or_else(|wait| wait))
    }

    /// Like [`acquire`](Self::acquire), but only when the wait is at most
    /// `max_wait`: then it waits and returns `Ok(waited)`. A longer wait
    /// reserves nothing and returns `Err(wait)`, for the caller to come back
    /// after it instead of holding its work through it.
    pub async fn reserve_within(
        &self,
        requests: u32,
        max_wait: Duration,
    ) -> StoreResult<Result<Duration, Duration>> {
        self.reserve(requests, Some(max_wait)).await
    }

    async fn reserve(
        &self,
        requests: u32,
        max_wait: Option<Duration>,
    ) -> StoreResult<Result<Duration, Duration>> {
        if self.rate == 0 || requests == 0 {
            return Ok(Ok(Duration::ZERO));
        }
        let started = Instant::now();
        let wait_ms = self
            .store
            .reserve_rate(
                &self.key,
                self.rate,
                self.burst,
                requests,
                max_wait.map(|m| m.as_millis() as u64),
            )
            .await?;
        if wait_ms < 0 {
            return Ok(Err(Duration::from_millis(wait_ms.unsigned_abs())));
        }
        if wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
        }
        let waited = started.elapsed();
        metrics::histogram!("groupcast_rate_limiter_wait_seconds").record(waited.as_secs_f64());
        Ok(Ok(waited))
    }
}
