//! `groupcast bench --user-path`: the workload as a user runs it.
//!
//! Before the clock starts, each batch's recipients are written to a CSV
//! file (and the template to a JSON file) in a temporary directory, a
//! private server of the kind `--server` names is started, the mock provider
//! in its own process, and `--workers` `groupcast worker` processes with
//! their default settings: only the connection, the provider and
//! `--metrics-listen off` (two workers cannot share the default metrics
//! port), plus `--group-cap` when the workload's cap is not the default (the
//! provider's cap is the deployment's to give, not a tuning). The run waits
//! until every worker has logged `worker started`.
//!
//! The clock then runs from the first `groupcast submit` to the last report.
//! One `groupcast submit` takes the directory of files, each file its own
//! batch (`--batch bench`, file `7.csv`: batch `bench-7`); with
//! `--submit-each` the submits run one after the other, one per batch, as a
//! shell loop over the files would. Each is reaped with `wait4`, which
//! gives its peak resident set and its CPU time.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::ValueEnum;

use super::summary::{RunKind, SubmitUse};
use super::workload::{bench_template, recipients, Plan};
use super::{
    conclude, cpu_now, during, own_exe, start_mock, used_memory, wait_for_reports, BenchArgs,
    Procs, Ran, ServerKind, API_KEY, API_SECRET,
};
use crate::redis_server::{free_port, RedisServer};
use groupcast::cli::CliError;
use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast::worker::durability::Durability;
use groupcast::worker::WorkerConfig;

/// What a batch id is, before the file's stem: `--batch bench` and
/// `7.csv` make batch `bench-7` (see `Plan::batch_ids`).
const BATCH_PREFIX: &str = "bench-";

/// Rows generated at a time while writing a CSV file (W5's ten million
/// are never all in memory).
const WRITE_ROWS: usize = 100_000;

/// How often Redis' memory is sampled while a submit runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// How long the workers may take to start.
pub(super) const WORKERS_START: Duration = Duration::from_secs(30);

/// This machine's clock, in ms since the epoch: the Redis server the events
/// are stamped by runs on it too, and reading the server's would add a
/// command per batch to the run's count.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, CliError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("groupcast-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An I/O failure on `path`, as an error.
pub(super) fn io(path: &Path) -> impl Fn(std::io::Error) -> CliError + '_ {
    move |e| CliError::Failed(format!("{}: {e}", path.display()))
}

/// `--server`'s value, as the result line names it.
pub(super) fn server_name(kind: ServerKind) -> String {
    kind.to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}

/// Starts the private server of `kind`. Without Valkey, the error says to
/// run `scripts/ensure-deps --tests`.
pub(super) fn start_server(kind: ServerKind) -> Result<RedisServer, CliError> {
    match kind {
        ServerKind::Redis => RedisServer::start(),
        ServerKind::ValkeyEverysec => RedisServer::start_valkey("everysec", &[]),
        ServerKind::ValkeyAlways => RedisServer::start_valkey("always", &[]),
        ServerKind::Redis8Everysec => RedisServer::start_redis8("everysec", &[]),
    }
    .map_err(|e| CliError::Usage(e.to_string()))
}

/// The workload's files: the template, and each batch's CSV file.
pub(super) struct Files {
    pub(super) template: PathBuf,
    /// The directory of the CSV files (and of nothing else).
    pub(super) recipients: PathBuf,
    /// Batch id and its recipients file, in batch order.
    batches: Vec<(String, PathBuf)>,
}

/// Writes the template (JSON, the provider's shape) and one CSV file per
/// batch, with the recipients the in-process mode appends.
fn write_workload(dir: &Path, plan: &Plan) -> Result<Files, CliError> {
    let t = bench_template();
    let template = dir.join("template.json");
    let json = serde_json::json!({"type": t.kind, "from": t.from, "text": t.text});
    std::fs::write(&template, json.to_string()).map_err(io(&template))?;
    let recipients_dir = dir.join("recipients");
    std::fs::create_dir_all(&recipients_dir).map_err(io(&recipients_dir))?;
    let mut batches = Vec::new();
    for (index, batch) in plan.batch_ids().into_iter().enumerate() {
        // `bench-7` from `7.csv`, submitted with `--batch bench`.
        let stem = batch.strip_prefix(BATCH_PREFIX).unwrap_or(&batch);
        let path = recipients_dir.join(format!("{stem}.csv"));
        let mut w = BufWriter::new(File::create(&path).map_err(io(&path))?);
        writeln!(w, "to,name").map_err(io(&path))?;
        for from in (0..plan.recipients).step_by(WRITE_ROWS) {
            let n = WRITE_ROWS.min(plan.recipients - from);
            for r in recipients(index, plan.recipients, from, n) {
                let name = r.vars.get("name").map_or("", String::as_str);
                writeln!(w, "{},{name}", r.to).map_err(io(&path))?;
            }
        }
        w.flush().map_err(io(&path))?;
        batches.push((batch, path));
    }
    Ok(Files {
        template,
        recipients: recipients_dir,
        batches,
    })
}

