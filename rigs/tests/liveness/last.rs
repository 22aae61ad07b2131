//! How a batch learns its end from chunks it refuses: a chunk flagged `last`
//! that fails validation still ends the batch (a batch of one such chunk
//! included), and a `last` flag below a seq that already arrived ends the
//! batch at the highest seq received, named in the report. None of these
//! needs an operator's `close`.

use std::collections::BTreeMap;

use groupcast::producer::append_chunks;

use super::input::{chunk, registrations, the_report, wait_dead_letters};
use super::retry::{rig_with_hook, wait_state};
use crate::common::*;

/// A batch of one chunk, flagged last, with an unusable number: refused,
/// and the batch reports `failed` at once; nothing reaches the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_one_invalid_last_chunk_reports_failed() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "one-invalid";
    let mut people = recipients(81, 20);
    people[7].to = String::new();
    append_chunks(&rig.store, &[chunk(batch, 0, true, people)])
        .await
        .expect("append");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["rejected"], 1, "{report}");
    assert_eq!(report["registered"], 0, "{report}");
    assert_eq!(report["missing"], 0, "{report}");
    assert!(report["last_conflict"].is_null(), "{report}");
    let letters = wait_dead_letters(&rig, 1).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(registrations(&rig, batch).is_empty());
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// The last of three chunks fails validation: the first two are sent, the
/// third is counted as rejected, and the batch reports `partial` without
/// anyone closing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invalid_last_chunk_still_ends_the_batch() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "invalid-last";
    let people = recipients(82, 300);
    let mut broken = people[200..300].to_vec();
    broken[40].to = String::new();
    let chunks = vec![
        chunk(batch, 2, true, broken),
        chunk(batch, 0, false, people[0..100].to_vec()),
        chunk(batch, 1, false, people[100..200].to_vec()),
    ];
    append_chunks(&rig.store, &chunks).await.expect("append");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["registered"], 200, "{report}");
    assert_eq!(report["rejected"], 1, "{report}");
    assert_eq!(report["missing"], 0, "{report}");
    assert!(report["closed"].is_null(), "nobody closed it: {report}");
    let seen = registrations(&rig, batch);
    assert_eq!(seen.len(), 200);
    assert!(seen.values().all(|&n| n == 1), "each number once");
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 200)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// Seqs 0, 2 and 3 arrive, then seq 1 flagged last (a producer that flags
/// the wrong chunk; chunks travel out of order): the flag contradicts seq 3,
/// so seq 1 is refused, the batch ends at seq 3, sends what it has, and the
/// report names the contradiction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_last_flag_below_a_seq_received_ends_the_batch_at_the_highest() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "contradicting-last";
    let people = recipients(83, 400);
    let part = |k: usize| people[k * 100..(k + 1) * 100].to_vec();
    let early = vec![
        chunk(batch, 0, false, part(0)),
        chunk(batch, 2, false, part(2)),
        chunk(batch, 3, false, part(3)),
    ];
    append_chunks(&rig.store, &early).await.expect("append");
    let log = rig.store.batch(batch);
    wait_state(&log, "seqs 0, 2 and 3 are accepted", |s| s.int("seqs") == 3).await;
    append_chunks(&rig.store, &[chunk(batch, 1, true, part(1))])
        .await
        .expect("append");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["chunks"], 3, "{report}");
    assert_eq!(report["registered"], 300, "{report}");
    assert_eq!(report["rejected"], 1, "{report}");
    let conflict = report["last_conflict"].as_str().unwrap_or_default();
    assert!(
        conflict.contains("seq 1 is flagged last") && conflict.contains("ends at seq 3"),
        "{report}"
    );
    let letters = wait_dead_letters(&rig, 1).await;
    assert!(
        letters
            .iter()
            .any(|(_, r)| r.contains("seq 1 is flagged last, but seq 3")),
        "{letters:?}"
    );
    let seen = registrations(&rig, batch);
    assert_eq!(seen.len(), 300);
    assert!(!seen.contains_key(&people[150].to), "seq 1 was never sent");
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 300)]));
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}
