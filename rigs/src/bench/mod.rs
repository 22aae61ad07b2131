//! `groupcast bench`: a whole campaign on this machine, measured.
//!
//! A private `redis-server`, the mock provider in its own process (so that its
//! CPU is measured apart), N worker processes, and this process as the
//! producer, until every report arrives. Prints one JSON line per run; every
//! run also verifies every batch (a fast wrong answer counts for nothing).
//!
//! Two modes: by default this process appends and the workers are tuned for
//! throughput (`--durability none`, no rate limit, short poll and backoff);
//! `--user-path` (`user_path`) runs what a user runs instead: CSV files
//! through `groupcast submit`, workers with their default settings, on a
//! server of the kind `--server` names; with `--against bullmq` (`bullmq`)
//! the same files then go through the BullMQ flow the project grew from,
//! and the two are compared. `--lanes` (`lanes`) is a race of its own.
//!
//! [`run`] is the I/O: it starts the processes, produces, waits, and
//! `conclude` reads the counters and verifies (both modes). The rest is
//! pure and tested without Redis:
//!
//! - `workload`: the workloads' sizes, the flags applied to them, and the
//!   chunks of each append;
//! - `summary`: the counters read (`/proc`, `INFO`), the latencies in a
//!   batch's events, the broken rules, and the result line.

mod bullmq;
mod ingest;
mod lanes;
mod summary;
mod user_path;
mod workload;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use crate::mock::LedgerSummary;
use crate::redis_server::{free_port, RedisServer};
use groupcast::cli::CliError;
use groupcast::events::Recorded;
use groupcast::keys::Keyspace;
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::store::queue::read_after;
use groupcast::store::Store;
use groupcast::verify::verify_batch;
use summary::{
    commands_by_name, cpu_seconds, info_field, largest_keys, redis_cpu_seconds, result_line,
    violations, CpuSeconds, FailedCheck, KeySize, Latencies, Measured, MemoryUse, RunKind,
};
use workload::{bench_template, Plan};

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
    /// Instead of a workload, the priority lanes race: the provider (and the
    /// workers) limited to `--rate-limit` requests/s, a `bulk` batch of
    /// `--recipients` (default 100,000, chunks of 250) in flight, and an
    /// `urgent` batch of 20 submitted `--urgent-after-ms` later; prints how
    /// long the urgent batch took from submit to report.
    #[arg(long)]
    pub lanes: bool,
    /// With `--lanes`: requests per second of the provider and the workers.
    #[arg(long, default_value_t = 25)]
    pub rate_limit: u32,
    /// With `--lanes`: when the urgent batch is submitted, after the bulk one.
    #[arg(long, default_value_t = 2000)]
    pub urgent_after_ms: u64,
    /// Run the workload as a user does: each batch written to a CSV file and
    /// sent with `groupcast submit` (a child process, one batch after the
    /// other), and `--workers` `groupcast worker` processes with their
    /// default settings (only the connection, the provider and
    /// `--metrics-listen off`; `--group-cap` when the workload's differs from
    /// the default, as the provider's cap is the deployment's to give).
    /// Measures `submit`'s own time and peak memory too.
    #[arg(long, conflicts_with_all = ["lanes", "concurrency"])]
    pub user_path: bool,
    /// Instead of a run to the reports, ingest alone, with no worker: the
    /// workload's chunks appended through the stream path, then PUT to
    /// `groupcast serve`'s API as MessagePack and as JSON from
    /// `--concurrency` clients; prints recipients per second of each.
    #[arg(long, conflicts_with_all = ["lanes", "user_path"])]
    pub ingest: bool,
    /// With `--user-path`: the private server the run uses.
    #[arg(long, value_enum, default_value_t = ServerKind::Redis, requires = "user_path")]
    pub server: ServerKind,
    /// With `--user-path`: the workers' `--durability` instead of their
    /// default (`auto`); `none` measures what the default's waits cost.
    #[arg(long, value_enum, requires = "user_path")]
    pub worker_durability: Option<groupcast::worker::durability::Durability>,
    /// With `--user-path`: the workers' `--rate-limit` (provider requests
    /// a second, all workers together) instead of their default (`auto`:
    /// unpaced until the provider answers 429); 0: never paced.
    #[arg(long, requires = "user_path")]
    pub worker_rate_limit: Option<u32>,
    /// With `--user-path`: one `groupcast submit` per batch, one after the
    /// other (a shell loop over the files), instead of one `groupcast
    /// submit` of the directory of files (each file its own batch).
    #[arg(long, requires = "user_path")]
    pub submit_each: bool,
    /// With `--user-path`: after the groupcast run, in the same invocation,
    /// run the same files through another flow on a fresh server of the
    /// same kind, and print its line and the ratios of the two.
    #[arg(long, value_enum, requires = "user_path")]
    pub against: Option<Against>,
}

