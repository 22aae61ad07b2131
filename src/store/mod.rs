//! The connection to Redis and everything groupcast keeps there.
//!
//! - [`batch`]: the batch scripts (accept, park, record group, loaded, sent,
//!   completed, append): each appends its events and updates the batch's
//!   projection in one atomic step.
//! - [`queue`]: the work plumbing (consumer groups, dead letters, delayed
//!   retries, reclaiming).
//! - [`info`]: stream lengths, consumer groups' progress, trimming.
//! - [`coord`]: the watchdog's lease, the active sets, the rate limiter.
//! - [`server`]: the server's settings and statistics.
//! - [`scripts`]: the Lua sources from `streams/scripts/`, each with its
//!   declaration (keys, arguments, replies, events, next steps), loaded on demand.
//! - [`overview`]: read-only queries for operators (stream health, queued
//!   batches, dead letters and their redrive).
//! - [`durability`]: what Redis keeps: waiting until events are on disk
//!   (`WAITAOF`, group-committed) and reading acknowledged events back to
//!   detect writes it lost.
//! - [`shards`]: the deployment's shard count, recorded in Redis.
//! - [`clock`]: the Redis clock, against which every instant Redis stamped
//!   is compared.

pub mod batch;
pub mod clock;
pub mod coord;
pub mod delivery;
pub mod durability;
pub(crate) mod front;
pub(crate) mod info;
pub(crate) mod notes;
pub(crate) mod numbers;
pub(crate) mod overview;
pub mod queue;
pub mod scripts;
pub mod server;
pub mod shards;

use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};
use thiserror::Error;

use crate::keys::Keyspace;

/// Errors at the Redis boundary, classified by what the caller should do.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// Redis answered with an error or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A script answered something this build does not understand.
    #[error("unexpected reply from script {script}: {reply}")]
    UnexpectedReply {
        /// The script's name.
        script: &'static str,
        /// What it said.
        reply: String,
    },
    /// A call of a script that does not match its declaration (a bug: see
    /// [`scripts::declarations`]); it never reached Redis.
    #[error("call of script {script} does not match its declaration: {detail}")]
    ScriptCall {
        /// The script's name.
        script: &'static str,
        /// What does not match.
        detail: String,
    },
    /// A batch's number log (its batch-wide dedupe) is not a sequence of
    /// frames: something other than `accept.lua` wrote its key.
    #[error("batch {batch}: {source}; delete the key {key} only if the batch has ended")]
    NumberLog {
        /// The batch.
        batch: String,
        /// The log's key.
        key: String,
        /// Where it is malformed.
        source: crate::protocol::numbers::Malformed,
    },
    /// A batch's number log moved on each time this process read up to its
    /// end (other processes accepting the batch's chunks just then): the
    /// chunk is tried again later.
    #[error(
        "batch {batch}: its number log moved on {rounds} times in a row while a chunk was accepted"
    )]
    Behind {
        /// The batch.
        batch: String,
        /// How many times.
        rounds: u32,
    },
    /// The task that was accepting a chunk along with this one, for the
    /// same batch, stopped midway (its worker is stopping): the chunk may or
    /// may not be accepted, and is tried again later.
    #[error("batch {batch}: the accept this chunk waited for stopped midway")]
    AcceptAbandoned {
        /// The batch.
        batch: String,
    },
    /// The deployment's recorded shard count cannot be used as asked (see
    /// [`shards`]): the text says what to do.
    #[error("{0}")]
    ShardCount(String),
    /// The configured URL or credentials cannot be used.
    #[error("cannot use redis at {url}: {reason}")]
    Config {
        /// The URL, with any password removed.
        url: String,
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// Whether trying again later can help (connection trouble, a restarting
    /// server, a cluster resharding), as opposed to a bug or a bad setting.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            StoreError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_cluster_error()
                    || matches!(
                        e.code(),
                        Some("LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "BUSY")
                    )
            }
            StoreError::Behind { .. } | StoreError::AcceptAbandoned { .. } => true,
            _ => false,
        }
    }
}

/// A result at the Redis boundary.
pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// A connection to one Redis server or to a Redis Cluster. Cheap to clone:
/// clones share one multiplexed connection (or one cluster connection).
#[derive(Clone)]
pub enum RedisConn {
    /// A single server, reconnecting on its own.
    Single(ConnectionManager),
    /// A Redis Cluster, following MOVED/ASK.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => {
                if is_script_load(cmd) {
                    cluster_script_load(c, cmd)
                } else {
                    c.req_packed_command(cmd)
                }
            }
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

