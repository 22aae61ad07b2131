//! `groupcast worker`: runs the pipeline's roles until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{secret_from_env, CliError, RedisArgs};
use crate::provider::{ProviderClient, ProviderConfig};
use crate::store::{Store, StoreError};
use crate::worker::{Ctx, Role, Worker, WorkerConfig};

pub(crate) fn duration(s: &str) -> Result<humantime::Duration, String> {
    s.parse::<humantime::Duration>()
        .map_err(|e| format!("{e} (write e.g. 500ms, 30s, 5m)"))
}

/// The durability the deployment expects from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    /// AOF with `appendfsync always`: no acknowledged write is lost in a crash.
    Always,
    /// AOF with `appendfsync everysec`: a crash can lose about a second.
    Everysec,
    /// No persistence expected (tests, throwaway demos).
    None,
}

/// Worker flags. Every flag has a `GROUPCAST_*` variable.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The worker's own settings.
    #[command(flatten)]
    pub worker: WorkerFlags,
}

/// The worker's own settings.
#[derive(Debug, Clone, Args)]
pub struct WorkerFlags {
    /// Provider base URL. Credentials come only from GROUPCAST_PROVIDER_API_KEY
    /// and GROUPCAST_PROVIDER_API_SECRET (or their _FILE variants).
    #[arg(
        long,
        env = "GROUPCAST_PROVIDER_URL",
        default_value = "https://api.solapi.com"
    )]
    pub provider_url: String,
    /// Roles to run, comma-separated: load, operate, promote, watchdog.
    #[arg(
        long,
        env = "GROUPCAST_ROLES",
        default_value = "load,operate,promote,watchdog",
        value_delimiter = ','
    )]
    pub roles: Vec<String>,
    /// Entries handled at once per stream.
    #[arg(long, env = "GROUPCAST_CONCURRENCY", default_value_t = WorkerConfig::CONCURRENCY)]
    pub concurrency: usize,
    /// Most recipients in one provider group (generation).
    #[arg(long, env = "GROUPCAST_GROUP_CAP", default_value_t = WorkerConfig::GROUP_CAP)]
    pub group_cap: u64,
    /// Provider requests per second across all workers (0 = unlimited).
    #[arg(long, env = "GROUPCAST_RATE_LIMIT", default_value_t = WorkerConfig::RATE_LIMIT)]
    pub rate_limit: u32,
    /// Requests allowed at once above the rate.
    #[arg(long, env = "GROUPCAST_RATE_BURST", default_value_t = WorkerConfig::RATE_BURST)]
    pub rate_burst: u32,
    /// Percent of `--rate-limit` each lower priority lane (normal, bulk)
    /// keeps while higher lanes have work: urgent goes first, bulk is never
    /// starved. 0: no guarantee.
    #[arg(long, env = "GROUPCAST_BULK_SHARE", default_value_t = WorkerConfig::BULK_SHARE, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub bulk_share: u32,
    /// How long a work item retries transient provider trouble (5xx,
    /// dropped answers, timeouts, 429, refused connections) before it is
    /// dead-lettered, counted from its first failure.
    #[arg(long, env = "GROUPCAST_RETRY_FOR", default_value_t = WorkerConfig::RETRY_FOR.into(), value_parser = duration)]
    pub retry_for: humantime::Duration,
    /// How long delivering a decided report retries a failing webhook.
    #[arg(long, env = "GROUPCAST_REPORT_RETRY_FOR", default_value_t = WorkerConfig::REPORT_RETRY_FOR.into(), value_parser = duration)]
    pub report_retry_for: humantime::Duration,
    /// Also dead-letter a work item after this many attempts (0: no cap;
    /// only --retry-for counts).
    #[arg(long, env = "GROUPCAST_MAX_ATTEMPTS", default_value_t = WorkerConfig::MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// First retry delay (doubles per attempt, with equal jitter).
    #[arg(long, env = "GROUPCAST_BACKOFF_BASE", default_value_t = WorkerConfig::BACKOFF_BASE.into(), value_parser = duration)]
    pub backoff_base: humantime::Duration,
    /// Longest retry delay.
    #[arg(long, alias = "retry-max-delay", env = "GROUPCAST_BACKOFF_MAX", default_value_t = WorkerConfig::BACKOFF_MAX.into(), value_parser = duration)]
    pub backoff_max: humantime::Duration,
    /// How long one provider request may take (connect to last byte) before
    /// it counts as a transient failure. A handler renews its entry's lease
    /// every third of --visibility-timeout while it runs, so a slow call is
    /// never mistaken for a crashed worker and run twice.
    #[arg(long, env = "GROUPCAST_PROVIDER_TIMEOUT", default_value_t = ProviderConfig::REQUEST_TIMEOUT.into(), value_parser = duration)]
    pub provider_timeout: humantime::Duration,
    /// Unacknowledged entries idle this long are reclaimed.
    #[arg(long, env = "GROUPCAST_VISIBILITY_TIMEOUT", default_value_t = WorkerConfig::VISIBILITY_TIMEOUT.into(), value_parser = duration)]
    pub visibility_timeout: humantime::Duration,
    /// Deliveries of one entry before it is dead-lettered as poison.
    #[arg(long, env = "GROUPCAST_MAX_DELIVERIES", default_value_t = WorkerConfig::MAX_DELIVERIES)]
    pub max_deliveries: u64,
    /// How often a sent group's status is read.
    #[arg(long, env = "GROUPCAST_POLL_INTERVAL", default_value_t = WorkerConfig::POLL_INTERVAL.into(), value_parser = duration)]
    pub poll_interval: humantime::Duration,
    /// Where to POST each batch's report (with an Idempotency-Key header).
    #[arg(long, env = "GROUPCAST_REPORT_WEBHOOK")]
    pub report_webhook: Option<String>,
    /// How long a finished batch's events are kept.
    #[arg(long, env = "GROUPCAST_RETENTION", default_value_t = WorkerConfig::RETENTION.into(), value_parser = duration)]
    pub retention: humantime::Duration,
    /// How long a reported batch's id is remembered after its events
    /// expire: later chunks of it are dead-lettered, never sent again.
    #[arg(long, env = "GROUPCAST_REMEMBER", default_value_t = WorkerConfig::REMEMBER.into(), value_parser = duration)]
    pub remember: humantime::Duration,
    /// Close a batch that has had no event for this long before its report
    /// (as `groupcast close` does). Off unless given.
    #[arg(long, env = "GROUPCAST_GIVE_UP_AFTER", value_parser = duration)]
    pub give_up_after: Option<humantime::Duration>,
    /// A batch quiet this long before its report is reported stalled.
    #[arg(long, env = "GROUPCAST_STALL_AFTER", default_value_t = WorkerConfig::STALL_AFTER.into(), value_parser = duration)]
    pub stall_after: humantime::Duration,
    /// How often the watchdog scans.
    #[arg(long, env = "GROUPCAST_WATCHDOG_INTERVAL", default_value_t = WorkerConfig::WATCHDOG_INTERVAL.into(), value_parser = duration)]
    pub watchdog_interval: humantime::Duration,
    /// How often stream lengths, pending counts, lag and delayed retries are
    /// sampled into gauges (by workers running the promote role).
    #[arg(long, env = "GROUPCAST_GAUGE_INTERVAL", default_value_t = WorkerConfig::GAUGE_INTERVAL.into(), value_parser = duration)]
    pub gauge_interval: humantime::Duration,
    /// Where to serve Prometheus metrics (`off` to disable). Loopback unless told otherwise.
    #[arg(
        long,
        env = "GROUPCAST_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    pub metrics_listen: String,
    /// The Redis durability this deployment expects; the worker warns at
    /// start when the server's settings are weaker.
    #[arg(long, env = "GROUPCAST_DURABILITY", value_enum, default_value_t = Durability::Everysec)]
    pub durability: Durability,
}