/// What `--against` compares groupcast with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Against {
    /// The BullMQ flow in `rigs/bullmq` (needs Node.js 18 or newer and npm): one
    /// job per chunk, `group.create` as a waiting child, `group.send` by
    /// jobId, every provider call behind the queue's limiter.
    Bullmq,
}

/// The private server of a `--user-path` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServerKind {
    /// `redis-server` from the PATH (Debian's is 7.0: no `WAITAOF`), without
    /// an AOF.
    Redis,
    /// Valkey 8.1 (installed by `scripts/ensure-deps --tests`) with an AOF,
    /// `appendfsync everysec`.
    ValkeyEverysec,
    /// Valkey 8.1 with an AOF, `appendfsync always`.
    ValkeyAlways,
    /// Redis 8.0 (installed by `scripts/ensure-deps --tests`; its `WAITAOF`
    /// waits for the fsync) with an AOF, `appendfsync everysec`.
    Redis8Everysec,
}

/// The mock provider's credentials, shared with the workers.
const API_KEY: &str = "bench-key";
const API_SECRET: &str = "bench-secret";

/// How many of the biggest keys the result line names.
const LARGEST_KEYS: usize = 8;

/// The children, killed when the run ends (however it ends).
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn info(store: &Store, section: &str) -> Result<String, CliError> {
    Ok(store.info(section).await?)
}

async fn used_memory(store: &Store) -> Result<Option<f64>, CliError> {
    Ok(info_field(&info(store, "memory").await?, "used_memory"))
}

/// Every party's CPU seconds so far.
async fn cpu_now(store: &Store, workers: &[u32], mock: u32) -> Result<CpuSeconds, CliError> {
    Ok(CpuSeconds {
        redis: redis_cpu_seconds(&info(store, "cpu").await?),
        workers: workers.iter().map(|p| cpu_seconds(*p)).sum(),
        mock: cpu_seconds(mock),
        producer: cpu_seconds(std::process::id()),
    })
}

/// Starts the mock provider on `port` (with `extra` flags) and waits until
/// it listens; returns its pid.
async fn start_mock(
    exe: &Path,
    port: u16,
    cap: u64,
    extra: &[&str],
    procs: &mut Procs,
) -> Result<u32, CliError> {
    let mock = Command::new(exe)
        .args([
            "mock-provider",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--complete-after-ms",
            "100",
        ])
        .args(["--cap", &cap.max(1_000_000).to_string()])
        .args(extra)
        .env("GROUPCAST_MOCK_API_KEY", API_KEY)
        .env("GROUPCAST_MOCK_API_SECRET", API_SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CliError::Failed(format!("cannot start the mock provider: {e}")))?;
    let pid = mock.id();
    procs.0.push(mock);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
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
    Ok(pid)
}

/// How the workers run.
struct WorkerFlags<'a> {
    workers: usize,
    concurrency: usize,
    group_cap: u64,
    /// `--rate-limit`, `--rate-burst`.
    rate: (u32, u32),
    procs: &'a mut Procs,
}