fn cluster_script_load<'a>(c: &'a mut ClusterConnection, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
    // redis-rs sends SCRIPT LOAD to every node and fails unless all answer, so
    // one unreachable master would keep a script from loading anywhere.
    // `Script::invoke_async` loads only after a NOSCRIPT from the node that
    // owns the script's keys (which therefore answers), so loading wherever
    // possible is enough: the EVALSHA that follows goes to that node, after
    // the SCRIPT LOAD on the same connection.
    let routing = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllMasters,
        Some(ResponsePolicy::OneSucceeded),
    ));
    Box::pin(c.route_command(cmd.clone(), routing))
}

/// Whether `cmd` is `SCRIPT LOAD`.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(b) => Some(b),
        _ => None,
    });
    matches!(
        (args.next(), args.next()),
        (Some(a), Some(b)) if a.eq_ignore_ascii_case(b"SCRIPT") && b.eq_ignore_ascii_case(b"LOAD")
    )
}

/// A connection for blocking reads (`XREADGROUP ... BLOCK`): its own socket
/// and no reply timeout, so that it never stalls or times out other commands.
pub enum BlockingConn {
    /// A single server.
    Single(MultiplexedConnection),
    /// A cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for BlockingConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            BlockingConn::Single(c) => c.req_packed_command(cmd),
            BlockingConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            BlockingConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            BlockingConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            BlockingConn::Single(c) => c.get_db(),
            BlockingConn::Cluster(c) => c.get_db(),
        }
    }
}

/// How to reach Redis.
#[derive(Clone)]
pub struct RedisTarget {
    url: String,
    kind: TargetKind,
}

// One per process and cloned rarely: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum TargetKind {
    Single(redis::Client),
    Cluster {
        /// For the shared command connection.
        commands: Box<ClusterClient>,
        /// For blocking reads: a reply timeout longer than any `BLOCK`.
        blocking: Box<ClusterClient>,
    },
}

/// How long a cluster command may take, redirections and retries included.
const CLUSTER_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a blocking read on a cluster may wait for its reply: longer than
/// any sensible `XREADGROUP ... BLOCK` (the worker's `--block`, default 2 s).
pub(crate) const CLUSTER_BLOCKING_REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Retries of one cluster command (MOVED, ASK, TRYAGAIN, a lost node). Few and
/// short on purpose: with redis-rs' defaults (16 retries, waits from 1.28 s
/// growing to minutes) the requests for a dead master pile up inside the
/// cluster connection and commands for the healthy masters stall behind them
/// for the whole reply timeout. A command that still fails is retried by
/// groupcast itself (the entry stays pending and is reclaimed).
const CLUSTER_RETRIES: u32 = 5;
/// Shortest and longest wait between those retries, in milliseconds.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (100, 1000);

fn cluster_client(nodes: &[String], reply_timeout: Duration) -> redis::RedisResult<ClusterClient> {
    ClusterClient::builder(nodes.to_vec())
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
        .response_timeout(reply_timeout)
        .connection_timeout(Duration::from_secs(5))
        .build()
}

/// The URL with any password replaced by `***`, for messages and logs. A
/// URL written without its scheme (`user:pw@host:6379`) is redacted too.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = userinfo.split(':').next().unwrap_or("");
    let userinfo = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        user.to_string()
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{userinfo}@{host}"),
        None => format!("{userinfo}@{host}"),
    }
}

