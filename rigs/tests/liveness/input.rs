//! The input half of liveness: duplicates across chunks, a chunk that cannot
//! be loaded or does not validate, a seq that never comes, a wrong `last`, a
//! late copy of a reported batch, and scripts run twice. Each test asserts
//! from the mock provider's ledger (who was registered, how many times) and
//! from the webhook (one report, its outcome and counts).

use std::collections::BTreeMap;
use std::time::Duration;

use groupcast::events::{Chunk, Event};
use groupcast::producer::append_chunks;
use groupcast::store::batch::{dedupe_records, Accepted, Closing, GroupRecord, Parked, Rejection};
use groupcast::worker::WorkerConfig;

use super::retry::{rig_with_hook, wait_delivered, wait_state, wait_until, Hook};
use crate::common::*;

/// Every number registered at the provider for `batch`, with how many times
/// (across all its groups); panics on a `1026` (a number added twice to one
/// group).
pub(crate) fn registrations<R>(rig: &Rig<R>, batch: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for g in rig.mock.ledger().groups {
        if g.custom_fields.get("batchId").map(String::as_str) != Some(batch) {
            continue;
        }
        for m in &g.messages {
            assert_ne!(
                m.status_code, "1026",
                "{} added twice to {}",
                m.to, g.group_id
            );
            if m.status_code == "2000" {
                *out.entry(m.to.clone()).or_default() += 1;
            }
        }
    }
    out
}

/// The one report the webhook received for `batch` (waits for it).
pub(crate) async fn the_report<R>(rig: &Rig<R>, hook: &Hook, batch: &str) -> serde_json::Value {
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(60))
        .await;
    wait_delivered(rig, hook, batch, Duration::from_secs(30)).await;
    let receipts: Vec<_> = hook
        .receipts()
        .into_iter()
        .filter(|(key, _)| key == &format!("{batch}:report"))
        .collect();
    assert_eq!(receipts.len(), 1, "one report for {batch}: {receipts:?}");
    let events = rig.store.batch(batch).events().await.expect("events");
    let decided = events
        .iter()
        .filter(|r| matches!(r, Ok(r) if matches!(r.event, Event::BatchReported(_))))
        .count();
    assert_eq!(decided, 1, "one report decision");
    receipts[0].1.clone()
}

/// The dead letters, once there are at least `n` (bounded wait).
pub(crate) async fn wait_dead_letters<R>(rig: &Rig<R>, n: usize) -> Vec<(String, String)> {
    wait_until("the dead letters arrive", Duration::from_secs(20), || {
        let store = rig.store.clone();
        async move { dead_letters(&store).await.len() >= n }
    })
    .await;
    dead_letters(&rig.store).await
}

/// A chunk of `batch` holding `recipients`.
pub(crate) fn chunk(
    batch: &str,
    seq: u32,
    last: bool,
    recipients: Vec<groupcast::events::Recipient>,
) -> Chunk {
    Chunk {
        batch: batch.into(),
        seq,
        last,
        template: template(),
        options: Default::default(),
        recipients,
    }
}

