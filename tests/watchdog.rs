//! The watchdog: a batch quiet past `stall_after` before its report gets
//! exactly one `batch_stalled` event per stall, one scanner runs at a time,
//! and reported batches leave the watch list. Real Redis; the first test
//! also runs the mock provider and a worker, and stalls the provider.

mod common;

use std::time::{Duration, Instant};

use common::*;
use groupcast::events::{BatchReported, BatchStalled, Event};
use groupcast::producer::append_chunks;
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::store::batch::{Accepted, BatchLog};
use groupcast::store::Store;
use groupcast::worker::watchdog::{self, ScanReport};
use groupcast::worker::{Ctx, WorkerConfig};
use groupcast_rigs::mock::Faults;
use redis::AsyncCommands;

const STALL_AFTER: Duration = Duration::from_millis(300);
const INTERVAL: Duration = Duration::from_millis(100);

fn watchdog_config() -> WorkerConfig {
    WorkerConfig {
        stall_after: STALL_AFTER,
        watchdog_interval: INTERVAL,
        ..test_config()
    }
}

/// The batch's `batch_stalled` events, in order.
async fn stalls(log: &BatchLog) -> Vec<BatchStalled> {
    log.events()
        .await
        .expect("events")
        .into_iter()
        .filter_map(|r| match r.expect("every event decodes").event {
            Event::BatchStalled(s) => Some(s),
            _ => None,
        })
        .collect()
}

async fn active(store: &Store, batch: &str) -> bool {
    store
        .raw_conn()
        .sismember(store.keys.active(store.keys.shard_of(batch)), batch)
        .await
        .expect("sismember")
}

async fn hb(log: &BatchLog) -> u64 {
    log.fields(&["hb".to_string()]).await.expect("hb")[0]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a heartbeat")
}

