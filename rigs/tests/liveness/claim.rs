//! Schedules hold at the moment of sending (issue 28): the check of
//! `send_at` and quiet hours is the send claim's own step, on the Redis
//! clock, and a claim lets the provider call start only for a short time.
//! A send claimed just before quiet hours and then retried gives its claim
//! back, so a cancel during the quiet hours stops it; no send starts inside
//! quiet hours or before `send_at`. Instants are set from the Redis clock at
//! the start of each test and the windows are in a named zone, so the tests
//! hold at any hour and in any local zone; when each group went out is read
//! from the mock provider's ledger.

use std::collections::BTreeMap;
use std::time::Duration;

use groupcast::events::options::{BatchOptions, QuietHours};
use groupcast::events::{Chunk, Event};
use groupcast::producer::{append_chunks, cut};
use groupcast::store::batch::{BatchLog, Cancelling};
use groupcast::worker::{DurableWait, WorkerConfig};
use jiff::Timestamp;

use super::cancel::{groups_of, operator, sends, wait_deleted};
use super::input::the_report;
use super::retry::rig_with_hook;
use super::retry::{self, wait_state};
use crate::common::*;

/// `HH:MM:SS` of the instant `ms` in zone `tz`.
fn local_hms(ms: u64, tz: &str) -> String {
    Timestamp::from_millisecond(ms as i64)
        .expect("instant")
        .in_tz(tz)
        .expect("zone")
        .strftime("%H:%M:%S")
        .to_string()
}

/// A batch held until `send_at` (Unix ms), with quiet hours `[opens,
/// closes)` in `tz` (whole seconds).
fn options(send_at: u64, opens: u64, closes: u64, tz: &str) -> BatchOptions {
    BatchOptions {
        send_at: Some(
            Timestamp::from_millisecond(send_at as i64)
                .expect("instant")
                .to_string(),
        ),
        quiet_hours: Some(QuietHours {
            start: local_hms(opens, tz),
            end: local_hms(closes, tz),
            tz: tz.into(),
        }),
        ..BatchOptions::default()
    }
}

fn chunks(batch: &str, k: u32, n: usize, size: usize, options: &BatchOptions) -> Vec<Chunk> {
    let mut chunks = cut(batch, &template(), recipients(k, n), size);
    for c in &mut chunks {
        c.options = options.clone();
    }
    chunks
}

/// The Redis clock, rounded down to a whole second, plus `secs`.
async fn second_from_now(log: &BatchLog, secs: u64) -> u64 {
    let now = log.server_time_ms().await.expect("the Redis clock");
    now / 1_000 * 1_000 + secs * 1_000
}

/// The batch's events of generation 0's claims: (entry ms, event).
async fn claim_events(log: &BatchLog) -> Vec<(u64, Event)> {
    log.events()
        .await
        .expect("events")
        .into_iter()
        .filter_map(|r| {
            let r = r.ok()?;
            matches!(r.event, Event::SendClaimed(_) | Event::ClaimGivenBack(_))
                .then(|| (groupcast::events::entry_millis(&r.id), r.event))
        })
        .collect()
}

