//! Prometheus metrics: the catalogue of every metric groupcast emits, the
//! recorder with real histogram buckets (never summaries, so that several
//! workers can be aggregated with `sum by (le)`), upkeep so that histogram
//! samples are drained even when nobody scrapes, and an HTTP listener that
//! answers `GET /metrics` and nothing else.
//!
//! [`METRICS`] is the single list: [`describe`] registers its help texts,
//! [`install`] its histogram buckets, `docs/observability.md` documents it
//! and `rigs/tests/metrics.rs` scrapes a worker to check that what it emits and
//! the catalogue agree.
//!
//! Where the values come from:
//! - counters and histograms are recorded on the path that does the work
//!   (script replies, provider calls, settling an entry);
//! - stream gauges are sampled from `XINFO`/`XLEN`/`ZCARD` by the promote
//!   role every `gauge_interval` ([`crate::worker::maintenance`]), never on
//!   the per-chunk path;
//! - batch gauges come from the watchdog's scan ([`crate::worker::watchdog`]).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// What kind of Prometheus metric an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (reset on restart); named `*_total`.
    Counter,
    /// A sampled value.
    Gauge,
    /// Observations in cumulative buckets (`*_bucket{le}`, `*_sum`, `*_count`).
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Its label names.
    pub labels: &'static [&'static str],
    /// The help text.
    pub help: &'static str,
    /// Bucket upper bounds, for histograms.
    pub buckets: &'static [f64],
}

const fn counter(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        labels,
        help,
        buckets: &[],
    }
}

const fn gauge(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        labels,
        help,
        buckets: &[],
    }
}

const fn histogram(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
    buckets: &'static [f64],
) -> Metric {
    Metric {
        name,
        kind: Kind::Histogram,
        labels,
        help,
        buckets,
    }
}

/// Buckets for any histogram not in the catalogue, in seconds (so that an
/// undeclared histogram is still a histogram, never a summary).
pub(crate) const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// Provider request latency buckets, in seconds: a fast answer to a timeout.
pub(crate) const PROVIDER_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Rate limiter wait buckets, in seconds: no wait to a long queue.
pub(crate) const LIMITER_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Batch duration buckets, in seconds: a test batch to a day-long campaign.
pub(crate) const BATCH_BUCKETS: &[f64] = &[
    0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
    86400.0,
];