/// The same number in two chunks of one generation, in two generations, and
/// twice in one chunk: each number is registered once, the copies are
/// counted as duplicates, and the batch completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_number_in_several_chunks_is_sent_once_and_counted_as_a_duplicate() {
    let config = WorkerConfig {
        group_cap: 250,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(3, config, mock_config()).await;
    let batch = "dupes";
    let people = recipients(70, 300);
    // Generation 0: chunks 0 and 1 (200 numbers); chunk 1 repeats 10 of
    // chunk 0's and one of its own. Generation 1: chunk 2 repeats 10 of
    // chunk 0's.
    let mut second = people[100..200].to_vec();
    second.extend_from_slice(&people[0..10]);
    second.push(people[150].clone());
    let mut third = people[200..300].to_vec();
    third.extend_from_slice(&people[20..30]);
    let chunks = vec![
        chunk(batch, 0, false, people[0..100].to_vec()),
        chunk(batch, 1, false, second),
        chunk(batch, 2, true, third),
    ];
    // In order, one at a time: the first copy of a number is the one sent.
    for c in &chunks {
        append_chunks(&rig.store, std::slice::from_ref(c))
            .await
            .expect("append");
        let log = rig.store.batch(batch);
        let seq = c.seq;
        wait_state(&log, "the chunk is accepted", |s| {
            s.assignment(seq).is_some()
        })
        .await;
    }
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["duplicates"], 21, "{report}");
    assert_eq!(report["registered"], 300, "{report}");
    assert_eq!(report["recipients"], 300, "{report}");
    let seen = registrations(&rig, batch);
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|&n| n == 1), "someone registered twice");
    let st = rig.store.batch(batch).state().await.expect("state");
    assert_eq!(
        st.int("g:1:n"),
        100,
        "generation 1 holds chunk 2's new numbers only"
    );
    assert_eq!(dead_letters(&rig.store).await, Vec::new());
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 300)]));
    rig.verify(&[batch.to_string()]).await;
    // The numbers are released at the report.
    let dedupe: bool = redis::cmd("EXISTS")
        .arg(&rig.store.batch(batch).keys.numbers)
        .query_async(&mut rig.store.raw_conn())
        .await
        .expect("exists");
    assert!(!dedupe, "the batch's number log is deleted at its report");
    rig.stop().await;
}

