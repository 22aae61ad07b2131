//! The provider rate limiter, shared by every worker process through Redis.
//!
//! A GCRA reservation (`streams/scripts/rate_limit.lua`): one round trip tells
//! the caller how long to wait before its request may go, and reserves the
//! slot; no retry loop, no thundering herd. A process books in rounds: the
//! requests of a lane that arrive together share one round trip, and while
//! the schedule is past its burst a call also books a few slots ahead for
//! the process's next requests of the lane ([`Limiter`]).
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
//!
//! The rate is fixed (`--rate-limit N`) or learned (`--rate-limit auto`, the
//! default): Solapi documents no per-second limit, others do, and a fixed
//! guess either wastes a fast provider or floods a slow one. Under `auto`
//! requests go unpaced until the provider answers `429`; the worker that
//! sees it records a rate every worker keeps to (`learn_rate.lua`: the
//! first `429` sets [`WorkerConfig::RATE_AFTER_PUSHBACK`], each later one
//! halves it, at most once every [`LEARNING`]`.between`), and every worker
//! reads it again each [`LEARNED_READ_EVERY`]. It is forgotten
//! [`LEARNING`]`.kept` after the last lowering. The request that got the
//! `429` retries after the provider's `Retry-After` in any case.
//!
//! [`WorkerConfig::RATE_AFTER_PUSHBACK`]: crate::worker::WorkerConfig::RATE_AFTER_PUSHBACK

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::keys::Priority;
use crate::store::coord::{BookAhead, LaneLimit, RateLearning};
use crate::store::{Store, StoreResult};
use crate::worker::config::{RateLimit, WorkerConfig};

/// How `--rate-limit auto` learns the provider's rate from its `429`s.
pub const LEARNING: RateLearning = RateLearning {
    first: WorkerConfig::RATE_AFTER_PUSHBACK,
    lowest: 1,
    kept: Duration::from_secs(600),
    between: Duration::from_secs(1),
};

/// How often a worker under `--rate-limit auto` reads the rate the workers
/// learned (a `429` seen by another process reaches it within this).
pub(crate) const LEARNED_READ_EVERY: Duration = Duration::from_secs(1);

/// Gauge: the requests per second this process keeps to (0: no pace).
const METRIC_RATE: &str = "groupcast_rate_limit_per_second";

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
///
/// Booking ahead: a call books up to [`ahead_cap`] more slots for the
/// process's next requests of the lane (never on an owed slot), which take
/// them in arrival order without a call. While the schedule is past its
/// burst (every slot booked has a wait), they come right after the round's
/// last one, each within the lane's horizon, and each serves a request
/// only while it has not started: a slot whose time passed unused lapses
/// (the schedule gave it away; nobody uses it late, so the provider still
/// never sees more than the rate). Below the burst, slots spaced by the
/// rate would mostly start before the next request comes; so they are
/// booked to be used at once, any time within [`BOOK_AHEAD`] of the call,
/// and charged as if they went at its end (`rate_limit.lua`): requests
/// going earlier than charged never take more from a token bucket. How many
/// to book ahead follows the process's demand: twice as many as last time
/// while all were used, as many as were used once some lapsed.
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
    pace: Arc<Pace>,
    burst: u32,
    share: u32,
}

/// The rate the limiter keeps to now: fixed, or learned from the
/// provider's `429`s.
struct Pace {
    /// Where the learned rate is kept, under `--rate-limit auto`.
    learned_key: Option<String>,
    /// Requests per second now (0: no pace).
    rate: AtomicU32,
    /// Set once the task reading the learned rate runs.
    watching: OnceLock<()>,
    /// A `learn_rate.lua` call of this process is in flight: the other
    /// `429`s of the same burst (every request in flight gets one) add
    /// nothing to it, so they make no call of their own.
    learning: AtomicBool,
}

