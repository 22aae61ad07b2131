//! The group-send pipeline end to end: real Redis, the mock provider, many
//! workers; invariants checked from the provider's ledger and our events.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use groupcast::producer::append_chunks;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shuffled_duplicated_chunks_of_three_batches_on_eight_workers() {
    let rig = Rig::start(8, test_config(), mock_config()).await;
    let mut all = Vec::new();
    let mut expected = BTreeMap::new();
    let batches: Vec<String> = (0..3).map(|k| format!("camp-{k}")).collect();
    for (k, b) in batches.iter().enumerate() {
        let n = 2_000 + 500 * k;
        all.extend(shuffled_chunks(b, k as u32, n, 150, k as u64 + 1));
        expected.insert(b.clone(), n);
    }
    shuffle(&mut all, 99);
    append_chunks(&rig.store, &all).await.expect("append");
    rig.wait_reported(&batches, Duration::from_secs(60)).await;
    rig.verify(&batches).await;
    rig.check_ledger(&expected);
    assert!(dead_letters(&rig.store).await.is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cap_rollover_keeps_every_generation_under_the_cap() {
    let config = groupcast::worker::WorkerConfig {
        group_cap: 1_000,
        ..test_config()
    };
    let rig = Rig::start(4, config, mock_config()).await;
    let batch = "rollover".to_string();
    let chunks = shuffled_chunks(&batch, 7, 10_000, 300, 5);
    append_chunks(&rig.store, &chunks).await.expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 10_000)]));
    let st = rig.store.batch(&batch).state().await.expect("state");
    // 34 chunks (33 of 300, one of 100), three or four per generation
    // depending on arrival order.
    assert!(
        (10..=12).contains(&st.generations()),
        "{} generations",
        st.generations()
    );
    for g in 0..st.generations() {
        assert!(st.gen_int(g, "n") <= 1_000);
        assert_eq!(st.gen_field(g, "sent"), Some("sent"));
    }
    rig.stop().await;
}