/// A chunk whose adds the provider refuses for good, and one that does not
/// validate: both end (failed recipients; a refused chunk), the rest is
/// sent, and the report says `partial` with the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chunks_that_cannot_be_loaded_end_as_failures_and_the_rest_is_sent() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "refusals";
    let people = recipients(71, 300);
    // Every add holding this number is answered 400: chunk 1 never loads.
    rig.mock.refuse_adds_with(Some(&people[150].to));
    let mut broken = recipients(72, 5);
    broken[2].to = String::new();
    let chunks = vec![
        chunk(batch, 0, false, people[0..100].to_vec()),
        chunk(batch, 1, false, people[100..200].to_vec()),
        chunk(batch, 2, false, broken),
        chunk(batch, 3, true, people[200..300].to_vec()),
    ];
    append_chunks(&rig.store, &chunks).await.expect("append");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["registered"], 200, "{report}");
    assert_eq!(report["failed"], 100, "{report}");
    assert_eq!(report["failed_by_reason"]["given_up"], 100, "{report}");
    assert_eq!(report["rejected"], 1, "{report}");
    assert_eq!(report["missing"], 0, "{report}");
    let seen = registrations(&rig, batch);
    assert_eq!(seen.len(), 200);
    assert!(!seen.contains_key(&people[150].to));
    // Each refusal is a dead letter with its reason.
    let letters = dead_letters(&rig.store).await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .any(|(_, r)| r.contains("refused (test hook)")),
        "{letters:?}"
    );
    assert!(
        letters.iter().any(|(_, r)| r.contains("unusable number")),
        "{letters:?}"
    );
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 200)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// A seq that never arrives: the batch waits until `close` gives up on it,
/// then sends what was loaded and reports `partial` with the missing seq.
/// Closing again changes nothing; a late copy of the missing chunk is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seq_that_never_comes_is_given_up_by_close() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "gap";
    let chunks = groupcast::producer::cut(batch, &template(), recipients(73, 400), 100);
    let arrived: Vec<Chunk> = chunks.iter().filter(|c| c.seq != 2).cloned().collect();
    append_chunks(&rig.store, &arrived).await.expect("append");
    let log = rig.store.batch(batch);
    wait_state(&log, "three chunks are loaded", |s| s.int("g:0:l") == 3).await;
    assert!(log.state().await.expect("state").report().is_none());
    // The command, as an operator runs it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_groupcast"))
        .args(["close", batch, "--reason", "producer crashed"])
        .args([
            "--redis",
            &rig.server.url(),
            "--prefix",
            "gct",
            "--shards",
            "1",
        ])
        .output()
        .expect("run groupcast close");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 missing seq"), "{stdout}");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["missing"], 1, "{report}");
    assert_eq!(
        report["missing_seq_ranges"],
        serde_json::json!([[2, 2]]),
        "{report}"
    );
    assert_eq!(report["registered"], 300, "{report}");
    assert_eq!(report["closed"], "producer crashed", "{report}");
    assert_eq!(
        log.close("again").await.expect("close"),
        Closing::AlreadyReported("partial".into())
    );
    append_chunks(&rig.store, &chunks[2..3])
        .await
        .expect("append");
    // Counted on the ended batch, not dead-lettered.
    wait_state(&log, "the late chunk counted", |s| {
        s.int(groupcast::projection::field::AFTER_END) == 1
    })
    .await;
    assert!(dead_letters(&rig.store).await.is_empty());
    assert_eq!(registrations(&rig, batch).len(), 300);
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 300)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// `--give-up-after`: a batch whose last seq never comes is closed by the
/// watchdog once it has been quiet that long, and reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn give_up_after_closes_a_batch_quiet_that_long() {
    let config = WorkerConfig {
        give_up_after: Some(Duration::from_secs(1)),
        watchdog_interval: Duration::from_millis(100),
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(1, config, mock_config()).await;
    let batch = "quiet";
    // Seqs 0 and 2 (the last) come; seq 1 never does.
    let chunks = groupcast::producer::cut(batch, &template(), recipients(74, 300), 100);
    append_chunks(&rig.store, &[chunks[0].clone(), chunks[2].clone()])
        .await
        .expect("append");
    let report = the_report(&rig, &hook, batch).await;
    let letters = dead_letters(&rig.store).await;
    assert_eq!(report["outcome"], "partial", "{report} {letters:?}");
    assert_eq!(
        report["missing_seq_ranges"],
        serde_json::json!([[1, 1]]),
        "{report} {letters:?}"
    );
    assert_eq!(report["registered"], 200, "{report}");
    let closed = report["closed"].as_str().unwrap_or_default().to_string();
    assert!(closed.contains("--give-up-after 1 s"), "{closed}");
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 200)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// `last` flagged on too low a seq (1 of 4): the chunks beyond it are
/// refused, and the report says so instead of `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_last_flag_on_too_low_a_seq_reports_partial_with_the_refused_chunks() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "short-last";
    let mut chunks = groupcast::producer::cut(batch, &template(), recipients(75, 400), 100);
    chunks[3].last = false;
    chunks[1].last = true;
    append_chunks(&rig.store, &chunks[..2])
        .await
        .expect("append");
    let log = rig.store.batch(batch);
    wait_state(&log, "the last seq is known", |s| s.last_seq() == Some(1)).await;
    append_chunks(&rig.store, &chunks[2..])
        .await
        .expect("append");
    let report = the_report(&rig, &hook, batch).await;
    // The refused chunks may arrive before or after the report: before, they
    // are counted; after, they are refused as chunks of a reported batch.
    let letters = wait_dead_letters(&rig, 2).await;
    let rejected = report["rejected"].as_u64().unwrap_or(0);
    assert_eq!(
        report["outcome"],
        if rejected > 0 { "partial" } else { "completed" },
        "{report}"
    );
    for (_, reason) in &letters {
        assert!(
            reason.contains("beyond the last seq 1") || reason.contains("already reported"),
            "{letters:?}"
        );
    }
    assert_eq!(
        rejected as usize,
        letters
            .iter()
            .filter(|(_, r)| r.contains("beyond the last seq 1"))
            .count(),
        "every refused chunk counted before the report is in it: {report}"
    );
    assert_eq!(report["registered"], 200, "{report}");
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 200)]));
    rig.stop().await;
}