/// Scans with `ctx` until `done` holds for the report (bounded).
async fn scan_until(
    ctx: &Ctx,
    limit: Duration,
    what: &str,
    done: impl Fn(&ScanReport) -> bool,
) -> ScanReport {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(r) = watchdog::scan(ctx).await.expect("scan") {
            if done(&r) {
                return r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no scan found {what} in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_provider_is_one_stall_event_and_the_batch_leaves_the_watch_list() {
    // Enough slots that every chunk of the stalled half is read at once
    // (hung loads holding every slot would delay the last chunk's
    // acceptance: an event in the middle of the stall).
    let config = WorkerConfig {
        concurrency: 16,
        ..watchdog_config()
    };
    let mut rig = Rig::start(0, config, mock_config()).await;
    // Requests hung by the stall time out after a second, so the batch
    // resumes quickly once the provider is unstalled.
    rig.provider = ProviderClient::new(ProviderConfig {
        base_url: rig.mock.base_url(),
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        request_timeout: Duration::from_secs(1),
        ..ProviderConfig::default()
    })
    .expect("provider client");
    rig.add_worker().await;
    let batch = "stall-me".to_string();
    let log = rig.store.batch(&batch);
    let chunks = groupcast::producer::cut(&batch, &template(), recipients(1, 1_000), 100);
    assert_eq!(chunks.len(), 10);

    // Half the batch goes through normally.
    append_chunks(&rig.store, &chunks[..5])
        .await
        .expect("append");
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.state().await.expect("state").gen_int(0, "l") < 5 {
        assert!(Instant::now() < deadline, "first half not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stalls(&log).await.is_empty(), "no stall while it flows");

    // Then the provider hangs: the rest is accepted (events) but never loads.
    rig.mock.set_faults(Faults {
        stall_ms: 60_000,
        ..Faults::default()
    });
    append_chunks(&rig.store, &chunks[5..])
        .await
        .expect("append");

    // The running watchdog records the stall, soon after the threshold.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let s = stalls(&log).await;
        if let Some(first) = s.first() {
            break first.clone();
        }
        assert!(Instant::now() < deadline, "no stall recorded in 10s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let quiet_since = hb(&log).await;
    assert_eq!(
        first.quiet_since_ms, quiet_since,
        "the stall names the heartbeat it found stale"
    );
    assert!(
        first.quiet_for_ms > STALL_AFTER.as_millis() as u64,
        "recorded after {}ms of quiet, before the threshold",
        first.quiet_for_ms
    );
    assert!(
        first.quiet_for_ms < (STALL_AFTER + Duration::from_secs(2)).as_millis() as u64,
        "recorded only after {}ms of quiet",
        first.quiet_for_ms
    );

    // Many scans while it stays stalled (the worker's own and ours, under the
    // worker's lease): still one event, and the heartbeat is untouched.
    let ctx = &rig.workers[0].ctx;
    for _ in 0..8 {
        let r = watchdog::scan(ctx)
            .await
            .expect("scan")
            .expect("the worker holds the lease");
        assert!(r.stalled.contains(&batch), "{r:?}");
        assert!(r.newly_stalled.is_empty(), "{r:?}");
        tokio::time::sleep(INTERVAL).await;
    }
    assert_eq!(stalls(&log).await.len(), 1, "one event per stall");
    assert_eq!(
        hb(&log).await,
        quiet_since,
        "a stall does not refresh the heartbeat"
    );
    assert_eq!(log.state().await.expect("state").int("stalls"), 1);

    // Unstalled, the batch completes and reports.
    rig.mock.set_faults(Faults::default());
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    assert!(
        !active(&rig.store, &batch).await,
        "reported: off the watch list"
    );
    let r = watchdog::scan(ctx).await.expect("scan").expect("lease");
    assert!(!r.stalled.contains(&batch) && r.in_flight == 0, "{r:?}");
    // Give the running watchdog a few more rounds to misbehave.
    for _ in 0..5 {
        watchdog::scan(ctx).await.expect("scan");
        tokio::time::sleep(INTERVAL).await;
    }
    let events: Vec<Event> = log
        .events()
        .await
        .expect("events")
        .into_iter()
        .map(|r| r.expect("decodes").event)
        .collect();
    assert_eq!(stalls(&log).await.len(), 1, "nothing more after the report");
    let report_at = events
        .iter()
        .position(|e| matches!(e, Event::BatchReported(_)))
        .expect("a report");
    assert!(
        !events[report_at..]
            .iter()
            .any(|e| matches!(e, Event::BatchStalled(_))),
        "no stall after the report"
    );

    // Stopping gives the lease up at once.
    let lock = rig.store.keys.watchdog_lock();
    let holder: Option<String> = rig.store.raw_conn().get(&lock).await.expect("get");
    assert_eq!(holder.as_deref(), Some(ctx.consumer.as_str()));
    for w in rig.workers.drain(..) {
        w.stop().await;
    }
    let holder: Option<String> = rig.store.raw_conn().get(&lock).await.expect("get");
    assert_eq!(holder, None, "the lease is released on stop");
}

fn idle_ctx(store: &Store) -> Ctx {
    // The provider is never called by a scan.
    let provider = ProviderClient::new(ProviderConfig {
        base_url: "http://127.0.0.1:9".into(),
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        ..ProviderConfig::default()
    })
    .expect("provider client");
    Ctx::new(store.clone(), provider, watchdog_config())
}

async fn accept(log: &BatchLog, seq: u32) {
    let a = log
        .accept(seq, false, 10, &format!("digest-{seq}"), 1_000)
        .await
        .expect("accept");
    assert!(matches!(a, Accepted::Assigned { .. }), "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scanner_at_a_time_one_event_per_stall_and_reported_batches_are_healed() {
    init_tracing();
    let (_server, store) = store(1).await;
    let a = idle_ctx(&store);
    let b = idle_ctx(&store);
    let batch = "quiet".to_string();
    let log = store.batch(&batch);
    accept(&log, 0).await;
    assert!(active(&store, &batch).await, "accepted: on the watch list");

    // One scanner at a time: A takes the lease, B is turned away.
    let r = watchdog::scan(&a).await.expect("scan").expect("A scans");
    assert_eq!(r.in_flight, 1);
    assert!(r.stalled.is_empty(), "not quiet yet: {r:?}");
    assert_eq!(watchdog::scan(&b).await.expect("scan"), None, "B waits");

    // First stall: recorded once, however many scans see it.
    let first_hb = hb(&log).await;
    let r = scan_until(&a, Duration::from_secs(5), "the first stall", |r| {
        !r.newly_stalled.is_empty()
    })
    .await;
    assert_eq!(r.newly_stalled, vec![batch.clone()]);
    for _ in 0..5 {
        let r = watchdog::scan(&a).await.expect("scan").expect("lease");
        assert_eq!(r.stalled, vec![batch.clone()]);
        assert!(r.newly_stalled.is_empty());
    }
    let s = stalls(&log).await;
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].quiet_since_ms, first_hb);
    assert!(s[0].quiet_for_ms > STALL_AFTER.as_millis() as u64);

    // The batch wakes up (a new chunk): no longer stalled...
    accept(&log, 1).await;
    let second_hb = hb(&log).await;
    assert!(second_hb >= first_hb);
    let r = watchdog::scan(&a).await.expect("scan").expect("lease");
    assert!(r.stalled.is_empty(), "fresh again: {r:?}");
    // ...and when it goes quiet again, that is a second stall.
    scan_until(&a, Duration::from_secs(5), "the second stall", |r| {
        !r.newly_stalled.is_empty()
    })
    .await;
    let s = stalls(&log).await;
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[1].quiet_since_ms, second_hb);
    assert_eq!(log.state().await.expect("state").int("stalls"), 2);

    // A crashed scanner's lease expires and B takes over; a released one is
    // taken at once.
    assert_eq!(watchdog::scan(&b).await.expect("scan"), None);
    scan_until(&b, watchdog::lease_ttl(INTERVAL) * 3, "B's lease", |_| true).await;
    assert_eq!(
        watchdog::scan(&a).await.expect("scan"),
        None,
        "B holds it now"
    );
    watchdog::release(&b).await.expect("release");
    assert!(watchdog::scan(&a).await.expect("scan").is_some(), "A again");

    // The report is decided: the scan heals the entry and records nothing.
    let report = Event::BatchReported(BatchReported {
        outcome: "completed".into(),
        generations: 1,
        chunks: 2,
        recipients: 20,
        registered: 20,
        failed: 0,
        sent_success: 20,
        sent_failed: 0,
        ..Default::default()
    });
    log.append("report", &report).await.expect("append");
    // (completed.lua removes it from the set itself; put it back, as a late
    // retry racing the report could.)
    let active_key = store.keys.active(store.keys.shard_of(&batch));
    let _: i64 = store
        .raw_conn()
        .sadd(&active_key, &batch)
        .await
        .expect("sadd");
    // A batch whose state and events are gone is dropped too.
    let _: i64 = store
        .raw_conn()
        .sadd(&active_key, "vanished")
        .await
        .expect("sadd");
    tokio::time::sleep(STALL_AFTER * 2).await;
    let r = watchdog::scan(&a).await.expect("scan").expect("lease");
    assert_eq!(r.healed, 2, "{r:?}");
    assert_eq!(r.in_flight, 0);
    assert!(r.stalled.is_empty() && r.newly_stalled.is_empty(), "{r:?}");
    assert!(!active(&store, &batch).await);
    assert!(!active(&store, "vanished").await);
    assert_eq!(
        stalls(&log).await.len(),
        2,
        "nothing recorded after the report"
    );
}
