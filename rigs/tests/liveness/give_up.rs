//! Provider operations given up for good still end their batch: a group
//! creation the provider refuses (403 after a key rotation) ends its
//! generations, their chunks counted failed, and the batch reports.

use std::time::Duration;

use groupcast::producer::append_chunks;

use super::input::{chunk, the_report, wait_dead_letters};
use super::retry::{rig_with_hook, wait_until};
use crate::common::*;

/// The provider's secret was rotated: every create is refused (403). Each
/// generation's create is given up (`generation_failed`), its chunks end as
/// given up, and the batch reports `failed` with every recipient counted,
/// once; nothing reaches the provider; a close afterwards changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_refused_for_good_ends_the_batch_as_failed() {
    let config = groupcast::worker::WorkerConfig {
        group_cap: 250,
        ..test_config()
    };
    let mock = groupcast_rigs::mock::MockConfig {
        api_secret: "rotated".into(),
        ..mock_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock).await;
    let batch = "create-refused";
    let people = recipients(91, 400);
    // Two generations (cap 250): chunks 0-1 in the first, 2-3 in the next.
    let chunks: Vec<_> = (0..4)
        .map(|k| chunk(batch, k, k == 3, people[k as usize * 100..][..100].to_vec()))
        .collect();
    append_chunks(&rig.store, &chunks).await.expect("append");
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["recipients"], 400, "{report}");
    assert_eq!(report["registered"], 0, "{report}");
    assert_eq!(report["failed"], 400, "{report}");
    assert_eq!(report["failed_by_reason"]["given_up"], 400, "{report}");
    let letters = wait_dead_letters(&rig, 2).await;
    assert!(
        letters.iter().all(|(_, r)| r.contains("403")),
        "the create items, dead-lettered with the provider's refusal: {letters:?}"
    );
    let state = rig.store.batch(batch).state().await.expect("state");
    for gen in 0..2 {
        assert_eq!(state.failed_in(gen), Some("create"), "generation {gen}");
    }
    assert!(
        rig.mock.ledger().groups.is_empty(),
        "no group was ever created"
    );
    // `close` now finds the batch reported.
    let closing = rig.store.batch(batch).close("late").await.expect("close");
    assert!(
        matches!(closing, groupcast::store::batch::Closing::AlreadyReported(ref o) if o == "failed"),
        "{closing:?}"
    );
    wait_until("nothing is parked", Duration::from_secs(5), || {
        let store = rig.store.clone();
        async move {
            let mut conn = store.raw_conn();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*parked*")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            keys.is_empty()
        }
    })
    .await;
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}