impl WorkerFlags {
    /// The worker config these flags describe.
    pub fn config(&self) -> Result<WorkerConfig, CliError> {
        let mut roles = Vec::new();
        for r in &self.roles {
            roles.push(Role::parse(r.trim()).ok_or_else(|| {
                CliError::Usage(format!(
                    "--roles: unknown role {r:?}; use load, operate, promote, watchdog"
                ))
            })?);
        }
        if self.concurrency == 0 {
            return Err(CliError::Usage("--concurrency must be at least 1".into()));
        }
        if self.group_cap == 0 {
            return Err(CliError::Usage("--group-cap must be at least 1".into()));
        }
        if self.retry_for.is_zero() || self.report_retry_for.is_zero() {
            return Err(CliError::Usage(
                "--retry-for and --report-retry-for must be longer than 0".into(),
            ));
        }
        if self.give_up_after.is_some_and(|d| d.is_zero()) {
            return Err(CliError::Usage(
                "--give-up-after must be longer than 0 (leave it out to wait for an operator)"
                    .into(),
            ));
        }
        if self.provider_timeout.is_zero() {
            return Err(CliError::Usage(
                "--provider-timeout must be longer than 0".into(),
            ));
        }
        Ok(WorkerConfig {
            roles,
            concurrency: self.concurrency,
            group_cap: self.group_cap,
            rate_limit: self.rate_limit,
            rate_burst: self.rate_burst,
            bulk_share: self.bulk_share,
            retry_for: self.retry_for.into(),
            report_retry_for: self.report_retry_for.into(),
            max_attempts: self.max_attempts,
            backoff_base: self.backoff_base.into(),
            backoff_max: self.backoff_max.into(),
            visibility_timeout: self.visibility_timeout.into(),
            max_deliveries: self.max_deliveries,
            poll_interval: self.poll_interval.into(),
            report_webhook: self.report_webhook.clone(),
            retention: self.retention.into(),
            remember: self.remember.into(),
            give_up_after: self.give_up_after.map(Into::into),
            stall_after: self.stall_after.into(),
            watchdog_interval: self.watchdog_interval.into(),
            gauge_interval: self.gauge_interval.into(),
            ..WorkerConfig::default()
        })
    }

