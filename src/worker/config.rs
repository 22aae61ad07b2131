//! Worker settings. Every one has a flag and a `GROUPCAST_*` variable in the
//! CLI (`groupcast worker --help`); the defaults are documented here.

use std::time::Duration;

use super::durability::DurableWait;

/// The roles a worker process can run; `--roles` splits them across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Reads the ingest streams: validates, accepts and loads chunks.
    Load,
    /// Reads the work streams: provider operations and report delivery.
    Operate,
    /// Moves due delayed retries back to their streams; trims the streams.
    Promote,
    /// Scans for batches that went quiet before their report.
    Watchdog,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Load, Role::Operate, Role::Promote, Role::Watchdog];

    /// Parses `load`, `operate`, `promote`, `watchdog`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "load" => Some(Role::Load),
            "operate" => Some(Role::Operate),
            "promote" => Some(Role::Promote),
            "watchdog" => Some(Role::Watchdog),
            _ => None,
        }
    }
}

/// The pace of provider requests across every worker (`--rate-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    /// No pace until the provider answers `429`; then the rate it accepts,
    /// learned by every worker together: first
    /// [`WorkerConfig::RATE_AFTER_PUSHBACK`], halved at each further `429`
    /// (at most once a second), forgotten ten minutes after the last
    /// lowering (see [`crate::worker::limiter`]).
    Auto,
    /// This many requests per second (0: none, whatever the provider says;
    /// its `429`s are still honoured, request by request).
    PerSecond(u32),
}

impl RateLimit {
    /// Parses `auto` or a number of requests per second.
    pub fn parse(s: &str) -> Result<RateLimit, String> {
        match s.trim() {
            "auto" => Ok(RateLimit::Auto),
            n => n.parse().map(RateLimit::PerSecond).map_err(|_| {
                format!("`{s}`: expected `auto` or requests per second (0: no limit)")
            }),
        }
    }
}

impl std::fmt::Display for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RateLimit::Auto => f.write_str("auto"),
            RateLimit::PerSecond(n) => write!(f, "{n}"),
        }
    }
}

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Roles to run. Default: all.
    pub roles: Vec<Role>,
    /// Entries processed at once per stream. Default 8.
    pub concurrency: usize,
    /// The group cap: most recipients in one generation (provider group).
    /// Default 1,000,000 (the real provider's cap).
    pub group_cap: u64,
    /// Provider requests per second across every worker. Default
    /// [`RateLimit::Auto`]: none until the provider answers `429`, then
    /// what it accepts.
    pub rate_limit: RateLimit,
    /// Requests allowed at once above the rate. Default 50.
    pub rate_burst: u32,
    /// Percent of `rate_limit` each lower priority lane (normal, bulk) is
    /// guaranteed while higher lanes keep the limiter busy, so that urgent
    /// work goes first without starving bulk work (see
    /// [`crate::worker::limiter`]). 0: no guarantee. Default 10.
    pub bulk_share: u32,
    /// How long a work item keeps retrying transient failures (5xx, dropped
    /// answers, timeouts, 429, refused connections) before it is
    /// dead-lettered, measured from its first failure (a time carried in the
    /// item, so a worker restart does not reset it). A poll starts over
    /// whenever the provider answers. Default 1 h.
    pub retry_for: Duration,
    /// The same for delivering a decided report to the webhook: a receiver
    /// that is down for a deploy must not cost the upstream its report.
    /// Default 24 h.
    pub report_retry_for: Duration,
    /// Also dead-letter a work item after this many attempts (0: no cap, only
    /// `retry_for` counts). Default 0.
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt, with equal jitter (half
    /// fixed, half random). Default 200 ms.
    pub backoff_base: Duration,
    /// Longest retry delay (`--retry-max-delay`). Default 30 s.
    pub backoff_max: Duration,
    /// An entry unacknowledged this long is reclaimed by another consumer.
    /// Default 30 s.
    pub visibility_timeout: Duration,
    /// Deliveries of one entry before it is dead-lettered as poison. Default 10.
    pub max_deliveries: u64,
    /// The longest wait between two reads of a sent group's status: the
    /// first read comes [`WorkerConfig::FIRST_POLL`] after the send, each
    /// next one twice as late as the one before, up to this. Default 500 ms.
    pub poll_interval: Duration,
    /// Where to POST each batch's report (none: reports only go to the
    /// reports stream). Default none.
    pub report_webhook: Option<String>,
    /// The secrets every report delivery is signed with
    /// (`GROUPCAST_WEBHOOK_SECRET`). None: deliveries are unsigned.
    pub webhook_secrets: Option<crate::worker::webhook::WebhookSecrets>,
    /// How the webhook's body names the report's fields. Default snake_case.
    pub webhook_field_names: crate::worker::webhook::FieldNames,
    /// How long a finished batch's events and state are kept. Default 7 days.
    pub retention: Duration,
    /// How long after a group's send its messages' delivery results are
    /// read (`track`); messages without a final result then count as
    /// `unknown`. Zero: delivery results are not tracked. Default 72 h.
    pub delivery_window: Duration,
    /// The first wait between two passes over a group's message list while
    /// results are missing; each next one twice as long, up to
    /// [`WorkerConfig::TRACK_MAX_WAIT`]. Default 2 s.
    pub track_first_wait: Duration,
    /// How long the per-recipient outcomes (and the delivery counts) are
    /// kept after the delivery report. Default 30 days.
    pub results_retention: Duration,
    /// How long a reported batch's id is remembered (a tombstone, a few
    /// dozen bytes) after its events expire: later chunks of it are
    /// dead-lettered as "already reported", never sent. Default 180 days.
    pub remember: Duration,
    /// Close batches that have had no event for this long before their
    /// report, as `groupcast close` does: the seqs that never came are given
    /// up on and everything loaded is sent. None (the default): wait for an
    /// operator.
    pub give_up_after: Option<Duration>,
    /// A batch with no event for this long before its report is stalled.
    /// Default 5 min.
    pub stall_after: Duration,
    /// How often the watchdog scans. Default 10 s.
    pub watchdog_interval: Duration,
    /// How often the promote role samples stream lengths, pending counts,
    /// lag and delayed retries into gauges (a few Redis commands per shard,
    /// off the per-chunk path). Default 5 s.
    pub gauge_interval: Duration,
    /// How long a blocking read waits for new entries. Default 2 s.
    pub block: Duration,
    /// What a provider add or send waits for before it goes out: until
    /// Redis has the events it relies on on disk. When Redis may lose its
    /// last acknowledged writes in a crash (`appendfsync everysec`, a
    /// failover), an add or send resting on facts Redis then lost would see
    /// the chunk reassigned or the generation redone in a new group, and
    /// recipients registered or sent twice. Default [`DurableWait::None`];
    /// `groupcast worker` chooses it from `--durability` and the server's
    /// settings (see `docs/durability.md`).
    pub durable: DurableWait,
    /// How long shutdown waits for in-flight entries. Default 10 s.
    pub drain_timeout: Duration,
    /// How long a send claim lets the provider call start (cut where the
    /// batch's quiet hours begin): a send that cannot start within it (a
    /// limiter or durability wait) claims again, checking the schedule
    /// anew. At least 1 s (twice the send's margin for its transit).
    /// Default 5 s.
    pub claim_lifetime: Duration,
}