/// Every metric groupcast emits.
pub const METRICS: &[Metric] = &[
    counter(
        "groupcast_events_appended_total",
        &["type"],
        "Events appended to batch logs, by event type",
    ),
    counter(
        "groupcast_chunks_total",
        &["outcome"],
        "Ingest chunks by what happened to them: accepted, duplicate, parked, loaded, rejected, refused (their batch had ended), given_up",
    ),
    counter(
        "groupcast_accept_behind_total",
        &[],
        "Accepts asked again because another process had appended to the batch's number log (its dedupe) since this one read it",
    ),
    counter(
        "groupcast_recipients_registered_total",
        &[],
        "Recipients registered at the provider, counted once per loaded chunk",
    ),
    counter(
        "groupcast_recipients_failed_total",
        &[],
        "Recipients the provider refused at registration, counted once per loaded chunk",
    ),
    counter(
        "groupcast_recipients_duplicate_total",
        &[],
        "Copies of a number a batch already had: recorded, not sent",
    ),
    counter(
        "groupcast_provider_requests_total",
        &["endpoint", "status"],
        "Provider HTTP requests, by endpoint and HTTP status (`error`: no answer)",
    ),
    histogram(
        "groupcast_provider_request_duration_seconds",
        &["endpoint"],
        "Provider HTTP request latency, by endpoint",
        PROVIDER_BUCKETS,
    ),
    histogram(
        "groupcast_rate_limiter_wait_seconds",
        &["lane"],
        "Time spent waiting for the shared provider rate limiter, by priority lane",
        LIMITER_BUCKETS,
    ),
    counter(
        "groupcast_rate_limiter_given_back_total",
        &["lane"],
        "Requests the rate limiter turned away (the wait was past the lane's horizon): entry given back, by priority lane",
    ),
    counter(
        "groupcast_rate_limiter_lapsed_total",
        &["lane"],
        "Slots a worker booked ahead for its next requests that no request took in time: they lapse unused, by priority lane",
    ),
    gauge(
        "groupcast_rate_limit_per_second",
        &[],
        "Provider requests per second this worker keeps to: the fixed --rate-limit, or under auto the rate learned from the provider's 429s (0: no pace)",
    ),
    counter(
        "groupcast_work_items_total",
        &["op", "outcome"],
        "Work items run, by op and outcome (done, retry, dead)",
    ),
    counter(
        "groupcast_retries_total",
        &["op", "reason"],
        "Retries scheduled, by op and reason (transient, rate_limited, not_finished, webhook, durability, limiter)",
    ),
    counter(
        "groupcast_dead_letters_total",
        &["stream"],
        "Entries dead-lettered, by the stream they came from",
    ),
    counter(
        "groupcast_reclaimed_total",
        &["stream"],
        "Entries taken over from consumers idle past the visibility timeout",
    ),
    counter(
        "groupcast_reclaimed_trimmed_total",
        &["stream"],
        "Pending entries found already trimmed away when reclaiming",
    ),
    counter(
        "groupcast_entries_left_pending_total",
        &["stream"],
        "Entries left pending for reclaim after a Redis failure",
    ),
    counter(
        "groupcast_sends_refused_total",
        &[],
        "Sends refused because the provider's count and our events disagreed",
    ),
    counter(
        "groupcast_send_claims_given_back_total",
        &[],
        "Send claims given back: a retried send found the batch held by its schedule",
    ),
    counter(
        "groupcast_send_claims_expired_total",
        &[],
        "Sends that could not start within their claim's lifetime and claimed again",
    ),
    counter(
        "groupcast_groups_sent_total",
        &["outcome"],
        "Groups sent, by outcome (sent, already_sent)",
    ),
    counter(
        "groupcast_batches_reported_total",
        &[],
        "Batches whose report was decided",
    ),
    counter(
        "groupcast_recipients_delivered_total",
        &[],
        "Messages the provider reports delivered (delivery tracking)",
    ),
    counter(
        "groupcast_recipients_delivery_failed_total",
        &["code"],
        "Messages whose delivery failed, by the provider's code (delivery tracking)",
    ),
    counter(
        "groupcast_recipients_unknown_total",
        &[],
        "Messages without a delivery result when their delivery window ended",
    ),
    counter(
        "groupcast_delivery_reports_total",
        &[],
        "Batches whose delivery report was decided",
    ),
    histogram(
        "groupcast_fsync_wait_seconds",
        &[],
        "Time an add or send waited for WAITAOF to confirm the events it relies on (--durability waitaof/auto)",
        LIMITER_BUCKETS,
    ),
    counter(
        "groupcast_redis_writes_lost_total",
        &[],
        "Acknowledged events found missing when read back: Redis lost writes (alert on any)",
    ),
    counter(
        "groupcast_acks_withheld_total",
        &[],
        "Settled entries left pending because the last event their handling appended was gone: Redis lost acknowledged writes; they are handled again",
    ),
    counter(
        "groupcast_batch_stalls_total",
        &[],
        "Stalls recorded by the watchdog (one per stall of a batch)",
    ),
    histogram(
        "groupcast_batch_duration_seconds",
        &[],
        "Time from a batch's first accepted chunk to its report",
        BATCH_BUCKETS,
    ),
    gauge(
        "groupcast_worker_in_flight",
        &["stream"],
        "Entries being handled by this process, by stream (ingest, work)",
    ),
    gauge(
        "groupcast_stream_length",
        &["stream", "shard", "lane"],
        "Entries in a stream (ingest, work, dlq, reports), by priority lane (`normal` for dlq and reports), sampled",
    ),
    gauge(
        "groupcast_stream_pending",
        &["stream", "shard", "group", "lane"],
        "Entries delivered to a consumer group but not acknowledged, by priority lane, sampled",
    ),
    gauge(
        "groupcast_stream_lag",
        &["stream", "shard", "group", "lane"],
        "Entries not yet delivered to a consumer group, by priority lane, sampled",
    ),
    gauge(
        "groupcast_delayed_retries",
        &["shard"],
        "Work entries waiting for a delayed retry, sampled",
    ),
    gauge(
        "groupcast_batches_in_flight",
        &[],
        "Batches accepted and not yet reported (0 on workers not holding the watchdog lease)",
    ),
    gauge(
        "groupcast_batches_stalled",
        &[],
        "Batches quiet past the stall threshold (0 on workers not holding the watchdog lease)",
    ),
];

