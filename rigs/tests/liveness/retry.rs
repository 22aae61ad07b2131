//! The time half of liveness: a provider outage longer than the old retry
//! budget, a report webhook that is down for a while, `replay` while workers
//! run, and a slow provider or long rate-limiter waits.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Json;

use groupcast::events::Event;
use groupcast::producer::append_chunks;
use groupcast::store::batch::Rebuilt;
use groupcast::worker::WorkerConfig;
use groupcast_rigs::mock::{Faults, MockConfig};

use crate::common::*;

/// A report webhook that can be taken down (it answers 503 then) and
/// brought back, keeping every receipt it accepted.
#[derive(Clone, Default)]
pub(crate) struct Hook {
    pub(crate) down: Arc<AtomicBool>,
    pub(crate) refused: Arc<AtomicU64>,
    accepted: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
}

impl Hook {
    /// Serves on a loopback port; returns its URL.
    pub(crate) async fn serve(&self) -> String {
        async fn receive(
            State(hook): State<Hook>,
            headers: HeaderMap,
            Json(body): Json<serde_json::Value>,
        ) -> StatusCode {
            if hook.down.load(Ordering::SeqCst) {
                hook.refused.fetch_add(1, Ordering::SeqCst);
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            hook.accepted.lock().expect("lock").push((key, body));
            StatusCode::OK
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/reports", listener.local_addr().expect("addr"));
        let app = axum::Router::new()
            .route("/reports", post(receive))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    pub(crate) fn receipts(&self) -> Vec<(String, serde_json::Value)> {
        self.accepted.lock().expect("lock").clone()
    }
}

/// Waits until the batch's state satisfies `ok`.
pub(crate) async fn wait_state(
    log: &groupcast::store::batch::BatchLog,
    what: &str,
    ok: impl Fn(&groupcast::projection::Projection) -> bool,
) {
    let ok = &ok;
    wait_until(what, Duration::from_secs(30), || {
        let log = log.clone();
        async move { log.state().await.map(|s| ok(&s)).unwrap_or(false) }
    })
    .await;
}

/// Waits (bounded) until `ok` holds, panicking with `what` otherwise.
pub(crate) async fn wait_until<F, Fut>(what: &str, limit: Duration, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !ok().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the webhook accepted `batch`'s report and our events say so.
pub(crate) async fn wait_delivered<R>(rig: &Rig<R>, hook: &Hook, batch: &str, limit: Duration) {
    let log = rig.store.batch(batch);
    wait_until("the report is delivered", limit, || {
        let log = log.clone();
        async move {
            log.state()
                .await
                .map(|s| s.get("delivered").is_some())
                .unwrap_or(false)
        }
    })
    .await;
    assert!(!hook.receipts().is_empty());
}

/// The checks every row ends with: exactly one report at the webhook (and one
/// report decision in the events), every group sent exactly once and everyone
/// registered once (the ledger), nothing dead-lettered, and the live state
/// equal to its replay.
async fn exactly_one_report<R>(rig: &Rig<R>, hook: &Hook, batch: &str, recipients: usize) {
    // The batch's report; its delivery report, at most once, is another
    // delivery (its own key).
    let all = hook.receipts();
    let deliveries = all
        .iter()
        .filter(|(k, _)| k == &format!("{batch}:delivery"))
        .count();
    assert!(deliveries <= 1, "the delivery report twice: {all:?}");
    let receipts: Vec<_> = all
        .into_iter()
        .filter(|(k, _)| k != &format!("{batch}:delivery"))
        .collect();
    assert_eq!(receipts.len(), 1, "one report at the webhook: {receipts:?}");
    let (key, body) = &receipts[0];
    assert_eq!(key, &format!("{batch}:report"));
    assert_eq!(body["batch_id"], batch);
    assert_eq!(body["registered"], recipients as u64);
    let events: Vec<_> = rig
        .store
        .batch(batch)
        .events()
        .await
        .expect("events")
        .into_iter()
        .map(|r| r.expect("every event decodes"))
        .collect();
    let reported = events
        .iter()
        .filter(|r| matches!(r.event, Event::BatchReported(_)))
        .count();
    assert_eq!(reported, 1, "one report decision");
    let sends = events
        .iter()
        .filter(|r| matches!(r.event, Event::SendTriggered(_)))
        .count();
    let summary = rig.mock.ledger_summary();
    let groups: Vec<_> = summary
        .groups
        .iter()
        .filter(|g| g.custom_fields.get("batchId").map(String::as_str) == Some(batch))
        .collect();
    let sent: Vec<_> = groups
        .iter()
        .filter(|g| g.send_calls.iter().any(|c| c.status == 200))
        .collect();
    assert_eq!(sends, sent.len(), "one send_triggered per group sent");
    for g in &sent {
        assert_eq!(
            g.send_calls.iter().filter(|c| c.status == 200).count(),
            1,
            "group {} sent once: {:?}",
            g.group_id,
            g.send_calls
        );
    }
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), recipients)]));
    assert_eq!(dead_letters(&rig.store).await, Vec::new(), "no dead letter");
    rig.verify(&[batch.to_string()]).await;
}