/// Starts the workers and waits until they have made their consumer groups;
/// returns their pids.
async fn start_workers(
    exe: &Path,
    store: &Store,
    redis_url: &str,
    provider_url: &str,
    flags: WorkerFlags<'_>,
) -> Result<Vec<u32>, CliError> {
    let mut pids = Vec::new();
    let procs = flags.procs;
    for _ in 0..flags.workers.max(1) {
        let w = Command::new(exe)
            .args(["worker", "--metrics-listen", "off", "--durability", "none"])
            .args([
                "--concurrency",
                &flags.concurrency.to_string(),
                "--group-cap",
                &flags.group_cap.to_string(),
                "--rate-limit",
                &flags.rate.0.to_string(),
                "--rate-burst",
                &flags.rate.1.max(1).to_string(),
            ])
            .args(["--poll-interval", "100ms", "--backoff-base", "50ms"])
            .env("GROUPCAST_REDIS_URL", redis_url)
            .env("GROUPCAST_PREFIX", "bench")
            .env("GROUPCAST_PROVIDER_URL", provider_url)
            .env("GROUPCAST_PROVIDER_API_KEY", API_KEY)
            .env("GROUPCAST_PROVIDER_API_SECRET", API_SECRET)
            .env("GROUPCAST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| CliError::Failed(format!("cannot start a worker: {e}")))?;
        pids.push(w.id());
        procs.0.push(w);
    }
    // Let the workers create their consumer groups before measuring.
    let ingest = store.keys.ingest(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if store.has_groups(&ingest).await.unwrap_or(false) {
            return Ok(pids);
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed("workers did not start".into()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What producing left behind.
struct Produced {
    /// When each chunk was appended (its entry id's milliseconds), by batch and seq.
    appended: BTreeMap<String, BTreeMap<u32, u64>>,
    chunks: usize,
}

/// Appends every batch's chunks, [`CHUNKS_PER_APPEND`] at a time, raising
/// `peak_memory` after each append.
async fn produce(store: &Store, plan: &Plan, peak_memory: &mut f64) -> Result<Produced, CliError> {
    let template = bench_template();
    let mut produced = Produced {
        appended: BTreeMap::new(),
        chunks: 0,
    };
    // Appends pause while the ingest stream holds too many unread chunks,
    // as every producer's do.
    let mut producer = groupcast::producer::Producer::new(store.clone());
    for (index, batch) in plan.batch_ids().iter().enumerate() {
        let appended = produced.appended.entry(batch.clone()).or_default();
        for from in plan.append_starts() {
            let part = plan.append_chunks(&template, index, batch, from);
            let ids = producer.append(&part).await?;
            for (c, id) in part.iter().zip(ids) {
                appended.insert(c.seq, groupcast::events::entry_millis(&id));
            }
            produced.chunks += part.len();
            if let Some(m) = used_memory(store).await? {
                *peak_memory = peak_memory.max(m);
            }
        }
    }
    Ok(produced)
}

/// Waits for a report from every batch, raising `peak_memory` on the way.
async fn wait_for_reports(
    store: &Store,
    batches: usize,
    timeout_secs: u64,
    peak_memory: &mut f64,
) -> Result<(), CliError> {
    // Blocking reads of the reports stream: one command per report rather
    // than a polling loop that would inflate the command count we measure.
    let deadline = Instant::now() + Duration::from_secs(timeout_secs);
    let mut reader = store.blocking().await?;
    let reports = store.keys.reports(0);
    let mut after = "0-0".to_string();
    let mut done = 0;
    loop {
        for e in read_after(&mut reader, &reports, &after, 1000, 250).await? {
            done += usize::from(!e.is_delivery_report());
            after = e.id;
        }
        if let Some(m) = used_memory(store).await? {
            *peak_memory = peak_memory.max(m);
        }
        if done >= batches {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "{done} of {batches} batches reported in {timeout_secs}s"
            )));
        }
    }
}

/// Most recipients the dedupe probe accepts (W5's ten million would only
/// take longer to say the same).
const DEDUPE_PROBE_MAX: usize = 1_000_000;

/// Redis memory the batch-wide dedupe keeps per recipient while a batch is
/// in flight: a probe batch of the workload's batch size (at most
/// [`DEDUPE_PROBE_MAX`]) is accepted chunk by chunk, as the loaders do, and
/// its number log measured before a report would delete it.
async fn dedupe_probe(store: &Store, plan: &Plan) -> Result<f64, CliError> {
    let n = plan.recipients.clamp(1, DEDUPE_PROBE_MAX);
    let log = store.batch("bench-dedupe-probe");
    let size = plan.chunk_size.max(1);
    let opts = groupcast::events::options::SendWindow::default().canonical();
    for (seq, from) in (0..n).step_by(size).enumerate() {
        let numbers: Vec<String> = (from..(from + size).min(n))
            .map(|i| format!("010{:08}", 90_000_000 + i))
            .collect();
        let records = groupcast::store::batch::dedupe_records(numbers.iter().map(String::as_str));
        let args = groupcast::protocol::accept::AcceptArgs {
            seq: seq as u32,
            last: false,
            records: &records,
            digest: &format!("probe{seq}"),
            cap: u64::MAX,
            opts: &opts,
        };
        log.accept_chunk(&args, 0).await?;
    }
    let bytes = store
        .memory_usage(&log.keys.numbers, true)
        .await?
        .unwrap_or(0);
    Ok(bytes as f64 / n as f64)
}

/// The share of a batch's recipients the results probe fails (the issue's
/// "a batch with 5 % failures").
const RESULTS_PROBE_FAILED: f64 = 0.05;

/// Redis memory the per-recipient outcomes take per recipient, for a batch
/// of the workload's size (at most [`DEDUPE_PROBE_MAX`]) of which 5 %
/// failed at delivery: its pages recorded as delivery tracking records
/// them (`track_page.lua`, 500 messages a page, the mock's message ids),
/// then its results and delivery hashes measured.
async fn results_probe(store: &Store, plan: &Plan) -> Result<f64, CliError> {
    use groupcast::results::{Outcome, Record, Stage};
    use groupcast::store::delivery::PageCounts;
    let n = plan.recipients.clamp(1, DEDUPE_PROBE_MAX);
    let log = store.batch("bench-results-probe");
    let every = (1.0 / RESULTS_PROBE_FAILED).round() as usize;
    let keep = std::time::Duration::from_secs(3600);
    for (page, from) in (0..n).step_by(500).enumerate() {
        let to = (from + 500).min(n);
        let mut counts = PageCounts::default();
        let mut records = Vec::new();
        for i in from..to {
            if i % every == every - 1 {
                let code = if i % 2 == 0 { "3104" } else { "3043" };
                counts.failed += 1;
                *counts.failed_by_code.entry(code.into()).or_default() += 1;
                let r = Record {
                    outcome: Outcome::Failed,
                    stage: Stage::Delivery,
                    gen: (i / 1_000_000) as u32,
                    code: code.into(),
                    message_id: format!("M4V20261204a1b2c3d4{:06}{i:09}", i / 1_000_000),
                    seq: None,
                };
                records.push((format!("010{:08}", 90_000_000 + i), r.encode()));
            } else {
                counts.delivered += 1;
            }
        }
        let key = if page == 0 {
            String::new()
        } else {
            format!("M4V{from:09}")
        };
        log.track_page(
            0,
            "G4V20261204a1b2c3d4000001",
            &key,
            &counts,
            keep,
            &records,
        )
        .await?;
    }
    let mut bytes = 0;
    for key in [&log.keys.results, &log.keys.delivery] {
        bytes += store.memory_usage(key, true).await?.unwrap_or(0);
    }
    Ok(bytes as f64 / n as f64)
}

/// The bytes the batches' state and events take.
async fn retained_event_bytes(store: &Store, batches: &[String]) -> Result<u64, CliError> {
    let mut retained = 0u64;
    for b in batches {
        let k = store.keys.batch(b);
        for key in [&k.state, &k.events] {
            retained += store.memory_usage(key, true).await?.unwrap_or(0);
        }
    }
    Ok(retained)
}

/// Every key's size: where the rest of the memory is.
async fn key_sizes(store: &Store) -> Result<Vec<KeySize>, CliError> {
    let mut sizes = Vec::new();
    for key in store.keys_matching("bench:*").await? {
        let bytes = store.memory_usage(&key, false).await?.unwrap_or(0);
        sizes.push(KeySize { key, bytes });
    }
    Ok(sizes)
}

/// The latencies in every batch's events.
async fn latencies(
    store: &Store,
    batches: &[String],
    appended: &BTreeMap<String, BTreeMap<u32, u64>>,
    submitted: &BTreeMap<String, u64>,
) -> Result<Latencies, CliError> {
    let mut latencies = Latencies::default();
    let none = BTreeMap::new();
    for b in batches {
        let events: Vec<Recorded> = store
            .batch(b)
            .events()
            .await?
            .into_iter()
            .flatten()
            .collect();
        latencies.add_batch(
            appended.get(b).unwrap_or(&none),
            submitted.get(b).copied(),
            &events,
        );
    }
    Ok(latencies)
}

/// Every batch verified, from our events and the provider's view.
async fn failed_checks(
    store: &Store,
    provider: &ProviderClient,
    batches: &[String],
    group_cap: u64,
) -> Result<Vec<FailedCheck>, CliError> {
    let mut failed = Vec::new();
    for b in batches {
        let v = verify_batch(store, Some(provider), b, group_cap).await?;
        failed.extend(v.failures().iter().map(|c| FailedCheck {
            batch: b.clone(),
            invariant: c.invariant,
            detail: c.detail.clone(),
        }));
    }
    Ok(failed)
}

/// Runs one bench and prints its JSON line.
pub(crate) async fn run(args: BenchArgs) -> Result<(), CliError> {
    if args.lanes {
        return lanes::run(&args).await;
    }
    let plan = args.plan()?;
    if args.user_path {
        // Before the groupcast run: a missing Node.js says so at once.
        let flow = match args.against {
            Some(Against::Bullmq) => Some(bullmq::prepare(&plan)?),
            None => None,
        };
        return user_path::run(&args, &plan, flow.as_ref()).await;
    }
    if args.ingest {
        return ingest::run(&args, &plan).await;
    }
    let exe = own_exe()?;
    let server = RedisServer::start().map_err(|e| CliError::Usage(e.to_string()))?;
    let store = Store::connect(&server.url(), Keyspace::new("bench", 1)).await?;
    let mut procs = Procs(Vec::new());
    let mock_port = free_port().map_err(|e| CliError::Failed(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{mock_port}");
    let mock_pid = start_mock(&exe, mock_port, plan.group_cap, &[], &mut procs).await?;
    let flags = WorkerFlags {
        workers: plan.workers,
        concurrency: args.concurrency,
        group_cap: plan.group_cap,
        rate: (0, 1),
        procs: &mut procs,
    };
    let worker_pids = start_workers(&exe, &store, &server.url(), &base_url, flags).await?;

    let start = used_memory(&store).await?.unwrap_or(0.0);
    store.reset_stats().await?;
    let cpu_start = cpu_now(&store, &worker_pids, mock_pid).await?;
    let started = Instant::now();
    let mut peak = start;
    let produced = produce(&store, &plan, &mut peak).await?;
    wait_for_reports(&store, plan.batches, args.timeout_secs, &mut peak).await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_now(&store, &worker_pids, mock_pid)
        .await?
        .since(cpu_start);
    let ran = Ran {
        store,
        server,
        base_url,
        procs,
        chunks: produced.chunks,
        wall_seconds,
        cpu,
        memory: (start, peak),
        appended: produced.appended,
        submitted: BTreeMap::new(),
        kind: RunKind::in_process(),
    };
    conclude(&plan, ran).await.map(drop)
}

/// The binary running now: the workers, the mock and `submit` are it too.
fn own_exe() -> Result<std::path::PathBuf, CliError> {
    std::env::current_exe().map_err(|e| CliError::Failed(format!("cannot find my own binary: {e}")))
}

/// `r`, its error saying what the bench was doing (a timeout alone does not
/// say which step of a long run met it).
fn during<T>(what: &str, r: Result<T, CliError>) -> Result<T, CliError> {
    r.map_err(|e| match e {
        CliError::Usage(m) => CliError::Usage(format!("{what}: {m}")),
        CliError::Redis(m) => CliError::Redis(format!("{what}: {m}")),
        CliError::Failed(m) => CliError::Failed(format!("{what}: {m}")),
    })
}

/// A finished run, for [`conclude`] to measure and verify.
struct Ran {
    store: Store,
    server: RedisServer,
    /// The mock provider's.
    base_url: String,
    /// Every child still running (stopped before the final memory reading).
    procs: Procs,
    chunks: usize,
    wall_seconds: f64,
    cpu: CpuSeconds,
    /// Redis `used_memory` before producing, and the highest seen since.
    memory: (f64, f64),
    /// When each chunk was appended, when this process appended them.
    appended: BTreeMap<String, BTreeMap<u32, u64>>,
    /// When each batch's `groupcast submit` started (ms since the epoch),
    /// when `submit` produced.
    submitted: BTreeMap<String, u64>,
    kind: RunKind,
}

/// Reads the counters a run leaves (commands, memory, keys), verifies every
/// batch, and prints the JSON line (and returns it); fails if a check broke.
async fn conclude(plan: &Plan, ran: Ran) -> Result<serde_json::Value, CliError> {
    let Ran {
        store,
        server,
        base_url,
        procs,
        chunks,
        wall_seconds,
        cpu,
        memory: (start, peak),
        appended,
        submitted,
        kind,
    } = ran;
    let commands = commands_by_name(&info(&store, "commandstats").await?);
    // The streams are trimmed by the workers' maintenance every 30 s; trim
    // now so that the final memory is what a steady state keeps.
    let trimmed = groupcast::worker::maintenance::trim_all(&store).await;
    during("trimming the streams", trimmed.map_err(CliError::from))?;
    let batches = plan.batch_ids();
    let retained_event_bytes = during(
        "measuring the batches' keys",
        retained_event_bytes(&store, &batches).await,
    )?;
    let sizes = during("measuring every key", key_sizes(&store).await)?;
    let largest = largest_keys(sizes, LARGEST_KEYS);
    let scripts =
        info_field(&info(&store, "memory").await?, "used_memory_scripts").unwrap_or(0.0) as u64;

    let (latencies, violations) =
        verify_run(&store, &base_url, plan, &batches, &appended, &submitted).await?;

    // Final memory with the workers, the mock and our own connections gone:
    // their client buffers are not what Redis keeps.
    drop(procs);
    let url = server.url();
    drop(store);
    let after = memory_after(&url, plan).await?;

    let measured = Measured {
        chunks,
        wall_seconds,
        cpu,
        commands,
        memory: MemoryUse {
            start,
            peak,
            end: after.used,
            retained_event_bytes,
            scripts,
            largest_keys: largest,
            stats_end: after.stats,
            dedupe_bytes_per_recipient: after.dedupe_bytes_per_recipient,
            results_bytes_per_recipient: after.results_bytes_per_recipient,
        },
        latencies,
        verified: violations.is_empty(),
        kind,
    };
    let line = result_line(plan, &measured);
    println!("{line}");
    drop(server);
    if violations.is_empty() {
        Ok(line)
    } else {
        Err(CliError::Failed(format!(
            "verification failed:\n  {}",
            violations.join("\n  ")
        )))
    }
}

/// Verifies the run: each batch's events (with their latencies, from when
/// chunks were `appended` and batches `submitted`) and the provider's ledger.
/// Returns the latencies and every broken check.
async fn verify_run(
    store: &Store,
    base_url: &str,
    plan: &Plan,
    batches: &[String],
    appended: &BTreeMap<String, BTreeMap<u32, u64>>,
    submitted: &BTreeMap<String, u64>,
) -> Result<(Latencies, Vec<String>), CliError> {
    let provider = ProviderClient::new(ProviderConfig {
        base_url: base_url.to_string(),
        api_key: API_KEY.into(),
        api_secret: API_SECRET.into(),
        ..ProviderConfig::default()
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    let latencies = during(
        "reading the batches' events",
        latencies(store, batches, appended, submitted).await,
    )?;
    let failed = during(
        "verifying the batches",
        failed_checks(store, &provider, batches, plan.group_cap).await,
    )?;
    let summary = ledger_summary(base_url).await?;
    let ledger = crate::mock::invariants::check(&summary, plan.group_cap);
    let violations = violations(&failed, &ledger, plan.total_recipients());
    Ok((latencies, violations))
}

/// The mock provider's ledger, counted (`GET /_mock/ledger/summary`).
async fn ledger_summary(base_url: &str) -> Result<LedgerSummary, CliError> {
    reqwest::get(format!("{base_url}/_mock/ledger/summary"))
        .await
        .map_err(|e| CliError::Failed(format!("ledger: {e}")))?
        .json()
        .await
        .map_err(|e| CliError::Failed(format!("ledger: {e}")))
}

/// Redis memory once the run's parties are gone, and the probes' bytes per
/// recipient.
struct MemoryAfter {
    /// `used_memory`.
    used: f64,
    /// `MEMORY STATS`.
    stats: serde_json::Map<String, serde_json::Value>,
    dedupe_bytes_per_recipient: f64,
    results_bytes_per_recipient: f64,
}

/// Measures the memory of the server at `url` on a fresh connection, then
/// runs the probes.
async fn memory_after(url: &str, plan: &Plan) -> Result<MemoryAfter, CliError> {
    let fresh = Store::connect(url, Keyspace::new("bench", 1)).await?;
    let used = used_memory(&fresh).await?.unwrap_or(0.0);
    let stats = fresh
        .memory_stats()
        .await?
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    // Last: its commands and keys are not the run's.
    let dedupe_bytes_per_recipient = during("the dedupe probe", dedupe_probe(&fresh, plan).await)?;
    let results_bytes_per_recipient =
        during("the results probe", results_probe(&fresh, plan).await)?;
    Ok(MemoryAfter {
        used,
        stats,
        dedupe_bytes_per_recipient,
        results_bytes_per_recipient,
    })
}
