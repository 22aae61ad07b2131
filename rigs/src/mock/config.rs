//! The mock's start-up configuration and its fault settings.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the mock provider behaves.
#[derive(Clone)]
pub struct MockConfig {
    /// The only API key accepted. Default `mock-api-key`.
    pub api_key: String,
    /// The secret signatures are checked against. Default `mock-api-secret`.
    pub api_secret: String,
    /// Group cap: messages registered (`"2000"`) per group; beyond it every
    /// further message is answered `"1000"`, like any rejection. Default
    /// 1,000,000 (the real service's cap).
    pub cap: u64,
    /// How long a sent group stays `SENDING` before it is `COMPLETE`
    /// (computed when the group is next read). Default 200 ms.
    pub complete_after: Duration,
    /// Faults active from the start (also what [`reset`](super::MockHandle::reset)
    /// returns to). Default: none.
    pub faults: Faults,
    /// Send `errorCount` as a string of digits (`"3"`) instead of a number,
    /// as the real service sometimes does. Default `false`.
    pub error_count_as_string: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            api_key: "mock-api-key".to_owned(),
            api_secret: "mock-api-secret".to_owned(),
            cap: 1_000_000,
            complete_after: Duration::from_millis(200),
            faults: Faults::default(),
            error_count_as_string: false,
        }
    }
}

impl fmt::Debug for MockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockConfig")
            .field("api_key", &self.api_key)
            .field("api_secret", &"<redacted>")
            .field("cap", &self.cap)
            .field("complete_after", &self.complete_after)
            .field("faults", &self.faults)
            .field("error_count_as_string", &self.error_count_as_string)
            .finish()
    }
}

/// Injected faults. JSON (camelCase) for `POST /_mock/faults`; every field
/// is optional there and defaults as in [`Faults::default`] (no faults).
///
/// Faults apply to the provider API routes only (never to `/_mock/...`),
/// in this order: stall, latency, refused credentials, rate limit, error,
/// then (after the request took effect) drop.
/// The delivery hooks ([`registration_failure_rate`](Self::registration_failure_rate)
/// and the `delivery_*` / `never_final_rate` fields) are not faults of the
/// transport but of the messages: they decide, by a hash of each message's
/// `to`, which registrations fail and how each registered message ends. They
/// apply to adds (registration) and to sends (delivery) made after they are
/// set. Their defaults keep every message registered and delivered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Faults {
    /// Share (0..=1) of requests answered `500 InternalError` before they
    /// have any effect.
    pub error_rate: f64,
    /// Share (0..=1) of requests that take effect but whose answer is
    /// dropped: the connection is aborted instead of the body being sent,
    /// so the client sees a transport failure, not a status.
    pub drop_rate: f64,
    /// Added latency before every request is handled, in milliseconds.
    pub latency_ms: u64,
    /// Requests per second (per one-second window) above which the mock
    /// answers `429 TooManyRequests` with `Retry-After`.
    pub rate_limit_per_sec: Option<u32>,
    /// The `Retry-After` seconds sent with a `429`. Default 1.
    pub retry_after_secs: u64,
    /// Setting this (at start, by `POST /_mock/faults` or
    /// [`set_faults`](super::MockHandle::set_faults)) opens a stall window of
    /// this many milliseconds from that moment: every request arriving while
    /// it is open hangs for `stall_ms` before being handled. 0: no stall.
    pub stall_ms: u64,
    /// Answer every request `403 InvalidAPIKey`, as if the account's key
    /// had been revoked: what a worker sees when its credentials stop
    /// working after it started.
    pub refuse_credentials: bool,
    /// Share (0..=1) of messages that would be registered (`"2000"`) but are
    /// answered with one of
    /// [`registration_failure_codes`](Self::registration_failure_codes)
    /// instead, chosen by a hash of the `to`: the same number always gets
    /// the same answer (a retried add too).
    pub registration_failure_rate: f64,
    /// The `"1xxx"` codes injected registration failures are answered with.
    /// Default `["1062"]`.
    pub registration_failure_codes: Vec<String>,
    /// Registered messages of a sent group become final between
    /// `delivery_delay_ms` and twice that after the send (by a hash of the
    /// `to`), but never before the group is `COMPLETE`. Default 0.
    pub delivery_delay_ms: u64,
    /// Share (0..=1) of registered messages whose delivery fails, with one
    /// of [`delivery_failure_codes`](Self::delivery_failure_codes).
    pub delivery_failure_rate: f64,
    /// The codes failed deliveries end with. Default `["3104", "3043"]`.
    pub delivery_failure_codes: Vec<String>,
    /// Share (0..=1) of registered messages that never get a final result
    /// (they stay `"3000"`).
    pub never_final_rate: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            error_rate: 0.0,
            drop_rate: 0.0,
            latency_ms: 0,
            rate_limit_per_sec: None,
            retry_after_secs: 1,
            stall_ms: 0,
            refuse_credentials: false,
            registration_failure_rate: 0.0,
            registration_failure_codes: vec!["1062".to_owned()],
            delivery_delay_ms: 0,
            delivery_failure_rate: 0.0,
            delivery_failure_codes: vec!["3104".to_owned(), "3043".to_owned()],
            never_final_rate: 0.0,
        }
    }
}

/// Most distinct codes a code list of [`Faults`] may hold.
pub const MAX_FAULT_CODES: usize = 32;

impl Faults {
    /// Checks the settings: rates within 0..=1, code lists non-empty (at
    /// most [`MAX_FAULT_CODES`]), registration failure codes `"1xxx"` (not
    /// `"1026"`, which means a duplicate), delivery failure codes four digits
    /// other than `"2000"`, `"3000"` and `"4000"`.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("errorRate", self.error_rate),
            ("dropRate", self.drop_rate),
            ("registrationFailureRate", self.registration_failure_rate),
            ("deliveryFailureRate", self.delivery_failure_rate),
            ("neverFinalRate", self.never_final_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be between 0 and 1, got {v}"));
            }
        }
        if self.delivery_failure_rate + self.never_final_rate > 1.0 {
            return Err(format!(
                "deliveryFailureRate + neverFinalRate must be at most 1, got {}",
                self.delivery_failure_rate + self.never_final_rate
            ));
        }
        let four_digits = |c: &str| c.len() == 4 && c.bytes().all(|b| b.is_ascii_digit());
        for (name, codes, ok) in [
            (
                "registrationFailureCodes",
                &self.registration_failure_codes,
                &(|c: &str| four_digits(c) && c.starts_with('1') && c != "1026")
                    as &dyn Fn(&str) -> bool,
            ),
            (
                "deliveryFailureCodes",
                &self.delivery_failure_codes,
                &|c: &str| four_digits(c) && !matches!(c, "2000" | "3000" | "4000"),
            ),
        ] {
            if codes.is_empty() || codes.len() > MAX_FAULT_CODES {
                return Err(format!(
                    "{name} must hold 1 to {MAX_FAULT_CODES} codes, got {}",
                    codes.len()
                ));
            }
            if let Some(bad) = codes.iter().find(|c| !ok(c)) {
                return Err(format!("{name}: {bad:?} is not allowed there"));
            }
        }
        Ok(())
    }
}
