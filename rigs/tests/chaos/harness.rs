//! The chaos rig: a private redis-server with an AOF, the in-process mock
//! provider with faults, and real `groupcast worker` processes that are
//! SIGKILLed and restarted while batches flow.
//!
//! Everything random comes from one seeded RNG (`CHAOS_SEED`, else the clock;
//! the seed is printed first). Waiting for an outcome always polls a
//! condition against a deadline; sleeps only space out chaos actions.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use groupcast::events::Chunk;
use groupcast::keys::{Keyspace, LOADERS_GROUP, OPERATORS_GROUP};
use groupcast::provider::ProviderClient;
use groupcast::store::Store;
use groupcast_rigs::mock::{self, Faults, MockConfig, MockHandle};
use groupcast_rigs::redis_server::{RedisServer, ServerOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::{Child, Command};

use crate::common;

pub const PREFIX: &str = "chaos";

/// How Redis persists, and how it dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `appendfsync always`; Redis is SIGKILLed.
    Always,
    /// `appendfsync everysec`; Redis is SIGKILLed, and every other kill also
    /// simulates a power loss: the AOF is cut back to its size one second
    /// earlier (what an OS crash leaves when the last fsync was a second ago).
    Everysec,
}

/// Which server runs: Debian's Redis 7.0 (no `WAITAOF`: the workers'
/// `--durability auto` waits the fixed window under everysec), Valkey 8.1
/// (`WAITAOF`, but one that confirms before the fsync: auto waits the
/// window) or Redis 8.0 (`WAITAOF` that waits for the fsync: auto waits for
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Redis,
    Valkey,
    Redis8,
}

impl Durability {
    pub fn appendfsync(self) -> &'static str {
        match self {
            Durability::Always => "always",
            Durability::Everysec => "everysec",
        }
    }
}

/// The shape of one chaos run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub durability: Durability,
    pub server: Server,
    /// The workers' `--durability` (default `auto`).
    pub worker_durability: &'static str,
    pub workers: usize,
    pub cap: u64,
    /// (batch id, recipients, chunk size, submitted after)
    pub batches: Vec<(String, usize, usize, Duration)>,
    /// Progress points (share of recipients registered) at which Redis is killed.
    pub redis_kills_at: Vec<f64>,
    /// How long the run may take before it is declared stuck.
    pub deadline: Duration,
    /// A provider outage (every request answered 5xx): the progress point at
    /// which it starts, and how long it lasts.
    pub outage: Option<(f64, Duration)>,
    /// Scheduled batches: (batch index, `send_at` after the start).
    pub scheduled: Vec<(usize, Duration)>,
}

impl Plan {
    /// Four batches of 3,000–5,000 recipients in chunks of 100–300, two of
    /// them submitted while the chaos already runs; Redis killed at two
    /// random progress points.
    pub fn random(durability: Durability, rng: &mut StdRng, redis_kills: usize) -> Plan {
        let batches = (0..4)
            .map(|k| {
                (
                    format!("chaos-{k}"),
                    rng.random_range(3_000..=5_000),
                    rng.random_range(100..=300),
                    if k < 2 {
                        Duration::ZERO
                    } else {
                        Duration::from_millis(rng.random_range(1_000..4_000))
                    },
                )
            })
            .collect();
        let mut redis_kills_at: Vec<f64> = (0..redis_kills)
            .map(|i| {
                let lo = 0.1 + 0.7 * i as f64 / redis_kills as f64;
                let hi = 0.1 + 0.7 * (i + 1) as f64 / redis_kills as f64;
                rng.random_range(lo..hi)
            })
            .collect();
        redis_kills_at.sort_by(f64::total_cmp);
        Plan {
            durability,
            server: Server::Redis,
            worker_durability: "auto",
            workers: 3,
            cap: 1_000,
            batches,
            redis_kills_at,
            deadline: Duration::from_secs(150),
            outage: None,
            // Batch 1 waits for a `send_at` a few seconds in: its groups are
            // filled under the chaos and held, then sent.
            scheduled: vec![(1, Duration::from_millis(rng.random_range(3_000..6_000)))],
        }
    }

