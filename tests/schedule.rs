//! Scheduled sends and quiet hours, end to end: real Redis, the mock
//! provider, workers; when each group went out is read from the provider's
//! ledger. Instants are set relative to the clock at the start of each test,
//! so the tests hold at any hour and in any zone (the time arithmetic itself,
//! across midnight and daylight-saving changes, is unit-tested in
//! `src/events/options.rs`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use groupcast::events::options::{BatchOptions, Priority, QuietHours};
use groupcast::events::{Chunk, Event};
use groupcast::producer::{append_chunks, cut};
use groupcast_rigs::mock::LedgerSnapshot;
use jiff::{Timestamp, ToSpan};

/// How late after its instant a held send may go: the promote loop wakes at
/// the due time, and the send is one provider call.
const ON_TIME_MS: u64 = 1_000;

fn now_ms() -> u64 {
    Timestamp::now().as_millisecond() as u64
}

/// A batch of `n` recipients in chunks of `size`, every chunk with `options`.
fn batch(name: &str, k: u32, n: usize, size: usize, options: &BatchOptions) -> Vec<Chunk> {
    let mut chunks = cut(name, &template(), recipients(k, n), size);
    for c in &mut chunks {
        c.options = options.clone();
    }
    chunks
}

fn send_at(at: Timestamp) -> BatchOptions {
    BatchOptions {
        send_at: Some(at.to_string()),
        ..BatchOptions::default()
    }
}

/// When each group of the ledger was sent (None: not sent), and how many
/// send calls it got.
fn sends(ledger: &LedgerSnapshot) -> Vec<(String, Option<u64>, usize)> {
    ledger
        .groups
        .iter()
        .map(|g| {
            let accepted = g.send_calls.iter().filter(|c| c.status == 200).count();
            (g.group_id.clone(), g.sent_at_ms, accepted)
        })
        .collect()
}

/// The batch's `send_scheduled` events: (gen, at_ms, reason).
async fn holds(rig: &Rig, batch: &str) -> Vec<(u32, u64, String)> {
    rig.store
        .batch(batch)
        .events()
        .await
        .expect("events")
        .into_iter()
        .filter_map(|r| match r.ok()?.event {
            Event::SendScheduled(e) => Some((e.gen, e.at_ms, e.reason)),
            _ => None,
        })
        .collect()
}

