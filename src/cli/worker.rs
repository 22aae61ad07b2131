//! `groupcast worker`: runs the pipeline's roles until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{secret_from_env, CliError, RedisArgs};
use crate::provider::{ProviderClient, ProviderConfig, RetryDecision};
use crate::store::{Store, StoreError};
use crate::worker::durability::{choose_wait, Durability, ServerPersistence};
use crate::worker::{Ctx, RateLimit, Role, Worker, WorkerConfig};

pub(crate) use crate::human::flag_duration as duration;

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

/// A worker's runtime threads by default (`--threads`).
pub const WORKER_THREADS: u16 = 1;

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
    /// Threads of the worker's runtime. A worker mostly waits on Redis and
    /// the provider: one thread handles more recipients a second than a
    /// provider accepts, and on a machine shared with other workers and
    /// Redis a thread per core measured slower and costlier than one
    /// (docs/benchmarks.md). For more, run more workers.
    #[arg(long, env = "GROUPCAST_WORKER_THREADS", default_value_t = WORKER_THREADS, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    /// Most recipients in one provider group (generation).
    #[arg(long, env = "GROUPCAST_GROUP_CAP", default_value_t = WorkerConfig::GROUP_CAP)]
    pub group_cap: u64,
    /// Provider requests per second across all workers: `auto` (no pace
    /// until the provider answers 429, then the rate it accepts, learned by
    /// every worker together), or a number (0: no pace at all).
    #[arg(long, env = "GROUPCAST_RATE_LIMIT", default_value = "auto", value_parser = RateLimit::parse)]
    pub rate_limit: RateLimit,
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
    pub retry_for: crate::human::FlagDuration,
    /// How long a send claim lets the provider call start: a send that
    /// cannot start within it (a limiter or durability wait, a crash)
    /// claims again, checking `--send-at` and quiet hours anew, so that a
    /// cancel or quiet hours can still stop it. At least 1s.
    #[arg(long, env = "GROUPCAST_CLAIM_LIFETIME", default_value_t = WorkerConfig::CLAIM_LIFETIME.into(), value_parser = duration)]
    pub claim_lifetime: crate::human::FlagDuration,
    /// How long delivering a decided report retries a failing webhook.
    #[arg(long, env = "GROUPCAST_REPORT_RETRY_FOR", default_value_t = WorkerConfig::REPORT_RETRY_FOR.into(), value_parser = duration)]
    pub report_retry_for: crate::human::FlagDuration,
    /// Also dead-letter a work item after this many attempts (0: no cap;
    /// only --retry-for counts).
    #[arg(long, env = "GROUPCAST_MAX_ATTEMPTS", default_value_t = WorkerConfig::MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// First retry delay (doubles per attempt, with equal jitter).
    #[arg(long, env = "GROUPCAST_BACKOFF_BASE", default_value_t = WorkerConfig::BACKOFF_BASE.into(), value_parser = duration)]
    pub backoff_base: crate::human::FlagDuration,
    /// Longest retry delay.
    #[arg(long, alias = "retry-max-delay", env = "GROUPCAST_BACKOFF_MAX", default_value_t = WorkerConfig::BACKOFF_MAX.into(), value_parser = duration)]
    pub backoff_max: crate::human::FlagDuration,
    /// How long one provider request may take (connect to last byte) before
    /// it counts as a transient failure. A handler renews its entry's lease
    /// every third of --visibility-timeout while it runs, so a slow call is
    /// never mistaken for a crashed worker and run twice.
    #[arg(long, env = "GROUPCAST_PROVIDER_TIMEOUT", default_value_t = ProviderConfig::REQUEST_TIMEOUT.into(), value_parser = duration)]
    pub provider_timeout: crate::human::FlagDuration,
    /// Unacknowledged entries idle this long are reclaimed.
    #[arg(long, env = "GROUPCAST_VISIBILITY_TIMEOUT", default_value_t = WorkerConfig::VISIBILITY_TIMEOUT.into(), value_parser = duration)]
    pub visibility_timeout: crate::human::FlagDuration,
    /// Deliveries of one entry before it is dead-lettered as poison.
    #[arg(long, env = "GROUPCAST_MAX_DELIVERIES", default_value_t = WorkerConfig::MAX_DELIVERIES)]
    pub max_deliveries: u64,
    /// The longest wait between two reads of a sent group's status (the
    /// first comes 100 ms after the send, each next one twice as late;
    /// shorter waits than this, up to 1 s, are waited in place, longer ones
    /// through the delayed set).
    #[arg(long, env = "GROUPCAST_POLL_INTERVAL", default_value_t = WorkerConfig::POLL_INTERVAL.into(), value_parser = duration)]
    pub poll_interval: crate::human::FlagDuration,
    /// Where to POST each batch's report (with an Idempotency-Key header),
    /// signed with GROUPCAST_WEBHOOK_SECRET (or GROUPCAST_WEBHOOK_SECRET_FILE):
    /// `whsec_<base64>` secrets separated by spaces (docs/reports.md).
    #[arg(long, env = "GROUPCAST_REPORT_WEBHOOK")]
    pub report_webhook: Option<String>,
    /// How the webhook's body names the report's fields: `snake` (as the
    /// reports stream and the board's API) or `camel`, the names of earlier
    /// releases, kept for this release only.
    #[arg(
        long,
        env = "GROUPCAST_WEBHOOK_FIELD_NAMES",
        value_enum,
        default_value_t
    )]
    pub webhook_field_names: crate::worker::webhook::FieldNames,
    /// How long a finished batch's events are kept.
    #[arg(long, env = "GROUPCAST_RETENTION", default_value_t = WorkerConfig::RETENTION.into(), value_parser = duration)]
    pub retention: crate::human::FlagDuration,
    /// How long after a group's send its messages' delivery results are
    /// read from the provider; those without one then count as `unknown`.
    /// `0` turns delivery tracking off.
    #[arg(long, env = "GROUPCAST_DELIVERY_WINDOW", default_value_t = WorkerConfig::DELIVERY_WINDOW.into(), value_parser = duration)]
    pub delivery_window: crate::human::FlagDuration,
    /// How long the recipients' outcomes (`groupcast results`) are kept
    /// after the delivery report.
    #[arg(long, env = "GROUPCAST_RESULTS_RETENTION", default_value_t = WorkerConfig::RESULTS_RETENTION.into(), value_parser = duration)]
    pub results_retention: crate::human::FlagDuration,
    /// How long a reported batch's id is remembered after its events
    /// expire: later chunks of it are dead-lettered, never sent again.
    #[arg(long, env = "GROUPCAST_REMEMBER", default_value_t = WorkerConfig::REMEMBER.into(), value_parser = duration)]
    pub remember: crate::human::FlagDuration,
    /// Close a batch that has had no event for this long before its report
    /// (as `groupcast close` does). Off unless given.
    #[arg(long, env = "GROUPCAST_GIVE_UP_AFTER", value_parser = duration)]
    pub give_up_after: Option<crate::human::FlagDuration>,
    /// A batch quiet this long before its report is reported stalled.
    #[arg(long, env = "GROUPCAST_STALL_AFTER", default_value_t = WorkerConfig::STALL_AFTER.into(), value_parser = duration)]
    pub stall_after: crate::human::FlagDuration,
    /// How often the watchdog scans.
    #[arg(long, env = "GROUPCAST_WATCHDOG_INTERVAL", default_value_t = WorkerConfig::WATCHDOG_INTERVAL.into(), value_parser = duration)]
    pub watchdog_interval: crate::human::FlagDuration,
    /// How often stream lengths, pending counts, lag and delayed retries are
    /// sampled into gauges (by workers running the promote role).
    #[arg(long, env = "GROUPCAST_GAUGE_INTERVAL", default_value_t = WorkerConfig::GAUGE_INTERVAL.into(), value_parser = duration)]
    pub gauge_interval: crate::human::FlagDuration,
    /// Where to serve Prometheus metrics (`off` to disable). Without it:
    /// 127.0.0.1:9464, or when another worker on this host has that port,
    /// the next free one up to 9495 (not 9465, the board's); the worker
    /// logs the address it took. An address given that is taken is an
    /// error.
    #[arg(long, env = "GROUPCAST_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// The Redis durability this deployment expects; the worker warns at
    /// start when the server's settings are weaker.
    #[arg(long, env = "GROUPCAST_DURABILITY", value_enum, default_value_t = Durability::Auto)]
    pub durability: Durability,
    /// Replicas that must acknowledge the events an add or send relies on
    /// as well (`WAITAOF 1 N`): a failover to such a replica loses none of
    /// them. With N > 0, `auto` waits with WAITAOF whatever `appendfsync`.
    #[arg(long, env = "GROUPCAST_REPLICAS_ACK", default_value_t = 0)]
    pub replicas_ack: u32,
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
        if Duration::from(self.claim_lifetime) < 2 * crate::worker::ops::send_group::SEND_MARGIN {
            return Err(CliError::Usage(format!(
                "--claim-lifetime {} is too short: a send needs {} of it to reach the provider; use at least 1s",
                self.claim_lifetime,
                crate::human::duration(crate::worker::ops::send_group::SEND_MARGIN)
            )));
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
            webhook_secrets: webhook_secrets()?,
            webhook_field_names: self.webhook_field_names,
            retention: self.retention.into(),
            delivery_window: self.delivery_window.into(),
            results_retention: self.results_retention.into(),
            remember: self.remember.into(),
            give_up_after: self.give_up_after.map(Into::into),
            stall_after: self.stall_after.into(),
            watchdog_interval: self.watchdog_interval.into(),
            gauge_interval: self.gauge_interval.into(),
            claim_lifetime: self.claim_lifetime.into(),
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

/// The secrets report deliveries are signed with, from
/// `GROUPCAST_WEBHOOK_SECRET` or the file `GROUPCAST_WEBHOOK_SECRET_FILE`
/// names; none when neither is set.
fn webhook_secrets() -> Result<Option<crate::worker::webhook::WebhookSecrets>, CliError> {
    secret_from_env("GROUPCAST_WEBHOOK_SECRET")?
        .map(|text| {
            crate::worker::webhook::WebhookSecrets::parse(&text)
                .map_err(|e| CliError::Usage(e.to_string()))
        })
        .transpose()
}

/// Says at start what the webhook settings mean for receivers: unsigned
/// deliveries, and the camelCase names that go away in the next release.
fn warn_about_webhook(config: &WorkerConfig) {
    if config.report_webhook.is_none() {
        return;
    }
    if config.webhook_secrets.is_none() {
        tracing::warn!(
            "report deliveries are unsigned: a receiver cannot tell them from forged ones; \
             set GROUPCAST_WEBHOOK_SECRET (see docs/reports.md)"
        );
    }
    if config.webhook_field_names == crate::worker::webhook::FieldNames::Camel {
        tracing::warn!(
            "--webhook-field-names camel sends the report's fields with the names of earlier releases; \
             the next release sends snake_case only (see docs/reports.md)"
        );
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
    // `auto` adapts to whatever the server does (and says so at start).
    if !matches!(durability, Durability::None | Durability::Auto) {
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
                (Some("yes"), Some("everysec"), Durability::Everysec | Durability::Waitaof) => {
                    false
                }
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

/// The metrics port of a worker without `--metrics-listen`, on loopback.
pub(crate) const DEFAULT_METRICS_PORT: u16 = 9464;
/// How many ports from [`DEFAULT_METRICS_PORT`] on a worker without
/// `--metrics-listen` tries: several workers on one host (a systemd
/// template, one per core) each find one, and Prometheus has a short,
/// known range to scrape.
pub(crate) const DEFAULT_METRICS_PORTS: u16 = 32;

/// The addresses a worker without `--metrics-listen` tries, in order:
/// [`DEFAULT_METRICS_PORT`] and the ports after it, except the board's
/// default ([`crate::cli::board::DEFAULT_LISTEN`]), which a board started later
/// would find taken.
pub fn default_metrics_addrs() -> Vec<SocketAddr> {
    (DEFAULT_METRICS_PORT..DEFAULT_METRICS_PORT + DEFAULT_METRICS_PORTS)
        .map(|port| SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
        .filter(|a| a.to_string() != crate::cli::board::DEFAULT_LISTEN)
        .collect()
}

/// Binds the metrics listener: the address given (taken: an error naming
/// the flag), or without one the first free of [`default_metrics_addrs`].
async fn bind_metrics(given: Option<&str>) -> Result<tokio::net::TcpListener, CliError> {
    use std::io::ErrorKind::AddrInUse;
    if let Some(given) = given {
        let addr: SocketAddr = given
            .parse()
            .map_err(|e| CliError::Usage(format!("--metrics-listen {given}: {e}")))?;
        return tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            CliError::Usage(if e.kind() == AddrInUse {
                format!(
                    "--metrics-listen {addr}: address already in use (another worker?): \
                     give a free address, or leave --metrics-listen (and \
                     GROUPCAST_METRICS_LISTEN) out to take the next free port from {DEFAULT_METRICS_PORT}"
                )
            } else {
                format!("--metrics-listen {addr}: {e}")
            })
        });
    }
    let candidates = default_metrics_addrs();
    for addr in &candidates {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            // Another worker's: try the next.
            Err(e) if e.kind() == AddrInUse => continue,
            Err(e) => return Err(CliError::Usage(format!("metrics on {addr}: {e}"))),
        }
    }
    Err(CliError::Usage(format!(
        "metrics: every port from {DEFAULT_METRICS_PORT} to {} on 127.0.0.1 is taken: \
         give --metrics-listen ADDR (port 0 picks any free one) or --metrics-listen off",
        DEFAULT_METRICS_PORT + DEFAULT_METRICS_PORTS - 1
    )))
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
    .map_err(|e| args.redis.failure(&e, &creds))?;
    check_server(&store, args.worker.durability).await;
    let mut config = config.clone();
    // Only the modes that depend on the server read it (`+config|get` and
    // `+waitaof` stay optional for the others).
    let server = match args.worker.durability {
        Durability::Auto | Durability::Waitaof => {
            while_redis_is_away(&describe, "reading the server's persistence", || {
                ServerPersistence::read(&store)
            })
            .await
            .map_err(|e| args.redis.failure(&e, &creds))?
        }
        _ => ServerPersistence::default(),
    };
    let (wait, why) = choose_wait(args.worker.durability, args.worker.replicas_ack, &server)
        .map_err(CliError::Usage)?;
    if why.contains("WARNING") {
        tracing::warn!("durability: {why}");
    } else {
        tracing::info!("durability: {why}");
    }
    config.durable = wait;
    if args.worker.metrics_listen.as_deref() != Some("off") {
        let listener = bind_metrics(args.worker.metrics_listen.as_deref()).await?;
        let handle = crate::metrics::install().map_err(|e| CliError::Usage(e.to_string()))?;
        crate::metrics::zero(store.keys.shards());
        let local = crate::metrics::serve_on(listener, handle)
            .map_err(|e| CliError::Failed(format!("serving metrics: {e}")))?;
        if args.worker.metrics_listen.is_none() && local.port() != DEFAULT_METRICS_PORT {
            tracing::info!(
                %local,
                "metrics at http://{local}/metrics (port {DEFAULT_METRICS_PORT} is taken, \
                 by another worker on this host most likely: took the next free one)"
            );
        } else {
            tracing::info!(%local, "metrics at http://{local}/metrics");
        }
    }
    let worker = while_redis_is_away(&describe, "starting the roles", || {
        Worker::start(Ctx::new(store.clone(), provider.clone(), config.clone()))
    })
    .await?;
    Ok(worker)
}

/// How long the start-up credential check waits for the provider's answer
/// before the worker starts without one.
const CREDENTIAL_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the credential check waits before it asks again after
/// transient trouble (a refused connection, a 5xx).
const CREDENTIAL_CHECK_PAUSE: Duration = Duration::from_millis(200);

/// How long the credential check asks again after transient trouble.
const CREDENTIAL_CHECK_RETRY_FOR: Duration = Duration::from_secs(2);

/// Asks the provider, with one harmless authenticated request
/// ([`ProviderClient::check_credentials`]), whether it accepts the
/// credentials. Refused: the worker does not start (exit 2), since every
/// batch would fail on its first create. No answer (the provider is away,
/// slow, or has no such call): the worker starts, warned; a refusal later
/// shows on each batch it hits.
async fn check_credentials(provider: &ProviderClient) -> Result<(), CliError> {
    let url = provider.base_url();
    // A provider starting with the worker (a container, a systemd unit, a
    // mock in the same shell) refuses connections for a moment: transient
    // trouble is asked again for a short while; a provider away for longer
    // does not hold the worker's start (it warns and starts).
    let retry_until = std::time::Instant::now() + CREDENTIAL_CHECK_RETRY_FOR;
    let ask = async {
        loop {
            match provider.check_credentials().await {
                Err(e)
                    if matches!(e.retry_decision(), RetryDecision::RetryWithBackoff)
                        && std::time::Instant::now() < retry_until =>
                {
                    tracing::debug!(provider = %url, error = %e, "the credential check failed: asking again");
                    tokio::time::sleep(CREDENTIAL_CHECK_PAUSE).await;
                }
                answer => return answer,
            }
        }
    };
    match tokio::time::timeout(CREDENTIAL_CHECK_TIMEOUT, ask).await {
        Ok(Ok(())) => {
            tracing::info!(provider = %url, "the provider accepts the credentials");
            Ok(())
        }
        Ok(Err(e)) if matches!(e.status(), Some(401 | 403)) => {
            let clock = if e.error_code() == Some("RequestTimeTooSkewed") {
                " and this host's clock"
            } else {
                ""
            };
            Err(CliError::Usage(format!(
                "the provider at {url} refused the credentials: {e}. Check \
                 GROUPCAST_PROVIDER_API_KEY and GROUPCAST_PROVIDER_API_SECRET (or their _FILE \
                 variants){clock}; the worker did not start"
            )))
        }
        Ok(Err(e)) => {
            tracing::warn!(provider = %url, error = %e, "could not check the provider's credentials: starting anyway");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(provider = %url, timeout = ?CREDENTIAL_CHECK_TIMEOUT, "the provider did not answer the credential check: starting anyway");
            Ok(())
        }
    }
}

/// Runs the worker.
pub async fn run(args: WorkerArgs) -> Result<(), CliError> {
    let config = args.worker.config()?;
    let provider = args.worker.provider()?;
    warn_about_webhook(&config);
    let worker = tokio::select! {
        w = async {
            check_credentials(&provider).await?;
            start(&args, &config, &provider).await
        } => w?,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 9464, then 9466 on (9465 is the board's), 31 ports in all, all on
    /// loopback.
    #[test]
    fn workers_without_metrics_listen_try_the_ports_after_9464_but_the_boards() {
        let addrs = default_metrics_addrs();
        let ports: Vec<u16> = addrs.iter().map(SocketAddr::port).collect();
        assert_eq!(ports[..3], [9464, 9466, 9467]);
        assert_eq!(ports.last(), Some(&9495));
        assert_eq!(ports.len(), 31);
        assert!(addrs.iter().all(|a| a.ip().is_loopback()));
    }
}
