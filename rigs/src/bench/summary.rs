//! What the counters say: CPU from `/proc` and `INFO`, commands per name,
//! the latencies in a batch's events, the broken rules, and the JSON line a
//! run prints.

use std::collections::BTreeMap;

use serde_json::json;

use super::workload::Plan;
use crate::mock::invariants::LedgerCheck;
use groupcast::events::{Event, Recorded};

/// CPU seconds (user + system) in a `/proc/<pid>/stat` line.
pub(super) fn cpu_seconds_in_stat(stat: &str) -> f64 {
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

/// CPU seconds (user + system) of a live process, from /proc.
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(0.0, |s| cpu_seconds_in_stat(&s))
}

/// A numeric `name:value` line of `INFO`.
pub(super) fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// Redis's CPU seconds (user + system), from `INFO cpu`.
pub(super) fn redis_cpu_seconds(info: &str) -> f64 {
    info_field(info, "used_cpu_user").unwrap_or(0.0)
        + info_field(info, "used_cpu_sys").unwrap_or(0.0)
}

/// Calls per command (scripts' inner commands included, as Redis counts
/// them), from `INFO commandstats`, excluding INFO itself.
pub(super) fn commands_by_name(info: &str) -> BTreeMap<String, u64> {
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

/// CPU seconds (user + system) used by each party.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct CpuSeconds {
    pub(super) workers: f64,
    pub(super) redis: f64,
    pub(super) mock: f64,
    /// The producer: this process (and the bench's own reads), or the
    /// `groupcast submit` processes of a `--user-path` run.
    pub(super) producer: f64,
}

impl CpuSeconds {
    /// What was used between `start` and `self`.
    pub(super) fn since(self, start: CpuSeconds) -> CpuSeconds {
        CpuSeconds {
            workers: self.workers - start.workers,
            redis: self.redis - start.redis,
            mock: self.mock - start.mock,
            producer: self.producer - start.producer,
        }
    }

    /// The shortest wall time this CPU could have taken on two cores: half
    /// of all of it, and no less than the mock's (one process).
    pub(super) fn wall_bound(self) -> f64 {
        self.mock
            .max((self.workers + self.redis + self.mock + self.producer) / 2.0)
    }
}

/// One key's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeySize {
    pub(super) key: String,
    pub(super) bytes: u64,
}

/// The `n` biggest keys, biggest first (keys of one size in their order).
pub(super) fn largest_keys(mut sizes: Vec<KeySize>, n: usize) -> Vec<KeySize> {
    sizes.sort_by_key(|k| std::cmp::Reverse(k.bytes));
    sizes.truncate(n);
    sizes
}

/// Redis memory over the run, in bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct MemoryUse {
    /// `used_memory` before producing.
    pub(super) start: f64,
    /// The highest `used_memory` seen while producing and waiting.
    pub(super) peak: f64,
    /// `used_memory` once the streams are trimmed and every client but one gone.
    pub(super) end: f64,
    /// The batches' state and events, as `MEMORY USAGE` counts them.
    pub(super) retained_event_bytes: u64,
    /// `used_memory_scripts` at the end.
    pub(super) scripts: u64,
    /// The biggest keys at the end.
    pub(super) largest_keys: Vec<KeySize>,
    /// `MEMORY STATS` at the end.
    pub(super) stats_end: serde_json::Map<String, serde_json::Value>,
    /// What the batch-wide dedupe keeps in Redis per recipient of a batch
    /// in flight (a probe batch of the workload's size, measured just
    /// before its report would release it).
    pub(super) dedupe_bytes_per_recipient: f64,
    /// What the per-recipient outcomes keep in Redis per recipient of a
    /// batch of the workload's size with 5 % failures (a probe).
    pub(super) results_bytes_per_recipient: f64,
}

/// Milliseconds between the events the result line reports on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Latencies {
    /// From a chunk's append to its `chunk_loaded`.
    pub(super) submit_to_loaded_ms: Vec<u64>,
    /// From a generation's `generation_ready` to its `send_triggered`.
    pub(super) complete_to_send_ms: Vec<u64>,
    /// When each batch passed each stage.
    pub(super) stages: Vec<BatchStages>,
}

/// When a batch passed each stage on its way from submit to report, in ms
/// since the epoch (its events' Redis clock; `submitted` the bench's own
/// clock on the same machine). Each stage is when the *last* of the batch's
/// chunks or generations passed it (the first, for `accepted`): a batch is
/// as late as its slowest part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BatchStages {
    /// Its first chunk appended (in-process) or its `submit` started.
    pub(super) submitted: Option<u64>,
    /// Its first chunk accepted (`chunk_assigned`).
    pub(super) accepted: Option<u64>,
    /// Its last generation's group recorded (`group_created`).
    pub(super) group_recorded: Option<u64>,
    /// Its last chunk loaded into its group (`chunk_loaded`).
    pub(super) loaded: Option<u64>,
    /// Its last generation sent (`send_triggered`).
    pub(super) sent: Option<u64>,
    /// Its last group finished at the provider (`group_completed`).
    pub(super) completed: Option<u64>,
    /// Its report decided (`batch_reported`).
    pub(super) reported: Option<u64>,
}

