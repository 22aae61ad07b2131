//! Priority lanes end to end (real Redis, the mock provider in-process):
//! urgent work overtakes a bulk batch that saturates the provider's rate
//! limit, and bulk work keeps its guaranteed share while urgent work keeps
//! coming. Asserted from the provider's ledger and our events, by order and
//! by counts, never by wall time (`groupcast bench --workload lanes` prints
//! the latencies).

mod common;

use std::time::{Duration, Instant};

use common::*;
use groupcast::events::Chunk;
use groupcast::keys::Priority;
use groupcast::producer::{cut, Producer};
use groupcast::worker::WorkerConfig;

/// Appends a batch's chunks to its shard's ingest stream of `lane`.
async fn submit(rig: &Rig, lane: Priority, chunks: &[Chunk]) {
    let shard = rig.store.keys.shard_of(&chunks[0].batch);
    Producer::new(rig.store.clone())
        .max_unread(0)
        .append_encoded(
            shard,
            lane,
            chunks
                .iter()
                .map(|c| {
                    // The lane is the batch's priority, in its options.
                    let mut c = c.clone();
                    c.options.priority = Some(lane);
                    c.encode()
                })
                .collect(),
        )
        .await
        .expect("append");
}

/// Messages the provider registered for `batch` so far.
fn registered(rig: &Rig, batch: &str) -> u64 {
    rig.mock
        .ledger_summary()
        .groups
        .iter()
        .filter(|g| g.custom_fields.get("batchId").map(String::as_str) == Some(batch))
        .map(|g| g.count.registered_success)
        .sum()
}

/// Send calls the provider saw for `batch`'s groups.
fn sends(rig: &Rig, batch: &str) -> usize {
    rig.mock
        .ledger_summary()
        .groups
        .iter()
        .filter(|g| g.custom_fields.get("batchId").map(String::as_str) == Some(batch))
        .map(|g| g.send_calls.len())
        .sum()
}

async fn reported(rig: &Rig, batch: &str) -> bool {
    rig.store
        .batch(batch)
        .state()
        .await
        .map(|s| s.get("report").is_some())
        .unwrap_or(false)
}

/// The race of issue 12: the provider limited to 25 requests/s, a bulk batch
/// of 100,000 recipients (400 adds of 250) loading, and an urgent batch of
/// 20 submitted once the bulk batch is well under way: the urgent batch is
/// sent and reported while the bulk batch is still loading.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_urgent_batch_overtakes_a_bulk_batch_at_the_rate_limit() {
    let config = WorkerConfig {
        concurrency: WorkerConfig::CONCURRENCY,
        rate_limit: groupcast::worker::RateLimit::PerSecond(25),
        rate_burst: 1,
        visibility_timeout: WorkerConfig::VISIBILITY_TIMEOUT,
        poll_interval: Duration::from_millis(100),
        ..test_config()
    };
    let mut mock = mock_config();
    mock.faults.rate_limit_per_sec = Some(25);
    let rig = Rig::start(1, config, mock).await;
    let (bulk, urgent) = ("lanes-bulk", "lanes-urgent");
    submit(
        &rig,
        Priority::Bulk,
        &cut(bulk, &template(), recipients(1, 100_000), 250),
    )
    .await;
    // "2 s later": once the bulk batch holds the rate limit (50 adds in).
    wait_until(
        Duration::from_secs(60),
        "the bulk batch to load 50 chunks",
        || async { registered(&rig, bulk) >= 50 * 250 },
    )
    .await;
    let submitted = Instant::now();
    submit(
        &rig,
        Priority::Urgent,
        &cut(urgent, &template(), recipients(2, 20), 250),
    )
    .await;
    wait_until(Duration::from_secs(60), "the urgent batch's report", || {
        reported(&rig, urgent)
    })
    .await;
    let latency = submitted.elapsed();
    // At the moment the urgent batch reported, the bulk batch was still
    // loading: not reported, not sent, not every recipient registered.
    assert!(!reported(&rig, bulk).await, "the bulk batch reported first");
    let bulk_registered = registered(&rig, bulk);
    assert!(
        bulk_registered < 100_000,
        "the bulk batch was fully loaded before the urgent one reported"
    );
    assert_eq!(sends(&rig, bulk), 0, "the bulk batch was sent first");
    assert_eq!(registered(&rig, urgent), 20);
    assert_eq!(sends(&rig, urgent), 1);
    eprintln!(
        "urgent batch reported {:.2} s after its submit; bulk batch at {bulk_registered}/100000 registered",
        latency.as_secs_f64()
    );
    let rate_limited = rig.mock.ledger_summary().totals.faults.rate_limited;
    eprintln!("requests the provider refused for its rate limit: {rate_limited}");
    rig.verify(&[urgent.to_string()]).await;
    rig.stop().await;
}

