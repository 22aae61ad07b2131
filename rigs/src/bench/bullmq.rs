//! `groupcast bench --user-path --against bullmq`: the same workload
//! through the BullMQ flow the project grew from, in the same invocation,
//! and the ratios of the two.
//!
//! After the groupcast run, with the same CSV files and template: a fresh
//! private server of the same `--server` kind, the same mock provider
//! binary on a free port, `--workers` Node worker processes
//! (`rigs/bullmq/flow.mjs worker`, BullMQ's concurrency set to groupcast's
//! default) and, once each has said `worker ready`, the clock runs from the
//! start of one producer process (`flow.mjs producer`, one job per chunk)
//! to the last report in the flow's `bmq:reports` stream. The workers are
//! then stopped, and the run is verified: every batch reported once, and
//! the mock's ledger shows each batch in one group, sent exactly once, with
//! all its recipients. Then the flow's line and the comparison line are
//! printed.
//!
//! The flow is a baseline, not a contender: it stays as it was described
//! (`rigs/bullmq/flow.mjs`), and it is not part of the tests CI runs (it
//! needs npm). [`prepare`] checks Node.js and installs the flow's
//! `node_modules` (`npm ci`) before the groupcast run starts.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::summary::{commands_by_name, round};
use super::user_path::{
    io, log_tail, not_starting, reap, server_name, start_server, Files, WORKERS_START,
};
use super::workload::Plan;
use super::{cpu_now, info, ledger_summary, start_mock, BenchArgs, Procs, API_KEY, API_SECRET};
use crate::redis_server::free_port;
use groupcast::cli::CliError;
use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast::worker::WorkerConfig;

/// The oldest Node.js the flow runs on (its global `fetch`).
const NODE_MIN_MAJOR: u32 = 18;

/// The stream the flow's reports go to (one entry per batch).
const REPORTS: &str = "bmq:reports";

/// What the bench needs to run the flow, checked before the groupcast run.
#[derive(Debug, Clone)]
pub(super) struct Flow {
    /// `rigs/bullmq`, with its `node_modules`.
    dir: PathBuf,
    /// The BullMQ version installed there.
    bullmq_version: String,
}

/// Where the flow lives: `GROUPCAST_BULLMQ_DIR`, else `rigs/bullmq` of the
/// checkout this binary was built from.
fn flow_dir() -> PathBuf {
    std::env::var_os("GROUPCAST_BULLMQ_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("bullmq"),
            PathBuf::from,
        )
}

/// The major version in `node --version`'s answer (`v20.11.1`).
pub(super) fn node_major(version: &str) -> Option<u32> {
    version
        .trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// What to say when a program the flow needs is missing.
fn install_hint(what: &str) -> CliError {
    CliError::Usage(format!(
        "--against bullmq runs the BullMQ flow with Node.js: {what}. Install Node.js \
         {NODE_MIN_MAJOR} or newer with npm (e.g. `apt-get install nodejs npm`), \
         or run without --against"
    ))
}

/// Checks that the workload fits the flow and that Node.js is there, and
/// installs the flow's packages if they are missing (`npm ci`).
pub(super) fn prepare(plan: &Plan) -> Result<Flow, CliError> {
    if plan.recipients as u64 > plan.group_cap {
        return Err(CliError::Usage(format!(
            "--against bullmq: the BullMQ flow puts a batch in one group (it has no \
             generations), and a batch of {} recipients exceeds the group cap {}",
            plan.recipients, plan.group_cap
        )));
    }
    let out = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| install_hint(&format!("cannot run `node` ({e})")))?;
    let version = String::from_utf8_lossy(&out.stdout).to_string();
    match node_major(&version) {
        Some(major) if major >= NODE_MIN_MAJOR => {}
        _ => {
            return Err(install_hint(&format!(
                "`node --version` says {:?}",
                version.trim()
            )))
        }
    }
    let dir = flow_dir();
    if !dir.join("flow.mjs").is_file() {
        return Err(CliError::Usage(format!(
            "--against bullmq: no flow.mjs in {} (set GROUPCAST_BULLMQ_DIR to rigs/bullmq)",
            dir.display()
        )));
    }
    if !dir.join("node_modules").join("bullmq").is_dir() {
        eprintln!(
            "installing the BullMQ flow's packages: npm ci --no-audit --no-fund in {}",
            dir.display()
        );
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .map_err(|e| install_hint(&format!("cannot run `npm` ({e})")))?;
        if !status.success() {
            return Err(CliError::Failed(format!(
                "npm ci in {} failed ({status}); it needs the npm registry",
                dir.display()
            )));
        }
    }
    let package = dir.join("node_modules/bullmq/package.json");
    let text = std::fs::read_to_string(&package).map_err(io(&package))?;
    let bullmq_version = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .unwrap_or_default();
    Ok(Flow {
        dir,
        bullmq_version,
    })
}

