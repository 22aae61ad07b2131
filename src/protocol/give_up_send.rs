//! `give_up_send.lua`: record that a generation's send, or what follows it,
//! was given up, so that the generation and the batch still end truthfully.
//! A send given up is never claimed again; with no claim in place nothing
//! went out (done `unsent`, its group deleted); with one, a `recall` asks the
//! provider. A poll or recall given up leaves the outcome unknown (done
//! `unknown`).

use super::settle::try_report;
use super::{reply, work_item, BatchPolicy, Db, Run};
use crate::events::{Event, GenerationFailed, GroupCompleted};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// What was given up (the script's `what`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenUp {
    /// The send item: refused for good, failing past `--retry-for`, or
    /// refused by the count check.
    Send,
    /// The recall deleted the group (or found it deleted): it never went
    /// out.
    Unsent,
    /// The poll of a sent group: its outcome cannot be learned.
    Poll,
    /// The recall itself: whether the group went out cannot be learned.
    Recall,
}

impl GivenUp {
    /// The script's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            GivenUp::Send => "send",
            GivenUp::Unsent => "unsent",
            GivenUp::Poll => "poll",
            GivenUp::Recall => "recall",
        }
    }
}

/// `give_up_send.lua` for generation `gen` (its group `group`, '' when
/// unknown). Returns `unsent, <recipients>`, `recalling`, `unknown,
/// <recipients>`, `sent` (the send was recorded: nothing given up), `done`
/// (the generation is done: nothing recorded) or `stale` (what the item
/// rested on is not recorded, lost with Redis's unsynced writes: a send of
/// a generation not ready, a poll of one not sent, a recall of one whose
/// send was not given up; nothing given up).
pub fn give_up_send(
    db: &mut Db,
    batch: &str,
    policy: &BatchPolicy,
    gen: u32,
    what: GivenUp,
    reason: &str,
    group: &str,
) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gk = |f: &str| field::gen(gen, f);
    if r.get(&gk(generation::DONE)).is_some() {
        return reply(["done"]);
    }
    let rests_on = match what {
        GivenUp::Send => r.get(&gk(generation::READY)).is_some(),
        GivenUp::Poll => r.get(&field::key(&event_key::send(gen))).is_some(),
        GivenUp::Unsent | GivenUp::Recall => {
            r.get(&gk(generation::GIVEN_UP)).as_deref() == Some("send")
        }
    };
    if !rests_on {
        return reply(["stale"]);
    }
    let registered = r.num(&gk(generation::REGISTERED));
    let finish = |r: &mut Run, status: &str| {
        r.emit(
            &event_key::done(gen),
            Event::GroupCompleted(GroupCompleted {
                gen,
                group_id: group.to_string(),
                status: status.into(),
                sent_success: 0,
                sent_failed: 0,
                recipients: registered as u64,
            }),
            true,
        );
        r.put(gk(generation::DONE), status);
        r.flush();
        r.incr("done", 1);
        r.incr("sent_success", 0);
        r.incr("sent_failed", 0);
        r.incr(status, registered);
        try_report(r, policy);
        reply([status, &registered.to_string()])
    };
    match what {
        GivenUp::Send => {
            if r.get(&field::key(&event_key::send(gen))).is_some() {
                return reply(["sent"]);
            }
            if r.get(&gk(generation::GIVEN_UP)).is_some() {
                return reply(["recalling"]);
            }
            let n = r.num(&gk(generation::CLAIMED));
            let claim_key = super::claim_send::claim_key(gen, n);
            let claimed =
                n > r.num(&gk(generation::GIVEN_BACK)) && r.get(&field::key(&claim_key)).is_some();
            r.emit(
                &event_key::failed(gen),
                Event::GenerationFailed(GenerationFailed {
                    gen,
                    op: "send".into(),
                    reason: reason.into(),
                    recall: claimed,
                }),
                true,
            );
            r.put(gk(generation::GIVEN_UP), "send");
            if claimed {
                let item = work_item(batch, gen, None, Some(group));
                r.db.add_work("recall", item, None);
                r.flush();
                return reply(["recalling"]);
            }
            if !group.is_empty() {
                let item = work_item(batch, gen, None, Some(group));
                r.db.add_work("delete", item, None);
            }
            finish(&mut r, "unsent")
        }
        GivenUp::Unsent => finish(&mut r, "unsent"),
        GivenUp::Poll | GivenUp::Recall => {
            r.emit(
                &event_key::failed_to(gen, what.as_str()),
                Event::GenerationFailed(GenerationFailed {
                    gen,
                    op: what.as_str().into(),
                    reason: reason.into(),
                    recall: false,
                }),
                true,
            );
            finish(&mut r, "unknown")
        }
    }
}
