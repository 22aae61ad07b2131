//! The event log: idempotent appends, the scripts' projections, and replay.

mod common;

use std::collections::BTreeSet;

use groupcast::events::{ChunkLoaded, Event, InputRejected};
use groupcast::projection::Projection;
use groupcast::store::batch::{Accepted, Appended, GroupRecord, Parked};
use proptest::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_of_the_same_keys_append_each_once() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("b-concurrent");
    let mut tasks = Vec::new();
    for t in 0..32u32 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut new = 0u32;
            // Each task walks the keys from a different starting point, so
            // that tasks really collide on the same keys at the same time.
            for i in 0..1000u32 {
                let k = (i + t * 31) % 1000;
                let e = Event::InputRejected(InputRejected {
                    seq: Some(k),
                    reason: "test".into(),
                    hole: false,
                    ..Default::default()
                });
                if let Appended::New(_) = log
                    .append(&format!("reject/{k}"), &e)
                    .await
                    .expect("append")
                {
                    new += 1;
                }
            }
            new
        }));
    }
    let mut total_new = 0;
    for t in tasks {
        total_new += t.await.expect("task");
    }
    assert_eq!(total_new, 1000, "each key appended by exactly one task");
    let len: u64 = store.stream_len(&log.keys.events).await.expect("xlen");
    assert_eq!(len, 1000);
    let live = log.state().await.expect("state");
    assert_eq!(live.int("rejected"), 1000);
    let keys: BTreeSet<_> = live.fields.keys().filter(|k| k.starts_with("k:")).collect();
    assert_eq!(keys.len(), 1000);
    let rebuilt = log.replay().await.expect("replay").expect("all decode");
    assert_eq!(live.diff(&rebuilt), Vec::<String>::new());
}

#[tokio::test]
async fn a_repeated_append_returns_the_first_entry() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("b1");
    let e = Event::InputRejected(InputRejected {
        seq: None,
        reason: "x".into(),
        hole: false,
        ..Default::default()
    });
    let Appended::New(first) = log.append("reject/x", &e).await.expect("append") else {
        panic!("first append must be new")
    };
    assert_eq!(
        log.append("reject/x", &e).await.expect("append"),
        Appended::Duplicate(first)
    );
}

#[tokio::test]
async fn chunks_roll_over_to_a_new_generation_at_the_cap() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("b-roll");
    // cap 1000, chunks of 300: generations of 3 chunks (900), the 4th rolls over.
    let mut gens = Vec::new();
    for seq in 0..10u32 {
        let last = seq == 9;
        match log
            .accept(seq, last, 300, &format!("d{seq}"), 1000)
            .await
            .expect("accept")
        {
            Accepted::Assigned { gen, .. } => gens.push(gen),
            other => panic!("seq {seq}: {other:?}"),
        }
    }
    assert_eq!(gens, vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
    let p = log.state().await.expect("state");
    for g in 0..4 {
        assert!(p.gen_int(g, "n") <= 1000);
        assert!(p.gen_field(g, "closed").is_some(), "gen {g} closed");
    }
    assert_eq!(p.gen_field(3, "closed"), Some("final"));
    // A repeat with the same digest is a duplicate; another digest a conflict.
    assert!(matches!(
        log.accept(4, false, 300, "d4", 1000).await.expect("accept"),
        Accepted::Duplicate { gen: 1, .. }
    ));
    assert!(matches!(
        log.accept(4, false, 300, "other", 1000)
            .await
            .expect("accept"),
        Accepted::Conflict(_)
    ));
    // Beyond the last seq.
    assert!(matches!(
        log.accept(10, false, 1, "x", 1000).await.expect("accept"),
        Accepted::Rejected(_)
    ));
}

#[tokio::test]
async fn last_seq_conflicts_are_rejected() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("b-last");
    assert!(matches!(
        log.accept(5, false, 1, "a", 100).await.expect("accept"),
        Accepted::Assigned { .. }
    ));
    // Flagging 3 as last after 5 was accepted: refused, and the batch ends
    // at the highest seq received (5), the contradiction kept.
    assert!(matches!(
        log.accept(3, true, 1, "b", 100).await.expect("accept"),
        Accepted::Rejected(_)
    ));
    let state = log.state().await.expect("state");
    assert_eq!(state.last_seq(), Some(5));
    assert!(state
        .get("last_conflict")
        .is_some_and(|w| w.contains("seq 3 is flagged last") && w.contains("ends at seq 5")));
    // Beyond that end, flagged or not.
    assert!(matches!(
        log.accept(6, true, 1, "c", 100).await.expect("accept"),
        Accepted::Rejected(_)
    ));
    // Below it, still taken.
    assert!(matches!(
        log.accept(4, false, 1, "e", 100).await.expect("accept"),
        Accepted::Assigned { .. }
    ));
    // A second, different last seq below the end.
    assert!(matches!(
        log.accept(2, true, 1, "d", 100).await.expect("accept"),
        Accepted::Rejected(_)
    ));
}

