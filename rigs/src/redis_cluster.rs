//! A private Redis Cluster for the tests and benchmarks: three (or more)
//! masters, no replicas, each a `redis-server --cluster-enabled yes` on free
//! ports in a temporary directory, joined with `redis-cli --cluster create`.
//! Every process is killed (and the directory removed) on drop.
//!
//! A master can be killed and restarted on the same port and directory: it
//! comes back with its data (append-only file, `appendfsync always`, so a
//! `SIGKILL` loses no acknowledged write) and its `nodes.conf` (so it rejoins
//! as the same node with the same slots).
//!
//! [`hash_slot`] computes a key's cluster slot the way Redis does (CRC16 of
//! the key or of its `{hash tag}`, modulo 16384).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::redis_server::{free_port, RedisServer, ServerError, ServerOptions};

/// How many hash slots a Redis Cluster has.
pub const SLOTS: u16 = groupcast::keys::CLUSTER_SLOTS;

/// Why a private cluster could not be started or restarted.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// A node failed to start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// No `redis-cli` binary on the PATH.
    #[error(
        "no `redis-cli` binary found on PATH (needed to create the cluster). Install Redis 7 \
         or newer, for example `sudo apt-get install redis-tools redis-server`"
    )]
    CliNotInstalled,
    /// `redis-cli --cluster create` failed.
    #[error("redis-cli --cluster create failed: {0}")]
    Create(String),
    /// The cluster did not reach `cluster_state:ok` in time.
    #[error("the cluster was not ok after {secs} s: {detail}")]
    NotReady {
        /// How long we waited.
        secs: u64,
        /// What the nodes said last.
        detail: String,
    },
    /// A slot to move still holds keys.
    #[error("slot {slot} holds {keys} key(s): only empty slots are moved")]
    SlotNotEmpty {
        /// The slot.
        slot: u16,
        /// How many keys it holds.
        keys: u64,
    },
    /// A command to a node failed.
    #[error("node {node}: {message}")]
    Node {
        /// The node index.
        node: usize,
        /// What went wrong.
        message: String,
    },
    /// A node index out of range.
    #[error("no node {0} (the cluster has {1})")]
    NoSuchNode(usize, usize),
    /// An I/O failure.
    #[error("starting the cluster: {0}")]
    Io(#[from] std::io::Error),
}

/// Options for a private cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How many masters (at least 3: `redis-cli --cluster create` wants 3).
    pub masters: usize,
    /// `cluster-node-timeout` in milliseconds: how long a silent master may
    /// be away before the others mark it failed.
    pub node_timeout_ms: u64,
    /// Whether nodes keep an append-only file (needed to restart a master
    /// with its data).
    pub appendonly: bool,
    /// `appendfsync` (`always`: a killed master loses nothing it answered).
    pub appendfsync: String,
    /// Extra `redis-server` arguments for every node.
    pub args: Vec<String>,
    /// How long to wait for `cluster_state:ok`.
    pub ready_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            node_timeout_ms: 5000,
            appendonly: true,
            appendfsync: "always".into(),
            args: Vec::new(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// A running private Redis Cluster.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: PathBuf,
    options: ClusterOptions,
}