impl RedisTarget {
    /// Parses `redis://`, `rediss://`, or `redis+cluster://host:port,host:port`
    /// (seed nodes; `rediss+cluster://` for TLS).
    pub fn parse(url: &str) -> StoreResult<RedisTarget> {
        let config_err = |reason: String| StoreError::Config {
            url: redact_url(url),
            reason,
        };
        let kind = if let Some(rest) = url
            .strip_prefix("redis+cluster://")
            .map(|r| ("redis", r))
            .or_else(|| url.strip_prefix("rediss+cluster://").map(|r| ("rediss", r)))
        {
            let (scheme, rest) = rest;
            let (userinfo, hosts) = match rest.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| match userinfo {
                    Some(u) => format!("{scheme}://{u}@{h}"),
                    None => format!("{scheme}://{h}"),
                })
                .collect();
            if nodes.is_empty() {
                return Err(config_err("no cluster seed nodes given".into()));
            }
            let commands = cluster_client(&nodes, CLUSTER_REPLY_TIMEOUT)
                .map_err(|e| config_err(e.to_string()))?;
            let blocking = cluster_client(&nodes, CLUSTER_BLOCKING_REPLY_TIMEOUT)
                .map_err(|e| config_err(e.to_string()))?;
            TargetKind::Cluster {
                commands: Box::new(commands),
                blocking: Box::new(blocking),
            }
        } else {
            TargetKind::Single(redis::Client::open(url).map_err(|e| config_err(e.to_string()))?)
        };
        Ok(RedisTarget {
            url: url.to_string(),
            kind,
        })
    }

    /// The URL without its password.
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    /// Whether this is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.kind, TargetKind::Cluster { .. })
    }

    /// Opens the shared command connection (5 s reply timeout; reconnects).
    pub async fn connect(&self) -> StoreResult<RedisConn> {
        match &self.kind {
            TargetKind::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(Duration::from_secs(5)))
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    .set_number_of_retries(3);
                Ok(RedisConn::Single(
                    client.get_connection_manager_with_config(config).await?,
                ))
            }
            TargetKind::Cluster { commands, .. } => {
                Ok(RedisConn::Cluster(commands.get_async_connection().await?))
            }
        }
    }

    /// Opens a connection of its own that never reconnects by itself (once
    /// broken, every later command fails), with `reply_timeout`: for
    /// commands whose meaning depends on the connection's own history
    /// (`WAITAOF`, see [`durability::aof`]). Single servers only.
    pub(crate) async fn connect_dedicated(
        &self,
        reply_timeout: Duration,
    ) -> StoreResult<MultiplexedConnection> {
        match &self.kind {
            TargetKind::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(reply_timeout))
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                Ok(client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?)
            }
            TargetKind::Cluster { .. } => Err(StoreError::Config {
                url: self.redacted(),
                reason: "WAITAOF waits are for single servers, not a cluster".into(),
            }),
        }
    }

    /// Opens a connection for blocking reads: no reply timeout on a single
    /// server, [`CLUSTER_BLOCKING_REPLY_TIMEOUT`] on a cluster (a blocking
    /// `XREADGROUP` would otherwise hit redis-rs' default 500 ms one).
    pub(crate) async fn connect_blocking(&self) -> StoreResult<BlockingConn> {
        match &self.kind {
            TargetKind::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(None)
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                Ok(BlockingConn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            // Every call opens a cluster connection of its own (its own
            // sockets): a blocking read never waits behind, nor holds up,
            // another command.
            TargetKind::Cluster { blocking, .. } => Ok(BlockingConn::Cluster(
                blocking.get_async_connection().await?,
            )),
        }
    }
}

/// TLS material for a `rediss://` server: the CA to verify it with and,
/// optionally, a client certificate (re-exported from redis-rs).
pub use redis::{ClientTlsConfig, TlsCertificates};

impl RedisTarget {
    /// Like [`parse`](Self::parse), verifying a `rediss://` server against
    /// `tls.root_cert` (instead of the system's trust store) and presenting
    /// `tls.client_tls` when the server asks for a client certificate.
    /// With `None` it is `parse`. Single servers only for now: a cluster URL
    /// with certificates is refused rather than connected unverified.
    pub(crate) fn parse_with_tls(
        url: &str,
        tls: Option<TlsCertificates>,
    ) -> StoreResult<RedisTarget> {
        let Some(certs) = tls else {
            return Self::parse(url);
        };
        let config_err = |reason: String| StoreError::Config {
            url: redact_url(url),
            reason,
        };
        if url.contains("+cluster://") {
            return Err(config_err(
                "CA or client certificate files are not supported with a cluster URL yet".into(),
            ));
        }
        if !url.starts_with("rediss://") {
            return Err(config_err(
                "a CA or client certificate file needs a rediss:// (TLS) URL".into(),
            ));
        }
        let client =
            redis::Client::build_with_tls(url, certs).map_err(|e| config_err(e.to_string()))?;
        Ok(RedisTarget {
            url: url.to_string(),
            kind: TargetKind::Single(client),
        })
    }
}

/// The shared handle the rest of groupcast uses: a connection and the keyspace.
#[derive(Clone)]
pub struct Store {
    /// The command connection: private, so that every command groupcast
    /// sends is written in this module.
    conn: RedisConn,
    /// Key names.
    pub keys: Keyspace,
    /// Where it connects.
    pub target: RedisTarget,
    /// The events this process appended, until they are read back.
    pub witnesses: std::sync::Arc<durability::witness::Witnesses>,
    /// This process's views of the batches' number logs.
    numbers: std::sync::Arc<numbers::NumberViews<batch::Waiting>>,
    /// How the batches this process ends end (see [`batch::BatchPolicy`]).
    policy: batch::BatchPolicy,
}