/// The stages' names, in the order a batch passes them, for the result line.
pub(super) const STAGES: [&str; 7] = [
    "submitted",
    "accepted",
    "group_recorded",
    "loaded",
    "sent",
    "completed",
    "reported",
];

impl BatchStages {
    /// The stages' instants in [`STAGES`] order.
    fn instants(&self) -> [Option<u64>; 7] {
        [
            self.submitted,
            self.accepted,
            self.group_recorded,
            self.loaded,
            self.sent,
            self.completed,
            self.reported,
        ]
    }

    /// A batch's stages, from its events.
    pub(super) fn of(submitted: Option<u64>, events: &[Recorded]) -> BatchStages {
        let mut s = BatchStages {
            submitted,
            ..BatchStages::default()
        };
        let latest = |slot: &mut Option<u64>, ms: u64| *slot = Some(slot.map_or(ms, |t| t.max(ms)));
        for r in events {
            let ms = r.millis();
            match &r.event {
                Event::ChunkAssigned(_) => {
                    s.accepted = Some(s.accepted.map_or(ms, |t| t.min(ms)));
                }
                Event::GroupCreated(_) => latest(&mut s.group_recorded, ms),
                Event::ChunkLoaded(_) => latest(&mut s.loaded, ms),
                Event::SendTriggered(_) => latest(&mut s.sent, ms),
                Event::GroupCompleted(_) => latest(&mut s.completed, ms),
                Event::BatchReported(_) => latest(&mut s.reported, ms),
                _ => {}
            }
        }
        s
    }
}

/// For each step between two stages (and for the whole way), the batches'
/// p50 and p99 in ms: `{"submitted_to_accepted": {"p50": .., "p99": ..}, ...,
/// "submitted_to_reported": ...}`. A step a batch did not pass both ends of
/// is not counted for it.
pub(super) fn stage_breakdown(stages: &[BatchStages]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    let mut step = |name: String, mut ms: Vec<u64>| {
        ms.sort_unstable();
        let v = if ms.is_empty() {
            serde_json::Value::Null
        } else {
            json!({"p50": percentile(&ms, 0.5), "p99": percentile(&ms, 0.99), "batches": ms.len()})
        };
        out.insert(name, v);
    };
    for i in 0..STAGES.len() - 1 {
        let ms = stages
            .iter()
            .filter_map(|s| {
                let t = s.instants();
                Some(t[i + 1]?.saturating_sub(t[i]?))
            })
            .collect();
        step(format!("{}_to_{}", STAGES[i], STAGES[i + 1]), ms);
    }
    let whole = stages
        .iter()
        .filter_map(|s| Some(s.reported?.saturating_sub(s.submitted?)))
        .collect();
    step("submitted_to_reported".into(), whole);
    serde_json::Value::Object(out)
}

impl Latencies {
    /// Adds one batch's, from its events; `appended` holds when each of its
    /// chunks was appended (the ingest entry id's milliseconds), by seq.
    pub(super) fn add_batch(
        &mut self,
        appended: &BTreeMap<u32, u64>,
        submitted: Option<u64>,
        events: &[Recorded],
    ) {
        let first_append = appended.values().min().copied();
        self.stages
            .push(BatchStages::of(submitted.or(first_append), events));
        let mut ready: BTreeMap<u32, u64> = BTreeMap::new();
        for r in events {
            match &r.event {
                Event::ChunkLoaded(e) => {
                    if let Some(t) = appended.get(&e.seq) {
                        self.submit_to_loaded_ms.push(r.millis().saturating_sub(*t));
                    }
                }
                Event::GenerationReady(e) => {
                    ready.insert(e.gen, r.millis());
                }
                Event::SendTriggered(e) => {
                    if let Some(t) = ready.get(&e.gen) {
                        self.complete_to_send_ms.push(r.millis().saturating_sub(*t));
                    }
                }
                _ => {}
            }
        }
    }
}

/// The value at fraction `p` of sorted values (0 for none).
pub(super) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A check `verify` found broken in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FailedCheck {
    pub(super) batch: String,
    pub(super) invariant: u8,
    pub(super) detail: String,
}

/// Every broken rule: the batches' failed checks, the ledger's own rules,
/// and recipients the provider did not register.
pub(super) fn violations(
    failed: &[FailedCheck],
    ledger: &LedgerCheck,
    recipients: u64,
) -> Vec<String> {
    let mut out: Vec<String> = failed
        .iter()
        .map(|c| format!("{}: invariant {}: {}", c.batch, c.invariant, c.detail))
        .collect();
    out.extend(ledger.violations.iter().cloned());
    let registered: u64 = ledger.registered.values().sum();
    if registered != recipients {
        out.push(format!(
            "{registered} of {recipients} recipients registered at the provider"
        ));
    }
    out
}