/// Urgent work that keeps the limiter busy does not starve bulk work: while
/// an urgent batch of 600 one-recipient chunks loads (each its own add, more
/// than the rate allows), the bulk batch keeps being added, at about its
/// guaranteed share (`bulk_share`, 10 %) of the requests, and the urgent
/// batch gets most of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_keeps_its_share_while_urgent_work_keeps_coming() {
    let config = WorkerConfig {
        concurrency: 16,
        rate_limit: groupcast::worker::RateLimit::PerSecond(100),
        rate_burst: 1,
        bulk_share: 10,
        poll_interval: Duration::from_millis(100),
        ..test_config()
    };
    let rig = Rig::start(1, config, mock_config()).await;
    let (bulk, urgent) = ("share-bulk", "share-urgent");
    submit(
        &rig,
        Priority::Bulk,
        &cut(bulk, &template(), recipients(3, 50_000), 250),
    )
    .await;
    wait_until(
        Duration::from_secs(60),
        "the bulk batch to start loading",
        || async { registered(&rig, bulk) > 0 },
    )
    .await;
    submit(
        &rig,
        Priority::Urgent,
        &cut(urgent, &template(), recipients(4, 600), 1),
    )
    .await;
    // A window in which urgent work is always waiting: from its 100th add
    // to its 400th (200 more are queued behind it).
    wait_until(Duration::from_secs(60), "100 urgent adds", || async {
        registered(&rig, urgent) >= 100
    })
    .await;
    let (u0, b0) = (registered(&rig, urgent), registered(&rig, bulk) / 250);
    wait_until(Duration::from_secs(60), "400 urgent adds", || async {
        registered(&rig, urgent) >= 400
    })
    .await;
    let (u1, b1) = (registered(&rig, urgent), registered(&rig, bulk) / 250);
    let (du, db) = (u1 - u0, b1 - b0);
    eprintln!("in the window: {du} urgent adds, {db} bulk adds");
    // 10 % of the window's requests is about 33 bulk adds: at least a third
    // of that, so that scheduling noise on a busy machine does not fail it.
    assert!(
        db * 30 >= (du + db),
        "bulk starved: {db} bulk adds against {du} urgent ones"
    );
    assert!(
        du >= 3 * db,
        "urgent work was not served first: {du} urgent adds against {db} bulk ones"
    );
    rig.stop().await;
}

/// The limiter script's lane rules, on one schedule at 1 request/s (long
/// enough that the microseconds between calls never matter): a lane books
/// up to its horizon, an owed lower lane past it, and urgent past what the
/// lower lanes booked.
#[tokio::test]
async fn the_limiter_books_lanes_by_horizon_and_owed_share() {
    use groupcast::store::coord::LaneLimit;
    let (_server, store) = store(1).await;
    let key = store.keys.limiter();
    let max_wait = Duration::from_secs(80);
    let limit = |lane: Priority| LaneLimit {
        max_wait_ms: 80_000,
        horizon_ms: groupcast::worker::limiter::horizon(lane, max_wait).as_millis() as u64,
        share: groupcast::worker::limiter::guaranteed(lane, 1, 10),
        share_key: store.keys.limiter_share(lane),
    };
    let book = |lane: Priority| {
        let (store, key, l) = (store.clone(), key.clone(), limit(lane));
        async move {
            store
                .reserve_rate(&key, 1, 1, 1, Some(&l))
                .await
                .expect("rate_limit")
        }
    };
    // A booking made `e` ms after the first waits for its slot less `e`:
    // the slot at `at` ms is answered within `at - e ..= at` (a loaded
    // machine only makes `e` larger, never the answer wrong).
    let first = Instant::now();
    let slot = |at: i64| (at - first.elapsed().as_millis() as i64 - 1)..=at;
    // Bulk's horizon is 80 s / 8 = 10 s: slots 0..=10 s are booked.
    for k in 0..=10 {
        let wait = book(Priority::Bulk).await;
        assert!(slot(k * 1000).contains(&wait), "bulk slot {k}: {wait}");
    }
    // 11 s is past the horizon, but bulk is owed a slot: booked.
    let owed = book(Priority::Bulk).await;
    assert!(slot(11_000).contains(&owed), "owed bulk slot: {owed}");
    // The next one is not owed for 10 s: refused, back when the wait fits
    // the horizon (in 2 s).
    let refused = book(Priority::Bulk).await;
    let back = slot(2_000);
    assert!(
        (-back.end()..=-back.start()).contains(&refused),
        "bulk past its horizon: {refused}"
    );
    // Normal's horizon is 20 s: booked at 12 s.
    let normal = book(Priority::Normal).await;
    assert!(slot(12_000).contains(&normal), "normal: {normal}");
    // Urgent's is 40 s: booked at 13 s, past everything bulk booked.
    let urgent = book(Priority::Urgent).await;
    assert!(slot(13_000).contains(&urgent), "urgent: {urgent}");
    // Without a longest wait (no lane), every booking is taken.
    let any = store
        .reserve_rate(&key, 1, 1, 1, None)
        .await
        .expect("rate_limit");
    assert!(slot(14_000).contains(&any), "no lane: {any}");
}

