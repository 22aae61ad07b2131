//! The mock's message fates: injected registration failures and delivery
//! results, each decided by a seeded hash of the message's number (its
//! packed key), so that the same number always gets the same answer.

use std::sync::Arc;

use super::config::Faults;

/// Seed of the registration hash.
const REGISTRATION_SEED: u64 = 0x7265_6769_7374_6572;
/// Seed of the delivery hash (a different one: a number's registration and
/// its delivery are independent).
const DELIVERY_SEED: u64 = 0x6465_6c69_7665_7279;
/// Seed of the delay drawn from the delivery hash.
const DELAY_SEED: u64 = 0x6465_6c61_795f_7531;

/// splitmix64's finaliser of `key ^ seed`.
fn mix(key: u64, seed: u64) -> u64 {
    let mut x = (key ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A hash as a number in [0, 1).
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Index in a list of `len` codes for `u` uniform in [0, `rate`).
fn pick(u: f64, rate: f64, len: usize) -> usize {
    (((u / rate) * len as f64) as usize).min(len.saturating_sub(1))
}

/// The injected registration failure of a number that would otherwise be
/// registered: the code, or `None` (registered).
pub(crate) fn registration_failure(key: u64, faults: &Faults) -> Option<&str> {
    let rate = faults.registration_failure_rate;
    let codes = &faults.registration_failure_codes;
    if rate <= 0.0 || codes.is_empty() {
        return None;
    }
    let u = unit(mix(key, REGISTRATION_SEED));
    (u < rate).then(|| codes[pick(u, rate, codes.len())].as_str())
}

/// How one registered message of a sent group ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Stays `"3000"` forever.
    Never,
    /// `"4000"`, this many ms after the send.
    Delivered(u32),
    /// The plan's failure code of this index, this many ms after the send.
    Failed(usize, u32),
}

/// The delivery settings a group was sent with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeliveryPlan {
    delay_ms: u64,
    failure_rate: f64,
    pub failure_codes: Vec<Box<str>>,
    never_final_rate: f64,
}

impl DeliveryPlan {
    /// The delivery part of `faults`, as a group sent now keeps it.
    pub(crate) fn from_faults(faults: &Faults) -> Arc<Self> {
        Arc::new(DeliveryPlan {
            delay_ms: faults.delivery_delay_ms,
            failure_rate: faults.delivery_failure_rate,
            failure_codes: faults
                .delivery_failure_codes
                .iter()
                .map(|c| c.as_str().into())
                .collect(),
            never_final_rate: faults.never_final_rate,
        })
    }

    /// The fate of the message to this (packed) number.
    pub(crate) fn fate(&self, key: u64) -> Fate {
        let h = mix(key, DELIVERY_SEED);
        let u = unit(h);
        if u < self.never_final_rate {
            return Fate::Never;
        }
        let v = unit(mix(h, DELAY_SEED));
        // Clamped to u32 ms (49 days): far beyond any test.
        let offset = (self.delay_ms as f64 * (1.0 + v)).min(f64::from(u32::MAX)) as u32;
        let f = u - self.never_final_rate;
        if f < self.failure_rate && !self.failure_codes.is_empty() {
            Fate::Failed(pick(f, self.failure_rate, self.failure_codes.len()), offset)
        } else {
            Fate::Delivered(offset)
        }
    }
}

/// The final times of a sent group's registered messages, sorted, for
/// counting by binary search.
#[derive(Debug, Clone)]
pub(crate) struct Deliveries {
    pub plan: Arc<DeliveryPlan>,
    /// Offsets (ms after the send) of the delivered messages, ascending.
    delivered: Vec<u32>,
    /// Per failure code (index in the plan), offsets, ascending.
    failed: Vec<Vec<u32>>,
}

