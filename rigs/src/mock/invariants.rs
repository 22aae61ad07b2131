//! The invariants as the mock provider's ledger sees them: the provider-side
//! half of every end-to-end check (the other half is [`groupcast::verify`]).

use std::collections::BTreeMap;

use super::{GroupSummary, LedgerSummary};
use groupcast::provider::GroupStatus;

/// What the ledger says.
#[derive(Debug, Clone, Default)]
pub struct LedgerCheck {
    /// Every broken rule, in words.
    pub violations: Vec<String>,
    /// Empty, never-sent groups whose create answer was lost (the provider
    /// has no list endpoint to find them by): harmless, but counted.
    pub orphans: usize,
    /// Groups deleted (losers of a creation race).
    pub deleted: usize,
    /// Recipients registered, per batch.
    pub registered: BTreeMap<String, u64>,
    /// Used groups, per batch.
    pub groups: BTreeMap<String, usize>,
}

impl LedgerCheck {
    /// Whether nothing broke.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks: one used group per (batch, generation), sent with exactly one
/// `200`; no recipient registered twice anywhere; no group over `cap`.
pub fn check(summary: &LedgerSummary, cap: u64) -> LedgerCheck {
    let mut out = LedgerCheck::default();
    for d in summary.duplicate_registrations.iter().take(10) {
        out.violations.push(format!(
            "{} registered more than once, in {:?}",
            d.to, d.group_ids
        ));
    }
    let mut used: BTreeMap<(String, String), Vec<&GroupSummary>> = BTreeMap::new();
    for g in &summary.groups {
        let batch = g.custom_fields.get("batchId").cloned().unwrap_or_default();
        let gen = g
            .custom_fields
            .get("generation")
            .cloned()
            .unwrap_or_default();
        if g.status == GroupStatus::Deleted {
            out.deleted += 1;
            continue;
        }
        if g.count.total == 0 && g.status == GroupStatus::Pending && g.send_calls.is_empty() {
            out.orphans += 1;
            continue;
        }
        used.entry((batch, gen)).or_default().push(g);
    }
    for ((batch, gen), groups) in &used {
        if groups.len() != 1 {
            out.violations.push(format!(
                "batch {batch} generation {gen}: {} groups hold messages",
                groups.len()
            ));
        }
        for g in groups {
            let ok_sends = g.send_calls.iter().filter(|c| c.status == 200).count();
            if ok_sends != 1 {
                out.violations.push(format!(
                    "batch {batch} generation {gen}: group {} sent {ok_sends} times successfully",
                    g.group_id
                ));
            }
            if g.count.registered_success > cap {
                out.violations.push(format!(
                    "batch {batch} generation {gen}: {} registered, over the cap {cap}",
                    g.count.registered_success
                ));
            }
            *out.registered.entry(batch.clone()).or_default() += g.count.registered_success;
            *out.groups.entry(batch.clone()).or_default() += 1;
        }
    }
    out
}