impl Pace {
    fn rate(&self) -> u32 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Keeps to `rate` from now on; logs a change.
    fn set(&self, rate: u32) {
        let before = self.rate.swap(rate, Ordering::Relaxed);
        if before != rate {
            metrics::gauge!(METRIC_RATE).set(f64::from(rate));
            match rate {
                0 => tracing::info!(
                    before,
                    "no 429 from the provider lately: provider requests go unpaced again"
                ),
                _ => tracing::info!(
                    rate,
                    before,
                    "the provider pushed back (429): pacing provider requests"
                ),
            }
        }
    }
}

/// Under `--rate-limit auto`: reads the rate the workers learned every
/// [`LEARNED_READ_EVERY`], until the limiter is dropped.
async fn watch_learned(store: Store, key: String, pace: Weak<Pace>) {
    let mut every = tokio::time::interval(LEARNED_READ_EVERY);
    loop {
        every.tick().await;
        let Some(pace) = pace.upgrade() else {
            return;
        };
        match store.learned_rate(&key).await {
            Ok(rate) => pace.set(rate.unwrap_or(0)),
            // The last rate read stands until Redis answers again.
            Err(e) => tracing::debug!(error = %e, "cannot read the learned provider rate"),
        }
    }
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

/// How far ahead of a request a process books slots for its next ones, as
/// a time of the rate: at most `rate × BOOK_AHEAD` slots (15 at 300/s);
/// below the burst, also how long those slots may be used.
pub(crate) const BOOK_AHEAD: Duration = Duration::from_millis(50);

/// The most slots a process books ahead at `rate` ([`BOOK_AHEAD`] of it).
pub(crate) fn ahead_cap(rate: u32) -> u32 {
    (u128::from(rate) * BOOK_AHEAD.as_millis() / 1000) as u32
}

/// A lane's slots booked ahead ([`Limiter`]): handed out in order to the
/// process's next requests of the lane, each only until its last moment
/// (then it lapses unused).
struct Ahead {
    /// The slots booked ahead and not handed out, in order.
    slots: VecDeque<Slot>,
    /// The longest wait they were booked under: they only serve bookings
    /// under the same one (the same lane limit).
    max_wait: Option<Duration>,
    /// How many to book ahead at the next call.
    next: u32,
    /// Since the last call: slots handed out, and slots that lapsed.
    used: u32,
    lapsed: u32,
}

/// A slot booked ahead: its request goes at `start` (at once if that has
/// passed), and only if taken by `until`.
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: Instant,
    until: Instant,
}

impl Ahead {
    fn new() -> Ahead {
        Ahead {
            slots: VecDeque::new(),
            max_wait: None,
            next: 1,
            used: 0,
            lapsed: 0,
        }
    }

    /// Drops the slots whose last moment was before `now` (or that were
    /// booked under another longest wait than `max_wait`); returns how
    /// many.
    fn lapse(&mut self, now: Instant, max_wait: Option<Duration>) -> u32 {
        let before = self.slots.len();
        if self.max_wait != max_wait {
            self.slots.clear();
        } else {
            self.slots.retain(|s| s.until >= now);
        }
        let gone = (before - self.slots.len()) as u32;
        self.lapsed += gone;
        gone
    }

    /// Takes `requests` slots, if there are as many: the wait (ms, rounded
    /// up) until the last of them starts.
    fn take(&mut self, requests: u32, now: Instant) -> Option<i64> {
        if requests == 0 || self.slots.len() < requests as usize {
            return None;
        }
        let last = self.slots.drain(..requests as usize).next_back()?;
        self.used += requests;
        let wait = last.start.saturating_duration_since(now);
        Some(wait.as_micros().div_ceil(1000) as i64)
    }

    /// How many to book ahead at this call (at most `cap`), and starts
    /// counting anew: twice as many as last time while none lapsed (the
    /// process's requests used them all and want more), else as many as
    /// were used.
    fn size(&mut self, cap: u32) -> u32 {
        let want = if self.lapsed == 0 {
            self.next.saturating_mul(2).max(1)
        } else {
            self.used
        };
        (self.used, self.lapsed) = (0, 0);
        self.next = want.min(cap);
        self.next
    }

