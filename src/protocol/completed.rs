//! `completed.lua`: record that a sent group finished, and decide the batch's
//! report when every generation has (the `report` key decides it once).

use super::{reply, work_item, Db, Run};
use crate::events::{BatchReported, Event, GroupCompleted};

/// The arguments of `completed.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedArgs<'a> {
    /// The generation.
    pub gen: u32,
    /// Its group.
    pub group: &'a str,
    /// The provider's final status.
    pub status: &'a str,
    /// Messages sent.
    pub sent_success: u64,
    /// Messages that failed.
    pub sent_failed: u64,
    /// Retention of a reported batch's state and events (0: none).
    pub retention_secs: u64,
    /// Whether a webhook report work item is enqueued.
    pub deliver: bool,
}

/// `completed.lua`. Returns `completed`, `reported` or `duplicate`.
pub fn completed(db: &mut Db, batch: &str, a: &CompletedArgs) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gen = a.gen;
    if r.get(&format!("k:done/{gen}")).is_some() {
        return reply(["duplicate"]);
    }
    let done0 = r.num("done");
    let top = r.num("gen");
    let last = r.get("last").and_then(|v| v.parse::<i64>().ok());
    let seqs = r.num("seqs");
    let (ss0, sf0) = (r.num("sent_success"), r.num("sent_failed"));
    let (recipients, registered, failed) =
        (r.num("recipients"), r.num("registered"), r.num("failed"));
    let reported = r.get("k:report").is_some();
    r.emit(
        &format!("done/{gen}"),
        Event::GroupCompleted(GroupCompleted {
            gen,
            group_id: a.group.to_string(),
            status: a.status.to_string(),
            sent_success: a.sent_success,
            sent_failed: a.sent_failed,
        }),
        true,
    );
    let done = done0 + 1;
    let (ss, sf) = (ss0 + a.sent_success as i64, sf0 + a.sent_failed as i64);
    r.put(format!("g:{gen}:done"), a.status);
    r.put("done", done);
    r.put("sent_success", ss);
    r.put("sent_failed", sf);
    let all_assigned = last.is_some_and(|l| seqs == l + 1);
    if all_assigned && done == top + 1 && !reported {
        let report = BatchReported {
            outcome: "completed".into(),
            generations: done as u32,
            chunks: seqs as u32,
            recipients: recipients as u64,
            registered: registered as u64,
            failed: failed as u64,
            sent_success: ss as u64,
            sent_failed: sf as u64,
            duplicates: 0,
            rejected: 0,
            missing: 0,
            failed_by_reason: Default::default(),
        };
        r.emit("report", Event::BatchReported(report.clone()), true);
        r.put("report", "completed");
        r.flush();
        r.db.active.remove(batch);
        let id = r.db.next_id();
        r.db.reports
            .push((id, batch.to_string(), Event::BatchReported(report)));
        if a.deliver {
            r.db.add_work("report", work_item(batch, 0, None, None), None);
        }
        if a.retention_secs > 0 {
            if let Some(b) = r.db.batches.get_mut(batch) {
                b.expiring = true;
            }
        }
        return reply(["reported"]);
    }
    r.flush();
    reply(["completed"])
}
