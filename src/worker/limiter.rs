//! The provider rate limiter, shared by every worker process through Redis.
//!
//! A GCRA reservation (`streams/scripts/rate_limit.lua`): one round trip tells
//! the caller how long to wait before its request may go, and reserves the
//! slot; no retry loop, no thundering herd. A process books in rounds: the
//! requests of a lane that arrive together share one round trip ([`Limiter`]).
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

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::keys::Priority;
use crate::store::coord::LaneLimit;
use crate::store::{Store, StoreResult};

/// The shared limiter.
///
/// Reservations of one lane that arrive while that lane's booking is in
/// flight are booked together, in one call for their summed cost, and the
/// slots handed out in arrival order (a *booking round*, as a group commit):
/// the limiter costs one Redis round trip per round rather than per request.
/// The round's requests take consecutive slots of the one schedule, as they
/// would one by one, so the provider never sees more than the rate. Two
/// things differ from booking them one by one: a round whose last slot is
/// past the lane's horizon gives every one of its requests back (one by one,
/// the first few might have gone), and a round booked on the lane's owed
/// slot books all its requests past the horizon, moving the next owed slot
/// on by as many (the lane's share over time is the same).
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Shared>,
}

struct Shared {
    booker: Booker,
    /// Each lane's booking-round task, started by its first reservation
    /// (inside the runtime), in [`Priority::ALL`] order.
    rounds: [OnceLock<mpsc::UnboundedSender<Booking>>; 3],
}

/// What a booking round needs (the round task holds its own copy, so that
/// it ends when the limiter is dropped).
#[derive(Clone)]
struct Booker {
    store: Store,
    key: String,
    rate: u32,
    burst: u32,
    share: u32,
}

/// A reservation waiting for its lane's next booking round.
struct Booking {
    requests: u32,
    max_wait: Option<Duration>,
    /// The booking's own wait in ms, or `-ms` when nothing was reserved.
    reply: oneshot::Sender<StoreResult<i64>>,
}

/// How long a lane's request may book ahead: its horizon, a fraction of the
/// longest wait `max_wait` a handler holds its entry for.
pub fn horizon(lane: Priority, max_wait: Duration) -> Duration {
    match lane {
        Priority::Urgent => max_wait / 2,
        Priority::Normal => max_wait / 4,
        Priority::Bulk => max_wait / 8,
    }
}

/// Requests per second guaranteed to `lane` (its owed slots): `share`
/// percent of `rate` for the lower lanes, none for urgent.
pub fn guaranteed(lane: Priority, rate: u32, share: u32) -> f64 {
    match lane {
        Priority::Urgent => 0.0,
        _ => f64::from(rate) * f64::from(share.min(100)) / 100.0,
    }
}

/// Each booking's own wait (ms) when a round booked `requests` (in arrival
/// order) together and the round's last slot is `wait_ms` away: the slots
/// are `1 / rate` apart, so the k-th of `total` comes `(total - k) / rate`
/// before the last. Rounded up, never below 0.
fn split_wait(wait_ms: i64, requests: &[u32], rate: u32) -> Vec<i64> {
    let total: u32 = requests.iter().sum();
    let interval = 1000.0 / f64::from(rate.max(1));
    let mut end = 0u32;
    requests
        .iter()
        .map(|r| {
            end += r;
            let own = wait_ms as f64 - f64::from(total - end) * interval;
            own.ceil().max(0.0) as i64
        })
        .collect()
}

/// A lane's booking-round task: takes every booking queued (with the same
/// `max_wait` as the first), books them in one call, answers each, and
/// starts over. Ends when the limiter is dropped.
async fn rounds(booker: Booker, lane: Priority, mut queue: mpsc::UnboundedReceiver<Booking>) {
    let mut next: Option<Booking> = None;
    loop {
        let first = match next.take() {
            Some(b) => b,
            None => match queue.recv().await {
                Some(b) => b,
                None => return,
            },
        };
        let mut round = vec![first];
        while let Ok(b) = queue.try_recv() {
            if b.max_wait == round[0].max_wait {
                round.push(b);
            } else {
                next = Some(b);
                break;
            }
        }
        let requests: Vec<u32> = round.iter().map(|b| b.requests).collect();
        let cost: u32 = requests.iter().sum();
        let limit = round[0].max_wait.map(|m| LaneLimit {
            max_wait_ms: m.as_millis() as u64,
            horizon_ms: horizon(lane, m).as_millis() as u64,
            share: guaranteed(lane, booker.rate, booker.share),
            share_key: booker.store.keys.limiter_share(lane),
        });
        let booked = booker
            .store
            .reserve_rate(&booker.key, booker.rate, booker.burst, cost, limit.as_ref())
            .await;
        match booked {
            // Nothing reserved: every booking of the round comes back then.
            Ok(w) if w < 0 => {
                for b in round {
                    let _ = b.reply.send(Ok(w));
                }
            }
            Ok(w) => {
                for (b, own) in round.into_iter().zip(split_wait(w, &requests, booker.rate)) {
                    let _ = b.reply.send(Ok(own));
                }
            }
            Err(e) => {
                for b in round {
                    let _ = b.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

impl Limiter {
    /// A limiter of `rate` requests per second (0: unlimited) with `burst`,
    /// each lower lane guaranteed `share` percent of `rate`.
    pub fn new(store: Store, rate: u32, burst: u32, share: u32) -> Limiter {
        let key = store.keys.limiter();
        Limiter {
            inner: Arc::new(Shared {
                booker: Booker {
                    store,
                    key,
                    rate,
                    burst: burst.max(1),
                    share,
                },
                rounds: Default::default(),
            }),
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
        let shared = &self.inner;
        if shared.booker.rate == 0 || requests == 0 {
            return Ok(Ok(Duration::ZERO));
        }
        let started = Instant::now();
        let lane_index = Priority::ALL.iter().position(|p| *p == lane).unwrap_or(0);
        let queue = shared.rounds[lane_index].get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(rounds(shared.booker.clone(), lane, rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let stopped = || {
            crate::store::StoreError::Redis(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the rate limiter's booking task stopped",
            )))
        };
        queue
            .send(Booking {
                requests,
                max_wait,
                reply,
            })
            .map_err(|_| stopped())?;
        let wait_ms = answer.await.map_err(|_| stopped())??;
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

#[cfg(test)]
mod tests {
    use super::split_wait;

    #[test]
    fn a_round_hands_out_its_slots_in_arrival_order() {
        // 4 requests at 10/s: the last slot 500 ms away, the others 100 ms
        // apart before it; a booking of 2 takes the later of its two slots.
        assert_eq!(split_wait(500, &[1, 2, 1], 10), vec![200, 400, 500]);
        // Slots already due wait nothing.
        assert_eq!(split_wait(50, &[1, 1, 1], 10), vec![0, 0, 50]);
        // A fractional interval rounds up: no booking goes early.
        assert_eq!(split_wait(10, &[1, 1], 300), vec![7, 10]);
    }
}