    /// The provider client, with credentials from the environment or files.
    pub fn provider(&self) -> Result<ProviderClient, CliError> {
        let key = secret_from_env("GROUPCAST_PROVIDER_API_KEY")?;
        let secret = secret_from_env("GROUPCAST_PROVIDER_API_SECRET")?;
        let (Some(api_key), Some(api_secret)) = (key, secret) else {
            return Err(CliError::Usage(
                "provider credentials missing: set GROUPCAST_PROVIDER_API_KEY and GROUPCAST_PROVIDER_API_SECRET \
                 (or GROUPCAST_PROVIDER_API_KEY_FILE / GROUPCAST_PROVIDER_API_SECRET_FILE)"
                    .into(),
            ));
        };
        ProviderClient::new(ProviderConfig {
            base_url: self.provider_url.clone(),
            api_key,
            api_secret,
            request_timeout: self.provider_timeout.into(),
            ..ProviderConfig::default()
        })
        .map_err(|e| CliError::Usage(format!("--provider-url: {e}")))
    }
}

/// Warns when the server's settings are weaker than the expected durability,
/// or when it may evict keys. Returns the warnings. On a cluster every master
/// has settings of its own: each is checked, and named in its warnings.
pub async fn check_server(store: &Store, durability: Durability) -> Vec<String> {
    let mut warnings = Vec::new();
    let get = |name: &'static str| store.config_everywhere(name);
    let cluster = store.target.is_cluster();
    let redis_at = |node: &str| {
        if cluster {
            format!("redis node {node}")
        } else {
            "redis".to_string()
        }
    };
    for (node, policy) in get("maxmemory-policy").await {
        let redis = redis_at(&node);
        match policy {
            Some(p) if p == "noeviction" => {}
            Some(p) => warnings.push(format!(
                "{redis} maxmemory-policy is {p}: under memory pressure Redis may evict groupcast's keys and lose events; set `maxmemory-policy noeviction`"
            )),
            None => warnings.push(format!("cannot read maxmemory-policy of {redis} (CONFIG GET refused?): make sure it is noeviction")),
        }
    }
    if durability != Durability::None {
        let aofs = get("appendonly").await;
        let fsyncs = get("appendfsync").await;
        for (node, aof) in aofs {
            let fsync = fsyncs
                .iter()
                .find(|(n, _)| *n == node)
                .and_then(|(_, f)| f.clone());
            let redis = redis_at(&node);
            let weak = match (aof.as_deref(), fsync.as_deref(), durability) {
                (Some("yes"), Some("always"), Durability::Everysec) => {
                    tracing::info!(
                        "{redis} has appendfsync always, stronger than --durability everysec: with no failover \
                         to a replica that could lag, --durability always drops the wait before adds and sends"
                    );
                    false
                }
                (Some("yes"), Some("always"), _) => false,
                (Some("yes"), Some("everysec"), Durability::Everysec) => false,
                (None, _, _) | (_, None, _) => {
                    warnings.push(format!(
                        "cannot read appendonly/appendfsync of {redis}: durability not checked"
                    ));
                    false
                }
                _ => true,
            };
            if weak {
                warnings.push(format!(
                    "{redis} has appendonly={} appendfsync={}, weaker than --durability {:?}: a Redis crash can lose acknowledged events (see docs/durability.md)",
                    aof.unwrap_or_default(),
                    fsync.unwrap_or_default(),
                    durability
                ));
            }
        }
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    warnings
}

/// How long a provider add or send waits for the events it relies on to be
/// on disk (see [`WorkerConfig::durable_after`]), from what the deployment
/// promises rather than from one node's settings: a failover to a replica can
/// lose acknowledged writes whatever the old primary's `appendfsync` was.
/// `always` (every acknowledged write survives any crash or failover) and
/// `none` (nothing is expected to survive) wait nothing; `everysec` waits the
/// fsync window.
pub fn durable_after(durability: Durability) -> Duration {
    match durability {
        Durability::Everysec => crate::store::witness::WINDOW,
        Durability::Always | Durability::None => Duration::ZERO,
    }
}

/// Runs `attempt` until it succeeds, waiting (with a capped backoff) while
/// Redis does not answer or is still loading its data: a worker started
/// while Redis restarts must wait for it, not exit. Any other failure (bad
/// credentials, a refused command) is returned at once.
async fn while_redis_is_away<T, F, Fut>(
    describe: &dyn Fn(&StoreError) -> String,
    what: &str,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() => {
                failures += 1;
                let delay =
                    Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5));
                tracing::warn!(
                    "{what}: {} (attempt {failures}); trying again in {delay:?}",
                    describe(&e)
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects, checks the server and starts the roles, waiting for Redis as
/// long as it is away.
async fn start(
    args: &WorkerArgs,
    config: &WorkerConfig,
    provider: &ProviderClient,
) -> Result<Worker, CliError> {
    let creds = super::RedisCredentials::from_env()?;
    let tls = args.redis.tls_certificates()?;
    let describe = |e: &StoreError| args.redis.explain(e, &creds);
    let store = while_redis_is_away(&describe, "connecting", || {
        args.redis.connect_with(&creds, tls.clone())
    })
    .await
    .map_err(|e| CliError::Redis(describe(&e)))?;
    check_server(&store, args.worker.durability).await;
    let mut config = config.clone();
    config.durable_after = durable_after(args.worker.durability);
    if !config.durable_after.is_zero() {
        tracing::info!(
            "--durability {:?}: provider adds and sends wait {:?} after the events they rely on, until Redis has them on disk",
            args.worker.durability,
            config.durable_after
        );
    }
    if args.worker.metrics_listen != "off" {
        let addr: SocketAddr = args.worker.metrics_listen.parse().map_err(|e| {
            CliError::Usage(format!(
                "--metrics-listen {}: {e}",
                args.worker.metrics_listen
            ))
        })?;
        let handle = crate::metrics::install().map_err(|e| CliError::Usage(e.to_string()))?;
        crate::metrics::zero(store.keys.shards());
        let local = crate::metrics::serve(addr, handle)
            .await
            .map_err(|e| CliError::Usage(format!("--metrics-listen {addr}: {e}")))?;
        tracing::info!(%local, "metrics at http://{local}/metrics");
    }
    let worker = while_redis_is_away(&describe, "starting the roles", || {
        Worker::start(Ctx::new(store.clone(), provider.clone(), config.clone()))
    })
    .await?;
    Ok(worker)
}

/// Runs the worker.
pub async fn run(args: WorkerArgs) -> Result<(), CliError> {
    let config = args.worker.config()?;
    let provider = args.worker.provider()?;
    let worker = tokio::select! {
        w = start(&args, &config, &provider) => w?,
        _ = wait_for_signal() => return Ok(()),
    };
    wait_for_signal().await;
    tracing::info!("stopping: no new work; in-flight entries finish or stay pending for reclaim");
    worker.stop().await;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