    /// Adds `n` slots booked ahead past the burst by a call answered at
    /// `answered` that the cost's last slot starts in `wait_ms`: `1 / rate`
    /// apart after it, each taken only before it starts.
    fn add_after(
        &mut self,
        n: u32,
        answered: Instant,
        wait_ms: i64,
        rate: u32,
        max_wait: Option<Duration>,
    ) {
        self.booked_under(max_wait);
        let last = answered + Duration::from_millis(wait_ms.max(0) as u64);
        let rate = u64::from(rate.max(1));
        for k in 1..=u64::from(n) {
            // Rounded up: a slot booked ahead never starts early.
            let start = last + Duration::from_nanos((k * 1_000_000_000).div_ceil(rate));
            self.slots.push_back(Slot {
                start,
                until: start,
            });
        }
    }

    /// Adds `n` slots booked ahead below the burst by a call made at
    /// `asked` and answered at `answered`: they go at once, until `window`
    /// after the call (counted from `asked`, so no later than the server
    /// charged them).
    fn add_within(
        &mut self,
        n: u32,
        asked: Instant,
        answered: Instant,
        window: Duration,
        max_wait: Option<Duration>,
    ) {
        self.booked_under(max_wait);
        let until = asked + window;
        self.slots.extend((0..n).map(|_| Slot {
            start: answered,
            until,
        }));
    }

    /// Slots booked under another longest wait serve nobody now.
    fn booked_under(&mut self, max_wait: Option<Duration>) {
        if self.max_wait != max_wait {
            self.slots.clear();
            self.max_wait = max_wait;
        }
    }
}