/// A rig of `workers` whose reports go to a fresh [`Hook`].
pub(crate) async fn rig_with_hook(
    workers: usize,
    config: WorkerConfig,
    mock: MockConfig,
) -> (Rig, Hook) {
    let hook = Hook::default();
    let config = WorkerConfig {
        report_webhook: Some(hook.serve().await),
        ..config
    };
    (Rig::start(workers, config, mock).await, hook)
}

/// All 5xx for longer than the old retry budget (8 attempts, spent in
/// 13-25 s), hitting creates, adds, sends and polls mid-flight; then the
/// provider recovers and the batch reports, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_outage_longer_than_the_old_retry_budget_still_ends_in_one_report() {
    let config = WorkerConfig {
        group_cap: 1_000,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(3, config, mock_config()).await;
    let batch = "outage";
    let n = 3_000;
    // Half the chunks first: the outage starts with work in every stage.
    let chunks = shuffled_chunks(batch, 61, n, 150, 3);
    let (first, rest) = chunks.split_at(chunks.len() / 2);
    append_chunks(&rig.store, first).await.expect("append");
    let log = rig.store.batch(batch);
    wait_state(&log, "the first group is created", |s| {
        s.gen_field(0, "group").is_some()
    })
    .await;
    rig.mock.set_faults(faults(1.0, 0.0));
    append_chunks(&rig.store, rest).await.expect("append");
    let outage = Instant::now();
    // The outage lasts past the old budget however its retries are paced,
    // and sees many failed requests (far more than 8 per item in flight).
    let old_budget = Duration::from_secs(26);
    wait_until("the outage has lasted", Duration::from_secs(90), || {
        let errors = rig.mock.ledger_summary().totals.faults.errors;
        async move { outage.elapsed() >= old_budget && errors >= 100 }
    })
    .await;
    assert_eq!(
        dead_letters(&rig.store).await,
        Vec::new(),
        "nothing dead-lettered during the outage"
    );
    assert!(log.state().await.expect("state").get("report").is_none());
    rig.mock.set_faults(Faults::default());
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(60))
        .await;
    wait_delivered(&rig, &hook, batch, Duration::from_secs(30)).await;
    exactly_one_report(&rig, &hook, batch, n).await;
    rig.stop().await;
}

/// The report webhook is down (a deploy) through many more retries than the
/// old budget allowed; when it is back, the report is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_webhook_down_for_a_while_gets_its_report_once_it_is_back() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    hook.down.store(true, Ordering::SeqCst);
    let batch = "hook-down";
    append_chunks(&rig.store, &shuffled_chunks(batch, 62, 600, 100, 4))
        .await
        .expect("append");
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(30))
        .await;
    let refused = hook.refused.clone();
    wait_until(
        "the webhook refused many deliveries",
        Duration::from_secs(60),
        || {
            let n = refused.load(Ordering::SeqCst);
            async move { n >= 25 }
        },
    )
    .await;
    assert_eq!(dead_letters(&rig.store).await, Vec::new());
    assert!(hook.receipts().is_empty());
    hook.down.store(false, Ordering::SeqCst);
    wait_delivered(&rig, &hook, batch, Duration::from_secs(30)).await;
    exactly_one_report(&rig, &hook, batch, 600).await;
    rig.stop().await;
}