impl Deliveries {
    /// Decides the fate of every registered message (their packed keys).
    pub(crate) fn decide(plan: Arc<DeliveryPlan>, keys: impl Iterator<Item = u64>) -> Self {
        let mut delivered = Vec::new();
        let mut failed = vec![Vec::new(); plan.failure_codes.len()];
        for k in keys {
            match plan.fate(k) {
                Fate::Never => {}
                Fate::Delivered(o) => delivered.push(o),
                Fate::Failed(i, o) => failed[i].push(o),
            }
        }
        delivered.sort_unstable();
        for f in &mut failed {
            f.sort_unstable();
        }
        Deliveries {
            plan,
            delivered,
            failed,
        }
    }

    /// Messages delivered by `elapsed_ms` after the send.
    pub(crate) fn delivered_by(&self, elapsed_ms: u64) -> u64 {
        final_by(&self.delivered, elapsed_ms)
    }

    /// Messages failed by `elapsed_ms` after the send, per failure code.
    pub(crate) fn failed_by(&self, elapsed_ms: u64) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.plan
            .failure_codes
            .iter()
            .zip(&self.failed)
            .map(move |(c, offs)| (&**c, final_by(offs, elapsed_ms)))
    }
}

fn final_by(sorted: &[u32], elapsed_ms: u64) -> u64 {
    sorted.partition_point(|&o| u64::from(o) <= elapsed_ms) as u64
}

/// The `reason` the message list gives a status code.
pub(crate) fn reason(code: &str) -> &'static str {
    match code {
        "2000" => "registered, not sent yet",
        "3000" => "handed on, no result yet",
        "4000" => "delivered",
        "1026" => "duplicate recipient in this group",
        "1062" => "invalid recipient number",
        "1000" => "rejected",
        "3104" => "the recipient does not use KakaoTalk",
        "3043" => "the phone is off",
        "3107" => "no KakaoTalk use within 72 h",
        "3054" => "refused as spam",
        c if c.starts_with('1') => "registration failed",
        _ => "delivery failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_failures_are_deterministic_and_near_the_rate() {
        let faults = Faults {
            registration_failure_rate: 0.2,
            registration_failure_codes: vec!["1062".into(), "1000".into()],
            ..Faults::default()
        };
        let got: Vec<_> = (0..10_000u64)
            .map(|k| registration_failure(k, &faults))
            .collect();
        let again: Vec<_> = (0..10_000u64)
            .map(|k| registration_failure(k, &faults))
            .collect();
        assert_eq!(got, again);
        let failed = got.iter().flatten().count();
        assert!((1_700..2_300).contains(&failed), "{failed}");
        let c1000 = got.iter().flatten().filter(|c| **c == "1000").count();
        assert!(c1000 > failed / 3 && c1000 < failed * 2 / 3, "{c1000}");
        assert_eq!(registration_failure(7, &Faults::default()), None);
    }

    #[test]
    fn fates_and_counts() {
        let faults = Faults {
            delivery_delay_ms: 1_000,
            delivery_failure_rate: 0.3,
            never_final_rate: 0.1,
            ..Faults::default()
        };
        let plan = DeliveryPlan::from_faults(&faults);
        let d = Deliveries::decide(plan.clone(), 0..10_000u64);
        assert_eq!(d.delivered_by(999), 0);
        let failed = |e| d.failed_by(e).map(|(_, n)| n).sum::<u64>();
        assert_eq!(failed(999), 0);
        let (ok, ko) = (d.delivered_by(2_000), failed(2_000));
        assert!((5_700..6_300).contains(&ok), "{ok}");
        assert!((2_700..3_300).contains(&ko), "{ko}");
        let mid = d.delivered_by(1_500) + failed(1_500);
        assert!(mid > 0 && mid < ok + ko, "{mid}");
        // The counts agree with the fates one by one.
        let by_fate = (0..10_000u64)
            .filter(|k| matches!(plan.fate(*k), Fate::Delivered(o) if o <= 1_500))
            .count() as u64;
        assert_eq!(by_fate, d.delivered_by(1_500));
        // Defaults: everything delivered at once.
        let d = Deliveries::decide(DeliveryPlan::from_faults(&Faults::default()), 0..100u64);
        assert_eq!(d.delivered_by(0), 100);
    }
}
