//! `groupcast bench`: a whole campaign on this machine, measured.
//!
//! A private `redis-server`, the mock provider in its own process (so that its
//! CPU is measured apart), N worker processes, and this process as the
//! producer, until every report arrives. Prints one JSON line per run; every
//! run also verifies every batch (a fast wrong answer counts for nothing).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::json;

use super::CliError;
use crate::events::{Event, Recipient, Template};
use crate::keys::Keyspace;
use crate::mock::LedgerSummary;
use crate::provider::{ProviderClient, ProviderConfig};
use crate::redis_server::{free_port, RedisServer};
use crate::store::queue::read_after;
use crate::store::Store;
use crate::verify::verify_batch;

/// The workloads of issue 7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// One batch, 1,000,000 recipients, chunks of 5,000.
    W1,
    /// One batch, 200,000 recipients, chunks of 1,000.
    W2,
    /// 100 batches of 1,000 recipients, chunks of 100.
    W3,
    /// One batch of 1,000,000 with a group cap of 100,000.
    W4,
    /// 10,000,000 recipients in chunks of 10,000 (memory stays bounded).
    W5,
}

/// Bench flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A preset workload (its sizes can be overridden by the flags below).
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Multiply the workload's recipients by this (e.g. 0.01 for a smoke run).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Recipients per batch.
    #[arg(long)]
    pub recipients: Option<usize>,
    /// Batches.
    #[arg(long)]
    pub batches: Option<usize>,
    /// Recipients per chunk.
    #[arg(long)]
    pub chunk_size: Option<usize>,
    /// Group cap.
    #[arg(long)]
    pub group_cap: Option<u64>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrency per worker stream.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_secs: u64,
}

struct Plan {
    name: String,
    recipients: usize,
    batches: usize,
    chunk_size: usize,
    group_cap: u64,
}

impl BenchArgs {
    fn plan(&self) -> Result<Plan, CliError> {
        let (name, r, b, c, cap) = match self.workload {
            Some(Workload::W1) => ("W1", 1_000_000, 1, 5_000, 1_000_000),
            Some(Workload::W2) => ("W2", 200_000, 1, 1_000, 1_000_000),
            Some(Workload::W3) => ("W3", 1_000, 100, 100, 1_000_000),
            Some(Workload::W4) => ("W4", 1_000_000, 1, 5_000, 100_000),
            Some(Workload::W5) => ("W5", 10_000_000, 1, 10_000, 1_000_000),
            None => ("custom", 100_000, 1, 1_000, 1_000_000),
        };
        let scale = |n: usize| ((n as f64 * self.scale).round() as usize).max(1);
        let plan = Plan {
            name: name.to_string(),
            recipients: self.recipients.unwrap_or_else(|| scale(r)),
            batches: self.batches.unwrap_or(b),
            chunk_size: self.chunk_size.unwrap_or(c),
            group_cap: self.group_cap.unwrap_or(cap),
        };
        if plan.chunk_size == 0 || plan.chunk_size > crate::events::chunk::MAX_CHUNK_RECIPIENTS {
            return Err(CliError::Usage(
                "--chunk-size must be between 1 and 10000".into(),
            ));
        }
        if plan.recipients * plan.batches > 100_000_000 {
            return Err(CliError::Usage(
                "at most 100,000,000 recipients in all (numbers are 8-digit)".into(),
            ));
        }
        Ok(plan)
    }
}

/// CPU seconds (user + system) of a live process, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // rest starts at field 3 (state): utime is field 14 → index 11.
    (ticks(11) + ticks(12)) / 100.0
}

fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

async fn info(store: &Store, section: &str) -> Result<String, CliError> {
    Ok(store.info(section).await?)
}

