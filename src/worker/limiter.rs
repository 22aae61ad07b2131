//! The provider rate limiter, shared by every worker process through Redis.
//!
//! A GCRA reservation (`streams/scripts/rate_limit.lua`): one round trip tells
//! the caller how long to wait before its request may go, and reserves the
//! slot; no retry loop, no thundering herd.
//!
//! Priority lanes share it: every lane reserves on one schedule, but a lane
//! only reserves a slot that starts within its *horizon* ([`horizon`]), a
//! fraction of the longest wait a handler holds its entry for: urgent ½,
//! normal ¼, bulk ⅛. What a lower lane booked is therefore never more than
//! its horizon ahead of an urgent request, and urgent requests book past it.
//! A lower lane held back by its horizon gives its entry back until the wait
//! fits. So that it is not starved while higher lanes have work, each lower
//! lane (normal, bulk) is owed a slot every `1 / (rate × share)` seconds
//! (`--bulk-share`): an owed request may book up to the longest wait, past
//! the urgent horizon.

use std::time::{Duration, Instant};

use crate::keys::Priority;
use crate::store::{Store, StoreResult};

/// The shared limiter.
#[derive(Clone)]
pub struct Limiter {
    store: Store,
    key: String,
    rate: u32,
    burst: u32,
    /// Percent of `rate` each lower lane is guaranteed.
    share: u32,
}

/// How far ahead `lane` may book slots, given the longest wait a handler
/// holds its entry for: urgent ½ of it, normal ¼, bulk ⅛.
pub fn horizon(lane: Priority, max_wait: Duration) -> Duration {
    match lane {
        Priority::Urgent => max_wait / 2,
        Priority::Normal => max_wait / 4,
        Priority::Bulk => max_wait / 8,
    }
}

/// The requests per second guaranteed to `lane` while higher lanes keep the
/// limiter busy: `share` percent of `rate` for the lower lanes (normal,
/// bulk), none for urgent (nothing is above it).
pub fn guaranteed(lane: Priority, rate: u32, share: u32) -> f64 {
    match lane {
        Priority::Urgent => 0.0,
        _ => f64::from(rate) * f64::from(share.min(100)) / 100.0,
    }
}

impl Limiter {
    /// A limiter of `rate` requests per second (0 = unlimited) with `burst`;
    /// each lower lane keeps `share` percent of the rate.
    pub fn new(store: Store, rate: u32, burst: u32, share: u32) -> Limiter {
        let key = store.keys.limiter();
        Limiter {
            store,
            key,
            rate,
            burst: burst.max(1),
            share,
        }
    }

    /// Waits until `requests` provider requests may go (no lane: every
    /// reservation is taken, however far ahead).
    pub async fn acquire(&self, requests: u32) -> StoreResult<Duration> {
        Ok(self
            .reserve(Priority::Urgent, requests, None)
            .await?
            .unwrap_or_else(|wait| wait))
    }

    /// Like [`acquire`](Self::acquire) for a request of `lane`, but only
    /// when the wait is at most the lane's [`horizon`] of `max_wait` (up to
    /// `max_wait` when the lane is owed its share): then it waits and
    /// returns `Ok(waited)`. A longer wait reserves nothing and returns
    /// `Err(wait)`, for the caller to come back after it instead of holding
    /// its work through it.
    pub async fn reserve_within(
        &self,
        lane: Priority,
        requests: u32,
        max_wait: Duration,
    ) -> StoreResult<Result<Duration, Duration>> {
        self.reserve(lane, requests, Some(max_wait)).await
    }

    async fn reserve(
        &self,
        lane: Priority,
        requests: u32,
        max_wait: Option<Duration>,
    ) -> StoreResult<Result<Duration, Duration>> {
        if self.rate == 0 || requests == 0 {
            return Ok(Ok(Duration::ZERO));
        }
        let started = Instant::now();
        let lane_limit = max_wait.map(|m| crate::store::coord::LaneLimit {
            max_wait_ms: m.as_millis() as u64,
            horizon_ms: horizon(lane, m).as_millis() as u64,
            share: guaranteed(lane, self.rate, self.share),
            share_key: self.store.keys.limiter_share(lane),
        });
        let wait_ms = self
            .store
            .reserve_rate(
                &self.key,
                self.rate,
                self.burst,
                requests,
                lane_limit.as_ref(),
            )
            .await?;
        if wait_ms < 0 {
            metrics::counter!("groupcast_rate_limiter_given_back_total", "lane" => lane.name())
                .increment(1);
            return Ok(Err(Duration::from_millis(wait_ms.unsigned_abs())));
        }
        if wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
        }
        let waited = started.elapsed();
        metrics::histogram!("groupcast_rate_limiter_wait_seconds", "lane" => lane.name())
            .record(waited.as_secs_f64());
        Ok(Ok(waited))
    }
}