/// Reservations that arrive together are booked together: two limiters (two
/// worker processes' worth), 15 concurrent requests each, at 20 requests/s
/// with a burst of 1. Fewer booking calls than requests reach Redis, and no
/// request goes before its slot: the k-th to go went at least k / 20 s after
/// the first booking (a lower bound, which a slow machine cannot break).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reservations_are_booked_in_rounds_and_keep_the_rate() {
    use groupcast::worker::limiter::Limiter;
    let (_server, store) = store(1).await;
    let limiters = [
        Limiter::new(
            store.clone(),
            groupcast::worker::RateLimit::PerSecond(20),
            1,
            10,
        ),
        Limiter::new(
            store.clone(),
            groupcast::worker::RateLimit::PerSecond(20),
            1,
            10,
        ),
    ];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..30 {
        let limiter = limiters[k % 2].clone();
        tasks.push(tokio::spawn(async move {
            limiter
                .reserve_within(Priority::Normal, 1, Duration::from_secs(60))
                .await
                .expect("reserve")
                .expect("booked within the horizon");
            started.elapsed()
        }));
    }
    let mut went = Vec::new();
    for t in tasks {
        went.push(t.await.expect("task"));
    }
    went.sort();
    for (k, at) in went.iter().enumerate() {
        assert!(
            *at + Duration::from_millis(2) >= Duration::from_millis(50 * k as u64),
            "request {k} went after {at:?}, before its slot at {} ms",
            50 * k
        );
    }
    let calls = command_calls(&store, "evalsha").await;
    assert!(
        calls < 30,
        "{calls} booking calls for 30 requests: nothing was booked together"
    );
}

/// Requests that come one after another, each once the one before went (a
/// busy lane whose requests never arrive together), do not cost a call each:
/// while the schedule is past its burst, a call books slots ahead that the
/// next requests take without one. At 100 requests/s with a burst of 1, 30
/// sequential requests: at most half as many booking calls as requests, and
/// none goes before its slot (the k-th at least k / 100 s after the first
/// booking).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_reservations_take_slots_booked_ahead() {
    use groupcast::worker::limiter::Limiter;
    let (_server, store) = store(1).await;
    let limiter = Limiter::new(
        store.clone(),
        groupcast::worker::RateLimit::PerSecond(100),
        1,
        10,
    );
    let started = Instant::now();
    for k in 0..30u64 {
        limiter
            .reserve_within(Priority::Normal, 1, Duration::from_secs(60))
            .await
            .expect("reserve")
            .expect("booked within the horizon");
        let at = started.elapsed();
        assert!(
            at + Duration::from_millis(2) >= Duration::from_millis(10 * k),
            "request {k} went after {at:?}, before its slot at {} ms",
            10 * k
        );
    }
    let calls = command_calls(&store, "evalsha").await;
    assert!(
        calls <= 15,
        "{calls} booking calls for 30 sequential requests: nothing was booked ahead"
    );
}

