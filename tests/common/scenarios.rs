//! End-to-end scenarios shared by tests/pipeline.rs (one redis-server, one
//! shard) and rigs/tests/cluster.rs (a 3-master Redis Cluster, several shards):
//! the same steps and the same checks, whatever runs Redis.

use std::collections::BTreeMap;
use std::time::Duration;

use groupcast::producer::append_chunks;

use super::*;

/// Several batches of `n` recipients each (`(name, n)`), cut into chunks of
/// `chunk`, a third of them sent twice, everything shuffled together; every
/// batch must report, pass verification and the ledger check, with no dead
/// letter.
pub async fn shuffled_duplicated_batches<R>(
    rig: &Rig<R>,
    batches: &[(String, usize)],
    chunk: usize,
    limit: Duration,
) {
    let mut all = Vec::new();
    let mut expected = BTreeMap::new();
    for (k, (b, n)) in batches.iter().enumerate() {
        all.extend(shuffled_chunks(b, k as u32, *n, chunk, k as u64 + 1));
        expected.insert(b.clone(), *n);
    }
    shuffle(&mut all, 99);
    append_chunks(&rig.store, &all).await.expect("append");
    let names: Vec<String> = batches.iter().map(|(b, _)| b.clone()).collect();
    rig.wait_reported(&names, limit).await;
    rig.verify(&names).await;
    rig.check_ledger(&expected);
    assert!(dead_letters(&rig.store).await.is_empty());
}

/// One batch of 10,000 recipients in chunks of 300 under a group cap of
/// 1,000 (the rig's config must have it): every generation stays under the
/// cap and is sent.
pub async fn cap_rollover<R>(rig: &Rig<R>, batch: &str, limit: Duration) {
    assert_eq!(
        rig.config.group_cap, 1_000,
        "the scenario needs a cap of 1,000"
    );
    let batch = batch.to_string();
    let chunks = shuffled_chunks(&batch, 7, 10_000, 300, 5);
    append_chunks(&rig.store, &chunks).await.expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), limit).await;
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
}
