//! Run-time fault state: the active [`Faults`], the stall window, the rate
//! limiter's window, and counters of what was injected.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config::Faults;
use super::lock;

/// What the guard must do with one request before handling it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    /// Hang this long first (stall + latency).
    pub delay: Duration,
    /// Counted as stalled.
    pub stalled: bool,
}

/// What happens to one request after the delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Handle it (and maybe drop the answer).
    Proceed { drop: bool },
    /// `429` with this `Retry-After`.
    RateLimited { retry_after_secs: u64 },
    /// `500` without effect.
    Error,
    /// `403 InvalidAPIKey` without effect ([`Faults::refuse_credentials`]).
    RefuseCredentials,
}

struct State {
    faults: Faults,
    stall_until: Option<Instant>,
    window: u64,
    window_count: u32,
}

/// Faults, shared by every request.
pub(crate) struct FaultController {
    epoch: Instant,
    state: Mutex<State>,
    pub errors: AtomicU64,
    pub drops: AtomicU64,
    pub rate_limited: AtomicU64,
    pub stalled: AtomicU64,
}

impl FaultController {
    pub(super) fn new(faults: Faults) -> Self {
        let c = FaultController {
            epoch: Instant::now(),
            state: Mutex::new(State {
                faults: Faults::default(),
                stall_until: None,
                window: 0,
                window_count: 0,
            }),
            errors: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
        };
        c.set(faults);
        c
    }

    /// Replaces the faults; a non-zero `stall_ms` opens a stall window now.
    pub(super) fn set(&self, faults: Faults) {
        let mut s = lock(&self.state);
        s.stall_until =
            (faults.stall_ms > 0).then(|| Instant::now() + Duration::from_millis(faults.stall_ms));
        s.faults = faults;
        // A new limit starts with a fresh window.
        s.window_count = 0;
    }

    pub(super) fn get(&self) -> Faults {
        lock(&self.state).faults.clone()
    }

    pub(super) fn reset_counters(&self) {
        for c in [&self.errors, &self.drops, &self.rate_limited, &self.stalled] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Delay for a request arriving now.
    pub(super) fn plan(&self) -> Plan {
        let now = Instant::now();
        let s = lock(&self.state);
        let stalled = s.stall_until.is_some_and(|until| now < until);
        let mut delay = Duration::from_millis(s.faults.latency_ms);
        if stalled {
            delay += Duration::from_millis(s.faults.stall_ms);
            self.stalled.fetch_add(1, Ordering::Relaxed);
        }
        Plan { delay, stalled }
    }

    /// Rate limit, error and drop decisions for a request about to be handled.
    pub(super) fn verdict(&self) -> Verdict {
        let now_window = self.epoch.elapsed().as_secs();
        let (error_rate, drop_rate) = {
            let mut s = lock(&self.state);
            if s.faults.refuse_credentials {
                return Verdict::RefuseCredentials;
            }
            if let Some(limit) = s.faults.rate_limit_per_sec {
                // Fixed one-second windows: simple, and what a client
                // honouring `Retry-After: 1` needs to recover.
                if s.window != now_window {
                    s.window = now_window;
                    s.window_count = 0;
                }
                s.window_count = s.window_count.saturating_add(1);
                if s.window_count > limit {
                    self.rate_limited.fetch_add(1, Ordering::Relaxed);
                    return Verdict::RateLimited {
                        retry_after_secs: s.faults.retry_after_secs,
                    };
                }
            }
            (s.faults.error_rate, s.faults.drop_rate)
        };
        if error_rate > 0.0 && rand::random::<f64>() < error_rate {
            self.errors.fetch_add(1, Ordering::Relaxed);
            return Verdict::Error;
        }
        let drop = drop_rate > 0.0 && rand::random::<f64>() < drop_rate;
        Verdict::Proceed { drop }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_window() {
        let c = FaultController::new(Faults {
            rate_limit_per_sec: Some(2),
            retry_after_secs: 3,
            ..Faults::default()
        });
        // All within one window unless the test straddles a second boundary;
        // then at most one extra request passes, so check "at least one 429".
        let verdicts: Vec<_> = (0..5).map(|_| c.verdict()).collect();
        assert!(verdicts.contains(&Verdict::RateLimited {
            retry_after_secs: 3
        }));
        assert!(verdicts.contains(&Verdict::Proceed { drop: false }));
    }

    #[test]
    fn certain_faults() {
        let c = FaultController::new(Faults {
            error_rate: 1.0,
            ..Faults::default()
        });
        assert_eq!(c.verdict(), Verdict::Error);
        c.set(Faults {
            drop_rate: 1.0,
            ..Faults::default()
        });
        assert_eq!(c.verdict(), Verdict::Proceed { drop: true });
        c.set(Faults {
            stall_ms: 50,
            latency_ms: 5,
            ..Faults::default()
        });
        let p = c.plan();
        assert!(p.stalled);
        assert_eq!(p.delay, Duration::from_millis(55));
        c.set(Faults::default());
        assert!(!c.plan().stalled);
        assert_eq!(c.stalled.load(Ordering::Relaxed), 1);
    }
}
