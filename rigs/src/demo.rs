//! `groupcast demo`: the whole pipeline on this machine. Workers, the mock
//! provider and a report receiver run in this process; a batch is submitted
//! with its chunks shuffled and some sent twice; the report and the
//! verification are printed. Exit 0 only if every invariant held.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use clap::Args;

use crate::mock::invariants::LedgerCheck;
use crate::mock::{self, Faults, MockConfig, MockHandle};
use crate::redis_server::{RedisServer, ServerError};
use groupcast::cli::CliError;
use groupcast::events::{Chunk, Recipient, Template};
use groupcast::keys::Keyspace;
use groupcast::projection::field;
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::store::Store;
use groupcast::verify::verify_batch;
use groupcast::worker::{Ctx, Worker, WorkerConfig};

/// Demo flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Redis to use. Default: the local server if one answers on
    /// 127.0.0.1:6379 (under a fresh key prefix), else a private
    /// redis-server started for the demo.
    #[arg(long = "redis", env = "GROUPCAST_REDIS_URL")]
    pub redis: Option<String>,
    /// Recipients per batch.
    #[arg(long, default_value_t = 100_000)]
    pub recipients: usize,
    /// Batches submitted at once.
    #[arg(long, default_value_t = 1)]
    pub batches: usize,
    /// Recipients per chunk.
    #[arg(long, default_value_t = 1_000)]
    pub chunk_size: usize,
    /// Most recipients per provider group (small, to show generations rolling over).
    #[arg(long, default_value_t = 40_000)]
    pub group_cap: u64,
    /// Worker instances (each with every role).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Share of chunks submitted twice.
    #[arg(long, default_value_t = 0.1)]
    pub duplicates: f64,
    /// Share of provider requests answered 500 (retried).
    #[arg(long, default_value_t = 0.02)]
    pub error_rate: f64,
    /// Share of provider requests whose answer is dropped after the effect.
    #[arg(long, default_value_t = 0.01)]
    pub drop_rate: f64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

/// One report the demo's webhook received.
#[derive(Debug, Clone)]
struct Delivery {
    /// The `Idempotency-Key` header.
    idempotency_key: String,
    /// The report.
    body: serde_json::Value,
}

/// Every report the demo's webhook received.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Delivery>>>);