/// What one run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Measured {
    /// Chunks appended.
    pub(super) chunks: usize,
    /// From the first append to the last report.
    pub(super) wall_seconds: f64,
    pub(super) cpu: CpuSeconds,
    /// Calls per command, as [`commands_by_name`] reads them.
    pub(super) commands: BTreeMap<String, u64>,
    pub(super) memory: MemoryUse,
    pub(super) latencies: Latencies,
    /// Whether nothing broke.
    pub(super) verified: bool,
    /// How the run was made.
    pub(super) kind: RunKind,
}

/// How a run was made: by this process appending to a server it started,
/// or by `groupcast submit` and default workers on a server of a kind.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RunKind {
    /// `in-process` or `user-path`.
    pub(super) mode: &'static str,
    /// The server's kind, as `--server` names it.
    pub(super) server: String,
    /// The submits', when `groupcast submit` produced.
    pub(super) submit: Option<SubmitUse>,
    /// What the workers said they wait for at start (their `durability:`
    /// line), when they were started with the default `--durability auto`.
    pub(super) durability: Option<String>,
}

impl Default for RunKind {
    fn default() -> RunKind {
        RunKind::in_process()
    }
}

impl RunKind {
    /// This process appends, the workers tuned for throughput, on `redis`.
    pub(super) fn in_process() -> RunKind {
        RunKind {
            mode: "in-process",
            server: "redis".into(),
            submit: None,
            durability: None,
        }
    }
}

/// What the `groupcast submit` processes of a run used, together.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct SubmitUse {
    /// How many `groupcast submit` processes ran.
    pub(super) runs: usize,
    /// Their wall time, summed (they run one after the other).
    pub(super) seconds: f64,
    /// The largest peak resident set of any of them, in bytes.
    pub(super) max_rss_bytes: u64,
    /// Their CPU seconds (user + system), summed.
    pub(super) cpu_seconds: f64,
}

pub(super) fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The JSON line a run prints.
pub(super) fn result_line(plan: &Plan, m: &Measured) -> serde_json::Value {
    let total = plan.total_recipients();
    let wall = m.wall_seconds;
    let commands: u64 = m.commands.values().sum();
    let mut loaded = m.latencies.submit_to_loaded_ms.clone();
    loaded.sort_unstable();
    // Chunks appended by `submit` have no append time here: none measured.
    let loaded_at = |p: f64| (!loaded.is_empty()).then(|| percentile(&loaded, p));
    let submit = m.kind.submit;
    let mut send = m.latencies.complete_to_send_ms.clone();
    send.sort_unstable();
    let largest: Vec<serde_json::Value> = m
        .memory
        .largest_keys
        .iter()
        .map(|k| json!([k.key, k.bytes]))
        .collect();
    json!({
        "mode": m.kind.mode,
        "server": m.kind.server,
        "workload": plan.name,
        "recipients": total,
        "chunks": m.chunks,
        "batches": plan.batches,
        "group_cap": plan.group_cap,
        "workers": plan.workers,
        "wall_seconds": round(wall),
        "recipients_per_second": (total as f64 / wall).round(),
        "worker_cpu_seconds": round(m.cpu.workers),
        "worker_cpu_seconds_per_million": round(m.cpu.workers / (total as f64 / 1e6)),
        "redis_cpu_seconds": round(m.cpu.redis),
        "redis_commands": commands,
        "redis_commands_per_chunk": round(commands as f64 / m.chunks as f64),
        "redis_commands_by_name": m.commands,
        "mock_cpu_seconds": round(m.cpu.mock),
        "producer_cpu_seconds": round(m.cpu.producer),
        "wall_over_bound": round(wall / m.cpu.wall_bound()),
        "redis_used_memory_start": m.memory.start as u64,
        "redis_used_memory_peak": m.memory.peak as u64,
        "redis_used_memory_end": m.memory.end as u64,
        "retained_event_bytes": m.memory.retained_event_bytes,
        "redis_used_memory_scripts": m.memory.scripts,
        "largest_keys_end": largest,
        "redis_memory_stats_end": m.memory.stats_end,
        "dedupe_bytes_per_recipient": round(m.memory.dedupe_bytes_per_recipient),
        "results_bytes_per_recipient": round(m.memory.results_bytes_per_recipient),
        "submit_seconds": submit.map(|s| round(s.seconds)),
        "submit_runs": submit.map(|s| s.runs),
        "submit_max_rss_mb": submit.map(|s| round(s.max_rss_bytes as f64 / (1024.0 * 1024.0))),
        "worker_durability": m.kind.durability,
        "submit_to_loaded_ms_p50": loaded_at(0.5),
        "submit_to_loaded_ms_p99": loaded_at(0.99),
        "complete_to_send_ms_p50": percentile(&send, 0.5),
        "complete_to_send_ms_p99": percentile(&send, 0.99),
        "stages_ms": stage_breakdown(&m.latencies.stages),
        "verified": m.verified,
    })
}