/// The four figures the comparison is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Figures {
    pub(super) wall_seconds: f64,
    pub(super) worker_cpu_seconds: f64,
    pub(super) redis_commands_per_chunk: f64,
    pub(super) redis_cpu_seconds: f64,
}

impl Figures {
    /// Reads them from a result line (groupcast's, or the flow's).
    pub(super) fn of_line(line: &serde_json::Value) -> Option<Figures> {
        Some(Figures {
            wall_seconds: line["wall_seconds"].as_f64()?,
            worker_cpu_seconds: line["worker_cpu_seconds"].as_f64()?,
            redis_commands_per_chunk: line["redis_commands_per_chunk"].as_f64()?,
            redis_cpu_seconds: line["redis_cpu_seconds"].as_f64()?,
        })
    }

    fn to_json(self) -> serde_json::Value {
        json!({
            "wall_seconds": self.wall_seconds,
            "worker_cpu_seconds": self.worker_cpu_seconds,
            "redis_commands_per_chunk": self.redis_commands_per_chunk,
            "redis_cpu_seconds": self.redis_cpu_seconds,
        })
    }
}

/// `other / groupcast`, to two decimals; none when groupcast's is zero.
fn ratio(other: f64, groupcast: f64) -> Option<f64> {
    (groupcast > 0.0).then(|| (other / groupcast * 100.0).round() / 100.0)
}

/// The comparison line: both runs' figures and, for each, how many times
/// groupcast's the BullMQ flow's is (BullMQ / groupcast: above 1, the
/// flow costs more).
pub(super) fn comparison(
    plan: &Plan,
    server: &str,
    groupcast: Figures,
    bullmq: Figures,
) -> serde_json::Value {
    json!({
        "mode": "comparison",
        "against": "bullmq",
        "server": server,
        "workload": plan.name,
        "recipients": plan.total_recipients(),
        "groupcast": groupcast.to_json(),
        "bullmq": bullmq.to_json(),
        "wall_ratio": ratio(bullmq.wall_seconds, groupcast.wall_seconds),
        "worker_cpu_ratio": ratio(bullmq.worker_cpu_seconds, groupcast.worker_cpu_seconds),
        "redis_commands_per_chunk_ratio":
            ratio(bullmq.redis_commands_per_chunk, groupcast.redis_commands_per_chunk),
        "redis_cpu_ratio": ratio(bullmq.redis_cpu_seconds, groupcast.redis_cpu_seconds),
    })
}

/// What is wrong with the reports: a batch reported other than once, or a
/// report of a batch not in the run.
pub(super) fn report_violations(batches: &[String], reported: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let n = reported.iter().filter(|r| *r == b).count();
        if n != 1 {
            out.push(format!("{b}: reported {n} times by the BullMQ flow"));
        }
    }
    for r in reported {
        if !batches.contains(r) {
            out.push(format!("{r}: reported by the BullMQ flow, not in the run"));
        }
    }
    out
}

/// What is wrong with each batch at the provider: not in exactly one
/// group, or not all its recipients registered.
pub(super) fn batch_violations(
    batches: &[String],
    recipients: u64,
    ledger: &crate::mock::invariants::LedgerCheck,
) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let groups = ledger.groups.get(b).copied().unwrap_or(0);
        if groups != 1 {
            out.push(format!("{b}: {groups} groups hold its messages"));
        }
        let registered = ledger.registered.get(b).copied().unwrap_or(0);
        if registered != recipients {
            out.push(format!(
                "{b}: {registered} of {recipients} recipients registered"
            ));
        }
    }
    out
}

/// A `node flow.mjs <mode>` child connected to `redis_url`.
fn node(flow: &Flow, mode: &str, redis_url: &str) -> Command {
    let mut c = Command::new("node");
    c.arg(flow.dir.join("flow.mjs"))
        .arg(mode)
        .current_dir(&flow.dir)
        .env("REDIS_URL", redis_url)
        .stdin(Stdio::null());
    c
}