/// Every group sent exactly once, no earlier than `at_ms` and at most
/// [`ON_TIME_MS`] after it.
fn assert_sent_on_time(ledger: &LedgerSnapshot, at_ms: u64, groups: usize) {
    let sends = sends(ledger);
    assert_eq!(sends.len(), groups, "groups at the provider: {sends:?}");
    for (group, sent, calls) in &sends {
        let sent = sent.unwrap_or_else(|| panic!("group {group} was never sent"));
        assert_eq!(*calls, 1, "group {group} accepted {calls} send calls");
        assert!(
            sent >= at_ms,
            "group {group} was sent at {sent}, {} ms before its instant {at_ms}",
            at_ms - sent
        );
        assert!(
            sent <= at_ms + ON_TIME_MS,
            "group {group} was sent {} ms after its instant {at_ms}",
            sent - at_ms
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_sent_before_send_at_and_everything_soon_after() {
    let config = groupcast::worker::WorkerConfig {
        group_cap: 1_000,
        ..test_config()
    };
    let rig = Rig::start(3, config, mock_config()).await;
    let at = Timestamp::now() + 8.seconds();
    let at_ms = at.as_millisecond() as u64;
    // 2,500 recipients, cap 1,000: three generations, all held.
    let chunks = batch("at-six", 1, 2_500, 250, &send_at(at));
    append_chunks(&rig.store, &chunks).await.expect("append");

    // Every generation becomes ready and is held (its groups filled), while
    // nothing is sent.
    wait_until(
        Duration::from_secs(30),
        "three held generations",
        || async { holds(&rig, "at-six").await.len() == 3 },
    )
    .await;
    assert!(now_ms() < at_ms, "the test was too slow to see the hold");
    let before = rig.mock.ledger();
    assert_eq!(before.groups.len(), 3);
    for g in &before.groups {
        assert_eq!(g.sent_at_ms, None, "group {} sent early", g.group_id);
        assert!(
            g.send_calls.is_empty(),
            "group {} got a send call",
            g.group_id
        );
    }
    let filled: u64 = before
        .groups
        .iter()
        .map(|g| g.count.registered_success)
        .sum();
    assert_eq!(filled, 2_500, "the held groups are filled");
    for (gen, held_until, reason) in holds(&rig, "at-six").await {
        assert_eq!(held_until, at_ms, "generation {gen}");
        assert_eq!(reason, "send_at");
    }

    let names = vec!["at-six".to_string()];
    rig.wait_reported(&names, Duration::from_secs(30)).await;
    assert_sent_on_time(&rig.mock.ledger(), at_ms, 3);
    rig.verify(&names).await;
    rig.check_ledger(&BTreeMap::from([("at-six".to_string(), 2_500)]));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_generation_ready_after_send_at_goes_at_once() {
    let rig = Rig::start(2, test_config(), mock_config()).await;
    let chunks = batch(
        "late",
        2,
        300,
        100,
        &send_at(Timestamp::now() - 10.minutes()),
    );
    append_chunks(&rig.store, &chunks).await.expect("append");
    let names = vec!["late".to_string()];
    rig.wait_reported(&names, Duration::from_secs(30)).await;
    assert!(
        holds(&rig, "late").await.is_empty(),
        "a past send_at held the send"
    );
    let sent = sends(&rig.mock.ledger());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].2, 1);
    rig.verify(&names).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_restarted_while_a_send_is_held_still_send_on_time_and_once() {
    let config = groupcast::worker::WorkerConfig {
        group_cap: 600,
        ..test_config()
    };
    let mut rig = Rig::start(2, config, mock_config()).await;
    let at = Timestamp::now() + 10.seconds();
    let at_ms = at.as_millisecond() as u64;
    let chunks = batch("restart", 3, 1_200, 200, &send_at(at));
    append_chunks(&rig.store, &chunks).await.expect("append");
    wait_until(Duration::from_secs(30), "two held generations", || async {
        holds(&rig, "restart").await.len() == 2
    })
    .await;
    // Every worker dies at once (no drain), and new ones start: the held
    // sends live in Redis, not in a worker.
    for w in rig.workers.drain(..) {
        w.abort();
    }
    assert!(
        now_ms() < at_ms,
        "the test was too slow to restart before send_at"
    );
    rig.add_worker().await;
    rig.add_worker().await;
    let names = vec!["restart".to_string()];
    rig.wait_reported(&names, Duration::from_secs(30)).await;
    assert_sent_on_time(&rig.mock.ledger(), at_ms, 2);
    rig.verify(&names).await;
    rig.stop().await;
}

/// `HH:MM:SS` of an instant in a zone.
fn local_hms(t: Timestamp, tz: &str) -> String {
    t.in_tz(tz).expect("zone").strftime("%H:%M:%S").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quiet_hours_defer_a_send_to_the_end_of_the_window() {
    let rig = Rig::start(2, test_config(), mock_config()).await;
    // A window around now, in Seoul: it opened an hour ago and closes in 8 s
    // (across midnight, when now is just after it: the arithmetic handles both).
    let tz = "Asia/Seoul";
    let now = Timestamp::now();
    let end = now + 8.seconds();
    let options = BatchOptions {
        priority: Some(Priority::Bulk),
        quiet_hours: Some(QuietHours {
            start: local_hms(now - 1.hour(), tz),
            end: local_hms(end, tz),
            tz: tz.into(),
        }),
        ..BatchOptions::default()
    };
    // The window ends on a whole second.
    let end_ms = (end.as_millisecond() / 1_000 * 1_000) as u64;
    let chunks = batch("quiet", 4, 400, 100, &options);
    append_chunks(&rig.store, &chunks).await.expect("append");
    wait_until(Duration::from_secs(30), "the held generation", || async {
        !holds(&rig, "quiet").await.is_empty()
    })
    .await;
    assert!(now_ms() < end_ms, "the test was too slow to see the hold");
    assert_eq!(
        holds(&rig, "quiet").await,
        vec![(0, end_ms, "quiet_hours".to_string())]
    );
    let names = vec!["quiet".to_string()];
    rig.wait_reported(&names, Duration::from_secs(30)).await;
    assert_sent_on_time(&rig.mock.ledger(), end_ms, 1);
    rig.verify(&names).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chunk_whose_options_differ_from_the_batch_is_refused_as_a_conflict() {
    let rig = Rig::start(2, test_config(), mock_config()).await;
    let mut chunks = batch("mixed", 5, 300, 100, &BatchOptions::default());
    // Chunk 0 is accepted first (normal); chunk 1 says bulk.
    let first = chunks.remove(0);
    append_chunks(&rig.store, &[first]).await.expect("append");
    wait_until(Duration::from_secs(30), "chunk 0 accepted", || async {
        rig.store
            .batch("mixed")
            .state()
            .await
            .map(|p| p.int("seqs") == 1)
            .unwrap_or(false)
    })
    .await;
    chunks[0].options.priority = Some(Priority::Bulk);
    append_chunks(&rig.store, &chunks).await.expect("append");
    let names = vec!["mixed".to_string()];
    rig.wait_reported(&names, Duration::from_secs(30)).await;
    let dlq = dead_letters(&rig.store).await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert!(
        dlq[0]
            .1
            .contains("seq 1 has the batch options |bulk|, but the batch has |normal|"),
        "{dlq:?}"
    );
    let p = rig.store.batch("mixed").state().await.expect("state");
    assert_eq!(p.get("report"), Some("partial"));
    assert_eq!(p.int("rejected"), 1);
    assert_eq!(p.int("registered"), 200);
    rig.verify(&names).await;
    rig.stop().await;
}