/// A reported batch whose events have expired (`--retention`) is remembered
/// by a tombstone: a late copy of one of its chunks is dead-lettered as
/// "already reported", never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_copy_after_retention_is_refused_by_the_tombstone() {
    // No webhook: with a one-second retention the state may be gone before
    // a delivery could be recorded; the tombstone says the batch reported.
    let config = WorkerConfig {
        retention: Duration::from_secs(1),
        ..test_config()
    };
    let rig = Rig::start(2, config, mock_config()).await;
    let batch = "expired";
    let chunks = groupcast::producer::cut(batch, &template(), recipients(76, 200), 100);
    append_chunks(&rig.store, &chunks).await.expect("append");
    wait_until("the batch reports", Duration::from_secs(30), || {
        let store = rig.store.clone();
        async move { store.is_tombstoned(batch).await.unwrap_or(false) }
    })
    .await;
    let log = rig.store.batch(batch);
    wait_until("the batch's events expire", Duration::from_secs(10), || {
        let log = log.clone();
        async move { log.events().await.map(|e| e.is_empty()).unwrap_or(false) }
    })
    .await;
    assert!(rig.store.is_tombstoned(batch).await.expect("zscore"));
    append_chunks(&rig.store, &chunks[..1])
        .await
        .expect("append");
    let letters = wait_dead_letters(&rig, 1).await;
    assert!(
        letters[0].1.contains("its events have expired"),
        "{letters:?}"
    );
    // Nothing was recorded for it (no state brought back), nobody sent twice.
    assert!(log.events().await.expect("events").is_empty());
    let seen = registrations(&rig, batch);
    assert_eq!(seen.len(), 200);
    assert!(seen.values().all(|&n| n == 1));
    // Direct refusals by the scripts, too.
    assert!(matches!(
        log.reject(0, "d", "x", false).await.expect("reject"),
        Rejection::Refused(_)
    ));
    // Tombstones older than --remember are forgotten.
    let forgotten =
        groupcast::worker::maintenance::forget_old_tombstones(&rig.store, Duration::ZERO)
            .await
            .expect("forget");
    assert_eq!(forgotten, 1);
    assert!(!rig.store.is_tombstoned(batch).await.expect("zscore"));
    rig.stop().await;
}

/// Dead letters carry a chunk's recipients: they are kept as long as a
/// finished batch's events (`--retention`), then removed by the
/// maintenance loop. Two letters with ids on either side of the cut (one
/// stamped at the epoch's first millisecond, one now): only the old one
/// goes, and a second pass removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_older_than_the_retention_are_removed() {
    let (server, store) = store(2).await;
    let client = redis::Client::open(server.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for shard in 0..2 {
        let dlq = store.keys.dead_letters(shard);
        for id in ["1-0", "*"] {
            let _: String = redis::cmd("XADD")
                .arg(&dlq)
                .arg(id)
                .arg("reason")
                .arg("chunk 0 rejected: 01012345678 is invalid")
                .query_async(&mut conn)
                .await
                .expect("xadd");
        }
    }
    let keep = Duration::from_secs(7 * 24 * 3600);
    let forgotten = groupcast::worker::maintenance::forget_old_dead_letters(&store, keep)
        .await
        .expect("forget");
    assert_eq!(forgotten, 2, "the letter from 1970 of each shard");
    let left = store.dead_letter_entries().await.expect("dead letters");
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|(_, e)| e.id != "1-0"), "{left:?}");
    let again = groupcast::worker::maintenance::forget_old_dead_letters(&store, keep)
        .await
        .expect("forget");
    assert_eq!(again, 0);
}