/// Starts the Node workers (their output to files in `dir`) and waits until
/// each has said `worker ready`; returns their pids.
async fn start_workers(
    flow: &Flow,
    (redis_url, provider_url): (&str, &str),
    workers: usize,
    dir: &Path,
    procs: &mut Procs,
) -> Result<Vec<u32>, CliError> {
    let first = procs.0.len();
    let mut logs = Vec::new();
    let mut pids = Vec::new();
    for i in 0..workers.max(1) {
        let log = dir.join(format!("bullmq-worker-{i}.log"));
        let out = File::create(&log).map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let child = node(flow, "worker", redis_url)
            .env("PROVIDER_URL", provider_url)
            .env("PROVIDER_API_KEY", API_KEY)
            .env("PROVIDER_API_SECRET", API_SECRET)
            .env("CONCURRENCY", WorkerConfig::CONCURRENCY.to_string())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| CliError::Failed(format!("cannot start a BullMQ worker: {e}")))?;
        pids.push(child.id());
        procs.0.push(child);
        logs.push(log);
    }
    let deadline = Instant::now() + WORKERS_START;
    loop {
        let ready = logs
            .iter()
            .filter(|l| {
                std::fs::read_to_string(l)
                    .is_ok_and(|t| t.lines().any(|line| line == "worker ready"))
            })
            .count();
        if ready == logs.len() {
            return Ok(pids);
        }
        if let Some(e) = not_starting(
            &mut procs.0[first..],
            &logs,
            ready,
            deadline,
            "BullMQ workers",
        ) {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the producer did and used.
struct Produced {
    chunks: u64,
    cpu_seconds: f64,
}

/// Runs the producer over the workload's files and reaps it (`wait4`: its
/// CPU time); kills it at `deadline`.
async fn produce(
    flow: &Flow,
    redis_url: &str,
    (plan, files): (&Plan, &Files),
    log: &Path,
    deadline: Instant,
) -> Result<Produced, CliError> {
    let stderr = File::create(log).map_err(io(log))?;
    let mut child = node(flow, "producer", redis_url)
        .arg("--dir")
        .arg(&files.recipients)
        .arg("--template")
        .arg(&files.template)
        .args(["--chunk-size", &plan.chunk_size.to_string()])
        // `bench-7` from `7.csv`, as groupcast's run names them.
        .args(["--batch-prefix", "bench"])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| CliError::Failed(format!("cannot start the BullMQ producer: {e}")))?;
    let pid = child.id();
    let stdout = child.stdout.take();
    let reaped = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        if let Some(mut s) = stdout {
            let _ = s.read_to_string(&mut out);
        }
        reap(pid).map(|r| (out, r))
    });
    let left = deadline.saturating_duration_since(Instant::now());
    let (out, r) = match tokio::time::timeout(left, reaped).await {
        Ok(joined) => joined
            .map_err(|e| CliError::Failed(format!("waiting for the producer: {e}")))?
            .map_err(|e| CliError::Failed(format!("waiting for the producer: {e}")))?,
        Err(_) => {
            let _ = child.kill();
            return Err(CliError::Failed(
                "the BullMQ producer was still running at --timeout-secs".into(),
            ));
        }
    };
    if !r.status.success() {
        return Err(CliError::Failed(format!(
            "the BullMQ producer failed ({}):\n{}",
            r.status,
            log_tail(log)
        )));
    }
    let line: serde_json::Value = serde_json::from_str(out.trim()).map_err(|e| {
        CliError::Failed(format!(
            "the BullMQ producer printed {out:?}, not JSON: {e}"
        ))
    })?;
    Ok(Produced {
        chunks: line["chunks"].as_u64().unwrap_or(0),
        cpu_seconds: r.cpu_seconds,
    })
}

/// A `batch` field of each entry of an `XREAD`/`XRANGE` answer.
fn batches_of(entries: &[redis::streams::StreamId]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.get::<String>("batch"))
        .collect()
}

