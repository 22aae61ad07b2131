//! Cancel: before any send nothing goes out and the groups are deleted;
//! mid-batch the generations not yet sent are stopped; a send claimed
//! before the cancel goes out and is counted, one not claimed never does,
//! also with many workers racing the cancel. Each test asserts from the mock
//! provider's ledger (who was sent, how many times), from our events
//! (`groupcast verify`) and from the webhook (one report, `cancelled`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use groupcast::events::{Chunk, Event};
use groupcast::producer::{append_chunks, cut};
use groupcast::provider::GroupStatus;
use groupcast::store::batch::{BatchLog, BatchPolicy, Cancelling, Claim, ClaimArgs};
use groupcast::worker::WorkerConfig;
use groupcast_rigs::mock::LedgerGroup;

use super::input::{registrations, the_report};
use super::retry::{rig_with_hook, wait_state, wait_until};
use crate::common::*;

/// The batch's groups at the provider, by generation.
pub(crate) fn groups_of<R>(rig: &Rig<R>, batch: &str) -> BTreeMap<u32, Vec<LedgerGroup>> {
    let mut out: BTreeMap<u32, Vec<LedgerGroup>> = BTreeMap::new();
    for g in rig.mock.ledger().groups {
        if g.custom_fields.get("batchId").map(String::as_str) != Some(batch) {
            continue;
        }
        let gen = g.custom_fields["generation"].parse().expect("generation");
        out.entry(gen).or_default().push(g);
    }
    out
}

/// The batch's log as an operator's command uses it: a report the cancel
/// decides is queued for the webhook (as `groupcast cancel` does).
pub(crate) fn operator<R>(rig: &Rig<R>, batch: &str) -> BatchLog {
    rig.store
        .clone()
        .with_policy(BatchPolicy {
            deliver: true,
            ..BatchPolicy::default()
        })
        .batch(batch)
}

/// Sends the provider answered 200 for this group.
pub(crate) fn sends(g: &LedgerGroup) -> usize {
    g.send_calls.iter().filter(|c| c.status == 200).count()
}

/// Waits until every group of `gens` of the batch is deleted at the
/// provider (the cancel's `delete` work items ran).
pub(crate) async fn wait_deleted<R>(rig: &Rig<R>, batch: &str, gens: &[u32]) {
    wait_until(
        "the stopped generations' groups are deleted at the provider",
        Duration::from_secs(30),
        || {
            let groups = groups_of(rig, batch);
            let done = gens.iter().all(|g| {
                groups
                    .get(g)
                    .is_some_and(|gs| gs.iter().all(|x| x.status == GroupStatus::Deleted))
            });
            async move { done }
        },
    )
    .await;
}

/// Waits until every work item is handled: none pending or unread, none
/// waiting in the delayed set for a retry.
pub(crate) async fn wait_work_handled<R>(rig: &Rig<R>) {
    wait_until(
        "every work item is handled",
        Duration::from_secs(30),
        || {
            let store = rig.store.clone();
            async move {
                store
                    .stream_health()
                    .await
                    .map(|h| {
                        h.iter().all(|s| match s.what {
                            "work" => s.pending == Some(0) && s.lag == Some(0),
                            "delayed retries" => s.length == 0,
                            _ => true,
                        })
                    })
                    .unwrap_or(false)
            }
        },
    )
    .await;
}

