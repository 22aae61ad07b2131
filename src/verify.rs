//! Checks the six invariants for a batch, from our event log and, when a
//! provider client is given, from the provider's own view of each group.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::events::{Chunk, Event, Recorded};
use crate::projection::Projection;
use crate::provider::{GroupStatus, ProviderClient};
use crate::store::{Store, StoreResult};

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The invariant (1-6, or 0 for the log's own integrity).
    pub invariant: u8,
    /// Whether it held.
    pub ok: bool,
    /// What was checked, or what broke.
    pub detail: String,
}

/// Every check of one batch.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    /// The batch.
    pub batch: String,
    /// Whether the batch has reported.
    pub reported: bool,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Verification {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

#[derive(Default)]
struct Gen {
    created: Vec<String>,
    discarded: Vec<String>,
    assigned: BTreeMap<u32, u32>,
    loaded: BTreeMap<u32, (usize, String, u32, usize)>,
    sends: Vec<usize>,
    refused: Vec<String>,
    closed: bool,
}

/// Verifies a batch. `cap` is the group cap the workers ran with.
pub async fn verify_batch(
    store: &Store,
    provider: Option<&ProviderClient>,
    batch: &str,
    cap: u64,
) -> StoreResult<Verification> {
    let log = store.batch(batch);
    let mut checks = Vec::new();
    let mut check = |invariant: u8, ok: bool, detail: String| {
        checks.push(Check {
            invariant,
            ok,
            detail,
        })
    };

    let raw = log.events().await?;
    let bad: Vec<_> = raw.iter().filter_map(|r| r.as_ref().err()).collect();
    check(
        0,
        bad.is_empty(),
        format!("{} events, {} undecodable", raw.len(), bad.len()),
    );
    let lost = crate::store::witness::lost_records(store, batch).await?;
    check(
        0,
        lost.is_empty(),
        if lost.is_empty() {
            "no lost Redis writes were detected for this batch".into()
        } else {
            format!(
                "Redis lost acknowledged writes of this batch, so its events may not show \
                 everything the provider did (a second group for a generation, a send): {}",
                lost.iter()
                    .map(|(id, d)| format!("[{id}] {d}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        },
    );
    let events: Vec<Recorded> = raw.into_iter().filter_map(Result::ok).collect();
    let live = log.state().await?;
    let rebuilt = Projection::fold(&events);
    let diff = live.diff(&rebuilt);
    check(
        0,
        diff.is_empty(),
        if diff.is_empty() {
            "live state equals its replay".into()
        } else {
            format!("live state differs from replay: {}", diff.join("; "))
        },
    );

    let mut gens: BTreeMap<u32, Gen> = BTreeMap::new();
    let mut reports = 0;
    let mut rejected = BTreeSet::new();
    let mut recipients = 0u64;
    for (i, r) in events.iter().enumerate() {
        match &r.event {
            Event::ChunkAssigned(e) => {
                gens.entry(e.gen)
                    .or_default()
                    .assigned
                    .insert(e.seq, e.count);
                recipients += u64::from(e.count);
            }
            Event::GroupCreated(e) => gens
                .entry(e.gen)
                .or_default()
                .created
                .push(e.group_id.clone()),
            Event::GroupDiscarded(e) => gens
                .entry(e.gen)
                .or_default()
                .discarded
                .push(e.group_id.clone()),
            Event::ChunkLoaded(e) => {
                gens.entry(e.gen)
                    .or_default()
                    .loaded
                    .insert(e.seq, (i, e.group_id.clone(), e.registered, e.failed.len()));
            }
            Event::SendTriggered(e) => gens.entry(e.gen).or_default().sends.push(i),
            Event::SendRefused(e) => gens
                .entry(e.gen)
                .or_default()
                .refused
                .push(e.reason.clone()),
            Event::GenerationClosed(e) => gens.entry(e.gen).or_default().closed = true,
            Event::BatchReported(_) => reports += 1,
            Event::InputRejected(e) => {
                rejected.insert(r.key.clone());
                let _ = e;
            }
            _ => {}
        }
    }
    let reported = reports > 0;

    for (g, st) in &gens {
        // 1. One group per generation.
        let kept = st.created.first().cloned();
        check(
            1,
            st.created.len() <= 1,
            format!("gen {g}: {} group(s) recorded", st.created.len()),
        );
        check(
            1,
            st.discarded.iter().all(|d| Some(d) != kept.as_ref()),
            format!("gen {g}: the kept group was never discarded"),
        );
        // 2. Sent once, only when fully loaded.
        check(
            2,
            st.sends.len() <= 1,
            format!("gen {g}: {} send event(s)", st.sends.len()),
        );
        // A refused send (the provider's count disagreed with our events)
        // leaves the generation unsent: never a pass.
        check(
            2,
            st.refused.is_empty(),
            if st.refused.is_empty() {
                format!("gen {g}: no send refused")
            } else {
                format!("gen {g}: send refused: {}", st.refused.join("; "))
            },
        );
        if let Some(&send_at) = st.sends.first() {
            let all_loaded_before = st.closed
                && st
                    .assigned
                    .keys()
                    .all(|s| st.loaded.get(s).is_some_and(|(i, ..)| *i < send_at));
            check(
                2,
                all_loaded_before,
                format!("gen {g}: closed and every assigned chunk loaded before the send"),
            );
        } else if reported {
            check(
                2,
                false,
                format!("gen {g}: batch reported but generation never sent"),
            );
        }
        // 3. Loaded once, into the generation's own group.
        let wrong_group: Vec<_> = st
            .loaded
            .iter()
            .filter(|(_, (_, gid, ..))| Some(gid) != kept.as_ref())
            .map(|(s, _)| *s)
            .collect();
        check(
            3,
            wrong_group.is_empty(),
            format!("gen {g}: every chunk loaded into the kept group (wrong: {wrong_group:?})"),
        );
        let unassigned: Vec<_> = st
            .loaded
            .keys()
            .filter(|s| !st.assigned.contains_key(s))
            .collect();
        check(
            3,
            unassigned.is_empty(),
            format!("gen {g}: only assigned chunks loaded (stray: {unassigned:?})"),
        );
        // 6. The cap.
        let n: u64 = st.assigned.values().map(|c| u64::from(*c)).sum();
        check(
            6,
            n <= cap,
            format!("gen {g}: {n} recipients assigned, cap {cap}"),
        );

        if let (Some(p), Some(group_id)) = (provider, kept.as_ref()) {
            let ours: u64 = st
                .loaded
                .values()
                .map(|(_, _, reg, _)| u64::from(*reg))
                .sum();
            match get_group(p, group_id).await {
                Ok(group) => {
                    check(
                        3,
                        group.count.registered_success == ours || st.sends.is_empty(),
                        format!(
                            "gen {g}: provider registered {} in {group_id}, our events {ours}",
                            group.count.registered_success
                        ),
                    );
                    check(
                        6,
                        group.count.registered_success <= cap,
                        format!(
                            "gen {g}: provider holds {} (cap {cap})",
                            group.count.registered_success
                        ),
                    );
                    if !st.sends.is_empty() {
                        check(
                            2,
                            group.status != GroupStatus::Pending,
                            format!("gen {g}: provider status {:?} after our send", group.status),
                        );
                    } else {
                        // Only we send our groups: one sent without a send
                        // event means events were lost (or a send is being
                        // recorded right now).
                        check(
                            2,
                            matches!(group.status, GroupStatus::Pending | GroupStatus::Deleted),
                            format!(
                                "gen {g}: provider status {:?} of {group_id}, and no send event",
                                group.status
                            ),
                        );
                    }
                }
                Err(e) => check(
                    3,
                    false,
                    format!("gen {g}: cannot read group {group_id} at the provider: {e}"),
                ),
            }
            for d in &st.discarded {
                let gone = match get_group(p, d).await {
                    Ok(grp) => grp.status == GroupStatus::Deleted,
                    Err(e) => e.status() == Some(404),
                };
                check(
                    1,
                    gone,
                    format!("gen {g}: losing group {d} is deleted at the provider"),
                );
            }
        }
    }

    // 4. One report decision, and one entry in the reports stream.
    check(4, reports <= 1, format!("{reports} report event(s)"));
    if reported {
        let stream_reports = count_reports(store, batch).await?;
        check(
            4,
            stream_reports == 1,
            format!("{stream_reports} entr(ies) in the reports stream"),
        );
    }

    // 5. Nothing lost.
    if reported {
        let last = live.last_seq();
        let all_assigned = last
            .is_some_and(|l| (0..=l).all(|s| gens.values().any(|g| g.assigned.contains_key(&s))));
        check(5, all_assigned, format!("every seq 0..={last:?} assigned"));
        let accounted: u64 = gens
            .values()
            .flat_map(|g| g.loaded.values())
            .map(|(_, _, reg, failed)| u64::from(*reg) + *failed as u64)
            .sum();
        check(
            5,
            accounted == recipients,
            format!("{accounted} of {recipients} recipients registered or listed as failures"),
        );
    }
    let dead = count_dead_letters(store, batch).await?;
    check(
        5,
        dead >= rejected.len(),
        format!(
            "{} rejected input(s), {dead} dead letter(s) for the batch",
            rejected.len()
        ),
    );

    Ok(Verification {
        batch: batch.to_string(),
        reported,
        checks,
    })
}

/// Reads a group, trying transient failures again (a flaky provider must not
/// fail a verification).
async fn get_group(
    p: &ProviderClient,
    id: &str,
) -> Result<crate::provider::Group, crate::provider::ProviderError> {
    let mut attempt = 0;
    loop {
        match p.get_group(id).await {
            Err(e) if e.is_retryable() && attempt < 8 => {
                attempt += 1;
                let wait = e
                    .retry_after()
                    .unwrap_or(std::time::Duration::from_millis(50 << attempt.min(5)));
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
    }
}

async fn count_reports(store: &Store, batch: &str) -> StoreResult<usize> {
    let stream = store.keys.reports(store.keys.shard_of(batch));
    Ok(store
        .entries(&stream)
        .await?
        .iter()
        .filter(|e| e.get("batch") == Some(batch.as_bytes()))
        .count())
}

/// Dead letters whose original entry is a chunk of `batch`.
pub async fn count_dead_letters(store: &Store, batch: &str) -> StoreResult<usize> {
    let stream = store.keys.dead_letters(store.keys.shard_of(batch));
    Ok(store
        .entries(&stream)
        .await?
        .iter()
        .filter(|e| {
            e.get("f:d")
                .and_then(|d| Chunk::decode(d).ok())
                .is_some_and(|c| c.batch == batch)
        })
        .count())
}