impl WorkerConfig {
    // The defaults, written once: `Default` and the CLI flags both use them.
    /// Default of [`WorkerConfig::concurrency`].
    pub const CONCURRENCY: usize = 8;
    /// Default of [`WorkerConfig::group_cap`].
    pub const GROUP_CAP: u64 = 1_000_000;
    /// The rate [`RateLimit::Auto`] keeps to after the provider's first
    /// `429` (NHN Cloud documents 300 requests/s; Solapi documents none).
    pub const RATE_AFTER_PUSHBACK: u32 = 300;
    /// Default of [`WorkerConfig::rate_burst`].
    pub(crate) const RATE_BURST: u32 = 50;
    /// Default of [`WorkerConfig::bulk_share`].
    pub(crate) const BULK_SHARE: u32 = 10;
    /// Default of [`WorkerConfig::retry_for`].
    pub(crate) const RETRY_FOR: Duration = Duration::from_secs(3600);
    /// Default of [`WorkerConfig::report_retry_for`].
    pub(crate) const REPORT_RETRY_FOR: Duration = Duration::from_secs(24 * 3600);
    /// Default of [`WorkerConfig::max_attempts`] (no cap).
    pub(crate) const MAX_ATTEMPTS: u32 = 0;
    /// Default of [`WorkerConfig::backoff_base`].
    pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(200);
    /// Default of [`WorkerConfig::backoff_max`].
    pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);
    /// Default of [`WorkerConfig::visibility_timeout`].
    pub const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default of [`WorkerConfig::max_deliveries`].
    pub(crate) const MAX_DELIVERIES: u64 = 10;
    /// Default of [`WorkerConfig::poll_interval`].
    pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);
    /// How long after the send a group's status is first read (at most
    /// [`WorkerConfig::poll_interval`]): a small group is often finished
    /// by then, a large one costs a few more reads.
    pub(crate) const FIRST_POLL: Duration = Duration::from_millis(100);
    /// Default of [`WorkerConfig::retention`].
    pub(crate) const RETENTION: Duration = crate::store::batch::BatchPolicy::RETENTION;
    /// Default of [`WorkerConfig::delivery_window`].
    pub(crate) const DELIVERY_WINDOW: Duration = Duration::from_secs(72 * 3600);
    /// Default of [`WorkerConfig::track_first_wait`].
    pub(crate) const TRACK_FIRST_WAIT: Duration = Duration::from_secs(2);
    /// The longest wait between two passes of delivery tracking.
    pub(crate) const TRACK_MAX_WAIT: Duration = Duration::from_secs(10 * 60);
    /// Default of [`WorkerConfig::results_retention`].
    pub(crate) const RESULTS_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
    /// Default of [`WorkerConfig::remember`].
    pub const REMEMBER: Duration = Duration::from_secs(180 * 24 * 3600);
    /// Default of [`WorkerConfig::stall_after`].
    pub const STALL_AFTER: Duration = Duration::from_secs(300);
    /// Default of [`WorkerConfig::watchdog_interval`].
    pub(crate) const WATCHDOG_INTERVAL: Duration = Duration::from_secs(10);
    /// Default of [`WorkerConfig::gauge_interval`].
    pub(crate) const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
    /// Default of [`WorkerConfig::block`].
    pub const BLOCK: Duration = Duration::from_secs(2);
    /// Default of [`WorkerConfig::drain_timeout`].
    pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`WorkerConfig::claim_lifetime`].
    pub(crate) const CLAIM_LIFETIME: Duration = Duration::from_secs(5);
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            roles: Role::ALL.to_vec(),
            concurrency: Self::CONCURRENCY,
            group_cap: Self::GROUP_CAP,
            rate_limit: RateLimit::Auto,
            rate_burst: Self::RATE_BURST,
            bulk_share: Self::BULK_SHARE,
            retry_for: Self::RETRY_FOR,
            report_retry_for: Self::REPORT_RETRY_FOR,
            max_attempts: Self::MAX_ATTEMPTS,
            backoff_base: Self::BACKOFF_BASE,
            backoff_max: Self::BACKOFF_MAX,
            visibility_timeout: Self::VISIBILITY_TIMEOUT,
            max_deliveries: Self::MAX_DELIVERIES,
            poll_interval: Self::POLL_INTERVAL,
            report_webhook: None,
            webhook_secrets: None,
            webhook_field_names: Default::default(),
            retention: Self::RETENTION,
            delivery_window: Self::DELIVERY_WINDOW,
            track_first_wait: Self::TRACK_FIRST_WAIT,
            results_retention: Self::RESULTS_RETENTION,
            remember: Self::REMEMBER,
            give_up_after: None,
            stall_after: Self::STALL_AFTER,
            watchdog_interval: Self::WATCHDOG_INTERVAL,
            gauge_interval: Self::GAUGE_INTERVAL,
            block: Self::BLOCK,
            durable: DurableWait::None,
            drain_timeout: Self::DRAIN_TIMEOUT,
            claim_lifetime: Self::CLAIM_LIFETIME,
        }
    }
}