#[tokio::test]
async fn parked_chunks_are_released_when_the_group_is_recorded() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("b-park");
    for seq in 0..3u32 {
        log.accept(seq, seq == 2, 10, &format!("d{seq}"), 100)
            .await
            .expect("accept");
        assert_eq!(
            log.park(seq, 0, b"payload").await.expect("park"),
            Parked::Parked
        );
    }
    let work: u64 = store.stream_len(&log.keys.work).await.expect("xlen");
    assert_eq!(
        work, 1,
        "one create-group work item for three parked chunks"
    );
    assert_eq!(
        log.record_group(0, "G1").await.expect("record"),
        GroupRecord::Won
    );
    assert_eq!(
        log.record_group(0, "G2").await.expect("record"),
        GroupRecord::Lost { kept: "G1".into() }
    );
    let work: u64 = store.stream_len(&log.keys.work).await.expect("xlen");
    assert_eq!(work, 4, "three released load items follow the create item");
    assert_eq!(
        log.park(1, 0, b"payload").await.expect("park"),
        Parked::Group("G1".into())
    );
    // Loading all three makes the final generation ready: one send item.
    for seq in 0..3u32 {
        let ready = log
            .loaded(&ChunkLoaded {
                gen: 0,
                seq,
                group_id: "G1".into(),
                registered: 10,
                duplicates: 0,
                failed: vec![],
                given_up: None,
            })
            .await
            .expect("loaded");
        assert_eq!(ready, Some(seq == 2));
    }
    let again = log
        .loaded(&ChunkLoaded {
            gen: 0,
            seq: 1,
            group_id: "G1".into(),
            registered: 10,
            duplicates: 0,
            failed: vec![],
            given_up: None,
        })
        .await
        .expect("loaded");
    assert_eq!(again, None);
    let work: u64 = store.stream_len(&log.keys.work).await.expect("xlen");
    assert_eq!(work, 5);
    let live = log.state().await.expect("state");
    let rebuilt = log.replay().await.expect("replay").expect("decodes");
    assert_eq!(live.diff(&rebuilt), Vec::<String>::new());
    assert_eq!(live.int("registered"), 30);
}

/// One step of a random but valid history of a batch.
#[derive(Debug, Clone)]
enum Step {
    Chunk(u32),
    Load(u32),
}

