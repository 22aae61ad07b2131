//! `reject.lua`: record a chunk refused before it could be accepted (it does
//! not validate); its seq becomes a hole the batch can end without.

use super::settle::{reject as record, tombstoned};
use super::{BatchPolicy, Db, Run};
use crate::projection::field;

/// `reject.lua` for chunk `seq` (content `digest`) refused for `reason`;
/// `flagged_last`: the chunk's `last` flag, which still tells the batch its
/// end. Returns `rejected` or `refused, why` (the batch has ended).
pub fn reject(
    db: &mut Db,
    batch: &str,
    policy: &BatchPolicy,
    seq: u32,
    digest: &str,
    reason: &str,
    flagged_last: bool,
) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let refused = |why: String| vec!["refused".to_string(), format!("batch {batch} {why}")];
    if let Some(o) = r.get(field::REPORT) {
        return refused(format!(
            "was already reported ({o}): it takes no more chunks"
        ));
    }
    if let Some(c) = r.get(field::CANCELLED) {
        return refused(format!("was cancelled ({c}): it takes no more chunks"));
    }
    if let Some(c) = r.get(field::CLOSED) {
        return refused(format!("was closed ({c}): it takes no more chunks"));
    }
    let nothing = r.get(field::SEQS).is_none()
        && r.get(field::HOLES).is_none()
        && r.get(field::REJECTED).is_none();
    if tombstoned(&r, nothing) {
        return refused(
            "was already reported (its events have expired): it takes no more chunks".into(),
        );
    }
    record(&mut r, policy, seq, digest, reason, true, flagged_last);
    vec!["rejected".into()]
}