/// A delete retried after its first answer was lost finds its group already
/// `DELETED`: the provider refuses to delete it again (400), and the handler
/// looks at the group before giving up. Here another process keeps the
/// shared schedule 0.5-0.75 s ahead, past the normal lane's horizon (¼ of
/// the longest wait, 1 s), so this lane only gets its owed slot, one a
/// second. The look must not be given back: the retry would spend the owed
/// slot on the delete again and the look would be refused again, try after
/// try. The discard is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_of_a_group_already_deleted_is_recorded_under_a_busy_limiter() {
    use groupcast::projection::event_key;
    use groupcast::worker::ops::{Op, WorkItem};
    use std::collections::BTreeMap;
    let (rate, burst) = (4, 1);
    let config = WorkerConfig {
        concurrency: 2,
        rate_limit: groupcast::worker::RateLimit::PerSecond(rate),
        rate_burst: burst,
        // The normal lane is owed 25% of 4/s: a slot a second.
        bulk_share: 25,
        // The longest limiter wait a handler holds: 1 s.
        visibility_timeout: Duration::from_secs(4),
        ..test_config()
    };
    let rig = Rig::start(1, config, mock_config()).await;
    let batch = "busy-delete";
    let group = rig
        .provider
        .create_group(&BTreeMap::from([(
            "batchId".to_string(),
            batch.to_string(),
        )]))
        .await
        .expect("create")
        .group_id;
    // The first delete's answer was lost: the group is gone already.
    rig.provider.delete_group(&group).await.expect("delete");
    // Another process's bookings: whenever the schedule is less than 0.5 s
    // ahead, one more slot (0.25 s at 4/s).
    let busy = {
        let store = rig.store.clone();
        tokio::spawn(async move {
            let key = store.keys.limiter();
            loop {
                let wait = store
                    .reserve_rate(&key, rate, burst, 1, None)
                    .await
                    .expect("rate_limit");
                if wait >= 500 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };
    let log = rig.store.batch(batch);
    let item = WorkItem {
        batch: batch.to_string(),
        gen: 0,
        seq: None,
        group_id: Some(group.clone()),
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
        cursor: None,
    };
    rig.store
        .enqueue(
            &log.keys.work,
            Op::Delete.name(),
            &groupcast::events::encode_payload(&item),
            None,
        )
        .await
        .expect("enqueue");
    let key = event_key::discard(&group);
    wait_until(Duration::from_secs(20), "the discard is recorded", || {
        let (log, key) = (log.clone(), key.clone());
        async move { log.appended(&key).await.ok().flatten().is_some() }
    })
    .await;
    busy.abort();
    rig.stop().await;
}

/// Below the burst, slots booked ahead may be used at once within the
/// window, so they are charged as if they all went at its end: the shared
/// schedule then stands at least `window + n / rate` past the call, and
/// another process gets at once only what is left of the burst after that.
/// (Charged at the call instead, requests going late in the window would
/// add up with other processes' at-once requests beyond the burst.)
#[tokio::test]
async fn slots_booked_below_the_burst_are_charged_at_the_end_of_their_window() {
    let (_server, store) = store(1).await;
    let key = store.keys.limiter();
    // 100/s (10 ms a slot), a burst of 20, an idle schedule.
    let (rate, burst) = (100, 20);
    let before = store.time_ms_at(&key).await.expect("time");
    let (wait, n, within) = store
        .reserve_rate_ahead(
            &key,
            rate,
            burst,
            1,
            groupcast::store::coord::BookAhead {
                slots: 5,
                window_ms: 50,
            },
            None,
        )
        .await
        .expect("rate_limit");
    assert_eq!((wait, n, within), (0, 5, 50), "the cost at once, 5 ahead");
    let after = store.time_ms_at(&key).await.expect("time");
    let tat: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut store.raw_conn())
        .await
        .expect("get");
    let tat_ms = tat.parse::<u64>().expect("the schedule, in µs") / 1000;
    // max(cost's slot, the window's end) + 5 slots: 50 + 50 ms.
    assert!(
        tat_ms >= before + 100 && tat_ms <= after + 100,
        "schedule at {} ms past the call",
        tat_ms as i64 - before as i64
    );
    // Another process: at once only while the schedule is within the burst
    // (200 ms) of now, one slot each: 10 at once, then a wait.
    let mut at_once = 0;
    while store
        .reserve_rate(&key, rate, burst, 1, None)
        .await
        .expect("rate_limit")
        == 0
    {
        at_once += 1;
        assert!(at_once <= burst, "the burst is exceeded");
    }
    let elapsed = store.time_ms_at(&key).await.expect("time") - before;
    // 20 - 10 (5 charged and the 50 ms window), plus what the time spent
    // booking gave back.
    assert!(
        u64::from(at_once) <= 10 + elapsed / 10,
        "{at_once} at once after {elapsed} ms"
    );
}

/// Requests that come one after another below the burst (a lane whose
/// requests never arrive together and never wait) do not cost a call each:
/// a call books slots ahead that the next requests use at once within the
/// window. At 100 requests/s with a burst of 50, 30 sequential requests
/// arriving 2 ms apart: at most half as many calls as requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_reservations_below_the_burst_take_slots_booked_ahead() {
    use groupcast::worker::limiter::Limiter;
    let (_server, store) = store(1).await;
    let limiter = Limiter::new(
        store.clone(),
        groupcast::worker::RateLimit::PerSecond(100),
        50,
        10,
    );
    for _ in 0..30 {
        let waited = limiter
            .reserve_within(Priority::Normal, 1, Duration::from_secs(60))
            .await
            .expect("reserve")
            .expect("booked within the horizon");
        assert!(
            waited < Duration::from_millis(20),
            "a request below the burst waited {waited:?}"
        );
        // The next request comes a moment later (pacing, not
        // synchronisation: any gap within the window shows the same).
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let calls = command_calls(&store, "evalsha").await;
    assert!(
        calls <= 15,
        "{calls} booking calls for 30 sequential requests below the burst"
    );
}