/// Commands executed (calls summed over every command, scripts' inner
/// commands included, as Redis counts them), excluding INFO itself.
fn commands(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Calls per command (scripts' inner commands included), excluding INFO.
fn commands_by_name(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            Some((
                name.to_string(),
                rest.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?,
            ))
        })
        .collect()
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Recipients `from..from + n` of batch `batch` (of `per_batch`).
fn recipients(batch: usize, per_batch: usize, from: usize, n: usize) -> Vec<Recipient> {
    (from..from + n)
        .map(|i| Recipient {
            to: format!("010{:08}", (batch * per_batch + i) % 100_000_000),
            vars: BTreeMap::from([("name".to_string(), format!("c{i}"))]),
        })
        .collect()
}

/// Runs one bench and prints its JSON line.
pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let plan = args.plan()?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find my own binary: {e}")))?;
    let server = RedisServer::start().map_err(|e| CliError::Usage(e.to_string()))?;
    let store = Store::connect(&server.url(), Keyspace::new("bench", 1)).await?;
    let mut procs = Procs(Vec::new());

    // The mock provider, in its own process.
    let mock_port = free_port().map_err(|e| CliError::Failed(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{mock_port}");
    let (key, secret) = ("bench-key", "bench-secret");
    let mock = Command::new(&exe)
        .args([
            "mock-provider",
            "--listen",
            &format!("127.0.0.1:{mock_port}"),
            "--complete-after-ms",
            "100",
        ])
        .args(["--cap", &plan.group_cap.max(1_000_000).to_string()])
        .env("GROUPCAST_MOCK_API_KEY", key)
        .env("GROUPCAST_MOCK_API_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CliError::Failed(format!("cannot start the mock provider: {e}")))?;
    let mock_pid = mock.id();
    procs.0.push(mock);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", mock_port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            return Err(CliError::Failed(
                "the mock provider did not start listening".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Workers.
    let mut worker_pids = Vec::new();
    for _ in 0..args.workers.max(1) {
        let w = Command::new(&exe)
            .args([
                "worker",
                "--metrics-listen",
                "off",
                "--rate-limit",
                "0",
                "--durability",
                "none",
            ])
            .args([
                "--concurrency",
                &args.concurrency.to_string(),
                "--group-cap",
                &plan.group_cap.to_string(),
            ])
            .args(["--poll-interval", "100ms", "--backoff-base", "50ms"])
            .env("GROUPCAST_REDIS_URL", server.url())
            .env("GROUPCAST_PREFIX", "bench")
            .env("GROUPCAST_PROVIDER_URL", &base_url)
            .env("GROUPCAST_PROVIDER_API_KEY", key)
            .env("GROUPCAST_PROVIDER_API_SECRET", secret)
            .env("GROUPCAST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| CliError::Failed(format!("cannot start a worker: {e}")))?;
        worker_pids.push(w.id());
        procs.0.push(w);
    }
    // Let the workers create their consumer groups before measuring.
    let ingest = store.keys.ingest(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if store.has_groups(&ingest).await.unwrap_or(false) {
            break;
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed("workers did not start".into()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let template = Template {
        kind: "SMS".into(),
        from: "0212345678".into(),
        text: "#{name}, your order shipped".into(),
        kakao_options: None,
    };
    let batches: Vec<String> = (0..plan.batches).map(|b| format!("bench-{b}")).collect();
    let mem_start = info_field(&info(&store, "memory").await?, "used_memory").unwrap_or(0.0);
    store.reset_stats().await?;
    let cpu_redis_0 = {
        let i = info(&store, "cpu").await?;
        info_field(&i, "used_cpu_user").unwrap_or(0.0)
            + info_field(&i, "used_cpu_sys").unwrap_or(0.0)
    };
    let cpu_workers_0: f64 = worker_pids.iter().map(|p| cpu_seconds(*p)).sum();
    let cpu_mock_0 = cpu_seconds(mock_pid);
    let cpu_producer_0 = cpu_seconds(std::process::id());

    // Produce. Chunks are built batch by batch so that W5 never holds ten
    // million recipients in memory at once.
    let started = Instant::now();
    let mut submitted: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let mut chunks_total = 0usize;
    let mut peak_memory = mem_start;
    let mut producer = crate::producer::Producer::new(store.clone());
    for (k, b) in batches.iter().enumerate() {
        let per_part = plan.chunk_size * 50;
        let mut seq_base = 0u32;
        let total_chunks = plan.recipients.div_ceil(plan.chunk_size) as u32;
        let mut from = 0usize;
        while from < plan.recipients {
            let n = per_part.min(plan.recipients - from);
            let mut part = crate::producer::cut(
                b,
                &template,
                recipients(k, plan.recipients, from, n),
                plan.chunk_size,
            );
            for c in &mut part {
                c.seq += seq_base;
                c.last = c.seq + 1 == total_chunks;
            }
            seq_base += part.len() as u32;
            let ids = producer.append(&part).await?;
            for (c, id) in part.iter().zip(ids) {
                submitted.insert((b.clone(), c.seq), crate::events::entry_millis(&id));
            }
            chunks_total += part.len();
            from += n;
            if let Some(m) = info_field(&info(&store, "memory").await?, "used_memory") {
                peak_memory = peak_memory.max(m);
            }
        }
    }

    // Wait for every report.
    // Blocking reads of the reports stream: one command per report rather
    // than a polling loop that would inflate the command count we measure.
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut reader = store.blocking().await?;
    let reports = store.keys.reports(0);
    let mut after = "0-0".to_string();
    let mut done = 0;
    loop {
        for e in read_after(&mut reader, &reports, &after, 1000, 250).await? {
            after = e.id;
            done += 1;
        }
        if let Some(m) = info_field(&info(&store, "memory").await?, "used_memory") {
            peak_memory = peak_memory.max(m);
        }
        if done >= batches.len() {
            break;
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "{done} of {} batches reported in {}s",
                batches.len(),
                args.timeout_secs
            )));
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu_workers: f64 = worker_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu_workers_0;
    let cpu_mock = cpu_seconds(mock_pid) - cpu_mock_0;
    // This process: the producer (and the bench's own polling).
    let cpu_producer = cpu_seconds(std::process::id()) - cpu_producer_0;
    let stats = info(&store, "commandstats").await?;
    let cpu_redis = {
        let i = info(&store, "cpu").await?;
        info_field(&i, "used_cpu_user").unwrap_or(0.0)
            + info_field(&i, "used_cpu_sys").unwrap_or(0.0)
            - cpu_redis_0
    };
    let redis_commands = commands(&stats);
    // The streams are trimmed by the workers' maintenance every 30 s; trim
    // now so that the final memory is what a steady state keeps.
    crate::worker::maintenance::trim_all(&store).await?;
    let mut retained = 0u64;
    for b in &batches {
        let k = store.keys.batch(b);
        for key in [&k.state, &k.events] {
            let n = store.memory_usage(key, true).await?;
            retained += n.unwrap_or(0);
        }
    }
    // Where the rest of the final memory is: every key's size, biggest first.
    let mut key_sizes: Vec<(String, u64)> = Vec::new();
    for k in store.keys_matching("bench:*").await? {
        let n = store.memory_usage(&k, false).await?;
        key_sizes.push((k, n.unwrap_or(0)));
    }
    key_sizes.sort_by_key(|k| std::cmp::Reverse(k.1));
    key_sizes.truncate(8);
    let mem_info = info(&store, "memory").await?;
    let scripts_bytes = info_field(&mem_info, "used_memory_scripts").unwrap_or(0.0) as u64;

    // Latencies, from the events, and verification.
    let provider = ProviderClient::new(ProviderConfig {
        base_url: base_url.clone(),
        api_key: key.into(),
        api_secret: secret.into(),
        ..ProviderConfig::default()
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    let mut load_ms = Vec::new();
    let mut send_ms = Vec::new();
    let mut violations = Vec::new();
    for b in &batches {
        let mut ready: BTreeMap<u32, u64> = BTreeMap::new();
        for r in store.batch(b).events().await?.into_iter().flatten() {
            match &r.event {
                Event::ChunkLoaded(e) => {
                    if let Some(t) = submitted.get(&(b.clone(), e.seq)) {
                        load_ms.push(r.millis().saturating_sub(*t));
                    }
                }
                Event::GenerationReady(e) => {
                    ready.insert(e.gen, r.millis());
                }
                Event::SendTriggered(e) => {
                    if let Some(t) = ready.get(&e.gen) {
                        send_ms.push(r.millis().saturating_sub(*t));
                    }
                }
                _ => {}
            }
        }
        let v = verify_batch(&store, Some(&provider), b, plan.group_cap).await?;
        violations.extend(
            v.failures()
                .iter()
                .map(|c| format!("{b}: invariant {}: {}", c.invariant, c.detail)),
        );
    }
    let summary: LedgerSummary = reqwest::get(format!("{base_url}/_mock/ledger/summary"))
        .await
        .map_err(|e| CliError::Failed(format!("ledger: {e}")))?
        .json()
        .await
        .map_err(|e| CliError::Failed(format!("ledger: {e}")))?;
    let ledger = crate::mock::invariants::check(&summary, plan.group_cap);
    violations.extend(ledger.violations.iter().cloned());
    let registered: u64 = ledger.registered.values().sum();
    let total = (plan.recipients * plan.batches) as u64;
    if registered != total {
        violations.push(format!(
            "{registered} of {total} recipients registered at the provider"
        ));
    }
    // Final memory with the workers, the mock and our own connections gone:
    // their client buffers are not what Redis keeps.
    drop(procs);
    drop(reader);
    let url = server.url();
    drop(store);
    let fresh = Store::connect(&url, Keyspace::new("bench", 1)).await?;
    let mem_end = info_field(&info(&fresh, "memory").await?, "used_memory").unwrap_or(0.0);
    let mut mem_stats = serde_json::Map::new();
    for (k, v) in fresh.memory_stats().await? {
        mem_stats.insert(k, v.into());
    }

    let line = json!({
        "workload": plan.name,
        "recipients": total,
        "chunks": chunks_total,
        "batches": plan.batches,
        "group_cap": plan.group_cap,
        "workers": args.workers,
        "wall_seconds": round(wall),
        "recipients_per_second": (total as f64 / wall).round(),
        "worker_cpu_seconds": round(cpu_workers),
        "worker_cpu_seconds_per_million": round(cpu_workers / (total as f64 / 1e6)),
        "redis_cpu_seconds": round(cpu_redis),
        "redis_commands": redis_commands,
        "redis_commands_per_chunk": round(redis_commands as f64 / chunks_total as f64),
        "redis_commands_by_name": commands_by_name(&stats),
        "mock_cpu_seconds": round(cpu_mock),
        "producer_cpu_seconds": round(cpu_producer),
        "wall_over_bound": round(wall / (cpu_mock.max((cpu_workers + cpu_redis + cpu_mock + cpu_producer) / 2.0))),
        "redis_used_memory_start": mem_start as u64,
        "redis_used_memory_peak": peak_memory as u64,
        "redis_used_memory_end": mem_end as u64,
        "retained_event_bytes": retained,
        "redis_used_memory_scripts": scripts_bytes,
        "largest_keys_end": key_sizes,
        "redis_memory_stats_end": mem_stats,
        "submit_to_loaded_ms_p50": percentile(&mut load_ms.clone(), 0.5),
        "submit_to_loaded_ms_p99": percentile(&mut load_ms, 0.99),
        "complete_to_send_ms_p50": percentile(&mut send_ms.clone(), 0.5),
        "complete_to_send_ms_p99": percentile(&mut send_ms, 0.99),
        "verified": violations.is_empty(),
    });
    println!("{line}");
    if violations.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "verification failed:\n  {}",
            violations.join("\n  ")
        )))
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