/// Before any send: nothing goes out, the group is deleted at the provider,
/// one report says `cancelled` with nothing sent. Cancel again answers the
/// same; the chunk that comes later is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_before_the_send_sends_nothing_and_deletes_the_group() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "wrong-campaign";
    let chunks = cut(batch, &template(), recipients(81, 400), 100);
    // Seqs 0..=2 come; the last (3) not yet: one open generation.
    append_chunks(&rig.store, &chunks[..3])
        .await
        .expect("append");
    let log = operator(&rig, batch);
    wait_state(&log, "three chunks are loaded", |s| s.int("g:0:l") == 3).await;
    let first = log.cancel("wrong template").await.expect("cancel");
    assert_eq!(
        first,
        Cancelling::Cancelled {
            stopped: 1,
            unsent: 300,
            seen: true
        }
    );
    assert_eq!(log.cancel("again").await.expect("cancel"), first);
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["cancelled"], "wrong template", "{report}");
    assert_eq!(report["registered"], 300, "{report}");
    assert_eq!(report["sent_success"], 0, "{report}");
    assert_eq!(report["sent_generations"], 0, "{report}");
    assert_eq!(report["sent_recipients"], 0, "{report}");
    assert_eq!(report["stopped"], 1, "{report}");
    assert_eq!(report["unsent"], 300, "{report}");
    assert_eq!(report["groups"][0]["status"], "cancelled", "{report}");
    wait_deleted(&rig, batch, &[0]).await;
    for (gen, gs) in groups_of(&rig, batch) {
        for g in gs {
            assert!(
                g.send_calls.is_empty(),
                "gen {gen}: group {} had a send call",
                g.group_id
            );
        }
    }
    assert_eq!(
        registrations(&rig, batch).len(),
        300,
        "registered, not sent"
    );
    // The last chunk, late: refused by the cancelled (reported) batch.
    append_chunks(&rig.store, &chunks[3..])
        .await
        .expect("append");
    // Counted on the batch, not dead-lettered.
    wait_state(&log, "the late chunk counted", |s| {
        s.int(groupcast::projection::field::AFTER_END) == 1
    })
    .await;
    assert!(dead_letters(&rig.store).await.is_empty());
    assert_eq!(log.cancel("once more").await.expect("cancel"), first);
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 0)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// Mid-batch: five generations went out; the sixth (its chunk loaded, the
/// generation not full yet) and the chunks still to come are stopped. The
/// report counts what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_mid_batch_stops_the_generations_not_yet_sent() {
    let config = WorkerConfig {
        group_cap: 100,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock_config()).await;
    let batch = "half-sent";
    // One chunk per generation: a generation is closed (and sent) when the
    // next chunk comes.
    let chunks = cut(batch, &template(), recipients(82, 800), 100);
    append_chunks(&rig.store, &chunks[..6])
        .await
        .expect("append");
    let log = operator(&rig, batch);
    wait_state(&log, "generations 0-4 sent, 5 loaded", |s| {
        (0..5).all(|g| s.gen_field(g, "sent").is_some()) && s.int("g:5:l") == 1
    })
    .await;
    assert_eq!(
        log.cancel("stop the rest").await.expect("cancel"),
        Cancelling::Cancelled {
            stopped: 1,
            unsent: 100,
            seen: true
        }
    );
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["registered"], 600, "{report}");
    assert_eq!(report["sent_generations"], 5, "{report}");
    assert_eq!(report["sent_recipients"], 500, "{report}");
    assert_eq!(report["sent_success"], 500, "{report}");
    assert_eq!(report["stopped"], 1, "{report}");
    assert_eq!(report["unsent"], 100, "{report}");
    wait_deleted(&rig, batch, &[5]).await;
    let groups = groups_of(&rig, batch);
    for gen in 0..5 {
        let sent: usize = groups[&gen].iter().map(sends).sum();
        assert_eq!(sent, 1, "gen {gen} sent once");
    }
    assert!(groups[&5].iter().all(|g| g.send_calls.is_empty()));
    // The chunks still to come are refused.
    append_chunks(&rig.store, &chunks[6..])
        .await
        .expect("append");
    wait_state(&log, "the two late chunks counted", |s| {
        s.int(groupcast::projection::field::AFTER_END) == 2
    })
    .await;
    assert!(dead_letters(&rig.store).await.is_empty());
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 500)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// The claim decides, with the workers stopped so that each order is
/// certain: a generation made ready (by a close) whose send was claimed
/// before the cancel goes out and is counted; one whose send was not claimed
/// is never sent, although its send work item runs after the cancel (this
/// batch was closed before the cancel: it still stops what close would have
/// sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claimed_send_goes_out_and_an_unclaimed_one_never_does() {
    let (mut rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let (claimed, unclaimed) = ("claim-first", "cancel-first");
    let mut all: Vec<Chunk> = Vec::new();
    for (k, b) in [claimed, unclaimed].iter().enumerate() {
        // Seqs 0 and 1 of 3: the generation stays open.
        let chunks = cut(b, &template(), recipients(83 + k as u32, 300), 100);
        all.extend_from_slice(&chunks[..2]);
    }
    append_chunks(&rig.store, &all).await.expect("append");
    for b in [claimed, unclaimed] {
        wait_state(&rig.store.batch(b), "two chunks loaded", |s| {
            s.int("g:0:l") == 2
        })
        .await;
    }
    rig.stop_workers().await;
    // With no worker running: close (the generation is ready, its send
    // enqueued), then claim or not, then cancel.
    let (a, b) = (operator(&rig, claimed), operator(&rig, unclaimed));
    for log in [&a, &b] {
        log.close("producer gave up").await.expect("close");
    }
    let Claim::Claimed { .. } = a
        .claim_send(&ClaimArgs::unscheduled(0))
        .await
        .expect("claim")
    else {
        panic!("the claim before the cancel is granted");
    };
    assert_eq!(
        a.cancel("stop").await.expect("cancel"),
        Cancelling::Cancelled {
            stopped: 0,
            unsent: 0,
            seen: true
        }
    );
    assert_eq!(
        b.cancel("stop").await.expect("cancel"),
        Cancelling::Cancelled {
            stopped: 1,
            unsent: 200,
            seen: true
        }
    );
    assert!(matches!(
        b.claim_send(&ClaimArgs::unscheduled(0))
            .await
            .expect("claim"),
        Claim::Cancelled(_)
    ));
    // The workers come back: both send items run.
    rig.add_worker().await;
    rig.add_worker().await;
    let report = the_report(&rig, &hook, claimed).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["sent_success"], 200, "{report}");
    assert_eq!(report["sent_generations"], 1, "{report}");
    assert_eq!(report["stopped"], 0, "{report}");
    let report = the_report(&rig, &hook, unclaimed).await;
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["sent_success"], 0, "{report}");
    assert_eq!(report["stopped"], 1, "{report}");
    assert_eq!(report["closed"], "producer gave up", "{report}");
    wait_deleted(&rig, unclaimed, &[0]).await;
    // The unclaimed generation's send item ran and never reached the
    // provider's send: every work item is handled, none waits for a retry.
    wait_work_handled(&rig).await;
    let sent = |b: &str| -> usize { groups_of(&rig, b).values().flatten().map(sends).sum() };
    assert_eq!(sent(claimed), 1);
    assert_eq!(sent(unclaimed), 0);
    assert!(groups_of(&rig, unclaimed)[&0]
        .iter()
        .all(|g| g.send_calls.is_empty()));
    rig.check_ledger(&BTreeMap::from([
        (claimed.to_string(), 200),
        (unclaimed.to_string(), 0),
    ]));
    rig.verify(&[claimed.to_string(), unclaimed.to_string()])
        .await;
    rig.stop().await;
}

