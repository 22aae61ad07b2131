//! The connection to Redis and everything groupcast keeps there.
//!
//! - [`batch`]: the batch scripts (accept, park, record group, loaded, sent,
//!   completed, append): each appends its events and updates the batch's
//!   projection in one atomic step.
//! - [`queue`]: the work plumbing (consumer groups, dead letters, delayed
//!   retries, reclaiming).
//! - [`scripts`]: the Lua sources from `streams/scripts/`, loaded on demand.

pub mod batch;
pub mod queue;
pub mod scripts;

use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};
use thiserror::Error;

use crate::keys::Keyspace;

/// Errors at the Redis boundary, classified by what the caller should do.
#[derive(Debug, Error)]
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
    pub fn is_retryable(&self) -> bool {
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
            _ => false,
        }
    }
}

/// A result at the Redis boundary.
pub type StoreResult<T> = Result<T, StoreError>;

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
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
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

#[derive(Clone)]
enum TargetKind {
    Single(redis::Client),
    Cluster(Box<ClusterClient>, Vec<String>),
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
            let client = ClusterClient::builder(nodes.clone())
                .response_timeout(Duration::from_secs(5))
                .connection_timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| config_err(e.to_string()))?;
            TargetKind::Cluster(Box::new(client), nodes)
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
    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, TargetKind::Cluster(..))
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
            TargetKind::Cluster(client, _) => {
                Ok(RedisConn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Opens a connection for blocking reads: no reply timeout (a blocking
    /// `XREADGROUP` would otherwise hit redis-rs' default 500 ms one).
    pub async fn connect_blocking(&self) -> StoreResult<BlockingConn> {
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
            TargetKind::Cluster(_, nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .response_timeout(Duration::from_secs(3600))
                    .build()?;
                Ok(BlockingConn::Cluster(client.get_async_connection().await?))
            }
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
    pub fn parse_with_tls(url: &str, tls: Option<TlsCertificates>) -> StoreResult<RedisTarget> {
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
    /// The command connection.
    pub conn: RedisConn,
    /// Key names.
    pub keys: Keyspace,
    /// Where it connects.
    pub target: RedisTarget,
}

impl Store {
    /// Connects.
    pub async fn connect(url: &str, keys: Keyspace) -> StoreResult<Store> {
        let target = RedisTarget::parse(url)?;
        let conn = target.connect().await?;
        Ok(Store { conn, keys, target })
    }

    /// Connects with TLS material (see [`RedisTarget::parse_with_tls`]).
    pub async fn connect_with_tls(
        url: &str,
        keys: Keyspace,
        tls: Option<TlsCertificates>,
    ) -> StoreResult<Store> {
        let target = RedisTarget::parse_with_tls(url, tls)?;
        let conn = target.connect().await?;
        Ok(Store { conn, keys, target })
    }

    /// A fresh connection for blocking reads.
    pub async fn blocking(&self) -> StoreResult<BlockingConn> {
        self.target.connect_blocking().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