/// After the report, no recipient data is left outside the batch's events
/// (which expire with it): `verify` passes on a reported batch, and fails,
/// naming the key, when a dedupe hash or a parked hash of the batch is
/// found (written here by hand, as a script that forgot to delete it would
/// leave it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verify_finds_recipient_data_left_after_the_report() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "left-behind";
    let chunks = groupcast::producer::cut(batch, &template(), recipients(97, 20), 10);
    append_chunks(&rig.store, &chunks).await.expect("append");
    the_report(&rig, &hook, batch).await;
    rig.verify(&[batch.to_string()]).await;
    let keys = rig.store.keys.batch(batch);
    let client = redis::Client::open(rig.server.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for key in [keys.numbers.clone(), keys.parked(0)] {
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg("0")
            .arg("01097000001")
            .query_async(&mut conn)
            .await
            .expect("hset");
        let v = groupcast::verify::verify_batch(&rig.store, None, batch, rig.config.group_cap)
            .await
            .expect("verify");
        let failed: Vec<String> = v.failures().iter().map(|c| format!("{c:?}")).collect();
        assert!(
            failed
                .iter()
                .any(|f| f.contains("recipient data") && f.contains(&key)),
            "{key} left after the report, verify says {failed:?}"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("del");
    }
    rig.stop().await;
}

/// Every state-changing script, run again with the same arguments (a request
/// resent after a dropped connection), answers the same and appends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_changing_script_answers_the_same_when_run_again() {
    let (_server, store) = store(1).await;
    let log = store.batch("twice");
    let events = || async { log.events().await.expect("events").len() };
    let numbers = ["01000000001", "01000000002", "01000000001"];
    let records = dedupe_records(numbers);

    let first = log
        .accept_with_hint(0, false, &records, "d0", 100, 0)
        .await
        .expect("accept");
    let n = events().await;
    let again = log
        .accept_with_hint(0, false, &records, "d0", 100, 0)
        .await
        .expect("accept");
    assert_eq!(
        first,
        Accepted::Assigned {
            gen: 0,
            group: None,
            duplicates: vec![2]
        }
    );
    assert_eq!(
        again,
        Accepted::Duplicate {
            gen: 0,
            group: None,
            loaded: false,
            duplicates: vec![2]
        },
        "the same assignment"
    );
    assert_eq!(events().await, n);

    assert_eq!(log.park(0, 0, b"c").await.expect("park"), Parked::Parked);
    let n = events().await;
    assert_eq!(log.park(0, 0, b"c").await.expect("park"), Parked::Parked);
    assert_eq!(events().await, n);

    assert_eq!(
        log.record_group(0, "G1").await.expect("record"),
        GroupRecord::Won
    );
    let n = events().await;
    assert_eq!(
        log.record_group(0, "G1").await.expect("record"),
        GroupRecord::Won,
        "its own earlier win"
    );
    assert_eq!(
        log.record_group(0, "G2").await.expect("record"),
        GroupRecord::Lost { kept: "G1".into() }
    );
    assert_eq!(events().await, n);

    let rejected = log.reject(1, "d1", "bad", false).await.expect("reject");
    let n = events().await;
    assert_eq!(
        log.reject(1, "d1", "bad", false).await.expect("reject"),
        rejected
    );
    assert_eq!(events().await, n);

    let loaded = groupcast::events::ChunkLoaded {
        gen: 0,
        seq: 0,
        group_id: "G1".into(),
        registered: 2,
        duplicates: 0,
        failed: vec![],
        given_up: None,
    };
    assert_eq!(log.loaded(&loaded).await.expect("loaded"), Some(false));
    let n = events().await;
    assert_eq!(log.loaded(&loaded).await.expect("loaded"), None);
    assert_eq!(events().await, n);

    // Seq 2 never comes: close gives up on it (seq 1 is a hole).
    let closed = log.close("test").await.expect("close");
    let n = events().await;
    assert_eq!(log.close("test").await.expect("close"), closed);
    assert_eq!(events().await, n);
    assert_eq!(closed, Closing::Closed { missing: 0 });

    assert!(log.sent(0, "G1", "sent", 60_000, b"p").await.expect("sent"));
    let n = events().await;
    assert!(!log.sent(0, "G1", "sent", 60_000, b"p").await.expect("sent"));
    assert_eq!(events().await, n);

    let done = log
        .completed(0, "G1", "COMPLETE", 2, 0)
        .await
        .expect("completed");
    let n = events().await;
    assert_eq!(done, groupcast::store::batch::Completion::Reported);
    assert_eq!(
        log.completed(0, "G1", "COMPLETE", 2, 0)
            .await
            .expect("completed"),
        groupcast::store::batch::Completion::Duplicate
    );
    assert_eq!(events().await, n);
    // The report: one duplicate, one refused chunk.
    let st = log.state().await.expect("state");
    assert_eq!(st.report(), Some("partial"));
    assert_eq!(st.int("duplicates"), 1);
    assert_eq!(st.int("rejected"), 1);
    let replayed = log.replay().await.expect("replay").expect("decodes");
    let mut live = st.clone();
    live.fields
        .retain(|k, _| !groupcast::projection::LIVE_ONLY.contains(&k.as_str()));
    assert_eq!(
        live.diff(&replayed),
        Vec::<String>::new(),
        "live state = its replay"
    );
}