/// A lane's booking-round task: takes every booking queued (with the same
/// `max_wait` as the first), serves what it can from the slots booked ahead,
/// books the rest in one call (with slots ahead for the next ones), answers
/// each, and starts over. Ends when the limiter is dropped.
async fn rounds(booker: Booker, lane: Priority, mut queue: mpsc::UnboundedReceiver<Booking>) {
    let mut next: Option<Booking> = None;
    let mut ahead = Ahead::new();
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
        let max_wait = round[0].max_wait;
        // Read per round: under `auto` the rate changes with the provider.
        let rate = booker.pace.rate();
        if rate == 0 {
            for b in round {
                let _ = b.reply.send(Ok(0));
            }
            continue;
        }
        // Served from the slots booked ahead, in arrival order, until one
        // does not fit in what is left: it and those after it are booked.
        let now = Instant::now();
        let lapsed = ahead.lapse(now, max_wait);
        if lapsed > 0 {
            metrics::counter!("groupcast_rate_limiter_lapsed_total", "lane" => lane.name())
                .increment(u64::from(lapsed));
        }
        let mut rest = round.into_iter().peekable();
        while let Some(wait) = rest.peek().and_then(|b| ahead.take(b.requests, now)) {
            if let Some(b) = rest.next() {
                let _ = b.reply.send(Ok(wait));
            }
        }
        let round: Vec<Booking> = rest.collect();
        if round.is_empty() {
            continue;
        }
        let requests: Vec<u32> = round.iter().map(|b| b.requests).collect();
        let cost: u32 = requests.iter().sum();
        let limit = max_wait.map(|m| LaneLimit {
            max_wait_ms: m.as_millis() as u64,
            horizon_ms: horizon(lane, m).as_millis() as u64,
            share: guaranteed(lane, rate, booker.share),
            share_key: booker.store.keys.limiter_share(lane),
        });
        let book_ahead = ahead.size(ahead_cap(rate));
        let asked = Instant::now();
        let booked = booker
            .store
            .reserve_rate_ahead(
                &booker.key,
                rate,
                booker.burst,
                cost,
                BookAhead {
                    slots: book_ahead,
                    window_ms: BOOK_AHEAD.as_millis() as u64,
                },
                limit.as_ref(),
            )
            .await;
        let answered = Instant::now();
        match booked {
            // Nothing reserved: every booking of the round comes back then.
            Ok((w, _, _)) if w < 0 => {
                for b in round {
                    let _ = b.reply.send(Ok(w));
                }
            }
            Ok((w, n, within)) => {
                if within > 0 {
                    let window = Duration::from_millis(within);
                    ahead.add_within(n, asked, answered, window, max_wait);
                } else {
                    ahead.add_after(n, answered, w, rate, max_wait);
                }
                for (b, own) in round.into_iter().zip(split_wait(w, &requests, rate)) {
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
    /// A limiter of `rate` requests per second (fixed, 0: unlimited; or
    /// learned) with `burst`, each lower lane guaranteed `share` percent of
    /// the rate.
    pub fn new(store: Store, rate: RateLimit, burst: u32, share: u32) -> Limiter {
        let key = store.keys.limiter();
        let (fixed, learned_key) = match rate {
            RateLimit::PerSecond(n) => (n, None),
            RateLimit::Auto => (0, Some(store.keys.learned_rate())),
        };
        metrics::gauge!(METRIC_RATE).set(f64::from(fixed));
        Limiter {
            inner: Arc::new(Shared {
                booker: Booker {
                    store,
                    key,
                    pace: Arc::new(Pace {
                        learned_key,
                        rate: AtomicU32::new(fixed),
                        watching: OnceLock::new(),
                        learning: AtomicBool::new(false),
                    }),
                    burst: burst.max(1),
                    share,
                },
                rounds: Default::default(),
            }),
        }
    }

    /// The provider answered `429`. Under `--rate-limit auto`, learns or
    /// lowers the rate every worker keeps to, in the background: the
    /// request that got it retries after the provider's `Retry-After`
    /// whatever this decides. A fixed rate ignores it.
    pub(crate) fn pushed_back(&self) {
        let booker = &self.inner.booker;
        let Some(key) = booker.pace.learned_key.clone() else {
            return;
        };
        if booker.pace.learning.swap(true, Ordering::AcqRel) {
            return;
        }
        let (store, pace) = (booker.store.clone(), booker.pace.clone());
        tokio::spawn(async move {
            match store.learn_rate(&key, &LEARNING).await {
                Ok(rate) => pace.set(rate),
                Err(e) => tracing::warn!(error = %e, "cannot record the provider's 429"),
            }
            pace.learning.store(false, Ordering::Release);
        });
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
        let pace = &shared.booker.pace;
        if let Some(key) = &pace.learned_key {
            pace.watching.get_or_init(|| {
                let store = shared.booker.store.clone();
                tokio::spawn(watch_learned(store, key.clone(), Arc::downgrade(pace)));
            });
        }
        if pace.rate() == 0 || requests == 0 {
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
    use std::time::{Duration, Instant};

    use super::{ahead_cap, split_wait, Ahead};

    #[test]
    fn slots_booked_ahead_go_in_order_and_lapse_once_started() {
        let mut ahead = Ahead::new();
        let t0 = Instant::now();
        let lane = Some(Duration::from_secs(60));
        // The cost's last slot in 100 ms; 3 more at 10/s: 200, 300, 400 ms.
        ahead.add_after(3, t0, 100, 10, lane);
        assert_eq!(ahead.lapse(t0, lane), 0);
        assert_eq!(ahead.take(1, t0), Some(200));
        // Two at once wait for the later of their two slots.
        assert_eq!(ahead.take(2, t0 + Duration::from_millis(50)), Some(350));
        assert_eq!(ahead.take(1, t0), None, "none left");
        ahead.add_after(3, t0, 100, 10, lane);
        // At 250 ms the slot of 200 ms has started unused: it lapses.
        assert_eq!(ahead.lapse(t0 + Duration::from_millis(250), lane), 1);
        assert_eq!(ahead.take(1, t0 + Duration::from_millis(250)), Some(50));
        // More than are left: nothing taken.
        assert_eq!(ahead.take(2, t0 + Duration::from_millis(250)), None);
        // Another lane limit does not use them.
        assert_eq!(ahead.lapse(t0, Some(Duration::from_secs(1))), 1);
        assert_eq!(ahead.take(1, t0), None);
        // A fractional interval rounds up: 1/300 s after 0 ms is 4 ms.
        ahead.add_after(1, t0, 0, 300, lane);
        assert_eq!(ahead.take(1, t0), Some(4));
    }

    #[test]
    fn slots_booked_below_the_burst_go_at_once_until_the_window_ends() {
        let mut ahead = Ahead::new();
        let t0 = Instant::now();
        let lane = Some(Duration::from_secs(60));
        let window = Duration::from_millis(50);
        // Asked at t0, answered 2 ms later: usable from then until t0 + 50 ms.
        let answered = t0 + Duration::from_millis(2);
        ahead.add_within(3, t0, answered, window, lane);
        assert_eq!(ahead.lapse(answered, lane), 0);
        assert_eq!(ahead.take(1, answered), Some(0), "at once");
        let late = t0 + Duration::from_millis(40);
        assert_eq!(ahead.lapse(late, lane), 0);
        assert_eq!(ahead.take(1, late), Some(0), "still within the window");
        // Past the window (counted from the call, not the answer): lapsed.
        let after = t0 + Duration::from_millis(51);
        assert_eq!(ahead.lapse(after, lane), 1);
        assert_eq!(ahead.take(1, after), None);
    }

    #[test]
    fn a_lapsed_slot_behind_a_live_one_is_never_handed_out() {
        let mut ahead = Ahead::new();
        let t0 = Instant::now();
        let lane = None;
        // A slot of the rate starting at 100 ms, then window slots (from
        // a later call) usable until 50 ms.
        ahead.add_after(1, t0, 90, 100, lane);
        ahead.add_within(2, t0, t0, Duration::from_millis(50), lane);
        let now = t0 + Duration::from_millis(60);
        assert_eq!(ahead.lapse(now, lane), 2, "the window's two lapsed");
        assert_eq!(ahead.take(1, now), Some(40), "the rate's slot, at 100 ms");
        assert_eq!(ahead.take(1, now), None);
    }

    #[test]
    fn booking_ahead_grows_while_all_are_used_and_shrinks_to_what_was_used() {
        let mut ahead = Ahead::new();
        assert_eq!(ahead.size(15), 2);
        assert_eq!(ahead.size(15), 4);
        assert_eq!(ahead.size(15), 8);
        assert_eq!(ahead.size(15), 15, "capped");
        assert_eq!(ahead.size(15), 15);
        // 15 booked ahead, 6 used, 9 lapsed: next time 6.
        let t0 = Instant::now();
        let lane = None;
        ahead.add_after(15, t0, 0, 1000, lane);
        for _ in 0..6 {
            assert!(ahead.take(1, t0).is_some());
        }
        assert_eq!(ahead.lapse(t0 + Duration::from_secs(1), lane), 9);
        assert_eq!(ahead.size(15), 6);
        // None used, some lapsed: none booked ahead, then growing again.
        ahead.add_after(6, t0, 0, 1000, lane);
        ahead.lapse(t0 + Duration::from_secs(1), lane);
        assert_eq!(ahead.size(15), 0);
        assert_eq!(ahead.size(15), 1);
        assert_eq!(ahead.size(0), 0, "no booking ahead at a low rate");
    }

    #[test]
    fn booking_ahead_is_capped_at_a_short_time_of_the_rate() {
        assert_eq!(ahead_cap(300), 15);
        assert_eq!(ahead_cap(100), 5);
        assert_eq!(ahead_cap(19), 0);
    }

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