impl WorkerConfig {
    /// The delay before retry number `attempt` (1-based): exponential, capped
    /// at `backoff_max`, with equal jitter (a uniformly random delay between
    /// half the capped value and all of it), so that workers that failed
    /// together do not retry together while no retry comes back at once.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.backoff_base.saturating_mul(
            1u32.checked_shl(attempt.saturating_sub(1).min(20))
                .unwrap_or(u32::MAX),
        );
        let cap = exp.min(self.backoff_max);
        let jitter: f64 = rand::random::<f64>();
        cap.mul_f64(0.5 + jitter * 0.5)
    }

    /// The wait before the next read of a group still sending, after
    /// waiting `last` before this one (zero: the send): the first is
    /// [`WorkerConfig::FIRST_POLL`], each next one twice as long, never
    /// longer than [`WorkerConfig::poll_interval`].
    pub(crate) fn next_poll(&self, last: Duration) -> Duration {
        let next = if last.is_zero() {
            Self::FIRST_POLL
        } else {
            last.saturating_mul(2)
        };
        next.min(self.poll_interval)
    }

    /// How long an outcome record written before the delivery report lives
    /// at least: the delivery window, then the results' retention (the
    /// delivery report sets the retention again, from its own moment).
    pub(crate) fn results_keep(&self) -> Duration {
        self.delivery_window + self.results_retention
    }

    /// How the batches this worker ends end: its retention, and whether
    /// reports are queued for the webhook.
    pub(crate) fn batch_policy(&self) -> crate::store::batch::BatchPolicy {
        crate::store::batch::BatchPolicy {
            retention: self.retention,
            deliver: self.report_webhook.is_some(),
            track: !self.delivery_window.is_zero(),
        }
    }

    /// The longest wait for the shared rate limiter that a handler holds its
    /// entry for: a quarter of the visibility timeout. A longer wait gives
    /// the entry back (to the delayed set, without reserving a slot), so that
    /// it is never reclaimed and reserved a second time while it waits.
    pub(crate) fn max_limiter_wait(&self) -> Duration {
        self.visibility_timeout / 4
    }

    /// How often a long-running handler renews its entry's lease: a third of
    /// the visibility timeout, so that a slow provider call is not mistaken
    /// for a crashed consumer and run twice.
    pub(crate) fn lease_renewal(&self) -> Duration {
        (self.visibility_timeout / 3).max(Duration::from_millis(50))
    }
}