    pub fn recipients(&self) -> usize {
        self.batches.iter().map(|b| b.1).sum()
    }
}

/// The `groupcast` binary the workers run: this package's, or `CHAOS_BIN`
/// (a copy, when several checkouts share one target directory).
pub fn bin() -> String {
    std::env::var("CHAOS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_groupcast").to_string())
}

/// The seed: `CHAOS_SEED`, else the clock.
pub fn seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("CHAOS_SEED={s:?} is not a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// The share of provider requests answered 5xx outside an outage.
const NORMAL_ERROR_RATE: f64 = 0.04;

/// One `groupcast worker` process.
pub struct WorkerProc {
    pub slot: usize,
    pub child: Child,
    pub log: PathBuf,
}

/// What happened during the run.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub worker_kills: u32,
    pub redis_restarts: u32,
    pub power_losses: u32,
    pub stalls_opened: u32,
    pub outages: u32,
    /// Per Redis kill: (kind, canary increments acknowledged but lost).
    pub redis_losses: Vec<(&'static str, u64)>,
    /// Per simulated power loss: AOF bytes cut away (writes acknowledged to
    /// their clients but not confirmed on disk).
    pub power_loss_bytes: Vec<u64>,
}

/// Samples the AOF's current incremental file size, to know what a power
/// loss would leave of it.
#[derive(Default)]
struct AofSamples {
    samples: VecDeque<(Instant, PathBuf, u64)>,
    /// On a server with `WAITAOF` under everysec: the file size read right
    /// after the last real fsync was confirmed (see [`Rig::spawn_fsync_probe`]).
    fsynced: Option<(Instant, PathBuf, u64)>,
    /// The confirmation before that one.
    previous: Option<Instant>,
    /// Probe calls finished (confirmed or failed).
    probe_settled: u64,
}

pub struct Rig {
    pub seed: u64,
    pub rng: StdRng,
    pub plan: Plan,
    pub dir: tempfile::TempDir,
    pub server: RedisServer,
    pub store: Store,
    pub mock: MockHandle,
    pub provider: ProviderClient,
    pub workers: Vec<WorkerProc>,
    pub stats: Stats,
    pub started: Instant,
    /// `started` on the wall clock (Unix ms), for `send_at`.
    pub started_unix_ms: u64,
    base_faults: Faults,
    spawned: usize,
    aof: Arc<Mutex<AofSamples>>,
    canary: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    pub extra_worker_args: Vec<String>,
}

fn redis_args(d: Durability) -> Vec<String> {
    [
        "--appendonly",
        "yes",
        "--appendfsync",
        d.appendfsync(),
        // Keep the AOF in one incremental file for the whole run.
        "--auto-aof-rewrite-percentage",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Rig {
    pub async fn start(seed: u64, rng: StdRng, plan: Plan) -> Rig {
        common::init_tracing();
        let dir = tempfile::tempdir().expect("temp dir");
        let redis_dir = dir.path().join("redis");
        let program = match plan.server {
            Server::Redis => None,
            Server::Valkey => Some(
                groupcast_rigs::redis_server::VALKEY
                    .program()
                    .unwrap_or_else(|e| panic!("this chaos test needs valkey-server: {e}")),
            ),
            Server::Redis8 => Some(
                groupcast_rigs::redis_server::REDIS8
                    .program()
                    .unwrap_or_else(|e| panic!("this chaos test needs redis-server 8: {e}")),
            ),
        };
        let server = RedisServer::start_with(ServerOptions {
            args: redis_args(plan.durability),
            dir: Some(redis_dir),
            program,
            ..ServerOptions::default()
        })
        .unwrap_or_else(|e| panic!("chaos needs a real redis-server: {e}"));
        let store = Store::connect(&server.url(), Keyspace::new(PREFIX, 1))
            .await
            .expect("connect to the private redis-server");
        let base_faults = Faults {
            error_rate: NORMAL_ERROR_RATE,
            drop_rate: 0.04,
            latency_ms: 2,
            rate_limit_per_sec: Some(20),
            retry_after_secs: 1,
            stall_ms: 0,
            refuse_credentials: false,
            ..Faults::default()
        };
        let mock = mock::start(
            MockConfig {
                cap: plan.cap,
                complete_after: Duration::from_millis(300),
                faults: base_faults.clone(),
                ..common::mock_config()
            },
            "127.0.0.1:0".parse().expect("addr"),
        )
        .await
        .expect("mock provider");
        let provider = common::provider_for(&mock);
        let mut rig = Rig {
            seed,
            rng,
            plan,
            dir,
            server,
            store,
            mock,
            provider,
            workers: Vec::new(),
            stats: Stats::default(),
            started: Instant::now(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            base_faults,
            spawned: 0,
            aof: Arc::default(),
            canary: Arc::default(),
            stop: Arc::default(),
            extra_worker_args: Vec::new(),
        };
        rig.spawn_samplers();
        if rig.exact_power_loss() {
            rig.spawn_fsync_probe();
        }
        rig
    }

    /// Whether a simulated power loss cuts the AOF at the last write WAITAOF
    /// confirmed (a server with `WAITAOF` under everysec) rather than one
    /// second back.
    fn exact_power_loss(&self) -> bool {
        self.plan.server != Server::Redis && self.plan.durability == Durability::Everysec
    }

    /// Finds the last write `WAITAOF` confirmed: on a connection of its own,
    /// `INCR` a probe key and `WAITAOF 1 0 0` (which returns once the server
    /// counts the INCR as fsynced), then read the file size, over and over.
    /// The size read right after a confirmation is at least what it covered;
    /// the probe asks again at once, so the next confirmation comes with the
    /// server's next one. A power loss cut at the last such size loses
    /// nothing the server confirmed (to the probe or to a worker's WAITAOF),
    /// provided no confirmation came between that read and the kill:
    /// `kill_redis` waits for the probe's call in flight at the kill (a
    /// confirmation then is read after the kill: nothing is cut).
    fn spawn_fsync_probe(&mut self) {
        let aof = self.aof.clone();
        let dir = self.aof_dir();
        let stop = self.stop.clone();
        let url = self.server.url();
        let key = format!("{PREFIX}:fsync-probe");
        tokio::spawn(async move {
            let client = redis::Client::open(url.as_str()).expect("probe client");
            // No response timeout: on a server whose WAITAOF waits for the
            // fsync a confirmation takes up to a second, past redis-rs's
            // default 500 ms, and a probe that timed out confirmed nothing
            // for many seconds: the cuts then took back writes the workers'
            // WAITAOF had confirmed (Redis 8, 19 s cut, broken batches).
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let mut conn = None;
            while !stop.load(Ordering::Relaxed) {
                if conn.is_none() {
                    conn = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .ok();
                    if conn.is_none() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                let Some(c) = conn.as_mut() else { continue };
                let r: redis::RedisResult<(u64, (u64, u64))> = redis::pipe()
                    .cmd("INCR")
                    .arg(&key)
                    .cmd("WAITAOF")
                    .arg(1)
                    .arg(0)
                    .arg(0)
                    .query_async(c)
                    .await;
                let mut a = aof.lock().expect("aof samples");
                a.probe_settled += 1;
                match r {
                    Ok((_, (local, _))) if local >= 1 => {
                        if let Some(p) = Rig::current_incr(&dir) {
                            if let Ok(m) = std::fs::metadata(&p) {
                                a.previous = a.fsynced.as_ref().map(|f| f.0);
                                a.fsynced = Some((Instant::now(), p, m.len()));
                            }
                        }
                    }
                    _ => {
                        conn = None;
                    }
                }
            }
        });
    }

    fn probe_settled(&self) -> u64 {
        self.aof.lock().expect("aof samples").probe_settled
    }

    fn aof_dir(&self) -> PathBuf {
        self.server.dir().join("appendonlydir")
    }

    /// The AOF's current incremental file (the highest-numbered one).
    fn current_incr(dir: &Path) -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
            .max_by_key(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.split('.').rev().nth(2))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            })
    }

    /// Two background tasks: an AOF size sampler (every 25 ms) and a canary
    /// that increments a counter every 10 ms and remembers the last value
    /// Redis acknowledged, so that a restart shows what was lost.
    fn spawn_samplers(&mut self) {
        let aof = self.aof.clone();
        let dir = self.aof_dir();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(p) = Rig::current_incr(&dir) {
                    if let Ok(m) = std::fs::metadata(&p) {
                        let mut a = aof.lock().expect("aof samples");
                        a.samples.push_back((Instant::now(), p, m.len()));
                        while a.samples.len() > 400 {
                            a.samples.pop_front();
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        });
        let canary = self.canary.clone();
        let stop = self.stop.clone();
        let mut conn = self.store.raw_conn();
        let key = format!("{PREFIX}:canary");
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(v) = redis::cmd("INCR")
                    .arg(&key)
                    .query_async::<u64>(&mut conn)
                    .await
                {
                    canary.fetch_max(v, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    pub fn log(&self, what: impl AsRef<str>) {
        eprintln!(
            "chaos [{:6.1}s] {}",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }

    // ----- workers -------------------------------------------------------

    /// How many lines of every worker log so far (killed workers' too)
    /// contain `needle`.
    pub fn worker_log_lines(&self, needle: &str) -> usize {
        let Ok(dir) = std::fs::read_dir(self.dir.path()) else {
            return 0;
        };
        dir.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .map(|text| text.lines().filter(|l| l.contains(needle)).count())
            .sum()
    }

    pub fn spawn_worker(&mut self, slot: usize) {
        self.spawned += 1;
        let log = self
            .dir
            .path()
            .join(format!("worker-{slot}-{}.log", self.spawned));
        let out = File::create(&log).expect("worker log");
        let err = out.try_clone().expect("worker log");
        let mut cmd = Command::new(bin());
        cmd.arg("worker")
            .args(["--visibility-timeout", "2s"])
            .args(["--poll-interval", "100ms"])
            .args(["--backoff-base", "50ms", "--backoff-max", "1s"])
            .args(["--max-deliveries", "1000"])
            .args(["--metrics-listen", "off"])
            .args(["--durability", self.plan.worker_durability])
            .args(["--group-cap", &self.plan.cap.to_string()])
            .args(["--concurrency", "4"])
            .args(["--rate-limit", "25", "--rate-burst", "5"])
            .args(["--stall-after", "20s", "--watchdog-interval", "1s"])
            .args(&self.extra_worker_args)
            .env("GROUPCAST_REDIS_URL", self.server.url())
            .env("GROUPCAST_PREFIX", PREFIX)
            .env("GROUPCAST_PROVIDER_URL", self.mock.base_url())
            .env("GROUPCAST_PROVIDER_API_KEY", common::KEY)
            .env("GROUPCAST_PROVIDER_API_SECRET", common::SECRET)
            .env("GROUPCAST_LOG", "warn")
            .env_remove("GROUPCAST_ROLES")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd.spawn().expect("spawn groupcast worker");
        self.workers.push(WorkerProc { slot, child, log });
    }

    pub fn spawn_workers(&mut self) {
        for slot in 0..self.plan.workers {
            self.spawn_worker(slot);
        }
    }

    /// SIGKILLs one running worker; returns its slot.
    pub async fn kill_random_worker(&mut self) -> Option<usize> {
        if self.workers.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.workers.len());
        let mut w = self.workers.swap_remove(i);
        let pid = w.child.id();
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
        self.stats.worker_kills += 1;
        self.log(format!("SIGKILL worker slot {} (pid {pid:?})", w.slot));
        Some(w.slot)
    }

    /// Fails the test if a worker exited on its own: workers must ride out
    /// Redis restarts and provider trouble.
    pub async fn check_workers_alive(&mut self) {
        for w in &mut self.workers {
            if let Ok(Some(status)) = w.child.try_wait() {
                let tail = tail(&w.log, 30);
                self.stop.store(true, Ordering::Relaxed);
                panic!(
                    "chaos: seed={}: worker slot {} exited on its own ({status}); its log:\n{tail}",
                    self.seed, w.slot
                );
            }
        }
    }

    pub async fn kill_all_workers(&mut self) {
        for mut w in self.workers.drain(..) {
            let _ = w.child.start_kill();
            let _ = w.child.wait().await;
        }
    }

    // ----- provider faults -------------------------------------------------

    /// Opens a stall window: every provider request in it hangs `ms`.
    pub fn open_stall(&mut self, ms: u64) {
        self.mock.set_faults(Faults {
            stall_ms: ms,
            ..self.base_faults.clone()
        });
        self.stats.stalls_opened += 1;
        self.log(format!("provider stall window of {ms} ms"));
    }

    /// Starts (`true`) or ends a provider outage: every request answered
    /// 5xx, stall windows included, until it ends.
    pub fn provider_outage(&mut self, on: bool) {
        self.base_faults.error_rate = if on { 1.0 } else { NORMAL_ERROR_RATE };
        self.mock.set_faults(self.base_faults.clone());
        if on {
            self.stats.outages += 1;
        }
        self.log(if on {
            "provider outage begins: every request answers 5xx"
        } else {
            "provider outage ends"
        });
    }

    /// Turns every provider fault off (the chaos is over; what follows are
    /// the checks, which read the provider too).
    pub fn calm_provider(&self) {
        self.mock.set_faults(Faults::default());
    }

    // ----- redis ------------------------------------------------------------

    /// SIGKILLs Redis, leaves it down for `down`, and restarts it from its
    /// AOF on the same port and directory. With `power_loss`, the AOF is
    /// first cut back to its size one second before the kill.
    pub async fn kill_redis(&mut self, down: Duration, power_loss: bool) {
        let exact = power_loss && self.exact_power_loss();
        if exact {
            // Strike between two confirmations, most of the way to the next
            // (an honest everysec server confirms once a second; Valkey
            // 8.1.8 every ~100 ms, see docs/durability.md), so that writes
            // are at stake: right after a fresh confirmation, wait 50-90 %
            // of the last interval between two.
            let settled = self.probe_settled();
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.probe_settled() == settled && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let interval = {
                let a = self.aof.lock().expect("aof samples");
                match (&a.fsynced, a.previous) {
                    (Some((last, ..)), Some(prev)) => last.saturating_duration_since(prev),
                    _ => Duration::from_millis(100),
                }
            }
            .clamp(Duration::from_millis(20), Duration::from_millis(1_200));
            let share = self.rng.random_range(0.5..0.9);
            tokio::time::sleep(interval.mul_f64(share)).await;
        }
        let killed_at = Instant::now();
        tokio::task::block_in_place(|| self.server.kill());
        let acked = self.canary.load(Ordering::Relaxed);
        let mut cut = String::new();
        if exact {
            // The probe's call in flight at the kill settles (it fails, or
            // an fsync completed just before the kill: then its size is read
            // after the kill and nothing is cut).
            let settled = self.probe_settled();
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.probe_settled() == settled && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let fsynced = self.aof.lock().expect("aof samples").fsynced.clone();
            if let Some((at, path, size)) = fsynced {
                let dropped = cut_aof(&path, size);
                self.stats.power_loss_bytes.push(dropped);
                cut = format!(
                    ", AOF cut back to the last write WAITAOF confirmed, {} ms before the kill ({} bytes dropped)",
                    killed_at.saturating_duration_since(at).as_millis(),
                    dropped
                );
            }
            self.stats.power_losses += 1;
        } else if power_loss {
            let a = self.aof.lock().expect("aof samples");
            let before = killed_at.checked_sub(Duration::from_secs(1));
            let sample = a
                .samples
                .iter()
                .rev()
                .find(|(t, ..)| before.is_some_and(|b| *t <= b))
                .cloned();
            drop(a);
            if let Some((_, path, size)) = sample {
                let dropped = cut_aof(&path, size);
                self.stats.power_loss_bytes.push(dropped);
                cut = format!(", AOF cut back to its size 1 s earlier ({dropped} bytes dropped)");
            }
            self.stats.power_losses += 1;
        }
        self.log(format!(
            "SIGKILL redis{} (down for {} ms)",
            cut,
            down.as_millis()
        ));
        tokio::time::sleep(down).await;
        tokio::task::block_in_place(|| self.server.restart())
            .unwrap_or_else(|e| panic!("chaos: seed={}: redis restart: {e}", self.seed));
        self.stats.redis_restarts += 1;
        // What the canary had acknowledged against what survived.
        let mut survived = None;
        for _ in 0..100 {
            if let Ok(v) = redis::cmd("GET")
                .arg(format!("{PREFIX}:canary"))
                .query_async::<Option<u64>>(&mut self.store.raw_conn())
                .await
            {
                survived = Some(v.unwrap_or(0));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let survived = survived.expect("redis answers after its restart");
        // The canary goes on from what survived.
        self.canary.store(survived, Ordering::Relaxed);
        let lost = acked.saturating_sub(survived);
        let kind = if power_loss { "power-loss" } else { "sigkill" };
        self.stats.redis_losses.push((kind, lost));
        self.log(format!(
            "redis restarted from its AOF; canary: {acked} acknowledged, {survived} survived ({lost} lost writes, ~{} ms)",
            lost * 10
        ));
    }

    // ----- batches ------------------------------------------------------------

    /// The chunks of batch `k` (shuffled, a third of them twice).
    pub fn chunks(&self, k: usize) -> Vec<Chunk> {
        let (b, n, size, _) = &self.plan.batches[k];
        let mut chunks =
            common::shuffled_chunks(b, k as u32, *n, *size, self.seed ^ (k as u64 + 1));
        if let Some(at) = self.send_at_ms(k) {
            let at = jiff::Timestamp::from_millisecond(at as i64).expect("an instant");
            for c in &mut chunks {
                c.options.send_at = Some(at.to_string());
            }
        }
        chunks
    }

    /// Batch `k`'s `send_at` (Unix ms), if it is scheduled.
    pub fn send_at_ms(&self, k: usize) -> Option<u64> {
        self.plan
            .scheduled
            .iter()
            .find(|(i, _)| *i == k)
            .map(|(_, after)| self.started_unix_ms + after.as_millis() as u64)
    }

    /// Appends chunks, retrying through a Redis restart (duplicates from a
    /// retried pipeline are absorbed like any repeat delivery).
    pub async fn submit(&self, chunks: &[Chunk]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match groupcast::producer::append_chunks(&self.store, chunks).await {
                Ok(_) => return,
                Err(e) if Instant::now() < deadline => {
                    self.log(format!("submit failed ({e}); retrying"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("chaos: seed={}: cannot submit: {e}", self.seed),
            }
        }
    }

    /// Share of all recipients registered so far (0 while Redis is down).
    pub async fn progress(&self) -> Option<f64> {
        let mut reg = 0i64;
        for (b, ..) in &self.plan.batches {
            let f = self
                .store
                .batch(b)
                .fields(&["registered".into()])
                .await
                .ok()?;
            reg += f[0].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
        Some(reg as f64 / self.plan.recipients() as f64)
    }

    /// Batches without a report yet (None while Redis does not answer).
    pub async fn unreported(&self) -> Option<Vec<String>> {
        let mut out = Vec::new();
        for (b, ..) in &self.plan.batches {
            let f = self.store.batch(b).fields(&["report".into()]).await.ok()?;
            if f[0].is_none() {
                out.push(b.clone());
            }
        }
        Some(out)
    }

    /// Whether nothing is left to do: no pending or undelivered entry on
    /// either stream, and no delayed retry.
    pub async fn quiescent(&self) -> Option<bool> {
        let keys = &self.store.keys;
        let mut conn = self.store.raw_conn();
        for (stream, group) in [
            (keys.ingest(0), LOADERS_GROUP),
            (keys.work(0), OPERATORS_GROUP),
        ] {
            let v: redis::Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(&mut conn)
                .await
                .ok()?;
            let info = group_info(&v, group);
            if info.get("pending").map(String::as_str) != Some("0")
                || info.get("lag").map(String::as_str) != Some("0")
            {
                return Some(false);
            }
        }
        let delayed: u64 = redis::cmd("ZCARD")
            .arg(keys.delayed(0))
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(delayed == 0)
    }

    /// `groupcast status` (overview and every batch) and `groupcast dlq list`,
    /// plus the end of every worker's log: what a timeout shows.
    pub async fn dump(&self) -> String {
        let mut out = String::new();
        let run = |args: Vec<String>| {
            let url = self.server.url();
            async move {
                let o = Command::new(bin())
                    .args(&args)
                    .env("GROUPCAST_REDIS_URL", url)
                    .env("GROUPCAST_PREFIX", PREFIX)
                    .output()
                    .await;
                match o {
                    Ok(o) => format!(
                        "$ groupcast {}\n{}{}",
                        args.join(" "),
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    ),
                    Err(e) => format!("$ groupcast {}: {e}\n", args.join(" ")),
                }
            }
        };
        out += &run(vec!["status".into()]).await;
        for (b, ..) in &self.plan.batches {
            out += &run(vec!["status".into(), b.clone()]).await;
        }
        out += &run(vec!["dlq".into(), "list".into()]).await;
        for w in &self.workers {
            out += &format!(
                "--- worker slot {} ({})\n{}\n",
                w.slot,
                w.log.display(),
                tail(&w.log, 15)
            );
        }
        out
    }

    /// Stops the AOF sampler and the canary.
    pub async fn stop_samplers(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Cuts the AOF file at `path` back to `size` bytes (what a power loss
/// leaves of it) and makes that stick; returns the bytes dropped.
fn cut_aof(path: &Path, size: u64) -> u64 {
    let now_len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open AOF");
    f.set_len(size.min(now_len)).expect("truncate AOF");
    f.sync_all().expect("sync AOF");
    now_len.saturating_sub(size)
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A consumer group's fields from `XINFO GROUPS`.
pub fn group_info(v: &redis::Value, group: &str) -> BTreeMap<String, String> {
    let redis::Value::Array(groups) = v else {
        return BTreeMap::new();
    };
    for g in groups {
        let pairs: Vec<(String, String)> = match g {
            redis::Value::Array(kv) => kv
                .chunks(2)
                .filter_map(|p| {
                    Some((
                        redis::from_redis_value::<String>(p.first()?.clone()).ok()?,
                        redis::from_redis_value::<String>(p.get(1)?.clone()).unwrap_or_default(),
                    ))
                })
                .collect(),
            redis::Value::Map(m) => m
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        redis::from_redis_value::<String>(k.clone()).ok()?,
                        redis::from_redis_value::<String>(v.clone()).unwrap_or_default(),
                    ))
                })
                .collect(),
            _ => continue,
        };
        let map: BTreeMap<String, String> = pairs.into_iter().collect();
        if map.get("name").map(String::as_str) == Some(group) {
            return map;
        }
    }
    BTreeMap::new()
}

/// A seeded RNG.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
