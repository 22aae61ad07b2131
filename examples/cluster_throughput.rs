//! The same workload on one redis-server (1 shard) and on a private 3-master
//! Redis Cluster (3 shards), in recipients per second from the first append
//! to the last batch report.
//!
//! ```text
//! cargo run --release --example cluster_throughput -- [--recipients N] [--batches B]
//!     [--workers W] [--chunk C] [--runs R]
//! ```
//!
//! Defaults: 120,000 recipients in 12 batches (spread evenly over the
//! shards), chunks of 500, 4 worker processes' worth of workers (each
//! `Worker` reads every shard), the in-process mock provider, no provider
//! rate limit, no persistence on any Redis. Setups:
//!
//! - `single`: one redis-server, 1 shard;
//! - `cluster-3`: 3 masters, 3 shards (the default: one per master, each
//!   shard's tag on its own master with no slot moved, see docs/cluster.md);
//! - `cluster-6`: 3 masters, 6 shards (two per master).
//!
//! Everything (every Redis, the mock provider, the workers) shares this
//! machine's cores: on a small machine the cluster measures the cost of
//! cluster routing, not the capacity of three machines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::events::{chunk::KakaoTemplate, Recipient, Template};
use groupcast::keys::Keyspace;
use groupcast::producer::{append_chunks, cut};
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::store::Store;
use groupcast::worker::{Ctx, Worker, WorkerConfig};
use groupcast_rigs::mock::{self, MockConfig};
use groupcast_rigs::redis_cluster::{ClusterOptions, RedisCluster};
use groupcast_rigs::redis_server::RedisServer;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct Workload {
    recipients: usize,
    batches: usize,
    workers: usize,
    chunk: usize,
    runs: usize,
}

fn parse_args() -> Result<Workload, Error> {
    let mut w = Workload {
        recipients: 120_000,
        batches: 12,
        workers: 4,
        chunk: 500,
        runs: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            return Err(format!("{pair:?}: every flag takes a value").into());
        };
        let v: usize = value.parse()?;
        match flag.as_str() {
            "--recipients" => w.recipients = v,
            "--batches" => w.batches = v,
            "--workers" => w.workers = v,
            "--chunk" => w.chunk = v,
            "--runs" => w.runs = v,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(w)
}

fn template() -> Template {
    Template {
        kind: "ATA".into(),
        from: "0212345678".into(),
        text: "#{name}님, 주문 #{order} 배송이 시작되었습니다.".into(),
        kakao_options: Some(KakaoTemplate {
            pf_id: "PF1".into(),
            template_id: "T1".into(),
        }),
    }
}

fn recipients(k: usize, n: usize) -> Vec<Recipient> {
    (0..n)
        .map(|i| Recipient {
            to: format!("010{:08}", k * 1_000_000 + i),
            vars: BTreeMap::from([
                ("name".to_string(), format!("고객{i}")),
                ("order".to_string(), format!("A{i}")),
            ]),
        })
        .collect()
}

/// `count` batch names, as many on each shard.
fn batch_names(keys: &Keyspace, count: usize, run: usize) -> Vec<String> {
    let shards = keys.shards() as usize;
    let mut per_shard = vec![0usize; shards];
    let quota = count.div_ceil(shards);
    let mut out = Vec::new();
    for i in 0.. {
        if out.len() == quota * shards {
            break;
        }
        let b = format!("bench-{run}-{i}");
        let s = keys.shard_of(&b) as usize;
        if per_shard[s] < quota {
            per_shard[s] += 1;
            out.push(b);
        }
    }
    out
}

/// Runs the workload on `url` with `shards` shards; returns recipients/s.
async fn measure(url: &str, shards: u32, w: Workload, run: usize) -> Result<f64, Error> {
    let keys = Keyspace::new("bench", shards);
    let store = Store::connect(url, keys.clone()).await?;
    let mock = mock::start(
        MockConfig {
            cap: u64::MAX,
            complete_after: Duration::from_millis(30),
            ..MockConfig::default()
        },
        "127.0.0.1:0".parse()?,
    )
    .await?;
    let provider = ProviderClient::new(ProviderConfig {
        base_url: mock.base_url(),
        api_key: "mock-api-key".into(),
        api_secret: "mock-api-secret".into(),
        ..ProviderConfig::default()
    })?;
    let config = WorkerConfig {
        rate_limit: groupcast::worker::RateLimit::PerSecond(0),
        poll_interval: Duration::from_millis(30),
        block: Duration::from_millis(500),
        ..WorkerConfig::default()
    };
    let names = batch_names(&keys, w.batches, run);
    let per_batch = w.recipients / names.len();
    let mut chunks = Vec::new();
    for (k, b) in names.iter().enumerate() {
        chunks.extend(cut(b, &template(), recipients(k, per_batch), w.chunk));
    }
    let mut workers = Vec::new();
    for _ in 0..w.workers {
        let ctx = Ctx::new(store.clone(), provider.clone(), config.clone());
        workers.push(Worker::start(ctx).await?);
    }
    let started = Instant::now();
    append_chunks(&store, &chunks).await?;
    let deadline = started + Duration::from_secs(900);
    let mut registered = 0;
    for b in &names {
        loop {
            let st = store.batch(b).state().await?;
            if st.get("report").is_some() {
                registered += st.int("registered");
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{b} did not report in 15 minutes").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let elapsed = started.elapsed();
    for wk in workers {
        wk.stop().await;
    }
    let total = per_batch * names.len();
    if registered != total as i64 {
        return Err(format!("{registered} of {total} recipients registered").into());
    }
    Ok(total as f64 / elapsed.as_secs_f64())
}

fn cluster() -> Result<RedisCluster, Error> {
    Ok(RedisCluster::start_with(ClusterOptions {
        appendonly: false,
        ..ClusterOptions::default()
    })?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let w = parse_args()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{} recipients in {} batches, chunks of {}, {} workers, {cores} cores shared by everything",
        w.recipients, w.batches, w.chunk, w.workers
    );
    let mut results: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for run in 0..w.runs {
        let server = RedisServer::start()?;
        let r = measure(&server.url(), 1, w, run).await?;
        drop(server);
        results.entry("single (1 shard)").or_default().push(r);

        let even = cluster()?;
        let keys = Keyspace::new("bench", 3);
        let owners: Vec<usize> = (0..3)
            .map(|s| even.owner_of_key(&keys.work(s)))
            .collect::<Result<_, _>>()?;
        let r = measure(&even.url(), 3, w, run).await?;
        drop(even);
        results
            .entry("cluster-3 (3 masters, 3 shards: the default)")
            .or_default()
            .push(r);
        if run == 0 {
            println!("  (cluster-3: shards 0,1,2 on masters {owners:?})");
        }

        let hashed6 = cluster()?;
        let r = measure(&hashed6.url(), 6, w, run).await?;
        drop(hashed6);
        results
            .entry("cluster-6 (3 masters, 6 shards)")
            .or_default()
            .push(r);
    }
    for (name, rs) in &results {
        let shown: Vec<String> = rs.iter().map(|r| format!("{r:.0}")).collect();
        let mean = rs.iter().sum::<f64>() / rs.len() as f64;
        println!(
            "{name}: {mean:.0} recipients/s (runs: {})",
            shown.join(", ")
        );
    }
    Ok(())
}
