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
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
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
        }
    }
}