/// A `groupcast` child connected to `redis_url`, with none of this
/// process's `GROUPCAST_*` variables: a user's own settings would tune it.
fn groupcast(exe: &Path, redis_url: &str) -> Command {
    let mut c = Command::new(exe);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("GROUPCAST_") {
            c.env_remove(name);
        }
    }
    c.env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "bench")
        .stdin(Stdio::null());
    c
}

/// The messages of a JSON log file, in order (lines that are not JSON
/// log records are skipped).
fn log_messages(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["fields"]["message"].as_str().map(str::to_string))
        .collect()
}

/// The last lines of a log file, for an error message.
pub(super) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Default workers, started and ready.
struct Workers {
    pids: Vec<u32>,
    /// What the first worker said it waits for (its `durability:` line).
    durability: String,
}

/// Starts `plan.workers` workers with their default settings (but
/// `durability` and `rate_limit` when given), logging (at the default level, as JSON) to
/// files in `dir`, and waits until each has logged `worker started`.
async fn start_default_workers(
    exe: &Path,
    redis_url: &str,
    provider_url: &str,
    plan: &Plan,
    (durability, rate_limit): (Option<Durability>, Option<u32>),
    dir: &Path,
    procs: &mut Procs,
) -> Result<Workers, CliError> {
    let first = procs.0.len();
    let mut logs = Vec::new();
    let mut pids = Vec::new();
    for i in 0..plan.workers.max(1) {
        let log = dir.join(format!("worker-{i}.log"));
        let mut c = groupcast(exe, redis_url);
        c.args(["worker", "--metrics-listen", "off"])
            .env("GROUPCAST_PROVIDER_URL", provider_url)
            .env("GROUPCAST_PROVIDER_API_KEY", API_KEY)
            .env("GROUPCAST_PROVIDER_API_SECRET", API_SECRET)
            // The format only: the bench reads when it is ready and what
            // durability it chose.
            .env("GROUPCAST_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(File::create(&log).map_err(io(&log))?);
        if plan.group_cap != WorkerConfig::GROUP_CAP {
            c.env("GROUPCAST_GROUP_CAP", plan.group_cap.to_string());
        }
        if let Some(mode) = durability.and_then(|d| d.to_possible_value()) {
            c.env("GROUPCAST_DURABILITY", mode.get_name());
        }
        if let Some(rate) = rate_limit {
            c.env("GROUPCAST_RATE_LIMIT", rate.to_string());
        }
        let child = c
            .spawn()
            .map_err(|e| CliError::Failed(format!("cannot start a worker: {e}")))?;
        pids.push(child.id());
        procs.0.push(child);
        logs.push(log);
    }
    let deadline = Instant::now() + WORKERS_START;
    loop {
        let mut ready = 0;
        let mut durability = None;
        for log in &logs {
            let messages = log_messages(log);
            if messages.iter().any(|m| m == "worker started") {
                ready += 1;
            }
            durability = durability.or_else(|| {
                messages
                    .iter()
                    .find_map(|m| m.strip_prefix("durability: ").map(str::to_string))
            });
        }
        if ready == logs.len() {
            return Ok(Workers {
                pids,
                durability: durability.unwrap_or_default(),
            });
        }
        if let Some(e) = not_starting(&mut procs.0[first..], &logs, ready, deadline, "workers") {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While `what` (the processes `children`, logging to `logs`) start: the
/// error when one of them exited, or when the deadline passed with only
/// `ready` of them ready.
pub(super) fn not_starting(
    children: &mut [std::process::Child],
    logs: &[PathBuf],
    ready: usize,
    deadline: Instant,
    what: &str,
) -> Option<CliError> {
    for (i, c) in children.iter_mut().enumerate() {
        if let Ok(Some(status)) = c.try_wait() {
            return Some(CliError::Failed(format!(
                "{what}: {i} exited ({status}) before it was ready:\n{}",
                log_tail(&logs[i])
            )));
        }
    }
    (Instant::now() > deadline).then(|| {
        CliError::Failed(format!(
            "{ready} of {} {what} ready within {} s",
            logs.len(),
            WORKERS_START.as_secs()
        ))
    })
}

/// What one exited child used, from `wait4`.
pub(super) struct Reaped {
    pub(super) status: ExitStatus,
    /// Peak resident set, bytes.
    pub(super) max_rss_bytes: u64,
    /// User + system seconds.
    pub(super) cpu_seconds: f64,
    /// When it was reaped.
    pub(super) at: Instant,
}

/// Waits for child `pid` to exit, and reads what it used.
pub(super) fn reap(pid: u32) -> std::io::Result<Reaped> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::other(format!("pid {pid} out of range")))?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain integers and timevals: all zeroes is a
    // valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is a child of this process that nothing else waits
        // for (its `std::process::Child` is never waited); both pointers are
        // to locals that outlive the call.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Reaped {
        status: ExitStatus::from_raw(status),
        // Linux counts ru_maxrss in kilobytes.
        max_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
        cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime),
        at: Instant::now(),
    })
}