impl Store {
    /// Connects.
    pub async fn connect(url: &str, keys: Keyspace) -> StoreResult<Store> {
        let target = RedisTarget::parse(url)?;
        let conn = target.connect().await?;
        Ok(Store {
            conn,
            keys,
            target,
            witnesses: Default::default(),
            numbers: Default::default(),
            policy: Default::default(),
        })
    }

    /// Connects with TLS material (see [`RedisTarget::parse_with_tls`]).
    pub async fn connect_with_tls(
        url: &str,
        keys: Keyspace,
        tls: Option<TlsCertificates>,
    ) -> StoreResult<Store> {
        let target = RedisTarget::parse_with_tls(url, tls)?;
        let conn = target.connect().await?;
        Ok(Store {
            conn,
            keys,
            target,
            witnesses: Default::default(),
            numbers: Default::default(),
            policy: Default::default(),
        })
    }

    /// The same store, ending batches by `policy`.
    pub fn with_policy(mut self, policy: batch::BatchPolicy) -> Store {
        self.policy = policy;
        self
    }

    /// The command connection itself, for tests that inspect or damage
    /// Redis directly. groupcast sends every command through the typed
    /// methods of this module instead.
    #[doc(hidden)]
    pub fn raw_conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The `WAITAOF` waiter of this process (see [`durability::aof`]): `replicas`
    /// replica acknowledgements besides the local fsync.
    pub fn aof_waiter(&self, replicas: u32) -> durability::aof::AofWaiter {
        durability::aof::AofWaiter::new(self.target.clone(), self.keys.fsync_marker(), replicas)
    }

    /// How fast this server's `WAITAOF` confirms a write (see
    /// [`durability::aof::confirmation_delay`]): under `everysec`, well under a second
    /// means it confirms writes that are not fsynced yet. Measured once per
    /// server process: the first worker to start against it measures (up to
    /// 3 s on a server that waits for the fsync) and records the answer
    /// under the server's `run_id` ([`Keyspace::fsync_measured`]); the next
    /// ones read it. A restarted server has a new `run_id` and is measured
    /// again. (Workers restarted one after another, as in a rolling deploy
    /// or the chaos suite, each spent the 3 s.)
    pub async fn waitaof_confirmation_delay(&self) -> StoreResult<Duration> {
        let marker = self.keys.fsync_marker();
        let run_id = match self.run_id().await {
            Ok(id) => id,
            Err(e) if e.is_retryable() => return Err(e),
            // `INFO` refused (an ACL): measured every time.
            Err(_) => return durability::aof::confirmation_delay(&self.target, &marker, 2).await,
        };
        let key = self.keys.fsync_measured();
        let known: Option<u64> = redis::cmd("HGET")
            .arg(&key)
            .arg(&run_id)
            .query_async(&mut self.conn.clone())
            .await?;
        if let Some(ms) = known {
            return Ok(Duration::from_millis(ms));
        }
        let measured = durability::aof::confirmation_delay(&self.target, &marker, 2).await?;
        // Kept a week past the last measurement: a server process lives
        // long, the record is a few bytes per restart.
        redis::pipe()
            .cmd("HSET")
            .arg(&key)
            .arg(&run_id)
            .arg(measured.as_millis() as u64)
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(7 * 24 * 3600)
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(measured)
    }

    /// A fresh connection for blocking reads.
    pub async fn blocking(&self) -> StoreResult<BlockingConn> {
        self.target.connect_blocking().await
    }

    /// The clock (ms since the epoch) of the server that holds `key`: on a
    /// cluster, the master owning its slot, whose clock stamped that key's
    /// stream entries (a bare `TIME` would go to any master).
    pub async fn time_ms_at(&self, key: &str) -> StoreResult<u64> {
        time_ms_at(&self.conn, key).await
    }

    /// The masters of a cluster as `host:port`, from `CLUSTER SLOTS`
    /// (empty for a single server).
    pub(crate) async fn cluster_masters(&self) -> StoreResult<Vec<(String, u16)>> {
        let RedisConn::Cluster(c) = &self.conn else {
            return Ok(Vec::new());
        };
        let reply = c
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        Ok(parse_cluster_slots(&reply))
    }