/// A batch of 200,000 numbers: copies spread over the whole batch are still
/// found, and the numbers kept cost at most 32 bytes each in Redis (the
/// number log: 5 bytes a number and 20 a chunk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_is_deduplicated_in_a_few_bytes_a_number() {
    let (_server, store) = store(1).await;
    let log = store.batch("large");
    // 070 numbers: a view of the log keeps them in its set (mobile ones go
    // to its bitmap past 100,000).
    let number = |i: usize| format!("070{:08}", 20_000_000 + i);
    let size = 5_000;
    let chunks = 40;
    for seq in 0..chunks {
        let numbers: Vec<String> = (seq * size..(seq + 1) * size).map(number).collect();
        let records = dedupe_records(numbers.iter().map(String::as_str));
        let a = log
            .accept_with_hint(seq as u32, false, &records, &format!("d{seq}"), u64::MAX, 0)
            .await
            .expect("accept");
        assert!(
            matches!(&a, Accepted::Assigned { duplicates, .. } if duplicates.is_empty()),
            "seq {seq}: {a:?}"
        );
    }
    // A last chunk: 4,990 new numbers and 10 copies spread over the batch.
    let kept = chunks * size;
    let mut numbers: Vec<String> = (kept..kept + size - 10).map(number).collect();
    let copies: Vec<usize> = (0..10).map(|k| k * 19_997).collect();
    numbers.extend(copies.iter().map(|&i| number(i)));
    let records = dedupe_records(numbers.iter().map(String::as_str));
    let a = log
        .accept_with_hint(chunks as u32, true, &records, "dlast", u64::MAX, 0)
        .await
        .expect("accept");
    let expected: Vec<u32> = ((size - 10) as u32..size as u32).collect();
    assert!(
        matches!(&a, Accepted::Assigned { duplicates, .. } if *duplicates == expected),
        "{a:?}"
    );
    let st = log.state().await.expect("state");
    assert_eq!(st.int("recipients"), (kept + size - 10) as i64);
    assert_eq!(st.int("duplicates"), 10);
    let bytes = store
        .memory_usage(&log.keys.numbers, true)
        .await
        .expect("memory usage")
        .expect("the number log exists");
    let per = bytes as f64 / (kept + size - 10) as f64;
    assert!(per <= 32.0, "{per:.1} bytes per number kept");
}