/// A worker claims the send at `send_at`, two seconds before quiet hours
/// open; its durability wait (4 s) outlasts the claim's lifetime (1 s), so
/// the send cannot start and the item is retried, inside quiet hours: the
/// retry gives the claim back instead of holding the send with it. An
/// operator's cancel during the quiet hours then stops the generation:
/// nothing is sent (the provider's ledger), the report says `cancelled`.
/// (Before the fix, the retry held the send with its claim in place: the
/// cancel left it alone and it went out when the quiet hours ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_retried_into_quiet_hours_is_given_back_and_a_cancel_stops_the_send() {
    let config = WorkerConfig {
        durable: DurableWait::Window(Duration::from_secs(4)),
        claim_lifetime: Duration::from_secs(1),
        visibility_timeout: Duration::from_secs(30),
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock_config()).await;
    let batch = "claimed-at-nine";
    let log = operator(&rig, batch);
    let send_at = second_from_now(&log, 15).await;
    let (opens, closes) = (send_at + 2_000, send_at + 2_000 + 3_600_000);
    let options = options(send_at, opens, closes, "America/Los_Angeles");
    append_chunks(&rig.store, &chunks(batch, 95, 200, 100, &options))
        .await
        .expect("append");

    wait_state(&log, "the send claimed", |s| {
        s.gen_field(0, "claimed").is_some()
    })
    .await;
    wait_state(&log, "the claim given back", |s| {
        s.gen_field(0, "back").is_some()
    })
    .await;
    let claims = claim_events(&log).await;
    let [(claimed_ms, Event::SendClaimed(c)), (back_ms, Event::ClaimGivenBack(b))] =
        claims.as_slice()
    else {
        panic!("one claim, given back: {claims:?}");
    };
    assert!(
        *claimed_ms >= send_at,
        "claimed at {claimed_ms}, before send_at {send_at}"
    );
    assert!(
        *claimed_ms < opens,
        "the test was too slow: the claim came at {claimed_ms}, after quiet hours opened at {opens}"
    );
    assert!(
        *back_ms >= opens,
        "given back at {back_ms}, before quiet hours"
    );
    assert_eq!((c.gen, c.n), (0, None));
    assert_eq!((b.gen, b.n, b.at_ms), (0, 1, closes), "{b:?}");
    assert_eq!(b.reason, "quiet_hours");
    assert!(!b.stopped);
    let groups = groups_of(&rig, batch);
    assert!(
        groups[&0].iter().all(|g| g.send_calls.is_empty()),
        "a send call during the hold"
    );

    // Inside the quiet hours: the cancel finds no claim in place.
    assert_eq!(
        log.cancel("not at night").await.expect("cancel"),
        Cancelling::Cancelled {
            stopped: 1,
            unsent: 200,
            seen: true
        }
    );
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["sent_success"], 0, "{report}");
    assert_eq!(report["sent_generations"], 0, "{report}");
    assert_eq!(report["stopped"], 1, "{report}");
    assert_eq!(report["unsent"], 200, "{report}");
    wait_deleted(&rig, batch, &[0]).await;
    let now = log.server_time_ms().await.expect("clock");
    assert!(now < closes, "the quiet hours ended during the test");
    for (gen, gs) in groups_of(&rig, batch) {
        for g in gs {
            assert!(
                g.send_calls.is_empty() && g.sent_at_ms.is_none(),
                "gen {gen}: group {} was sent",
                g.group_id
            );
        }
    }
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 0)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// A worker claims the send at `send_at`, two seconds before quiet hours
/// of three seconds open, then stalls in its durability wait (8 s) past
/// the whole quiet window. An operator's cancel inside the quiet hours finds
/// the claim in place and leaves the generation alone (`stopped` 0). When
/// the worker wakes, the quiet hours are over: its claim's lifetime (cut
/// where they opened) is long gone, and in a cancelled batch a claim is never
/// renewed past its recorded end: the retry gives it back (`expired`) and
/// stops the generation. Nothing is sent, the report says `cancelled`.
/// (Before the end was recorded, the retry renewed the claim and sent the
/// batch after the quiet hours, long after the cancel.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_outlives_quiet_hours_after_a_cancel_is_not_renewed() {
    let config = WorkerConfig {
        durable: DurableWait::Window(Duration::from_secs(8)),
        claim_lifetime: Duration::from_secs(1),
        visibility_timeout: Duration::from_secs(30),
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock_config()).await;
    let batch = "stalled-through-the-night";
    let log = operator(&rig, batch);
    let send_at = second_from_now(&log, 12).await;
    let (opens, closes) = (send_at + 2_000, send_at + 5_000);
    let options = options(send_at, opens, closes, "Asia/Seoul");
    append_chunks(&rig.store, &chunks(batch, 96, 50, 50, &options))
        .await
        .expect("append");

    wait_state(&log, "the send claimed", |s| {
        s.gen_field(0, "claimed").is_some()
    })
    .await;
    let claims = claim_events(&log).await;
    let [(claimed_ms, Event::SendClaimed(c))] = claims.as_slice() else {
        panic!("one claim: {claims:?}");
    };
    assert!(
        *claimed_ms < opens,
        "the test was too slow: the claim came at {claimed_ms}, after quiet hours opened at {opens}"
    );
    let until = c.until_ms.expect("the claim's end recorded");
    assert!(
        until <= opens,
        "the claim's end {until} is past the opening {opens}"
    );
    // Inside the quiet hours, the worker still in its wait: the cancel
    // leaves the claimed generation alone.
    retry::wait_until("quiet hours open", Duration::from_secs(10), || async {
        log.server_time_ms().await.expect("clock") >= opens
    })
    .await;
    assert_eq!(
        log.cancel("not tonight").await.expect("cancel"),
        Cancelling::Cancelled {
            stopped: 0,
            unsent: 0,
            seen: true
        }
    );
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["sent_generations"], 0, "{report}");
    assert_eq!(report["stopped"], 1, "{report}");
    assert_eq!(report["unsent"], 50, "{report}");
    let claims = claim_events(&log).await;
    let Some((back_ms, Event::ClaimGivenBack(b))) = claims.get(1) else {
        panic!("the claim given back: {claims:?}");
    };
    assert!(
        *back_ms >= closes,
        "given back at {back_ms}, inside the quiet hours"
    );
    assert_eq!(
        (b.reason.as_str(), b.stopped, b.at_ms),
        ("expired", true, until),
        "{b:?}"
    );
    for (gen, gs) in groups_of(&rig, batch) {
        for g in gs {
            assert!(
                g.send_calls.is_empty() && g.sent_at_ms.is_none(),
                "gen {gen}: group {} was sent after the cancel",
                g.group_id
            );
        }
    }
    wait_deleted(&rig, batch, &[0]).await;
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 0)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// Twelve generations released at `send_at`, six seconds before quiet
/// hours of five seconds, through a limiter of 4 requests a second (a send
/// is two: its status read and the send; the twelve reads are booked
/// first): some go before the window, the others wait in the limiter, some
/// with their claims, when it opens. No group is
/// sent inside the window (nor before `send_at`), each is sent once, and
/// every one is sent after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_racing_the_start_of_quiet_hours_never_go_inside_them() {
    let config = WorkerConfig {
        group_cap: 100,
        rate_limit: groupcast::worker::RateLimit::PerSecond(4),
        rate_burst: 1,
        ..test_config()
    };
    let (rig, _hook) = rig_with_hook(2, config, mock_config()).await;
    let batch = "at-the-edge";
    let log = operator(&rig, batch);
    let send_at = second_from_now(&log, 15).await;
    let (opens, closes) = (send_at + 6_000, send_at + 11_000);
    let options = options(send_at, opens, closes, "Asia/Seoul");
    append_chunks(&rig.store, &chunks(batch, 96, 1_200, 100, &options))
        .await
        .expect("append");
    let names = vec![batch.to_string()];
    rig.wait_reported(&names, Duration::from_secs(90)).await;

    let (mut before, mut after) = (0, 0);
    for (gen, gs) in groups_of(&rig, batch) {
        let sent: Vec<u64> = gs.iter().filter_map(|g| g.sent_at_ms).collect();
        assert_eq!(
            gs.iter().map(sends).sum::<usize>(),
            1,
            "gen {gen}: {sent:?}"
        );
        let at = sent[0];
        assert!(
            at >= send_at,
            "gen {gen} sent at {at}, before send_at {send_at}"
        );
        assert!(
            !(opens..closes).contains(&at),
            "gen {gen} sent at {at}, {} ms inside quiet hours [{opens}, {closes})",
            at - opens
        );
        if at < opens {
            before += 1;
        } else {
            after += 1;
        }
    }
    let given_back = claim_events(&log)
        .await
        .iter()
        .filter(|(_, e)| matches!(e, Event::ClaimGivenBack(_)))
        .count();
    eprintln!(
        "quiet-hours edge: {before} generation(s) sent before the window, {after} after it, {given_back} claim(s) given back"
    );
    assert_eq!(before + after, 12);
    assert!(
        before > 0 && after > 0,
        "the sends did not straddle the window ({before} before, {after} after): the test did not exercise its edge"
    );
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 1_200)]));
    rig.verify(&names).await;
    rig.stop().await;
}
