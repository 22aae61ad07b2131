//! Shared test helpers: a private redis-server per test, and a store on it.
#![allow(dead_code)]

pub mod scenarios;

use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast_rigs::redis_server::RedisServer;

/// Starts a private redis-server, or fails the test saying how to install one.
pub fn redis() -> RedisServer {
    match RedisServer::start() {
        Ok(s) => s,
        Err(e) => panic!("tests need a real redis-server: {e}"),
    }
}

/// A store on a fresh server (keep the server alive as long as the store).
pub async fn store(shards: u32) -> (RedisServer, Store) {
    let server = redis();
    let store = Store::connect(&server.url(), Keyspace::new("gct", shards))
        .await
        .expect("connect to the private redis-server");
    (server, store)
}

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::events::{Chunk, Recipient, Template};
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::verify::verify_batch;
use groupcast::worker::{Ctx, Worker, WorkerConfig};
use groupcast_rigs::mock::{self, Faults, MockConfig, MockHandle};

pub const KEY: &str = "test-key";
pub const SECRET: &str = "test-secret";

/// Worker settings tuned for tests: short delays and timeouts.
pub fn test_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        rate_limit: groupcast::worker::RateLimit::PerSecond(0),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(300),
        visibility_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(30),
        block: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(2),
        max_attempts: 0,
        ..WorkerConfig::default()
    }
}

/// A mock provider config for tests.
pub fn mock_config() -> MockConfig {
    MockConfig {
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        complete_after: Duration::from_millis(30),
        ..MockConfig::default()
    }
}

/// A whole pipeline on loopback: redis, the mock provider, workers.
/// `R` is what runs Redis and lives as long as the rig: a private
/// [`RedisServer`] (the default), or a private cluster (rigs/tests/cluster.rs).
pub struct Rig<R = RedisServer> {
    pub server: R,
    pub store: Store,
    pub mock: MockHandle,
    pub provider: ProviderClient,
    pub workers: Vec<Worker>,
    pub config: WorkerConfig,
}

impl Rig {
    /// A rig on a private redis-server, one shard.
    pub async fn start(workers: usize, config: WorkerConfig, mock: MockConfig) -> Rig {
        let (server, store) = store(1).await;
        Rig::start_on(server, store, workers, config, mock).await
    }
}

