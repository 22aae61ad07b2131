//! Who got it, who did not, and why: delivery tracking against the mock
//! provider's message-level results (registration failures, delivery
//! failures over two codes, messages that never get a result), checked
//! against the mock's ledger; the results export; the fallback resend to
//! exactly the failed recipients of one code; and tracking through a
//! worker killed with SIGKILL. Real redis-server, the `groupcast` binary
//! for the commands.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use groupcast::events::{BatchDelivered, Event};
use groupcast::producer::append_chunks;
use groupcast::projection::{event_key, field};
use groupcast::worker::WorkerConfig;
use groupcast_rigs::mock::{Faults, LedgerSnapshot, MockConfig};

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

fn groupcast(redis_url: &str, dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "gct")
        .env_remove("GROUPCAST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run groupcast")
}

/// 2 % refused at registration (1062), 5 % failed at delivery over two
/// codes, 0.5 % never final; results come 200-400 ms after the send.
fn delivery_faults() -> Faults {
    Faults {
        registration_failure_rate: 0.02,
        registration_failure_codes: vec!["1062".into()],
        delivery_delay_ms: 200,
        delivery_failure_rate: 0.05,
        delivery_failure_codes: vec!["3104".into(), "3043".into()],
        never_final_rate: 0.005,
        ..Faults::default()
    }
}

/// Workers that track delivery with a short window.
fn tracking_config(window: Duration) -> WorkerConfig {
    WorkerConfig {
        group_cap: 20_000,
        delivery_window: window,
        track_first_wait: Duration::from_millis(200),
        ..test_config()
    }
}

/// What the ledger says became of each message of the batch's groups:
/// number → (stage, code) for every failure, and the numbers that never
/// got a final result.
type Failures = BTreeMap<String, (String, String)>;

fn ledger_outcomes(ledger: &LedgerSnapshot) -> (Failures, BTreeSet<String>, u64) {
    let (mut failed, mut never, mut delivered) = (BTreeMap::new(), BTreeSet::new(), 0);
    for g in &ledger.groups {
        for m in &g.messages {
            match (m.status_code.as_str(), m.final_status.as_deref()) {
                ("1026", _) => {}
                (_, Some("4000")) => delivered += 1,
                (_, Some(code)) => {
                    let stage = if code.starts_with('1') {
                        "registration"
                    } else {
                        "delivery"
                    };
                    failed.insert(m.to.clone(), (stage.to_string(), code.to_string()));
                }
                (_, None) => {
                    never.insert(m.to.clone());
                }
            }
        }
    }
    (failed, never, delivered)
}

/// Waits (bounded) for the batch's delivery report and returns it.
async fn delivery_report(store: &groupcast::store::Store, batch: &str) -> BatchDelivered {
    let log = store.batch(batch);
    wait_until(Duration::from_secs(90), "the delivery report", || async {
        log.appended(event_key::DELIVERY_REPORT)
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    let recorded = log
        .recorded(event_key::DELIVERY_REPORT)
        .await
        .expect("read")
        .expect("the delivery report");
    match recorded.event {
        Event::BatchDelivered(e) => e,
        other => panic!("delivery_report is {other:?}"),
    }
}

/// `groupcast results BATCH --status failed`, in full: number → (stage, code).
fn exported_failures(url: &str, dir: &std::path::Path, batch: &str) -> Failures {
    let out = groupcast(
        url,
        dir,
        &[
            "results",
            batch,
            "--status",
            "failed",
            "--show-numbers",
            "--format",
            "jsonl",
        ],
    );
    jsonl(&out)
        .into_iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("number"), (s("stage"), s("code")))
        })
        .collect()
}

