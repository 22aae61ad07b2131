//! Metrics end to end: a worker runs a batch (with provider errors, a stall
//! and a rejected chunk, so that retries, stalls and dead letters are emitted
//! too), serves `/metrics`, `promtool` accepts the exposition, a real
//! Prometheus scrapes it and answers the batch's registered count, every
//! metric the Grafana dashboard queries is one the worker emitted, and the
//! emitted metrics and the catalogue ([`METRICS`]) agree both ways.
//!
//! The metrics recorder is global per process: every test that needs it is
//! in this binary, and only one test (the scrape test) installs and reads it.
//! The other tests here only read files.
//!
//! Needs `prometheus` and `promtool` (Debian: `apt-get install prometheus`);
//! without them the tests fail and say so.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use groupcast::events::Event;
use groupcast::metrics::{Kind, METRICS};
use groupcast::producer::append_chunks;
use groupcast::worker::WorkerConfig;
use groupcast_rigs::mock::Faults;

const INSTALL: &str = "apt-get install prometheus";

/// The workspace's root (this test is the rigs package's).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The catalogued metrics that the scraped run does not provoke (or not
/// every time), with what emits them.
const NOT_PROVOKED: &[(&str, &str)] = &[
    (
        "groupcast_rate_limiter_given_back_total",
        "more requests in flight than a lane's limiter horizon holds (tests/lanes.rs)",
    ),
    (
        "groupcast_rate_limiter_lapsed_total",
        "a pause in a lane's requests longer than its slots booked ahead last (50 ms below the burst), seen at the lane's next booking: this run may or may not make one",
    ),
    (
        "groupcast_reclaimed_total",
        "a consumer that stops with entries pending past the visibility timeout",
    ),
    (
        "groupcast_reclaimed_trimmed_total",
        "a pending entry trimmed away before it is reclaimed",
    ),
    (
        "groupcast_entries_left_pending_total",
        "Redis failing while an entry is settled",
    ),
    (
        "groupcast_sends_refused_total",
        "the provider's registered count disagreeing with our events",
    ),
    (
        "groupcast_send_claims_given_back_total",
        "a claimed send retried into quiet hours or before send_at (rigs/tests/liveness/claim.rs)",
    ),
    (
        "groupcast_send_claims_expired_total",
        "a send whose limiter or durability wait outlasts its claim's lifetime (rigs/tests/liveness/claim.rs)",
    ),
    (
        "groupcast_accept_behind_total",
        "two workers accepting chunks of one batch at the same moment, one appending to the number log after the other read it: this run may or may not make one (tests/conformance.rs)",
    ),
    (
        "groupcast_fsync_wait_seconds",
        "a server with WAITAOF and appendfsync everysec (the scraped run's has no AOF)",
    ),
    (
        "groupcast_redis_writes_lost_total",
        "Redis losing acknowledged writes (a restart without its log)",
    ),
    (
        "groupcast_recipients_delivery_failed_total",
        "a message whose delivery fails (rigs/tests/delivery.rs)",
    ),
    (
        "groupcast_recipients_delivered_total",
        "delivery tracking, which runs after the report: the scrape may come first",
    ),
    (
        "groupcast_recipients_unknown_total",
        "delivery tracking, which runs after the report: the scrape may come first",
    ),
    (
        "groupcast_delivery_reports_total",
        "delivery tracking, which runs after the report: the scrape may come first",
    ),
    (
        "groupcast_acks_withheld_total",
        "Redis losing acknowledged writes between an event and its entry's acknowledgement",
    ),
];