/// What one submit did and used.
struct Submitted {
    chunks: usize,
    seconds: f64,
    max_rss_bytes: u64,
    cpu_seconds: f64,
}

/// What every submit of a run shares.
struct SubmitCtx<'a> {
    exe: &'a Path,
    redis_url: &'a str,
    /// The bench's own connection, to sample memory.
    store: &'a Store,
    plan: &'a Plan,
    files: &'a Files,
    /// Where submit's stderr goes.
    log: &'a Path,
    /// When a submit still running is killed.
    deadline: Instant,
}

/// One `groupcast submit` of a batch's file (or of the directory of
/// files, `--batch` then their batches' prefix), as a user types it (plus
/// `--json`, to read how many chunks it appended: one line a batch),
/// raising `peak` with Redis' memory while it runs.
async fn submit(
    cx: &SubmitCtx<'_>,
    (batch, csv): (&str, &Path),
    peak: &mut f64,
) -> Result<Submitted, CliError> {
    let SubmitCtx {
        exe,
        redis_url,
        store,
        plan,
        files,
        log,
        deadline,
    } = *cx;
    let stderr = File::create(log).map_err(io(log))?;
    let mut child = groupcast(exe, redis_url)
        .arg("submit")
        .args(["--batch", batch, "--recipients"])
        .arg(csv)
        .arg("--template")
        .arg(&files.template)
        .args(["--chunk-size", &plan.chunk_size.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| CliError::Failed(format!("cannot start groupcast submit: {e}")))?;
    let started = Instant::now();
    let pid = child.id();
    let stdout = child.stdout.take();
    let reaped = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        if let Some(mut s) = stdout {
            let _ = s.read_to_string(&mut out);
        }
        reap(pid).map(|r| (out, r))
    });
    tokio::pin!(reaped);
    let mut killed = false;
    let (out, r) = loop {
        tokio::select! {
            r = &mut reaped => {
                break r
                    .map_err(|e| CliError::Failed(format!("waiting for submit: {e}")))?
                    .map_err(|e| CliError::Failed(format!("waiting for submit: {e}")))?;
            }
            _ = tokio::time::sleep(SAMPLE_EVERY) => {
                let sampled = used_memory(store).await;
                if let Some(m) = during("sampling Redis' memory during submit", sampled)? {
                    *peak = peak.max(m);
                }
                // Once: after it is reaped its pid may be another's.
                if !killed && Instant::now() > deadline {
                    killed = true;
                    let _ = child.kill();
                }
            }
        }
    };
    if killed {
        return Err(CliError::Failed(format!(
            "groupcast submit of {batch} was still running at --timeout-secs"
        )));
    }
    if !r.status.success() {
        return Err(CliError::Failed(format!(
            "groupcast submit of {batch} failed ({}):\n{}",
            r.status,
            log_tail(log)
        )));
    }
    let mut chunks = 0;
    for l in out.lines().filter(|l| !l.trim().is_empty()) {
        let line: serde_json::Value = serde_json::from_str(l).map_err(|e| {
            CliError::Failed(format!("groupcast submit printed {l:?}, not JSON: {e}"))
        })?;
        chunks += line["chunks"].as_u64().ok_or_else(|| {
            CliError::Failed(format!("groupcast submit printed no chunk count: {line}"))
        })?;
    }
    Ok(Submitted {
        chunks: chunks as usize,
        seconds: r.at.duration_since(started).as_secs_f64(),
        max_rss_bytes: r.max_rss_bytes,
        cpu_seconds: r.cpu_seconds,
    })
}