/// Waits until `batches` reports are in the flow's stream, by blocking
/// reads (one command per wake-up, as groupcast's run waits).
async fn wait_for_reports(
    conn: &mut redis::aio::MultiplexedConnection,
    batches: usize,
    deadline: Instant,
) -> Result<(), CliError> {
    let mut after = "0-0".to_string();
    let mut seen = 0;
    while seen < batches {
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "{seen} of {batches} batches reported by the BullMQ flow within --timeout-secs"
            )));
        }
        let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(250)
            .arg("STREAMS")
            .arg(REPORTS)
            .arg(&after)
            .query_async(conn)
            .await
            .map_err(|e| CliError::Redis(e.to_string()))?;
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            seen += batches_of(&key.ids).len();
            if let Some(last) = key.ids.last() {
                after.clone_from(&last.id);
            }
        }
    }
    Ok(())
}

/// Runs the flow over `files` (written in `dir` for the groupcast run),
/// prints its line and the comparison with `groupcast_line`; fails if the
/// flow's run is not correct.
pub(super) async fn run(
    args: &BenchArgs,
    plan: &Plan,
    flow: &Flow,
    (dir, files): (&Path, &Files),
    groupcast_line: &serde_json::Value,
) -> Result<(), CliError> {
    let exe = super::own_exe()?;
    let server = start_server(args.server)?;
    let url = server.url();
    let store = Store::connect(&url, Keyspace::new("bench", 1)).await?;
    let client = redis::Client::open(url.as_str()).map_err(|e| CliError::Redis(e.to_string()))?;
    // Its own connection: the blocking reads must not hold up `store`'s.
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| CliError::Redis(e.to_string()))?;
    let mut procs = Procs(Vec::new());
    let mock_port = free_port().map_err(|e| CliError::Failed(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{mock_port}");
    let mock_pid = start_mock(&exe, mock_port, plan.group_cap, &[], &mut procs).await?;
    let workers = start_workers(flow, (&url, &base_url), plan.workers, dir, &mut procs).await?;

    // The run's commands only, as groupcast's are counted.
    store.reset_stats().await?;
    let cpu_start = cpu_now(&store, &workers, mock_pid).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let log = dir.join("bullmq-producer.log");
    let produced = produce(flow, &url, (plan, files), &log, deadline).await?;
    wait_for_reports(&mut conn, plan.batches, deadline).await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut cpu = cpu_now(&store, &workers, mock_pid).await?.since(cpu_start);
    cpu.producer = produced.cpu_seconds;
    let commands = commands_by_name(&info(&store, "commandstats").await?);
    // Every batch is reported: the workers are stopped (the mock, first
    // in `procs`, stays for its ledger).
    for w in procs.0.iter_mut().skip(1) {
        let _ = w.kill();
        let _ = w.wait();
    }

    let reports: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(REPORTS)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .map_err(|e| CliError::Redis(e.to_string()))?;
    let batches = plan.batch_ids();
    let summary = ledger_summary(&base_url).await?;
    let ledger = crate::mock::invariants::check(&summary, plan.group_cap);
    let mut violations = super::summary::violations(&[], &ledger, plan.total_recipients());
    violations.extend(report_violations(&batches, &batches_of(&reports.ids)));
    violations.extend(batch_violations(&batches, plan.recipients as u64, &ledger));
    if produced.chunks != groupcast_line["chunks"].as_u64().unwrap_or(0) {
        violations.push(format!(
            "the BullMQ producer added {} chunks, groupcast's run had {}",
            produced.chunks, groupcast_line["chunks"]
        ));
    }
    drop(procs);

    let total = plan.total_recipients();
    let calls: u64 = commands.values().sum();
    let line = json!({
        "mode": "bullmq",
        "server": server_name(args.server),
        "bullmq_version": flow.bullmq_version,
        "workload": plan.name,
        "recipients": total,
        "chunks": produced.chunks,
        "batches": plan.batches,
        "workers": plan.workers,
        "concurrency": WorkerConfig::CONCURRENCY,
        "wall_seconds": round(wall_seconds),
        "recipients_per_second": (total as f64 / wall_seconds).round(),
        "worker_cpu_seconds": round(cpu.workers),
        "worker_cpu_seconds_per_million": round(cpu.workers / (total as f64 / 1e6)),
        "redis_cpu_seconds": round(cpu.redis),
        "redis_commands": calls,
        "redis_commands_per_chunk": round(calls as f64 / produced.chunks.max(1) as f64),
        "redis_commands_by_name": commands,
        "mock_cpu_seconds": round(cpu.mock),
        "producer_cpu_seconds": round(cpu.producer),
        "verified": violations.is_empty(),
    });
    println!("{line}");
    if !violations.is_empty() {
        return Err(CliError::Failed(format!(
            "the BullMQ flow's run is not correct, no comparison:\n  {}",
            violations.join("\n  ")
        )));
    }
    let ours = Figures::of_line(groupcast_line)
        .ok_or_else(|| CliError::Failed("groupcast's line lacks a figure".into()))?;
    let theirs = Figures::of_line(&line)
        .ok_or_else(|| CliError::Failed("the BullMQ line lacks a figure".into()))?;
    println!(
        "{}",
        comparison(plan, &server_name(args.server), ours, theirs)
    );
    drop(server);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::invariants::LedgerCheck;

    fn plan() -> Plan {
        Plan {
            name: "W3".into(),
            recipients: 1_000,
            batches: 2,
            chunk_size: 100,
            group_cap: 1_000_000,
            workers: 2,
        }
    }

    #[test]
    fn node_versions() {
        assert_eq!(node_major("v20.20.2\n"), Some(20));
        assert_eq!(node_major("v18.0.0"), Some(18));
        assert_eq!(node_major("20.1.0"), None);
        assert_eq!(node_major(""), None);
    }

    #[test]
    fn ratios_are_bullmq_over_groupcast() {
        let line = json!({"wall_seconds": 0.5, "worker_cpu_seconds": 0.4,
            "redis_commands_per_chunk": 18.0, "redis_cpu_seconds": 0.2, "chunks": 1000});
        let ours = Figures::of_line(&line).unwrap();
        let theirs = Figures {
            wall_seconds: 2.0,
            worker_cpu_seconds: 1.0,
            redis_commands_per_chunk: 45.0,
            redis_cpu_seconds: 0.0,
        };
        let c = comparison(&plan(), "redis", ours, theirs);
        assert_eq!(c["wall_ratio"], json!(4.0));
        assert_eq!(c["worker_cpu_ratio"], json!(2.5));
        assert_eq!(c["redis_commands_per_chunk_ratio"], json!(2.5));
        assert_eq!(c["redis_cpu_ratio"], json!(0.0));
        assert_eq!(c["groupcast"]["wall_seconds"], json!(0.5));
        assert_eq!(c["recipients"], json!(2_000));
        // No ratio to a zero.
        let zero = Figures {
            redis_cpu_seconds: 0.0,
            ..ours
        };
        let c = comparison(&plan(), "redis", zero, theirs);
        assert_eq!(c["redis_cpu_ratio"], serde_json::Value::Null);
        assert!(Figures::of_line(&json!({"wall_seconds": 1.0})).is_none());
    }

    #[test]
    fn every_batch_reported_once() {
        let batches = vec!["bench-0".to_string(), "bench-1".to_string()];
        let once = vec!["bench-1".to_string(), "bench-0".to_string()];
        assert!(report_violations(&batches, &once).is_empty());
        let twice = vec!["bench-0".into(), "bench-0".into(), "bench-9".into()];
        assert_eq!(
            report_violations(&batches, &twice),
            vec![
                "bench-0: reported 2 times by the BullMQ flow".to_string(),
                "bench-1: reported 0 times by the BullMQ flow".into(),
                "bench-9: reported by the BullMQ flow, not in the run".into(),
            ]
        );
    }

    #[test]
    fn every_batch_in_one_full_group() {
        let batches = vec!["bench-0".to_string(), "bench-1".to_string()];
        let mut ledger = LedgerCheck::default();
        for b in &batches {
            ledger.groups.insert(b.clone(), 1);
            ledger.registered.insert(b.clone(), 1_000);
        }
        assert!(batch_violations(&batches, 1_000, &ledger).is_empty());
        ledger.groups.insert("bench-1".into(), 2);
        ledger.registered.insert("bench-1".into(), 999);
        assert_eq!(batch_violations(&batches, 1_000, &ledger).len(), 2);
        ledger.groups.remove("bench-0");
        assert!(batch_violations(&batches, 1_000, &ledger)[0].contains("0 groups"));
    }

    #[test]
    fn a_batch_over_the_cap_is_refused() {
        let mut p = plan();
        p.group_cap = 100;
        assert!(matches!(prepare(&p), Err(CliError::Usage(m)) if m.contains("group cap")));
    }
}