/// Fails the test, saying how to install the tool, when `tool` is missing.
fn require(tool: &str) {
    match Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) => panic!("`{tool}` is needed by this test and cannot be run ({e}): {INSTALL}"),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A private Prometheus scraping one target; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        require("prometheus");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n\
                 scrape_configs:\n  - job_name: groupcast\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write the scrape config");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus ({e}): {INSTALL}"));
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: `Ok(result array)`, or the error Prometheus gave.
    async fn query(&self, http: &reqwest::Client, q: &str) -> Result<serde_json::Value, String> {
        let r = http
            .get(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| format!("prometheus not answering: {e}"))?;
        let body: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{q}: {body}"));
        }
        Ok(body["data"]["result"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `promtool check metrics` on an exposition; returns its verdict.
fn promtool_check_metrics(exposition: &str) -> (bool, String) {
    require("promtool");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}): {INSTALL}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Metric families in an exposition, by `# TYPE` line: name → type.
fn families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.trim().to_string()))
        .collect()
}

/// Every `groupcast_*` identifier in a PromQL expression.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("groupcast_") {
        let start = i + at;
        let boundary =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The metric family a series name belongs to, given the known families:
/// `x_bucket`, `x_sum` and `x_count` of a histogram `x` are `x`.
fn family_of(series: &str, known: &BTreeMap<String, String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix) {
            if known.get(base).map(String::as_str) == Some("histogram") {
                return base.to_string();
            }
        }
    }
    series.to_string()
}

/// Every `expr` in the dashboard JSON (panels, nested rows, targets).
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let path = root().join("grafana/dashboards/groupcast.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let json: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    walk(&json, &mut out);
    out
}

/// Every `expr` of the alert rules.
fn alert_exprs() -> Vec<String> {
    let rules = std::fs::read_to_string(root().join("grafana/alerts.yml")).expect("alerts.yml");
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:").map(|e| e.trim().to_string()))
        .collect()
}

/// A dashboard expression with Grafana's variables put in, for Prometheus.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m")
}