    /// Runs `cmd` on every master (on the one server when not a cluster) and
    /// returns each node's reply, labelled `host:port` (`server` when not a
    /// cluster). For the commands whose answer is per node: `SCAN`,
    /// `CONFIG GET`, `INFO`.
    async fn on_every_master(
        &self,
        cmd: &Cmd,
    ) -> StoreResult<Vec<(String, redis::RedisResult<Value>)>> {
        match &self.conn {
            RedisConn::Single(c) => {
                let r = cmd.query_async::<Value>(&mut c.clone()).await;
                Ok(vec![("server".to_string(), r)])
            }
            RedisConn::Cluster(c) => {
                let mut out = Vec::new();
                for (host, port) in self.cluster_masters().await? {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let r = c.clone().route_command(cmd.clone(), routing).await;
                    out.push((format!("{host}:{port}"), r));
                }
                Ok(out)
            }
        }
    }

    /// Every key matching `pattern`, on every master: `SCAN` cursors belong
    /// to one node, so a cluster is scanned node by node. Sorted, without
    /// duplicates.
    pub(crate) async fn scan_match(&self, pattern: &str) -> StoreResult<Vec<String>> {
        let scan = |cursor: u64| {
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .clone()
        };
        let mut keys = Vec::new();
        match &self.conn {
            RedisConn::Single(c) => {
                let mut cursor = 0u64;
                loop {
                    let (next, batch): (u64, Vec<String>) =
                        scan(cursor).query_async(&mut c.clone()).await?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            RedisConn::Cluster(c) => {
                for (host, port) in self.cluster_masters().await? {
                    let mut cursor = 0u64;
                    loop {
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let v = c.clone().route_command(scan(cursor), routing).await?;
                        let (next, batch): (u64, Vec<String>) =
                            redis::from_redis_value(v).map_err(redis::RedisError::from)?;
                        keys.extend(batch);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// `TIME` on the server holding `key` (on a cluster, its slot's master), in
/// ms since the epoch: one command, routed like a command on `key` would be.
async fn time_ms_at(conn: &RedisConn, key: &str) -> StoreResult<u64> {
    let time = redis::cmd("TIME");
    let (secs, micros): (u64, u64) = match conn {
        RedisConn::Single(c) => time.query_async(&mut c.clone()).await?,
        RedisConn::Cluster(c) => {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_key(key, SlotAddr::Master),
            ));
            let v = c.clone().route_command(time, routing).await?;
            redis::from_redis_value(v).map_err(redis::RedisError::from)?
        }
    };
    Ok(secs * 1000 + micros / 1000)
}

/// The distinct masters in a `CLUSTER SLOTS` reply:
/// `[[first, last, [host, port, id, ...], replicas...], ...]`.
fn parse_cluster_slots(reply: &Value) -> Vec<(String, u16)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(master)) = parts.get(2) else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let port = match master.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok(),
            _ => None,
        };
        if let Some(port) = port {
            if !out.iter().any(|(h, p)| *h == host && *p == port) {
                out.push((host, port));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_load_is_recognised() {
        assert!(is_script_load(
            redis::cmd("SCRIPT").arg("LOAD").arg("return 1")
        ));
        assert!(is_script_load(redis::cmd("script").arg("load").arg("x")));
        assert!(!is_script_load(redis::cmd("SCRIPT").arg("FLUSH")));
        assert!(!is_script_load(redis::cmd("EVALSHA").arg("LOAD")));
    }

    #[test]
    fn cluster_slots_give_each_master_once() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(99), node("10.0.0.1", 7000)]),
            Value::Array(vec![
                Value::Int(100),
                Value::Int(199),
                node("10.0.0.2", 7001),
                node("10.0.0.9", 7009),
            ]),
            Value::Array(vec![
                Value::Int(200),
                Value::Int(16383),
                node("10.0.0.1", 7000),
            ]),
        ]);
        assert_eq!(
            parse_cluster_slots(&reply),
            vec![
                ("10.0.0.1".to_string(), 7000),
                ("10.0.0.2".to_string(), 7001)
            ]
        );
    }

    #[test]
    fn passwords_never_leave_the_url_parser() {
        assert_eq!(redact_url("redis://:s3cret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            redact_url("rediss://app:s3cret@h:1"),
            "rediss://app:***@h:1"
        );
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("app:s3cret@h:1"), "app:***@h:1");
        assert_eq!(
            redact_url("redis://app:p@ss:w@h:1/#insecure"),
            "redis://app:***@h:1/#insecure"
        );
    }
}