/// The catalogue entry of `name`.
pub fn find(name: &str) -> Option<&'static Metric> {
    METRICS.iter().find(|m| m.name == name)
}

/// Why the recorder could not be installed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot install the Prometheus recorder: {0}")]
pub struct InstallError(String);

/// How often histogram samples are drained when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the global recorder (once per process; later calls return the
/// same handle or the same error), registers the help texts and starts the
/// upkeep. Works inside or outside a tokio runtime: the upkeep runs on its
/// own thread, so it outlives the runtime that happened to install it.
pub fn install() -> Result<PrometheusHandle, InstallError> {
    static HANDLE: OnceLock<Result<PrometheusHandle, InstallError>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let err = |e: &dyn std::fmt::Display| InstallError(e.to_string());
            let mut builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .map_err(|e| err(&e))?;
            for m in METRICS.iter().filter(|m| m.kind == Kind::Histogram) {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(m.name.to_string()), m.buckets)
                    .map_err(|e| err(&e))?;
            }
            let handle = builder.install_recorder().map_err(|e| err(&e))?;
            describe();
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                })
                .map_err(|e| err(&e))?;
            Ok(handle)
        })
        .clone()
}

/// The content type of the text exposition format.
pub(crate) const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `GET /metrics` on `addr` in a background task (every other path
/// answers 404) and returns the bound address (port 0 picks a free one).
pub async fn serve(addr: SocketAddr, handle: PrometheusHandle) -> std::io::Result<SocketAddr> {
    serve_on(tokio::net::TcpListener::bind(addr).await?, handle)
}

/// [`serve`] on a listener already bound (the worker binds it itself, to
/// try the next port when the default one is taken).
pub(crate) fn serve_on(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
) -> std::io::Result<SocketAddr> {
    let local = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let h = handle.clone();
            async move { ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], h.render()) }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(local)
}

/// The label values a metric's series start with at [`zero`]: the known
/// values of each label (`shard`: every shard). Empty for a label whose
/// values are not known in advance.
fn initial_values(metric: &str, label: &str, shards: u32) -> Vec<String> {
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    match (metric, label) {
        (_, "shard") => (0..shards).map(|s| s.to_string()).collect(),
        ("groupcast_stream_length", "stream") => strs(&["ingest", "work", "dlq", "reports"]),
        (_, "stream") => strs(&["ingest", "work"]),
        (_, "type") => strs(crate::events::Event::TYPE_NAMES),
        (_, "lane") => strs(&crate::keys::Priority::ALL.map(|p| p.name())),
        ("groupcast_chunks_total", "outcome") => strs(&[
            "accepted",
            "duplicate",
            "parked",
            "loaded",
            "rejected",
            "refused",
            "after_end",
            "given_up",
            "stale",
        ]),
        ("groupcast_work_items_total", "outcome") => strs(&["done", "retry", "dead"]),
        ("groupcast_groups_sent_total", "outcome") => strs(&["sent", "already_sent"]),
        (_, "op") => crate::events::work_item::Op::ALL
            .iter()
            .map(|op| op.name().to_string())
            .collect(),
        // The delivery failures the provider documents most (no KakaoTalk,
        // no KakaoTalk use in 72 h, phone off, spam): others appear as they
        // come.
        ("groupcast_recipients_delivery_failed_total", "code") => {
            strs(&["3104", "3107", "3043", "3054"])
        }
        (_, "reason") => strs(&[
            "transient",
            "rate_limited",
            "not_finished",
            "webhook",
            "durability",
        ]),
        (_, "endpoint") => strs(&["create", "add", "get", "send", "delete"]),
        // A request that succeeded: 0 of them yet.
        (_, "status") => strs(&["200"]),
        _ => Vec::new(),
    }
}