fn jsonl(out: &Output) -> Vec<serde_json::Value> {
    ok_stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_recipient_of_a_50k_batch_ends_in_the_outcome_the_providers_ledger_shows() {
    let mock = MockConfig {
        faults: delivery_faults(),
        ..mock_config()
    };
    let rig = Rig::start(2, tracking_config(Duration::from_secs(4)), mock).await;
    let batch = "delivery-50k".to_string();
    // Out of order, a third of the chunks twice.
    let chunks = shuffled_chunks(&batch, 3, 50_000, 1_000, 7);
    append_chunks(&rig.store, &chunks).await.expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(120))
        .await;
    let report = delivery_report(&rig.store, &batch).await;

    let ledger = rig.mock.ledger();
    let (failed, never, delivered) = ledger_outcomes(&ledger);
    assert!(
        failed.len() > 2_000 && never.len() > 100,
        "{} {}",
        failed.len(),
        never.len()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let url = rig.server.url();

    // The export of failures equals the ledger: number, stage, code; each
    // with the provider's text for its code.
    assert_eq!(exported_failures(&url, dir.path(), &batch), failed);
    let rows = exported(&url, dir.path(), &batch, "failed");
    assert!(
        rows.iter()
            .all(|r| r["reason"].as_str().is_some_and(|t| !t.is_empty())),
        "{:?}",
        rows.iter().find(|r| r["reason"] == "")
    );
    // The unknown set is the never-final set.
    let out = groupcast(
        &url,
        dir.path(),
        &[
            "results",
            &batch,
            "--status",
            "unknown",
            "--show-numbers",
            "--format",
            "jsonl",
        ],
    );
    let unknown: BTreeSet<String> = jsonl(&out)
        .into_iter()
        .map(|r| r["number"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(unknown, never);
    assert!(unknown.is_disjoint(&failed.keys().cloned().collect()));
    // A batch never seen is said so, not an empty export.
    let out = groupcast(&url, dir.path(), &["results", "delivery-5ok"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no batch delivery-5ok"),
        "{out:?}"
    );
    // Masked unless asked.
    let out = groupcast(&url, dir.path(), &["results", &batch, "--format", "csv"]);
    let masked = ok_stdout(&out);
    assert!(
        masked.lines().nth(1).is_some_and(|l| l.contains("****")),
        "{masked}"
    );

    // The delivery report's counts add up and agree with the ledger.
    assert_eq!(report.recipients, 50_000);
    assert_eq!(
        report.delivered + report.failed + report.unknown + report.duplicates + report.not_sent,
        report.recipients,
        "{report:?}"
    );
    assert_eq!(report.delivered, delivered);
    assert_eq!(report.failed, failed.len() as u64);
    assert_eq!(report.unknown, never.len() as u64);
    assert_eq!(
        report.failed_by_code.values().sum::<u64>(),
        report.failed,
        "{report:?}"
    );
    // One delivery report, once, on the reports stream beside the report.
    let reports = rig
        .store
        .entries(&rig.store.keys.reports(0))
        .await
        .expect("reports");
    assert_eq!(reports.iter().filter(|e| e.is_delivery_report()).count(), 1);
    assert_eq!(
        reports.iter().filter(|e| !e.is_delivery_report()).count(),
        1
    );
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.stop().await;
}

/// `groupcast results BATCH --status S --show-numbers`, as JSON lines.
fn exported(url: &str, dir: &std::path::Path, batch: &str, status: &str) -> Vec<serde_json::Value> {
    jsonl(&groupcast(
        url,
        dir,
        &[
            "results",
            batch,
            "--status",
            status,
            "--show-numbers",
            "--format",
            "jsonl",
        ],
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_cancelled_before_its_send_names_everyone_not_sent_and_each_duplicate_copy() {
    let mock = MockConfig {
        faults: Faults {
            registration_failure_rate: 0.02,
            registration_failure_codes: vec!["1062".into()],
            ..Faults::default()
        },
        ..mock_config()
    };
    let config = WorkerConfig {
        group_cap: 1_000,
        ..tracking_config(Duration::from_secs(4))
    };
    let rig = Rig::start(2, config, mock).await;
    let batch = "held".to_string();
    // 3,000 numbers, then 20 of them again: held an hour by its send time,
    // so every generation loads and none is sent.
    let people = recipients(6, 3_000);
    let again: Vec<_> = people.iter().take(20).cloned().collect();
    let copied: BTreeSet<String> = again.iter().map(|r| r.to.clone()).collect();
    let mut chunks = groupcast::producer::cut(
        &batch,
        &template(),
        people.into_iter().chain(again).collect(),
        500,
    );
    let in_an_hour = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string();
    for c in &mut chunks {
        c.options.send_at = Some(in_an_hour.clone());
    }
    let last_seq = chunks.len() as u32 - 1;
    append_chunks(&rig.store, &chunks).await.expect("append");
    let log = rig.store.batch(&batch);
    wait_until(Duration::from_secs(60), "every chunk loaded", || async {
        log.read(&[field::REGISTERED.into(), field::FAILED.into()])
            .await
            .is_ok_and(|p| p.int(field::REGISTERED) + p.int(field::FAILED) == 3_000)
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = rig.server.url();
    ok_stdout(&groupcast(
        &url,
        dir.path(),
        &["cancel", &batch, "--reason", "wrong coupon"],
    ));

    // Nothing was sent, and the batch still gets its delivery report.
    let report = delivery_report(&rig.store, &batch).await;
    let ledger = rig.mock.ledger();
    let (mut registered, mut refused) = (BTreeSet::new(), BTreeSet::new());
    for g in &ledger.groups {
        assert!(g.sent_at_ms.is_none(), "group {} was sent", g.group_id);
        for m in &g.messages {
            match m.status_code.as_str() {
                "1026" => {}
                c if c.starts_with('1') => {
                    refused.insert(m.to.clone());
                }
                _ => {
                    registered.insert(m.to.clone());
                }
            }
        }
    }
    assert_eq!(registered.len() + refused.len(), 3_000);
    assert!(!refused.is_empty());
    assert_eq!(report.recipients, 3_020, "{report:?}");
    assert_eq!(report.delivered, 0, "{report:?}");
    assert_eq!(report.duplicates, 20, "{report:?}");
    assert_eq!(report.failed, refused.len() as u64, "{report:?}");
    assert_eq!(report.not_sent, registered.len() as u64, "{report:?}");

    // Every registered recipient is named not sent, for the cancel (the
    // groups' deletes record them; they may finish after the report).
    let numbers_of = |rows: &[serde_json::Value]| -> BTreeSet<String> {
        rows.iter()
            .map(|r| r["number"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    wait_until(
        Duration::from_secs(30),
        "every not_sent number stored",
        || async { numbers_of(&exported(&url, dir.path(), &batch, "not_sent")) == registered },
    )
    .await;
    let rows = exported(&url, dir.path(), &batch, "not_sent");
    assert_eq!(rows.len(), registered.len());
    assert!(
        rows.iter().all(|r| r["code"] == "cancelled"),
        "{:?}",
        rows[0]
    );
    // The refused are failed, not also not_sent.
    assert_eq!(
        numbers_of(&exported(&url, dir.path(), &batch, "failed")),
        refused
    );

    // Each duplicate copy, once, with the seq it came in (the first or the
    // last chunk: whichever of them was accepted second).
    let dups = exported(&url, dir.path(), &batch, "duplicate");
    assert_eq!(dups.len(), 20, "{dups:?}");
    assert_eq!(numbers_of(&dups), copied);
    for d in &dups {
        let seq = d["seq"].as_u64().expect("a seq");
        assert!(seq == 0 || seq == u64::from(last_seq), "{d}");
    }
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fallback_resend_reaches_exactly_the_failed_recipients_of_one_code_once_each() {
    let mock = MockConfig {
        faults: Faults {
            registration_failure_rate: 0.0,
            never_final_rate: 0.0,
            ..delivery_faults()
        },
        ..mock_config()
    };
    let rig = Rig::start(2, tracking_config(Duration::from_secs(30)), mock).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = rig.server.url();
    // The campaign file, with one number twice (the second row a duplicate).
    let people = recipients(5, 3_000);
    let mut csv = String::from("to,name,order\n");
    for r in people.iter().chain(people.iter().take(1)) {
        csv.push_str(&format!(
            "{},{},{}\n",
            r.to, r.vars["name"], r.vars["order"]
        ));
    }
    write(dir.path(), "campaign.csv", &csv);
    write(
        dir.path(),
        "alimtalk.json",
        r##"{"type": "ATA", "from": "0212345678", "text": "#{name}님, 주문 #{order} 배송이 시작되었습니다.",
            "kakaoOptions": {"pfId": "PF1", "templateId": "T1"}}"##,
    );
    write(
        dir.path(),
        "sms.json",
        r##"{"type": "SMS", "from": "0212345678", "text": "#{name}님, 주문 #{order} 배송 시작"}"##,
    );
    let submit = |batch: &str, file: &str, template: &str, extra: &[&str]| {
        let mut args = vec![
            "submit",
            "--batch",
            batch,
            "--recipients",
            file,
            "--template",
            template,
        ];
        args.extend_from_slice(extra);
        ok_stdout(&groupcast(&url, dir.path(), &args))
    };
    submit("spring", "campaign.csv", "alimtalk.json", &[]);
    let first = delivery_report(&rig.store, "spring").await;
    // submit drops the file's second copy of a number before the batch sees it.
    assert_eq!(first.recipients, 3_000);
    let (failed, _, _) = ledger_outcomes(&rig.mock.ledger());
    let expected: BTreeSet<String> = failed
        .iter()
        .filter(|(_, (_, code))| code == "3104")
        .map(|(n, _)| n.clone())
        .collect();
    assert!(expected.len() > 20, "{}", expected.len());

    // Command one: the failed-with-3104 rows of the campaign file.
    let out = groupcast(
        &url,
        dir.path(),
        &[
            "results",
            "spring",
            "--status",
            "failed",
            "--code",
            "3104",
            "--from",
            "campaign.csv",
            "--show-numbers",
        ],
    );
    let followup = ok_stdout(&out);
    write(dir.path(), "followup.csv", &followup);
    // Each once, with its original variables.
    let by_number: BTreeMap<&str, &groupcast::events::Recipient> =
        people.iter().map(|r| (r.to.as_str(), r)).collect();
    let mut rows = BTreeSet::new();
    for line in followup.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let r = by_number[f[0]];
        assert_eq!(
            (f[1], f[2]),
            (r.vars["name"].as_str(), r.vars["order"].as_str())
        );
        assert!(rows.insert(f[0].to_string()), "{} twice", f[0]);
    }
    assert_eq!(rows, expected);
    // Command two: the follow-up batch, by SMS, naming its origin.
    submit(
        "spring-sms",
        "followup.csv",
        "sms.json",
        &["--follow-up-of", "spring"],
    );
    let batches = ["spring-sms".to_string()];
    rig.wait_reported(&batches, Duration::from_secs(60)).await;
    let p = rig.store.batch("spring-sms").state().await.expect("state");
    assert_eq!(
        p.get(field::ORIGIN),
        Some("spring (recipients in followup.csv)")
    );
    // The provider got the follow-up for exactly those numbers, once each.
    let ledger = rig.mock.ledger();
    let mut sent: Vec<String> = ledger
        .groups
        .iter()
        .filter(|g| g.custom_fields.values().any(|v| v == "spring-sms"))
        .flat_map(|g| g.messages.iter().map(|m| m.to.clone()))
        .collect();
    sent.sort();
    let unique: BTreeSet<String> = sent.iter().cloned().collect();
    assert_eq!(sent.len(), unique.len(), "someone got the follow-up twice");
    assert_eq!(unique, expected);
    rig.stop().await;
}

/// A `groupcast worker` process that tracks delivery with a short window.
fn worker_process(redis_url: &str, provider_url: &str) -> std::process::Child {
    Command::new(BIN)
        .args([
            "worker",
            "--durability",
            "none",
            "--metrics-listen",
            "off",
            "--group-cap",
            "10000",
            "--visibility-timeout",
            "2s",
            "--delivery-window",
            "6s",
        ])
        .env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "gct")
        .env("GROUPCAST_PROVIDER_URL", provider_url)
        .env("GROUPCAST_PROVIDER_API_KEY", KEY)
        .env("GROUPCAST_PROVIDER_API_SECRET", SECRET)
        .env_remove("GROUPCAST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_again_and_again_while_tracking_lose_nothing_and_count_nothing_twice() {
    let (server, store) = store(1).await;
    let mock = groupcast_rigs::mock::start(
        MockConfig {
            faults: Faults {
                delivery_delay_ms: 1_500,
                ..delivery_faults()
            },
            ..mock_config()
        },
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .expect("mock");
    let url = server.url();
    let mut workers = [
        worker_process(&url, &mock.base_url()),
        worker_process(&url, &mock.base_url()),
    ];
    let batch = "delivery-kill".to_string();
    let chunks = shuffled_chunks(&batch, 4, 30_000, 1_000, 11);
    append_chunks(&store, &chunks).await.expect("append");
    let log = store.batch(&batch);
    wait_until(Duration::from_secs(90), "the report", || async {
        log.state()
            .await
            .ok()
            .and_then(|p| p.report().map(str::to_string))
            .is_some()
    })
    .await;
    // While the results come in (never-final messages keep tracking going
    // until the 6 s window ends): SIGKILL one worker after the other, every
    // 700 ms, each replaced at once, at most eight times; then let them
    // finish.
    let mut kills = 0;
    while kills < 8
        && log
            .appended(event_key::DELIVERY_REPORT)
            .await
            .expect("read")
            .is_none()
    {
        let w = &mut workers[kills % 2];
        w.kill().expect("SIGKILL");
        w.wait().expect("reap");
        *w = worker_process(&url, &mock.base_url());
        kills += 1;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let report = delivery_report(&store, &batch).await;
    for w in workers.iter_mut() {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert!(kills >= 3, "only {kills} kills happened while tracking");
    let (failed, never, delivered) = ledger_outcomes(&mock.ledger());
    assert_eq!(report.delivered, delivered, "{report:?}");
    assert_eq!(report.failed, failed.len() as u64, "{report:?}");
    assert_eq!(report.unknown, never.len() as u64, "{report:?}");
    assert_eq!(report.recipients, 30_000);
    assert_eq!(
        report.delivered + report.failed + report.unknown + report.duplicates + report.not_sent,
        report.recipients
    );
    // One generation_delivered per generation, the counts in the state
    // equal to the events' (the fold).
    let events = log.events().await.expect("events");
    let per_gen: Vec<u32> = events
        .iter()
        .flatten()
        .filter_map(|r| match &r.event {
            Event::GenerationDelivered(e) => Some(e.gen),
            _ => None,
        })
        .collect();
    let unique: BTreeSet<u32> = per_gen.iter().copied().collect();
    assert_eq!(per_gen.len(), unique.len(), "{per_gen:?}");
    assert_eq!(unique.len(), 3);
    let p = log.state().await.expect("state");
    assert_eq!(p.int(field::DL_DELIVERED) as u64, delivered);
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(exported_failures(&url, dir.path(), &batch), failed);
    let v = groupcast::verify::verify_batch(&store, Some(&provider_for(&mock)), &batch, 10_000)
        .await
        .expect("verify");
    assert!(v.passed(), "{:#?}", v.failures());
}

/// Two readers of one generation (an item reclaimed while its first
/// handler still runs): the one that read a page earlier, with fewer
/// results final, must not put its smaller count back over the later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_reading_of_a_page_never_replaces_a_newer_one() {
    use groupcast::store::delivery::{BatchDelivery, PageCounts};
    let (_server, store) = store(1).await;
    let log = store.batch("two-readers");
    let keep = Duration::from_secs(60);
    let newer = PageCounts {
        delivered: 480,
        failed: 20,
        ..Default::default()
    };
    let older = PageCounts {
        delivered: 300,
        failed: 5,
        ..Default::default()
    };
    for counts in [&newer, &older] {
        assert!(log
            .track_page(0, "G1", "", counts, keep, &[])
            .await
            .expect("track_page"));
    }
    assert_eq!(
        log.delivered(Some(0), "G1", false, keep)
            .await
            .expect("delivered"),
        BatchDelivery::Unreported
    );
    let p = log.state().await.expect("state");
    assert_eq!(p.int(field::DL_DELIVERED), 480);
    assert_eq!(p.int(field::DL_FAILED), 20);
}
