//! Worker settings. Every one has a flag and a `GROUPCAST_*` variable in the
//! CLI (`groupcast worker --help`); the defaults are documented here.

use std::time::Duration;

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
    /// Provider requests per second across every worker (0 = no limit).
    /// Default 300.
    pub rate_limit: u32,
    /// Requests allowed at once above the rate. Default 50.
    pub rate_burst: u32,
    /// Attempts of one work item before it is dead-lettered. Default 8.
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt, with full jitter. Default 200 ms.
    pub backoff_base: Duration,
    /// Longest retry delay. Default 30 s.
    pub backoff_max: Duration,
    /// An entry unacknowledged this long is reclaimed by another consumer.
    /// Default 30 s.
    pub visibility_timeout: Duration,
    /// Deliveries of one entry before it is dead-lettered as poison. Default 10.
    pub max_deliveries: u64,
    /// How often a sent group's status is read. Default 500 ms.
    pub poll_interval: Duration,
    /// Where to POST each batch's report (none: reports only go to the
    /// reports stream). Default none.
    pub report_webhook: Option<String>,
    /// How long a finished batch's events and state are kept. Default 7 days.
    pub retention: Duration,
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
    /// How long the event that made a generation ready must have been in
    /// Redis before the generation's send goes out. When Redis may lose the
    /// last second of acknowledged writes in a crash (`appendfsync
    /// everysec`), a send that relied on facts Redis then lost would see the
    /// generation redone in a new group and sent a second time; waiting until
    /// those facts are on disk rules that out. 0 when Redis writes every
    /// acknowledged write to disk first (`appendfsync always`). Default 0;
    /// `groupcast worker` sets it from the server's settings (see
    /// `docs/durability.md`).
    pub durable_after: Duration,
    /// How long shutdown waits for in-flight entries. Default 10 s.
    pub drain_timeout: Duration,
}

impl WorkerConfig {
    // The defaults, written once: `Default` and the CLI flags both use them.
    /// Default of [`WorkerConfig::concurrency`].
    pub const CONCURRENCY: usize = 8;
    /// Default of [`WorkerConfig::group_cap`].
    pub const GROUP_CAP: u64 = 1_000_000;
    /// Default of [`WorkerConfig::rate_limit`].
    pub const RATE_LIMIT: u32 = 300;
    /// Default of [`WorkerConfig::rate_burst`].
    pub const RATE_BURST: u32 = 50;
    /// Default of [`WorkerConfig::max_attempts`].
    pub const MAX_ATTEMPTS: u32 = 8;
    /// Default of [`WorkerConfig::backoff_base`].
    pub const BACKOFF_BASE: Duration = Duration::from_millis(200);
    /// Default of [`WorkerConfig::backoff_max`].
    pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
    /// Default of [`WorkerConfig::visibility_timeout`].
    pub const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default of [`WorkerConfig::max_deliveries`].
    pub const MAX_DELIVERIES: u64 = 10;
    /// Default of [`WorkerConfig::poll_interval`].
    pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
    /// Default of [`WorkerConfig::retention`].
    pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    /// Default of [`WorkerConfig::stall_after`].
    pub const STALL_AFTER: Duration = Duration::from_secs(300);
    /// Default of [`WorkerConfig::watchdog_interval`].
    pub const WATCHDOG_INTERVAL: Duration = Duration::from_secs(10);
    /// Default of [`WorkerConfig::gauge_interval`].
    pub const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
    /// Default of [`WorkerConfig::block`].
    pub const BLOCK: Duration = Duration::from_secs(2);
    /// Default of [`WorkerConfig::drain_timeout`].
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            roles: Role::ALL.to_vec(),
            concurrency: Self::CONCURRENCY,
            group_cap: Self::GROUP_CAP,
            rate_limit: Self::RATE_LIMIT,
            rate_burst: Self::RATE_BURST,
            max_attempts: Self::MAX_ATTEMPTS,
            backoff_base: Self::BACKOFF_BASE,
            backoff_max: Self::BACKOFF_MAX,
            visibility_timeout: Self::VISIBILITY_TIMEOUT,
            max_deliveries: Self::MAX_DELIVERIES,
            poll_interval: Self::POLL_INTERVAL,
            report_webhook: None,
            retention: Self::RETENTION,
            stall_after: Self::STALL_AFTER,
            watchdog_interval: Self::WATCHDOG_INTERVAL,
            gauge_interval: Self::GAUGE_INTERVAL,
            block: Self::BLOCK,
            durable_after: Duration::ZERO,
            drain_timeout: Self::DRAIN_TIMEOUT,
        }
    }
}

impl WorkerConfig {
    /// The delay before retry number `attempt` (1-based): exponential with
    /// full jitter, so that workers that failed together do not retry together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.backoff_base.saturating_mul(
            1u32.checked_shl(attempt.saturating_sub(1).min(20))
                .unwrap_or(u32::MAX),
        );
        let cap = exp.min(self.backoff_max);
        let jitter: f64 = rand::random::<f64>();
        cap.mul_f64(0.5 + jitter * 0.5)
    }
}