impl<R> Rig<R> {
    /// A rig on a store the caller connected (any URL, any keyspace), keeping
    /// `server` alive as long as the rig.
    pub async fn start_on(
        server: R,
        store: Store,
        workers: usize,
        config: WorkerConfig,
        mock: MockConfig,
    ) -> Rig<R> {
        init_tracing();
        let mock = mock::start(mock, "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("mock provider");
        let provider = provider_for(&mock);
        let mut rig = Rig {
            server,
            store,
            mock,
            provider,
            workers: Vec::new(),
            config,
        };
        for _ in 0..workers {
            rig.add_worker().await;
        }
        rig
    }

    pub async fn add_worker(&mut self) {
        let ctx = Ctx::new(
            self.store.clone(),
            self.provider.clone(),
            self.config.clone(),
        );
        self.workers
            .push(Worker::start(ctx).await.expect("worker starts"));
    }

    /// Waits (bounded) until every batch has reported; panics with the
    /// batches' states otherwise.
    pub async fn wait_reported(&self, batches: &[String], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut pending = Vec::new();
            for b in batches {
                // A Redis error (a cluster node restarting) counts as not
                // reported yet: the deadline bounds the wait.
                let st = self.store.batch(b).state().await.unwrap_or_default();
                if st.get("report").is_none() {
                    pending.push((b.clone(), st));
                }
            }
            if pending.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                let (b, st) = &pending[0];
                let dlq = dead_letters(&self.store).await;
                panic!(
                    "{} batch(es) did not report in {limit:?}; {b}: {:?}\ndead letters: {dlq:?}",
                    pending.len(),
                    st.fields
                        .iter()
                        .filter(|(k, _)| !k.starts_with("k:") && !k.starts_with("s:"))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every invariant, from our events and the provider, for each batch.
    pub async fn verify(&self, batches: &[String]) {
        for b in batches {
            let v = verify_batch(&self.store, Some(&self.provider), b, self.config.group_cap)
                .await
                .expect("verify");
            assert!(
                v.passed(),
                "batch {b} failed verification: {:#?}",
                v.failures()
            );
            assert!(v.reported, "batch {b} not reported");
        }
    }

    /// The invariants as the mock provider's ledger sees them.
    pub fn check_ledger(&self, expected: &BTreeMap<String, usize>) {
        check_ledger(&self.mock, expected, self.config.group_cap);
    }

    pub async fn stop(mut self) {
        self.stop_workers().await;
    }

    pub async fn stop_workers(&mut self) {
        for w in self.workers.drain(..) {
            w.stop().await;
        }
    }
}

pub fn provider_for(mock: &MockHandle) -> ProviderClient {
    ProviderClient::new(ProviderConfig {
        base_url: mock.base_url(),
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        request_timeout: Duration::from_secs(5),
        ..ProviderConfig::default()
    })
    .expect("provider client")
}

/// The ledger's half of the invariants (see `groupcast_rigs::mock::invariants`),
/// plus each batch's registered total as expected. Returns the orphan count.
pub fn check_ledger(mock: &MockHandle, expected: &BTreeMap<String, usize>, cap: u64) -> usize {
    // Only the batches expected to be complete: others may be in flight.
    let mut summary = mock.ledger_summary();
    summary.groups.retain(|g| {
        g.custom_fields
            .get("batchId")
            .is_some_and(|b| expected.contains_key(b))
    });
    let check = groupcast_rigs::mock::invariants::check(&summary, cap);
    assert!(check.ok(), "ledger violations: {:#?}", check.violations);
    for (batch, n) in expected {
        assert_eq!(
            check.registered.get(batch).copied().unwrap_or(0),
            *n as u64,
            "batch {batch}: registered at the provider"
        );
    }
    check.orphans
}

/// Every shard's dead letters as (source stream, reason).
pub async fn dead_letters(store: &Store) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dlq in store.keys.all(|k, s| k.dead_letters(s)) {
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(dlq)
            .arg("-")
            .arg("+")
            .query_async(&mut store.raw_conn())
            .await
            .expect("xrange");
        out.extend(
            groupcast::store::queue::parse_entries(&v)
                .into_iter()
                .map(|e| {
                    (
                        e.text("source").unwrap_or_default(),
                        e.text("reason").unwrap_or_default(),
                    )
                }),
        );
    }
    out
}

pub fn template() -> Template {
    Template {
        kind: "ATA".into(),
        from: "0212345678".into(),
        text: "#{name}님, 주문 #{order} 배송이 시작되었습니다.".into(),
        kakao_options: Some(groupcast::events::chunk::KakaoTemplate {
            pf_id: "PF1".into(),
            template_id: "T1".into(),
        }),
    }
}

/// `n` recipients with numbers unique across batches numbered `k`.
pub fn recipients(k: u32, n: usize) -> Vec<Recipient> {
    (0..n)
        .map(|i| Recipient {
            to: format!("010{:08}", u64::from(k) * 1_000_000 + i as u64),
            vars: BTreeMap::from([
                ("name".to_string(), format!("고객{i}")),
                ("order".to_string(), format!("A{i}")),
            ]),
        })
        .collect()
}

/// Chunks of a batch, shuffled, with some sent twice.
pub fn shuffled_chunks(batch: &str, k: u32, n: usize, size: usize, seed: u64) -> Vec<Chunk> {
    let mut chunks = groupcast::producer::cut(batch, &template(), recipients(k, n), size);
    let dups: Vec<Chunk> = chunks.iter().step_by(3).cloned().collect();
    chunks.extend(dups);
    shuffle(&mut chunks, seed);
    chunks
}

pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

pub fn faults(error_rate: f64, drop_rate: f64) -> Faults {
    Faults {
        error_rate,
        drop_rate,
        ..Faults::default()
    }
}

/// Logs to the test output, filtered by RUST_LOG (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `cond` until it holds, failing the test after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many times the server ran command `name` (lower case, as `INFO
/// commandstats` names it; inside scripts too) since it started or since the
/// last `CONFIG RESETSTAT`: 0 if never.
pub async fn command_calls(store: &Store, name: &str) -> u64 {
    let info = store.info("commandstats").await.expect("info");
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The stdout of a command that must have succeeded (else a panic with
/// its output).
pub fn ok_stdout(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Writes `text` to `dir/name`, and returns the path as a command line
/// takes it.
pub fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}