impl Received {
    fn count(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or(0)
    }
    fn all(&self) -> Vec<Delivery> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

async fn receive(
    State(r): State<Received>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> &'static str {
    let idempotency_key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if let Ok(mut v) = r.0.lock() {
        v.push(Delivery {
            idempotency_key,
            body,
        });
    }
    "ok"
}

fn say(msg: impl AsRef<str>) {
    eprintln!("» {}", msg.as_ref());
}

async fn local_redis_answers() -> bool {
    groupcast::store::server::answers("redis://127.0.0.1:6379/", Duration::from_millis(500)).await
}

fn demo_recipients(k: usize, n: usize) -> Vec<Recipient> {
    (0..n)
        .map(|i| Recipient {
            to: format!("010{:08}", (k * 10_000_000 + i) % 100_000_000),
            vars: BTreeMap::from([
                ("name".to_string(), format!("고객{i}")),
                ("order".to_string(), format!("A-{k}-{i}")),
            ]),
        })
        .collect()
}

/// Refuses settings the demo cannot run with.
fn check_args(args: &DemoArgs) -> Result<(), CliError> {
    if args.recipients == 0 || args.batches == 0 || args.workers == 0 {
        return Err(CliError::Usage(
            "--recipients, --batches and --workers must be at least 1".into(),
        ));
    }
    if args.chunk_size == 0 || args.chunk_size > groupcast::events::chunk::MAX_CHUNK_RECIPIENTS {
        return Err(CliError::Usage(
            "--chunk-size must be between 1 and 10000".into(),
        ));
    }
    if args.recipients * args.batches > 10_000_000 {
        return Err(CliError::Usage(
            "at most 10,000,000 recipients in all".into(),
        ));
    }
    Ok(())
}

/// The Redis the demo uses: `--redis`, else the local server if one
/// answers, else a private `redis-server` (kept alive by the returned handle).
async fn demo_redis(args: &DemoArgs) -> Result<(Store, Option<RedisServer>, String), CliError> {
    let mut private: Option<RedisServer> = None;
    let url = match &args.redis {
        Some(u) => u.clone(),
        None if local_redis_answers().await => "redis://127.0.0.1:6379/".to_string(),
        None => match RedisServer::start() {
            Ok(s) => {
                let u = s.url();
                private = Some(s);
                u
            }
            Err(e @ ServerError::NotInstalled) => return Err(CliError::Usage(e.to_string())),
            Err(e) => return Err(CliError::Failed(e.to_string())),
        },
    };
    let prefix = format!("demo-{}", ulid::Ulid::new().to_string().to_lowercase());
    let store = Store::connect(&url, Keyspace::new(prefix.clone(), 1))
        .await
        .map_err(|e| {
            CliError::Redis(format!(
                "cannot use redis at {}: {e}",
                groupcast::store::redact_url(&url)
            ))
        })?;
    say(format!(
        "redis: {} ({}), keys under {prefix}:",
        groupcast::store::redact_url(&url),
        if private.is_some() {
            "a private redis-server started for the demo"
        } else {
            "existing server"
        }
    ));
    Ok((store, private, prefix))
}

/// The mock provider, with the demo's faults, and a client for it.
async fn demo_provider(args: &DemoArgs) -> Result<(MockHandle, ProviderClient), CliError> {
    let key = format!("demo-key-{}", ulid::Ulid::new());
    let secret = format!("demo-secret-{}", ulid::Ulid::new());
    let mock = mock::start(
        MockConfig {
            api_key: key.clone(),
            api_secret: secret.clone(),
            complete_after: Duration::from_millis(300),
            faults: Faults {
                error_rate: args.error_rate,
                drop_rate: args.drop_rate,
                ..Faults::default()
            },
            ..MockConfig::default()
        },
        "127.0.0.1:0"
            .parse()
            .map_err(|_| CliError::Failed("address".into()))?,
    )
    .await
    .map_err(|e| CliError::Failed(format!("cannot start the mock provider: {e}")))?;
    say(format!(
        "mock provider: {} ({:.0}% of requests answered 500, {:.0}% answered then dropped)",
        mock.base_url(),
        args.error_rate * 100.0,
        args.drop_rate * 100.0
    ));
    let provider = ProviderClient::new(ProviderConfig {
        base_url: mock.base_url(),
        api_key: key,
        api_secret: secret,
        ..ProviderConfig::default()
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    Ok((mock, provider))
}

/// A webhook that records every report it receives; returns its URL.
async fn report_receiver() -> Result<(Received, String), CliError> {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| CliError::Failed(format!("cannot start the report receiver: {e}")))?;
    let url = format!(
        "http://{}/reports",
        listener
            .local_addr()
            .map_err(|e| CliError::Failed(e.to_string()))?
    );
    let app = Router::new()
        .route("/reports", post(receive))
        .with_state(received.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((received, url))
}

/// Quick retries and polls: the demo's provider is on loopback.
fn worker_config(args: &DemoArgs, report_webhook: String) -> WorkerConfig {
    WorkerConfig {
        group_cap: args.group_cap,
        rate_limit: groupcast::worker::RateLimit::Auto,
        poll_interval: Duration::from_millis(100),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_secs(2),
        visibility_timeout: Duration::from_secs(10),
        max_attempts: 20,
        block: Duration::from_millis(500),
        report_webhook: Some(report_webhook),
        retention: Duration::from_secs(3600),
        ..WorkerConfig::default()
    }
}

fn demo_template() -> Template {
    Template {
        kind: "ATA".into(),
        from: "0212345678".into(),
        text: "#{name}님, 주문하신 #{order} 상품이 출발했습니다.".into(),
        kakao_options: Some(groupcast::events::chunk::KakaoTemplate {
            pf_id: "KA01PF-demo".into(),
            template_id: "ORDER_SHIPPED".into(),
        }),
    }
}

/// What the demo submits: every batch cut into chunks, some of them twice,
/// all shuffled.
struct Submission {
    batches: Vec<String>,
    chunks: Vec<Chunk>,
    /// Chunks before the duplicates were added.
    originals: usize,
}

fn submission(args: &DemoArgs, rng: &mut impl rand::Rng) -> Submission {
    use rand::seq::SliceRandom;
    let batches: Vec<String> = (0..args.batches)
        .map(|k| format!("demo-campaign-{k}"))
        .collect();
    let template = demo_template();
    let mut chunks = Vec::new();
    for (k, b) in batches.iter().enumerate() {
        chunks.extend(groupcast::producer::cut(
            b,
            &template,
            demo_recipients(k, args.recipients),
            args.chunk_size,
        ));
    }
    let originals = chunks.len();
    let dups: Vec<Chunk> = chunks
        .iter()
        .filter(|_| rng.random::<f64>() < args.duplicates)
        .cloned()
        .collect();
    chunks.extend(dups);
    chunks.shuffle(rng);
    Submission {
        batches,
        chunks,
        originals,
    }
}

/// Progress until every batch reported and every report was delivered.
async fn wait_for_reports(
    store: &Store,
    batches: &[String],
    received: &Received,
    total: u64,
    timeout: Duration,
    prefix: &str,
) -> Result<(), CliError> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "  {bar:40} {pos}/{len} recipients loaded, {msg} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let deadline = Instant::now() + timeout;
    let mut last_line = Instant::now();
    loop {
        let mut loaded = 0u64;
        let mut reported = 0;
        for b in batches {
            let p = store
                .batch(b)
                .read(&[
                    field::REGISTERED.into(),
                    field::FAILED.into(),
                    field::REPORT.into(),
                ])
                .await?;
            loaded += (p.int(field::REGISTERED) + p.int(field::FAILED)).max(0) as u64;
            reported += usize::from(p.report().is_some());
        }
        let msg = format!("{reported}/{} reported", batches.len());
        match &bar {
            Some(b) => {
                b.set_position(loaded);
                b.set_message(msg.clone());
            }
            None if last_line.elapsed() >= Duration::from_secs(2) => {
                last_line = Instant::now();
                say(format!("{loaded}/{total} recipients loaded, {msg}"));
            }
            None => {}
        }
        if reported == batches.len() && received.count() >= batches.len() {
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            if let Some(b) = &bar {
                b.abandon();
            }
            return Err(CliError::Failed(format!(
                "not finished after {}s: {loaded}/{total} loaded, {reported} reported; see `groupcast status --prefix {prefix}`",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the demo found about one batch.
struct BatchFindings {
    batch: String,
    /// The reports the webhook received for it.
    reports: Vec<serde_json::Value>,
    /// `verify`'s failed checks, as (invariant, detail).
    failed_checks: Vec<(u8, String)>,
    /// Recipients the provider's ledger registered for it.
    registered: u64,
}

/// Every broken rule the findings show: one report per batch, every check
/// held, every recipient registered at the provider, the ledger's own rules.
fn judge(findings: &[BatchFindings], ledger: &LedgerCheck, recipients: u64) -> Vec<String> {
    let mut failures = Vec::new();
    for f in findings {
        let b = &f.batch;
        if f.reports.len() != 1 {
            failures.push(format!(
                "{b}: the webhook received {} report(s)",
                f.reports.len()
            ));
        }
        for (invariant, detail) in &f.failed_checks {
            failures.push(format!("{b}: invariant {invariant}: {detail}"));
        }
        if f.registered != recipients {
            failures.push(format!(
                "{b}: {} of {recipients} recipients registered at the provider",
                f.registered
            ));
        }
    }
    failures.extend(ledger.violations.iter().cloned());
    failures
}

/// What each batch came to: the reports the webhook received for it
/// (the first one printed), `verify`'s checks against our events and the
/// provider's view (printed as a count; `group_cap`: the workers'), and
/// what the ledger registered.
async fn batch_findings(
    store: &Store,
    provider: &ProviderClient,
    batches: &[String],
    deliveries: &[Delivery],
    ledger: &LedgerCheck,
    group_cap: u64,
) -> Result<Vec<BatchFindings>, CliError> {
    let mut findings = Vec::new();
    for b in batches {
        let key = format!("{b}:report");
        let reports: Vec<serde_json::Value> = deliveries
            .iter()
            .filter(|d| d.idempotency_key == key)
            .map(|d| d.body.clone())
            .collect();
        if let Some(body) = reports.first() {
            println!("report for {b} (received by the webhook with Idempotency-Key {key}):");
            println!("{}", serde_json::to_string_pretty(body).unwrap_or_default());
        }
        let v = verify_batch(store, Some(provider), b, group_cap).await?;
        let failed_checks: Vec<(u8, String)> = v
            .failures()
            .into_iter()
            .map(|c| (c.invariant, c.detail.clone()))
            .collect();
        println!(
            "verify {b}: {} checks from our events and the provider's view, {} failed",
            v.checks.len(),
            failed_checks.len()
        );
        findings.push(BatchFindings {
            batch: b.clone(),
            reports,
            failed_checks,
            registered: ledger.registered.get(b).copied().unwrap_or(0),
        });
    }
    Ok(findings)
}

/// Runs the demo.
pub(crate) async fn run(args: DemoArgs) -> Result<(), CliError> {
    check_args(&args)?;
    let started = Instant::now();
    // 1. Redis, 2. the mock provider, 3. a report receiver, 4. workers.
    let (store, private, prefix) = demo_redis(&args).await?;
    let (mock, provider) = demo_provider(&args).await?;
    let (received, receiver_url) = report_receiver().await?;
    let config = worker_config(&args, receiver_url);
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let w = Worker::start(Ctx::new(store.clone(), provider.clone(), config.clone())).await?;
        workers.push(w);
    }
    say(format!(
        "{} workers running (group cap {})",
        args.workers, args.group_cap
    ));

    // 5. Submit, shuffled, some chunks twice.
    let sub = submission(&args, &mut rand::rng());
    groupcast::producer::append_chunks(&store, &sub.chunks).await?;
    say(format!(
        "submitted {} batch(es): {} recipients in {} chunks, plus {} duplicate deliveries, in random order",
        sub.batches.len(),
        args.recipients * sub.batches.len(),
        sub.originals,
        sub.chunks.len() - sub.originals
    ));

    // 6. Progress until every report is delivered.
    let total = (args.recipients * sub.batches.len()) as u64;
    let timeout = Duration::from_secs(args.timeout_secs);
    wait_for_reports(&store, &sub.batches, &received, total, timeout, &prefix).await?;
    let elapsed = started.elapsed();
    for w in workers {
        w.stop().await;
    }

    // 7. Report, verification, ledger.
    let deliveries = received.all();
    let ledger = mock::invariants::check(&mock.ledger_summary(), args.group_cap);
    let findings = batch_findings(
        &store,
        &provider,
        &sub.batches,
        &deliveries,
        &ledger,
        args.group_cap,
    )
    .await?;
    let summary = mock.ledger_summary();
    println!(
        "provider ledger: {} group(s) used, {} deleted, {} orphaned, {} recipients registered, {} requests, faults injected: {} errors, {} dropped answers",
        ledger.groups.values().sum::<usize>(),
        ledger.deleted,
        ledger.orphans,
        ledger.registered.values().sum::<u64>(),
        summary.totals.requests.values().sum::<u64>(),
        summary.totals.faults.errors,
        summary.totals.faults.drops,
    );
    let failures = judge(&findings, &ledger, args.recipients as u64);
    let dead = groupcast::verify::count_dead_letters(&store, &sub.batches[0]).await?;
    println!(
        "{} recipients in {:.1}s ({:.0} recipients/s end to end), {dead} dead letter(s)",
        total,
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    drop(private);
    if failures.is_empty() {
        println!("every invariant held: one group per generation, each sent once, every recipient registered once, one report per batch");
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "invariants broken:\n  {}",
            failures.join("\n  ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> DemoArgs {
        match crate::cli::parse(&["demo"], extra) {
            crate::cli::Command::Demo(a) => a,
            other => panic!("not demo: {other:?}"),
        }
    }

    #[test]
    fn settings_the_demo_cannot_run_with_are_refused() {
        assert!(check_args(&args(&[])).is_ok());
        for bad in [
            &["--recipients", "0"][..],
            &["--workers", "0"],
            &["--chunk-size", "0"],
            &["--chunk-size", "10001"],
            &["--recipients", "6000000", "--batches", "2"],
        ] {
            assert!(
                matches!(check_args(&args(bad)), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_submission_holds_every_recipient_once_plus_duplicate_chunks() {
        use rand::SeedableRng;
        let a = args(&[
            "--recipients",
            "2500",
            "--batches",
            "2",
            "--chunk-size",
            "1000",
            "--duplicates",
            "0.5",
        ]);
        let sub = submission(&a, &mut rand::rngs::StdRng::seed_from_u64(7));
        assert_eq!(sub.batches, ["demo-campaign-0", "demo-campaign-1"]);
        assert_eq!(sub.originals, 6);
        assert!(sub.chunks.len() > sub.originals, "some chunks twice");
        let distinct: std::collections::BTreeSet<(String, String)> = sub
            .chunks
            .iter()
            .flat_map(|c| c.recipients.iter().map(|r| (c.batch.clone(), r.to.clone())))
            .collect();
        assert_eq!(distinct.len(), 5000);
    }

    #[test]
    fn judge_names_every_broken_rule() {
        let ok = |b: &str| BatchFindings {
            batch: b.into(),
            reports: vec![serde_json::json!({"outcome": "completed"})],
            failed_checks: vec![],
            registered: 10,
        };
        let ledger = LedgerCheck::default();
        assert!(judge(&[ok("a"), ok("b")], &ledger, 10).is_empty());

        let mut twice = ok("a");
        twice.reports.push(serde_json::json!({}));
        let mut short = ok("b");
        short.registered = 9;
        short
            .failed_checks
            .push((2, "gen 0: 2 send event(s)".into()));
        let ledger = LedgerCheck {
            violations: vec!["0101 registered more than once".into()],
            ..LedgerCheck::default()
        };
        assert_eq!(
            judge(&[twice, short], &ledger, 10),
            [
                "a: the webhook received 2 report(s)",
                "b: invariant 2: gen 0: 2 send event(s)",
                "b: 9 of 10 recipients registered at the provider",
                "0101 registered more than once",
            ]
        );
    }
}