/// Many workers sending while the cancel comes, and chunks still arriving:
/// every generation is either sent once (its send claimed before the
/// cancel) and counted in the report, or never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_racing_the_workers_sends_each_generation_once_or_never() {
    let config = WorkerConfig {
        group_cap: 50,
        concurrency: 8,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(4, config, mock_config()).await;
    let mut totals = (0usize, 0usize);
    for round in 0..3u32 {
        let batch = format!("race-{round}");
        let chunks = cut(&batch, &template(), recipients(90 + round, 2_000), 50);
        let (head, tail) = chunks.split_at(10 + 5 * round as usize);
        let (middle, last) = tail.split_at(tail.len() - 1);
        append_chunks(&rig.store, head).await.expect("append");
        let log = operator(&rig, &batch);
        wait_state(&log, "a generation is sent", |s| {
            (0..s.generations()).any(|g| s.gen_field(g, "sent").is_some())
        })
        .await;
        // More chunks arrive while the cancel runs.
        let store = rig.store.clone();
        let middle = middle.to_vec();
        let appending = tokio::spawn(async move { append_chunks(&store, &middle).await });
        let Cancelling::Cancelled { stopped, .. } = log.cancel("race").await.expect("cancel")
        else {
            panic!("the cancel of a batch in flight cancels it");
        };
        assert!(stopped >= 1, "the open generation is stopped");
        appending.await.expect("join").expect("append");
        append_chunks(&rig.store, last).await.expect("append");
        let report = the_report(&rig, &hook, &batch).await;
        assert_eq!(report["outcome"], "cancelled", "{report}");
        let state = log.state().await.expect("state");
        // Per generation, at the provider: sent once and on our record as
        // claimed and sent, or never sent.
        let groups = groups_of(&rig, &batch);
        let mut sent_gens = BTreeSet::new();
        let (mut delivered, mut registered) = (0u64, 0u64);
        for (gen, gs) in &groups {
            let n: usize = gs.iter().map(sends).sum();
            assert!(n <= 1, "{batch} gen {gen}: sent {n} times");
            if n == 1 {
                assert!(
                    state.gen_field(*gen, "claimed").is_some()
                        && state.gen_field(*gen, "sent").is_some()
                        && state.gen_field(*gen, "done") != Some("cancelled"),
                    "{batch} gen {gen}: sent at the provider, not as claimed and sent on our record"
                );
                sent_gens.insert(*gen);
                let g = gs.iter().find(|g| sends(g) == 1).expect("the sent group");
                delivered += g.count.sent_success;
                registered += g.count.registered_success;
            } else {
                assert_ne!(state.gen_field(*gen, "sent"), Some("sent"));
            }
        }
        let stopped_gens: Vec<u32> = (0..state.generations())
            .filter(|&g| state.gen_field(g, "done") == Some("cancelled"))
            .collect();
        assert_eq!(stopped_gens.len() as u32, stopped, "{batch}");
        assert!(stopped_gens.iter().all(|g| !sent_gens.contains(g)));
        assert_eq!(report["sent_generations"], sent_gens.len(), "{report}");
        assert_eq!(report["sent_success"], delivered, "{report}");
        assert_eq!(report["sent_recipients"], registered, "{report}");
        assert_eq!(report["stopped"], stopped, "{report}");
        let with_group: Vec<u32> = stopped_gens
            .iter()
            .copied()
            .filter(|&g| state.gen_field(g, "group").is_some())
            .collect();
        wait_deleted(&rig, &batch, &with_group).await;
        rig.verify(std::slice::from_ref(&batch)).await;
        totals.0 += sent_gens.len();
        totals.1 += stopped_gens.len();
        let events = log.events().await.expect("events");
        assert_eq!(
            events
                .iter()
                .filter(|r| matches!(r, Ok(r) if matches!(r.event, Event::BatchCancelled(_))))
                .count(),
            1
        );
    }
    eprintln!(
        "cancel race: {} generation(s) sent, {} stopped over 3 rounds",
        totals.0, totals.1
    );
    rig.stop().await;
}