/// Runs the workload through `submit` and default workers; prints its line.
/// With `against`, then runs the same files through that flow too
/// (`--against`), and prints its line and the comparison.
pub(super) async fn run(
    args: &BenchArgs,
    plan: &Plan,
    against: Option<&super::bullmq::Flow>,
) -> Result<(), CliError> {
    let exe = own_exe()?;
    let dir = TempDir::new()?;
    let files = write_workload(&dir.0, plan)?;
    let server = start_server(args.server)?;
    let url = server.url();
    let store = Store::connect(&url, Keyspace::new("bench", 1)).await?;
    let mut procs = Procs(Vec::new());
    let mock_port = free_port().map_err(|e| CliError::Failed(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{mock_port}");
    let mock_pid = start_mock(&exe, mock_port, plan.group_cap, &[], &mut procs).await?;
    let workers = start_default_workers(
        &exe,
        &url,
        &base_url,
        plan,
        (args.worker_durability, args.worker_rate_limit),
        &dir.0,
        &mut procs,
    )
    .await?;

    // After the workers' start-up (their persistence probe included): the
    // run's commands only.
    let start = used_memory(&store).await?.unwrap_or(0.0);
    store.reset_stats().await?;
    let cpu_start = cpu_now(&store, &workers.pids, mock_pid).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let mut peak = start;
    let mut used = SubmitUse::default();
    let mut chunks = 0;
    let log = dir.0.join("submit.log");
    let cx = SubmitCtx {
        exe: &exe,
        redis_url: &url,
        store: &store,
        plan,
        files: &files,
        log: &log,
        deadline,
    };
    let mut submitted = BTreeMap::new();
    // One submit of the directory, or (`--submit-each`) one per file.
    let prefix = BATCH_PREFIX.trim_end_matches('-');
    let runs: Vec<(&str, &Path, Vec<&String>)> = if args.submit_each {
        files
            .batches
            .iter()
            .map(|(batch, csv)| (batch.as_str(), csv.as_path(), vec![batch]))
            .collect()
    } else {
        let all = files.batches.iter().map(|(b, _)| b).collect();
        vec![(prefix, files.recipients.as_path(), all)]
    };
    for (batch, csv, batches) in runs {
        let at = wall_ms();
        submitted.extend(batches.into_iter().map(|b| (b.clone(), at)));
        let s = submit(&cx, (batch, csv), &mut peak).await?;
        chunks += s.chunks;
        used.runs += 1;
        used.seconds += s.seconds;
        used.max_rss_bytes = used.max_rss_bytes.max(s.max_rss_bytes);
        used.cpu_seconds += s.cpu_seconds;
    }
    let left = deadline.saturating_duration_since(Instant::now()).as_secs();
    let reported = wait_for_reports(&store, plan.batches, left.max(1), &mut peak).await;
    during("waiting for the reports", reported)?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut cpu = cpu_now(&store, &workers.pids, mock_pid)
        .await?
        .since(cpu_start);
    cpu.producer = used.cpu_seconds;
    let ran = Ran {
        store,
        server,
        base_url,
        procs,
        chunks,
        wall_seconds,
        cpu,
        memory: (start, peak),
        appended: BTreeMap::new(),
        submitted,
        kind: RunKind {
            mode: "user-path",
            server: server_name(args.server),
            submit: Some(used),
            durability: Some(workers.durability),
        },
    };
    let result = conclude(plan, ran).await;
    let result = match (result, against) {
        (Ok(line), Some(flow)) => {
            super::bullmq::run(args, plan, flow, (&dir.0, &files), &line).await
        }
        (r, _) => r.map(drop),
    };
    drop(dir);
    result
}