/// The label sets a metric starts with: the product of its labels' known
/// values; a consumer group goes with its stream (`loaders` reads ingest,
/// `operators` reads work).
fn initial_series(m: &Metric, shards: u32) -> Vec<Vec<metrics::Label>> {
    let mut sets: Vec<Vec<metrics::Label>> = vec![Vec::new()];
    for label in m.labels {
        if *label == "group" {
            continue;
        }
        let values = initial_values(m.name, label, shards);
        sets = sets
            .into_iter()
            .flat_map(|set| {
                values.iter().map(move |v| {
                    let mut s = set.clone();
                    s.push(metrics::Label::new(*label, v.clone()));
                    s
                })
            })
            .collect();
    }
    // Only ingest and work streams have lanes.
    sets.retain(|set| {
        let value = |k: &str| set.iter().find(|l| l.key() == k).map(|l| l.value());
        !matches!(value("stream"), Some("dlq" | "reports")) || value("lane") == Some("normal")
    });
    if m.labels.contains(&"group") {
        sets.retain_mut(|set| {
            let group = match set.iter().find(|l| l.key() == "stream").map(|l| l.value()) {
                Some("ingest") => crate::keys::LOADERS_GROUP,
                Some("work") => crate::keys::OPERATORS_GROUP,
                _ => return false,
            };
            set.push(metrics::Label::new("group", group));
            true
        });
    }
    sets
}

/// Creates every series of [`METRICS`] that can be named in advance, at
/// zero (histograms empty), so that every family exists from start-up: a
/// dashboard panel or an alert reads 0, not "No data", until the first
/// event. Gauges are only incremented by 0, so a value already sampled
/// stays. `shards`: how many shards the deployment has.
pub fn zero(shards: u32) {
    for m in METRICS {
        for labels in initial_series(m, shards) {
            match m.kind {
                Kind::Counter => metrics::counter!(m.name, labels).increment(0),
                Kind::Gauge => metrics::gauge!(m.name, labels).increment(0.0),
                Kind::Histogram => {
                    let _ = metrics::histogram!(m.name, labels);
                }
            }
        }
    }
}

/// Registers the help text of every metric in [`METRICS`] with the installed
/// recorder ([`install`] calls it).
pub fn describe() {
    for m in METRICS {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => {
                metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_follows_prometheus_naming() {
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} listed twice", m.name);
            assert!(m.name.starts_with("groupcast_"), "{}", m.name);
            assert!(
                m.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{} is not snake_case",
                m.name
            );
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                Kind::Gauge => assert!(!m.name.ends_with("_total"), "{}", m.name),
                Kind::Histogram => {
                    assert!(m.name.ends_with("_seconds"), "{}", m.name);
                    assert!(!m.buckets.is_empty(), "{} has no buckets", m.name);
                    assert!(
                        m.buckets.windows(2).all(|w| w[0] < w[1]),
                        "{} buckets not increasing",
                        m.name
                    );
                }
            }
        }
        // Every metric starts with at least one series, and every label of
        // it has a value in each.
        for m in METRICS {
            let sets = initial_series(m, 2);
            assert!(!sets.is_empty(), "{} starts with no series", m.name);
            for set in &sets {
                let keys: Vec<&str> = set.iter().map(|l| l.key()).collect();
                assert_eq!(keys.len(), m.labels.len(), "{}: {keys:?}", m.name);
            }
        }
        // A gauge `x` next to a counter `x_total` is one family in OpenMetrics.
        for m in METRICS.iter().filter(|m| m.kind == Kind::Counter) {
            let family = m.name.trim_end_matches("_total");
            assert!(find(family).is_none(), "{family} clashes with {}", m.name);
        }
    }
}