/// Whether `redis-cli` is on the PATH.
pub fn cli_installed() -> bool {
    Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The cluster hash slot of a key (the library's own, which picks the
/// shards' tags), the same as `CLUSTER KEYSLOT`.
pub use groupcast::keys::hash_slot;

impl RedisCluster {
    /// Starts a 3-master cluster with default options.
    pub fn start() -> Result<RedisCluster, ClusterError> {
        Self::start_with(ClusterOptions::default())
    }

    /// Starts a cluster and waits until every node says `cluster_state:ok`.
    ///
    /// Free ports are found by binding port 0 and letting go, so another
    /// process (a test suite running alongside) can take one before our node
    /// binds it: then the cluster cannot form, and a fresh start on other
    /// ports is tried, up to three times in all.
    pub fn start_with(options: ClusterOptions) -> Result<RedisCluster, ClusterError> {
        if !cli_installed() {
            return Err(ClusterError::CliNotInstalled);
        }
        let mut attempt = 1;
        loop {
            match Self::try_start(options.clone()) {
                Ok(c) => return Ok(c),
                Err(
                    e @ (ClusterError::CliNotInstalled
                    | ClusterError::Server(ServerError::NotInstalled)),
                ) => return Err(e),
                Err(e) if attempt < 3 => {
                    tracing::warn!(attempt, error = %e, "private cluster did not start; trying other ports");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn try_start(options: ClusterOptions) -> Result<RedisCluster, ClusterError> {
        let masters = options.masters.max(3);
        let dir = std::env::temp_dir().join(format!(
            "groupcast-cluster-{}-{}",
            std::process::id(),
            ulid::Ulid::new()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(masters),
            dir,
            options,
        };
        for _ in 0..masters {
            let port = free_port()?;
            let bus = free_port()?;
            let node_dir = cluster.dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir)?;
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-port",
                &bus.to_string(),
                "--cluster-node-timeout",
                &cluster.options.node_timeout_ms.to_string(),
                "--appendonly",
                if cluster.options.appendonly {
                    "yes"
                } else {
                    "no"
                },
                "--appendfsync",
                &cluster.options.appendfsync,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(cluster.options.args.iter().cloned());
            let node = RedisServer::start_with(ServerOptions {
                args,
                dir: Some(node_dir.clone()),
                port: Some(port),
                ..ServerOptions::default()
            })?;
            cluster.nodes.push(node);
            // The server answering on the port is ours (not another
            // process's that took the port first): it runs in our directory.
            let i = cluster.nodes.len() - 1;
            let dir = cluster.run(i, redis::cmd("CONFIG").arg("GET").arg("dir"))?;
            let dir: Vec<String> = redis::from_redis_value(dir).unwrap_or_default();
            let ours = std::fs::canonicalize(&node_dir).ok();
            if dir.get(1).map(|d| std::fs::canonicalize(d).ok()) != Some(ours) {
                return Err(ClusterError::Node {
                    node: i,
                    message: format!("port {port} answers from {dir:?}, not from our node"),
                });
            }
        }
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port())),
            )
            .arg("--cluster-replicas")
            .arg("0")
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(ClusterError::Create(format!(
                "{} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        cluster.wait_ok()?;
        Ok(cluster)
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`: every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// How many nodes (all masters).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Each node's port, by node index.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Node `i`'s own URL (`redis://127.0.0.1:<port>/`), for direct commands.
    pub fn node_url(&self, i: usize) -> Result<String, ClusterError> {
        Ok(self.node(i)?.url())
    }

    /// Node `i`'s working directory (its AOF and nodes.conf live there).
    pub fn node_dir(&self, i: usize) -> Result<&Path, ClusterError> {
        Ok(self.node(i)?.dir())
    }

    fn node(&self, i: usize) -> Result<&RedisServer, ClusterError> {
        self.nodes
            .get(i)
            .ok_or(ClusterError::NoSuchNode(i, self.nodes.len()))
    }

    /// Kills node `i` abruptly (SIGKILL), like a crash.
    pub fn kill(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(i)
            .ok_or(ClusterError::NoSuchNode(i, n))?
            .kill();
        Ok(())
    }

    /// Starts node `i` again on its port and directory (killing it first if
    /// it runs), and waits until the whole cluster is ok again.
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(i)
            .ok_or(ClusterError::NoSuchNode(i, n))?
            .restart()?;
        self.wait_ok()
    }

    /// The index of the node that owns `slot`, as node 0..n agree (the first
    /// that answers is asked).
    pub fn owner_of_slot(&self, slot: u16) -> Result<usize, ClusterError> {
        let ports = self.ports();
        let mut last = String::new();
        for i in 0..self.nodes.len() {
            match self.slot_ranges(i) {
                Ok(ranges) => {
                    for (lo, hi, port) in ranges {
                        if (lo..=hi).contains(&slot) {
                            if let Some(owner) = ports.iter().position(|p| *p == port) {
                                return Ok(owner);
                            }
                        }
                    }
                    last = format!("node {i} knows no owner of slot {slot}");
                }
                Err(e) => last = e,
            }
        }
        Err(ClusterError::NotReady {
            secs: 0,
            detail: last,
        })
    }

    /// The index of the node that owns `key`.
    pub fn owner_of_key(&self, key: &str) -> Result<usize, ClusterError> {
        self.owner_of_slot(hash_slot(key.as_bytes()))
    }

    /// Starts moving an empty slot to node `to`: `IMPORTING` on the target,
    /// `MIGRATING` on the owner. Until [`finish_slot_move`](Self::finish_slot_move),
    /// the owner answers `-ASK` for keys it does not hold. Returns the owner,
    /// or `None` when `to` owns the slot already.
    pub fn begin_slot_move(&self, slot: u16, to: usize) -> Result<Option<usize>, ClusterError> {
        let n = self.nodes.len();
        if to >= n {
            return Err(ClusterError::NoSuchNode(to, n));
        }
        let from = self.owner_of_slot(slot)?;
        if from == to {
            return Ok(None);
        }
        let (from_id, to_id) = (self.node_id(from)?, self.node_id(to)?);
        let keys = self.run(from, redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))?;
        let keys: u64 = redis::from_redis_value(keys).unwrap_or(u64::MAX);
        if keys != 0 {
            return Err(ClusterError::SlotNotEmpty { slot, keys });
        }
        self.run(to, &setslot(slot, "IMPORTING", &from_id))?;
        self.run(from, &setslot(slot, "MIGRATING", &to_id))?;
        Ok(Some(from))
    }

    /// Ends a slot move begun with [`begin_slot_move`](Self::begin_slot_move)
    /// (`SETSLOT ... NODE` on every node; no key is migrated) and waits until
    /// every node agrees.
    pub fn finish_slot_move(&self, slot: u16, from: usize, to: usize) -> Result<(), ClusterError> {
        let n = self.nodes.len();
        let to_id = self.node_id(to)?;
        self.run(to, &setslot(slot, "NODE", &to_id))?;
        self.run(from, &setslot(slot, "NODE", &to_id))?;
        for node in (0..n).filter(|i| *i != from && *i != to) {
            self.run(node, &setslot(slot, "NODE", &to_id))?;
        }
        let to_port = self.ports()[to];
        let deadline = Instant::now() + self.options.ready_timeout;
        loop {
            let agreed = (0..n).all(|i| {
                self.slot_ranges(i).is_ok_and(|r| {
                    r.iter()
                        .any(|(lo, hi, p)| (*lo..=*hi).contains(&slot) && *p == to_port)
                })
            });
            if agreed {
                return self.wait_ok();
            }
            if Instant::now() > deadline {
                return Err(ClusterError::NotReady {
                    secs: self.options.ready_timeout.as_secs(),
                    detail: format!("not every node sees slot {slot} on node {to}"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn run(&self, node: usize, cmd: &redis::Cmd) -> Result<redis::Value, ClusterError> {
        let err = |message: String| ClusterError::Node { node, message };
        let mut c = self.connect(node).map_err(err)?;
        cmd.query(&mut c).map_err(|e| err(e.to_string()))
    }

    /// Node `i`'s cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, node: usize) -> Result<String, ClusterError> {
        let v = self.run(node, redis::cmd("CLUSTER").arg("MYID"))?;
        redis::from_redis_value(v).map_err(|e| ClusterError::Node {
            node,
            message: e.to_string(),
        })
    }

    /// `CLUSTER SLOTS` of node `i`: (first slot, last slot, master port).
    fn slot_ranges(&self, i: usize) -> Result<Vec<(u16, u16, u16)>, String> {
        let mut c = self.connect(i)?;
        let v: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for r in v {
            let redis::Value::Array(parts) = r else {
                continue;
            };
            let int = |v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(n)) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (Some(lo), Some(hi)) = (int(parts.first()), int(parts.get(1))) else {
                continue;
            };
            let port = match parts.get(2) {
                Some(redis::Value::Array(m)) => int(m.get(1)),
                _ => None,
            };
            if let Some(port) = port {
                out.push((lo, hi, port));
            }
        }
        Ok(out)
    }

    fn connect(&self, i: usize) -> Result<redis::Connection, String> {
        let url = self.node_url(i).map_err(|e| e.to_string())?;
        redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .map_err(|e| e.to_string())
    }

    /// Waits (bounded by the ready timeout) until every node says
    /// `cluster_state:ok`, knows every node, and sees all 16384 slots served
    /// by the nodes of this cluster.
    pub fn wait_ok(&self) -> Result<(), ClusterError> {
        let limit = self.options.ready_timeout;
        let deadline = Instant::now() + limit;
        loop {
            let detail = match self.check_ok() {
                Ok(()) => return Ok(()),
                Err(d) => d,
            };
            if Instant::now() > deadline {
                return Err(ClusterError::NotReady {
                    secs: limit.as_secs(),
                    detail,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_ok(&self) -> Result<(), String> {
        let ports = self.ports();
        for i in 0..self.nodes.len() {
            let mut c = self.connect(i).map_err(|e| format!("node {i}: {e}"))?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .map_err(|e| format!("node {i}: {e}"))?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
                    .unwrap_or("")
                    .to_string()
            };
            if field("cluster_state") != "ok"
                || field("cluster_slots_ok") != SLOTS.to_string()
                || field("cluster_known_nodes") != ports.len().to_string()
            {
                return Err(format!(
                    "node {i}: cluster_state:{} cluster_slots_ok:{} cluster_known_nodes:{}",
                    field("cluster_state"),
                    field("cluster_slots_ok"),
                    field("cluster_known_nodes")
                ));
            }
            let ranges = self.slot_ranges(i).map_err(|e| format!("node {i}: {e}"))?;
            let covered: u32 = ranges
                .iter()
                .filter(|(_, _, p)| ports.contains(p))
                .map(|(lo, hi, _)| u32::from(hi - lo) + 1)
                .sum();
            if covered != u32::from(SLOTS) {
                return Err(format!(
                    "node {i} sees {covered} slots served by this cluster's nodes"
                ));
            }
        }
        Ok(())
    }
}

fn setslot(slot: u16, state: &str, node_id: &str) -> redis::Cmd {
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(node_id)
        .clone()
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
