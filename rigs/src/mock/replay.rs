//! Remembers accepted signatures to refuse replays, with bounded memory.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use groupcast::provider::auth::MAX_SKEW;

/// A signature can only be accepted while its date is within
/// [`MAX_SKEW`] of the clock, i.e. at most `2 × MAX_SKEW` after it was first
/// seen (a date up to 15 min ahead stays valid until 15 min after it).
/// Older entries can never match an acceptable request again, so they are
/// forgotten: memory is bounded by the request rate × 30 minutes.
const REMEMBER: Duration = Duration::from_secs(2 * MAX_SKEW.as_secs());

#[derive(Default)]
pub(crate) struct ReplayGuard {
    seen: HashSet<[u8; 32]>,
    order: VecDeque<(Instant, [u8; 32])>,
}

impl ReplayGuard {
    /// Records `sig`; `false` if it was already seen.
    pub(super) fn first_use(&mut self, sig: [u8; 32], now: Instant) -> bool {
        while let Some((at, old)) = self.order.front() {
            if now.duration_since(*at) < REMEMBER {
                break;
            }
            self.seen.remove(old);
            self.order.pop_front();
        }
        if !self.seen.insert(sig) {
            return false;
        }
        self.order.push_back((now, sig));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_and_expiry() {
        let mut g = ReplayGuard::default();
        let t0 = Instant::now();
        assert!(g.first_use([1; 32], t0));
        assert!(!g.first_use([1; 32], t0));
        assert!(g.first_use([2; 32], t0));
        let later = t0 + REMEMBER;
        assert!(g.first_use([3; 32], later));
        assert_eq!(g.seen.len(), 1, "old entries pruned");
    }
}