async fn wait_for<T>(
    limit: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Option<T>,
    detail: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}\n{}",
            detail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scraped_batch_adds_up_in_prometheus_and_the_dashboard_uses_only_emitted_metrics() {
    // Fail early, before any work, when the tools are missing.
    require("prometheus");
    require("promtool");
    let handle = groupcast::metrics::install().expect("install the recorder");
    let metrics_addr =
        groupcast::metrics::serve("127.0.0.1:0".parse().expect("addr"), handle.clone())
            .await
            .expect("serve /metrics");

    let config = WorkerConfig {
        rate_limit: groupcast::worker::RateLimit::PerSecond(100_000),
        rate_burst: 1_000,
        stall_after: Duration::from_millis(300),
        watchdog_interval: Duration::from_millis(100),
        gauge_interval: Duration::from_millis(200),
        ..test_config()
    };
    let rig = Rig::start(1, config, mock_config()).await;
    let batch = "scraped".to_string();
    let mut chunks = shuffled_chunks(&batch, 3, 2_000, 250, 11);
    // One number in two chunks (every copy of seq 0 gets seq 1's first
    // number): sent once, counted as a duplicate.
    let copy = chunks
        .iter()
        .find(|c| c.seq == 1)
        .map(|c| c.recipients[0].clone())
        .expect("seq 1");
    for c in chunks.iter_mut().filter(|c| c.seq == 0) {
        c.recipients.push(copy.clone());
    }
    // A chunk that can never be accepted (an unknown message type): it is
    // rejected and dead-lettered.
    let mut bad = groupcast::producer::cut("rejected", &template(), recipients(4, 3), 10);
    bad[0].template.kind = "FAX".into();
    // The provider hangs for a moment just as the batch starts (a stall the
    // watchdog records), then answers more than 5 requests a second with 429
    // (retries, deterministically) and some requests with 500.
    rig.mock.set_faults(Faults {
        stall_ms: 1_500,
        rate_limit_per_sec: Some(5),
        retry_after_secs: 1,
        error_rate: 0.05,
        ..Faults::default()
    });
    append_chunks(&rig.store, &chunks).await.expect("append");
    append_chunks(&rig.store, &bad).await.expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    let state = rig.store.batch(&batch).state().await.expect("state");
    let registered = state.int("registered");
    assert_eq!(registered, 2_000);
    // The other batch's only chunk (flagged last) was refused: it waits for
    // a corrected copy until an operator closes it; then it reports too.
    let refused = "rejected".to_string();
    rig.store
        .batch(&refused)
        .close("its only chunk was refused")
        .await
        .expect("close");
    rig.wait_reported(std::slice::from_ref(&refused), Duration::from_secs(30))
        .await;
    let mut stall_events = 0;
    for b in [&batch, &refused] {
        stall_events += rig
            .store
            .batch(b)
            .events()
            .await
            .expect("events")
            .into_iter()
            .filter(|r| matches!(r, Ok(r) if matches!(r.event, Event::BatchStalled(_))))
            .count();
    }
    assert!(stall_events >= 1, "the provider stall was recorded");

    // The exposition, once the gauges have been sampled after the report.
    let http = reqwest::Client::new();
    let url = format!("http://{metrics_addr}/metrics");
    let exposition = wait_for(
        Duration::from_secs(10),
        "sampled gauges and the stalls counter in /metrics",
        async || {
            let text = http.get(&url).send().await.ok()?.text().await.ok()?;
            let ok = text.contains("groupcast_stream_lag{")
                && text.contains("groupcast_batches_in_flight 0")
                && text.contains(
                    "groupcast_stream_length{stream=\"dlq\",shard=\"0\",lane=\"normal\"} 1",
                );
            ok.then_some(text)
        },
        || handle.render(),
    )
    .await;
    let other = http
        .get(format!("http://{metrics_addr}/"))
        .send()
        .await
        .expect("GET /");
    assert_eq!(other.status(), 404, "only /metrics is served");

    // promtool accepts it.
    let (ok, said) = promtool_check_metrics(&exposition);
    assert!(
        ok,
        "promtool check metrics failed:\n{said}\n---\n{exposition}"
    );

    // Every family is in the catalogue, typed as the catalogue says, with
    // help; histograms are real histograms with the catalogue's buckets.
    let fams = families(&exposition);
    for (name, kind) in &fams {
        let m = groupcast::metrics::find(name)
            .unwrap_or_else(|| panic!("{name} is emitted but not in groupcast::metrics::METRICS"));
        assert_eq!(kind, m.kind.name(), "{name}");
        assert!(
            exposition.contains(&format!("# HELP {name} ")),
            "{name} has no help"
        );
        if m.kind == Kind::Histogram {
            for b in m.buckets {
                assert!(
                    exposition.contains(&format!("{name}_bucket{{")),
                    "{name} has no buckets"
                );
                let le = format!("le=\"{b}\"");
                assert!(
                    exposition
                        .lines()
                        .any(|l| l.starts_with(&format!("{name}_bucket")) && l.contains(&le)),
                    "{name} lacks bucket {le}"
                );
            }
        }
    }
    assert!(!exposition.contains(" summary"), "no summaries");
    // And the other way round: every catalogued metric was emitted by this
    // run, save those that only a failure this run does not provoke emits
    // (each named with that failure). A catalogue entry that nothing emits
    // any more, or a metric renamed on one side only, fails here.
    let unprovoked: BTreeMap<&str, &str> = NOT_PROVOKED.iter().copied().collect();
    for name in unprovoked.keys() {
        assert!(
            groupcast::metrics::find(name).is_some(),
            "{name} is listed as not provoked but is not catalogued"
        );
    }
    let silent: Vec<&str> = METRICS
        .iter()
        .map(|m| m.name)
        .filter(|n| !fams.contains_key(*n) && !unprovoked.contains_key(n))
        .collect();
    assert!(
        silent.is_empty(),
        "catalogued in groupcast::metrics::METRICS but not emitted by the scraped run: {silent:?}"
    );
    let value = |series: &str| -> f64 {
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{exposition}"))
    };
    assert_eq!(
        value("groupcast_recipients_registered_total"),
        registered as f64
    );
    assert_eq!(value("groupcast_batch_stalls_total"), stall_events as f64);
    assert_eq!(value("groupcast_recipients_duplicate_total"), 1.0);
    assert_eq!(value("groupcast_batches_reported_total"), 1.0);
    // Both batches' reports were appended: the scraped one's by a worker,
    // the closed one's by the close (in this process too).
    assert_eq!(
        value("groupcast_events_appended_total{type=\"batch_reported\"}"),
        2.0
    );
    assert_eq!(
        value("groupcast_chunks_total{outcome=\"loaded\"}"),
        state.int("seqs") as f64
    );
    assert_eq!(
        value("groupcast_dead_letters_total{stream=\"ingest\"}"),
        1.0
    );
    let rate_limited: f64 = exposition
        .lines()
        .filter(|l| {
            l.starts_with("groupcast_retries_total{") && l.contains("reason=\"rate_limited\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(rate_limited >= 1.0, "429s are retried as rate_limited");

    // The dashboard queries only metrics the worker emitted.
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 15, "{} expressions", exprs.len());
    let mut used = BTreeSet::new();
    for e in &exprs {
        for n in names_in(e) {
            used.insert(family_of(&n, &fams));
        }
    }
    let unknown: Vec<_> = used.iter().filter(|n| !fams.contains_key(*n)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics this run did not emit: {unknown:?}\nemitted: {:?}",
        fams.keys().collect::<Vec<_>>()
    );

    // A real Prometheus scrapes the worker and answers the registered count.
    let prom = Prometheus::start(metrics_addr);
    let got = wait_for(
        Duration::from_secs(30),
        "prometheus answering the registered count",
        async || {
            let r = prom
                .query(&http, "sum(groupcast_recipients_registered_total)")
                .await
                .ok()?;
            let v: f64 = r[0]["value"][1].as_str()?.parse().ok()?;
            (v == registered as f64).then_some(v)
        },
        || prom.log(),
    )
    .await;
    assert_eq!(got, 2_000.0);
    // The histogram buckets arrive as series with `le`, and every dashboard
    // expression is valid PromQL that Prometheus evaluates.
    let buckets = prom
        .query(
            &http,
            "count(groupcast_provider_request_duration_seconds_bucket{le=\"+Inf\"})",
        )
        .await
        .expect("query");
    assert!(
        buckets[0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|n| n >= 1.0),
        "{buckets}"
    );
    for e in &exprs {
        prom.query(&http, &grafana_to_promql(e))
            .await
            .unwrap_or_else(|err| panic!("dashboard expression rejected: {err}"));
    }
    rig.stop().await;
}

#[test]
fn the_observability_doc_lists_every_metric_with_its_labels() {
    let doc = std::fs::read_to_string(root().join("docs/observability.md"))
        .expect("docs/observability.md");
    for m in METRICS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}`", m.name)))
            .unwrap_or_else(|| panic!("docs/observability.md has no table row for {}", m.name));
        assert!(row.contains(m.kind.name()), "{row}: kind {}", m.kind.name());
        for l in m.labels {
            assert!(row.contains(&format!("`{l}`")), "{row}: label {l}");
        }
    }
}

#[test]
fn grafana_and_prometheus_files_are_valid_and_use_catalogued_metrics() {
    require("promtool");
    let g = root().join("grafana");
    let out = Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(g.join("prometheus.yml"))
        .output()
        .unwrap_or_else(|e| panic!("promtool ({e}): {INSTALL}"));
    assert!(
        out.status.success(),
        "promtool check config grafana/prometheus.yml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The alert rules and the dashboard name only catalogued metrics.
    let known: BTreeMap<String, String> = METRICS
        .iter()
        .map(|m| (m.name.to_string(), m.kind.name().to_string()))
        .collect();
    let mut exprs = alert_exprs();
    assert!(exprs.len() >= 3, "alert rules: {exprs:?}");
    exprs.extend(dashboard_exprs());
    for e in &exprs {
        for n in names_in(e) {
            let fam = family_of(&n, &known);
            assert!(
                known.contains_key(&fam),
                "{e}: {n} is not a groupcast metric"
            );
        }
    }
    // The dashboard: a stable uid, and every panel on the templated source.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(g.join("dashboards/groupcast.json")).expect("dashboard"),
    )
    .expect("JSON");
    assert_eq!(dash["uid"], "groupcast");
    let panels = dash["panels"].as_array().expect("panels");
    let mut titles = BTreeSet::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            p["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "{}",
            p["title"]
        );
        assert!(
            titles.insert(p["title"].to_string()),
            "{} twice",
            p["title"]
        );
    }
    // Provisioning points at the dashboards and the datasource.
    let ds = std::fs::read_to_string(g.join("provisioning/datasources/prometheus.yml"))
        .expect("datasource provisioning");
    assert!(ds.contains("type: prometheus") && ds.contains("apiVersion: 1"));
    let dp = std::fs::read_to_string(g.join("provisioning/dashboards/groupcast.yml"))
        .expect("dashboard provisioning");
    assert!(dp.contains("type: file") && dp.contains("path: "));
}

/// A `groupcast worker` process (the binary) on a fresh Redis, serving
/// metrics on `port`; killed on drop.
struct WorkerProcess(Child);

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_worker_exposes_every_family_the_dashboard_and_alerts_use_at_zero() {
    require("prometheus");
    let server = redis();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let _worker = WorkerProcess(
        Command::new(env!("CARGO_BIN_EXE_groupcast"))
            .args(["worker", "--durability", "none", "--shards", "2"])
            .arg("--metrics-listen")
            .arg(addr.to_string())
            .env("GROUPCAST_REDIS_URL", server.url())
            .env("GROUPCAST_PREFIX", "fresh")
            .env("GROUPCAST_PROVIDER_URL", "http://127.0.0.1:9")
            .env("GROUPCAST_PROVIDER_API_KEY", "k")
            .env("GROUPCAST_PROVIDER_API_SECRET", "s")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a worker"),
    );
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/metrics");
    let exposition = wait_for(
        Duration::from_secs(20),
        "the fresh worker's /metrics",
        async || http.get(&url).send().await.ok()?.text().await.ok(),
        String::new,
    )
    .await;
    // Every catalogued family is there before any work, counters at zero.
    let fams = families(&exposition);
    let missing: Vec<_> = METRICS
        .iter()
        .filter(|m| !fams.contains_key(m.name))
        .map(|m| m.name)
        .collect();
    assert!(
        missing.is_empty(),
        "a fresh worker lacks {missing:?}:\n{exposition}"
    );
    for series in [
        "groupcast_batch_stalls_total 0",
        "groupcast_dead_letters_total{stream=\"ingest\"} 0",
        "groupcast_dead_letters_total{stream=\"work\"} 0",
        "groupcast_sends_refused_total 0",
        "groupcast_batch_duration_seconds_count 0",
        "groupcast_delayed_retries{shard=\"1\"} 0",
    ] {
        assert!(
            exposition.lines().any(|l| l == series),
            "no `{series}` in a fresh worker's exposition:\n{exposition}"
        );
    }
    // A real Prometheus scraping it has a series of every family the
    // dashboard and the alert rules query.
    let mut used = BTreeSet::new();
    for e in dashboard_exprs().iter().chain(alert_exprs().iter()) {
        used.extend(names_in(e));
    }
    assert!(used.len() >= 10, "{used:?}");
    let prom = Prometheus::start(addr);
    for name in &used {
        let q = format!("count({name})");
        let n = wait_for(
            Duration::from_secs(30),
            &format!("prometheus to have {name}"),
            async || {
                let r = prom.query(&http, &q).await.ok()?;
                let n: f64 = r[0]["value"][1].as_str()?.parse().ok()?;
                (n >= 1.0).then_some(n)
            },
            || prom.log(),
        )
        .await;
        assert!(n >= 1.0, "{name}");
    }
}