/// `replay` (not `--verify`) rebuilding the state over and over while
/// workers load, send and report: no idempotency key is lost, so there is
/// no second report decision and no second send; and the command says it
/// rebuilt atomically.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_while_workers_run_loses_nothing() {
    let config = WorkerConfig {
        group_cap: 700,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(3, config, mock_config()).await;
    let batch = "replayed";
    let n = 4_000;
    let log = rig.store.batch(batch);
    let stop = Arc::new(AtomicBool::new(false));
    let replays = {
        let (log, stop) = (log.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut replaced, mut raced) = (0u32, 0u32);
            while !stop.load(Ordering::SeqCst) {
                match log.rebuild(50).await.expect("rebuild") {
                    Rebuilt::Replaced { retries, .. } => {
                        replaced += 1;
                        raced += retries;
                    }
                    Rebuilt::Busy { .. } => {}
                    Rebuilt::Undecodable(bad) => panic!("undecodable events: {bad:?}"),
                }
            }
            (replaced, raced)
        })
    };
    append_chunks(&rig.store, &shuffled_chunks(batch, 63, n, 100, 5))
        .await
        .expect("append");
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(60))
        .await;
    wait_delivered(&rig, &hook, batch, Duration::from_secs(30)).await;
    stop.store(true, Ordering::SeqCst);
    let (replaced, raced) = replays.await.expect("replays");
    assert!(replaced > 10, "the state was rebuilt {replaced} times");
    tracing::info!(replaced, raced, "rebuilds while the batch ran");
    exactly_one_report(&rig, &hook, batch, n).await;
    // The command itself, on the live deployment.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_groupcast"))
        .args(["replay", "--redis", &rig.server.url(), "--prefix", "gct"])
        .args(["--shards", "1", "--batch", batch])
        .output()
        .expect("run groupcast replay");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rebuilt atomically"), "{stdout}");
    rig.stop().await;
}

/// A provider that takes longer than `--stall-after` to finish a sent group,
/// and a rate limit that makes loads wait far longer than the visibility
/// timeout: polls and limiter waits keep the batch alive (no
/// `batch_stalled`), and no entry is reclaimed and run twice (every chunk is
/// added exactly once: no `1026` at the provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_provider_and_long_limiter_waits_are_neither_stalls_nor_double_runs() {
    let config = WorkerConfig {
        rate_limit: groupcast::worker::RateLimit::PerSecond(8),
        rate_burst: 1,
        visibility_timeout: Duration::from_millis(800),
        stall_after: Duration::from_secs(2),
        watchdog_interval: Duration::from_millis(100),
        poll_interval: Duration::from_millis(100),
        ..test_config()
    };
    let mock = MockConfig {
        complete_after: Duration::from_secs(5),
        ..mock_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock).await;
    let batch = "slow";
    // No chunk twice in the input: every add at the provider is then one
    // chunk's first and only one, unless an entry ran twice.
    let chunks = groupcast::producer::cut(batch, &template(), recipients(64, 1_200), 60);
    let distinct = chunks.len() as u64;
    assert_eq!(distinct, 20);
    append_chunks(&rig.store, &chunks).await.expect("append");
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(90))
        .await;
    wait_delivered(&rig, &hook, batch, Duration::from_secs(30)).await;
    let st = rig.store.batch(batch).state().await.expect("state");
    assert_eq!(st.int("stalls"), 0, "no batch_stalled: {:?}", st.fields);
    // The waits did stamp the heartbeat (they are what kept it fresh).
    assert!(st.get("alive").is_some(), "{:?}", st.fields);
    let summary = rig.mock.ledger_summary();
    assert_eq!(
        summary.totals.requests.get("add").copied().unwrap_or(0),
        distinct,
        "every chunk added exactly once: {:?}",
        summary.totals
    );
    for g in &summary.groups {
        assert_eq!(
            g.status_codes.get("1026"),
            None,
            "no add repeated: {:?}",
            g.status_codes
        );
    }
    exactly_one_report(&rig, &hook, batch, 1_200).await;
    rig.stop().await;
}