fn history() -> impl Strategy<Value = (u32, u32, Vec<Step>)> {
    (2u32..12, 1u32..5).prop_flat_map(|(chunks, per_gen)| {
        let steps: Vec<Step> = (0..chunks)
            .flat_map(|s| [Step::Chunk(s), Step::Load(s)])
            .collect();
        // Every step appears once or twice, in any order.
        let dup = proptest::collection::vec(any::<bool>(), steps.len());
        (Just(chunks), Just(per_gen), Just(steps), dup).prop_flat_map(|(c, p, steps, dup)| {
            let mut all = steps.clone();
            for (s, d) in steps.iter().zip(dup) {
                if d {
                    all.push(s.clone());
                }
            }
            (Just(c), Just(p), Just(all).prop_shuffle())
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any interleaving and duplication of a batch's arrivals through the real
    /// scripts leaves a live state that replay rebuilds exactly, and the fold
    /// of the resulting events is the same in any order, with duplicates.
    #[test]
    fn live_state_equals_replay_for_any_interleaving((chunks, per_gen, steps) in history(), seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let (_server, store) = common::store(1).await;
            let log = store.batch("b-prop");
            let cap = u64::from(per_gen) * 10;
            let mut assigned = std::collections::HashMap::new();
            let mut pending_loads = Vec::new();
            for step in steps {
                match step {
                    Step::Chunk(seq) => {
                        let r = log.accept(seq, seq == chunks - 1, 10, &format!("d{seq}"), cap).await.expect("accept");
                        match r {
                            Accepted::Assigned { gen, group, .. } | Accepted::Duplicate { gen, group, .. } => {
                                assigned.insert(seq, gen);
                                if group.is_none() {
                                    log.park(seq, gen, b"p").await.expect("park");
                                    log.record_group(gen, &format!("G{gen}")).await.expect("record");
                                }
                            }
                            other => panic!("valid history refused: {other:?}"),
                        }
                    }
                    Step::Load(seq) => pending_loads.push(seq),
                }
                // A load can only happen after its chunk was assigned.
                let ready: Vec<u32> = pending_loads.iter().copied().filter(|s| assigned.contains_key(s)).collect();
                pending_loads.retain(|s| !assigned.contains_key(s));
                for seq in ready {
                    let gen = assigned[&seq];
                    log.loaded(&ChunkLoaded { gen, seq, group_id: format!("G{gen}"), registered: 10, duplicates: 0, failed: vec![], given_up: None })
                        .await
                        .expect("loaded");
                }
            }
            let live = log.state().await.expect("state");
            let events: Vec<_> = log.events().await.expect("events").into_iter().map(|r| r.expect("decodes")).collect();
            let rebuilt = Projection::fold(&events);
            assert_eq!(live.diff(&rebuilt), Vec::<String>::new());
            // Every generation that was closed and fully loaded became ready once.
            for g in 0..live.generations() {
                assert!(live.gen_int(g, "n") as u64 <= cap);
                if live.gen_field(g, "closed").is_some() && live.gen_int(g, "l") == live.gen_int(g, "c") {
                    assert_eq!(live.gen_field(g, "ready"), Some("1"), "gen {g} ready");
                }
            }
            assert_eq!(live.int("registered"), i64::from(chunks) * 10);
            // The fold does not depend on order or duplication.
            let mut shuffled = events.clone();
            shuffled.extend(events.iter().take((seed % 7) as usize).cloned());
            let n = shuffled.len();
            for i in 0..n {
                let j = (seed.wrapping_mul(i as u64 + 1).wrapping_add(7) % n as u64) as usize;
                shuffled.swap(i, j);
            }
            assert_eq!(Projection::fold(&shuffled), rebuilt);
        });
    }
}

/// Calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
async fn command_calls(store: &groupcast::store::Store) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut store.raw_conn())
        .await
        .expect("info");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

#[tokio::test]
async fn an_idempotent_append_costs_four_commands_and_a_repeat_two() {
    use groupcast::events::SendRefused;
    let (_server, store) = common::store(1).await;
    let log = store.batch("b-cost");
    let e = |k: u32| {
        Event::InputRejected(InputRejected {
            seq: Some(k),
            reason: "x".into(),
            hole: false,
            ..Default::default()
        })
    };
    // Load the script first (the first call answers NOSCRIPT and loads it).
    log.append("warm", &e(0)).await.expect("append");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut store.raw_conn())
        .await
        .expect("resetstat");
    log.append("reject/1", &e(1)).await.expect("append");
    let calls = command_calls(&store).await;
    let total: u64 = calls
        .iter()
        .filter(|(k, _)| !k.starts_with("info") && !k.starts_with("config"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        total, 5,
        "EVALSHA + HGET + XADD + HINCRBY + HSET: {calls:?}"
    );
    // An event whose change is a plain set: EVALSHA + HGET + XADD + HSET.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut store.raw_conn())
        .await
        .expect("resetstat");
    let refused = Event::SendRefused(SendRefused {
        gen: 0,
        group_id: "G".into(),
        reason: "r".into(),
    });
    log.append("refused/0", &refused).await.expect("append");
    let calls = command_calls(&store).await;
    let total: u64 = calls
        .iter()
        .filter(|(k, _)| !k.starts_with("info") && !k.starts_with("config"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("xadd"), Some(&1), "{calls:?}");
    assert_eq!(total, 4, "EVALSHA + HGET + XADD + HSET: {calls:?}");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut store.raw_conn())
        .await
        .expect("resetstat");
    log.append("reject/1", &e(1)).await.expect("append");
    let calls = command_calls(&store).await;
    let total: u64 = calls
        .iter()
        .filter(|(k, _)| !k.starts_with("info") && !k.starts_with("config"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 2, "a repeat is EVALSHA + HGET: {calls:?}");
}