/// A producer bug writes seq 4,000,000,000 (flagged last) after seqs 0 and
/// 1: closing the batch works in proportion to what arrived, not to the
/// highest seq. The close answers in well under a second while another
/// client's PINGs are answered throughout (the old script looped over every
/// seq: seconds with Redis blocked at 2·10⁶, never done at 4·10⁹); the
/// batch reports with the missing seqs as one range, in a small body; the
/// board's page for it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_holding_seq_four_billion_closes_at_once_and_reports_small() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    const TOP: u32 = 4_000_000_000;
    let (rig, hook) = rig_with_hook(1, test_config(), mock_config()).await;
    let batch = "seq-4e9";
    let people = recipients(76, 30);
    let chunks = vec![
        chunk(batch, 0, false, people[..10].to_vec()),
        chunk(batch, 1, false, people[10..20].to_vec()),
        chunk(batch, TOP, true, people[20..].to_vec()),
    ];
    append_chunks(&rig.store, &chunks).await.expect("append");
    let log = rig.store.batch(batch);
    wait_state(&log, "the three chunks are loaded", |s| {
        s.int("seqs") == 3 && s.int("g:0:l") == 3
    })
    .await;

    // Another client PINGs the same server while the close runs.
    let client = redis::Client::open(rig.server.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let done = Arc::new(AtomicBool::new(false));
    let pinger = tokio::spawn({
        let done = done.clone();
        async move {
            let (mut longest, mut pings) = (Duration::ZERO, 0u32);
            // At least a few PINGs, then until the close has returned.
            while pings < 5 || !done.load(Ordering::SeqCst) {
                let t = Instant::now();
                let pong: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .expect("PING");
                assert_eq!(pong, "PONG");
                longest = longest.max(t.elapsed());
                pings += 1;
            }
            (longest, pings)
        }
    });
    let t = Instant::now();
    let closed = log.close("producer bug").await.expect("close");
    let took = t.elapsed();
    done.store(true, Ordering::SeqCst);
    let (longest, pings) = pinger.await.expect("pinger");
    println!("close of a batch holding seq {TOP}: {took:?}; {pings} concurrent PINGs, the longest {longest:?}");
    assert_eq!(
        closed,
        Closing::Closed {
            missing: 3_999_999_998
        }
    );
    assert!(
        longest < Duration::from_millis(100),
        "a PING waited {longest:?}"
    );
    assert!(took < Duration::from_secs(5), "the close took {took:?}");

    let report = the_report(&rig, &hook, batch).await;
    let body = report.to_string();
    println!("report body: {} bytes", body.len());
    assert!(body.len() < 10_000, "{} bytes", body.len());
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["missing"], 3_999_999_998u64, "{report}");
    assert_eq!(report["missing_seq_count"], 3_999_999_998u64, "{report}");
    assert_eq!(
        report["missing_seq_ranges"],
        serde_json::json!([[2, 3_999_999_999u32]]),
        "{report}"
    );
    assert_eq!(report["registered"], 30, "{report}");

    // The board's page for the batch.
    let board = Board::start(&rig.server.url()).await;
    let r = reqwest::get(format!("{}/api/batches/{batch}", board.base))
        .await
        .expect("GET the batch page");
    assert!(r.status().is_success(), "{}", r.status());
    let page = r.text().await.expect("body");
    println!("board batch page: {} bytes", page.len());
    assert!(page.len() < 10_000, "{} bytes", page.len());
    let page: serde_json::Value = serde_json::from_str(&page).expect("JSON");
    assert_eq!(
        page["missingSeqRanges"],
        serde_json::json!([[2, 3_999_999_999u32]]),
        "{page}"
    );
    assert_eq!(page["missingSeqCount"], 3_999_999_998u64, "{page}");
    assert_eq!(page["report"]["missing"], 3_999_999_998u64, "{page}");

    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 30)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// A `groupcast board` process (read-only); killed on drop.
struct Board {
    child: std::process::Child,
    base: String,
}

impl Board {
    /// Starts it on a free port and waits (bounded) until it answers.
    async fn start(redis_url: &str) -> Board {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_groupcast"))
            .args(["board", "--prefix", "gct", "--redis", redis_url])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .env_remove("GROUPCAST_BOARD_TOKEN")
            .env_remove("GROUPCAST_BOARD_TOKEN_FILE")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the board");
        let board = Board {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let url = format!("{}/api/overview", board.base);
        wait_until("the board answers", Duration::from_secs(30), || {
            let url = url.clone();
            async move { reqwest::get(url).await.is_ok() }
        })
        .await;
        board
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
