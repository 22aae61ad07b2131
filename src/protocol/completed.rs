//! `completed.lua`: record that a sent group finished, and decide the
//! batch's report when it was the last thing the batch waited for (see
//! [`super::settle`]).

use super::settle::try_report;
use super::{reply, BatchPolicy, Db, Run};
use crate::events::{Event, GroupCompleted};
use crate::projection::{
    event_key,
    field::{self, generation},
};

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
}

/// `completed.lua`. Returns `completed`, `reported` or `duplicate`, or
/// `not_sent`: the generation's send is not on record (Redis lost it with
/// its unsynced writes while the poll went on), and nothing is recorded.
pub fn completed(db: &mut Db, batch: &str, policy: &BatchPolicy, a: &CompletedArgs) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gen = a.gen;
    if r.get(&field::key(&event_key::done(gen))).is_some() {
        return reply(["duplicate"]);
    }
    if r.get(&field::key(&event_key::send(gen))).is_none() {
        return reply(["not_sent"]);
    }
    let done = r.num(field::GENERATIONS_DONE);
    let (ss, sf) = (r.num(field::SENT_SUCCESS), r.num(field::SENT_FAILED));
    r.emit(
        &event_key::done(gen),
        Event::GroupCompleted(GroupCompleted {
            gen,
            group_id: a.group.to_string(),
            status: a.status.to_string(),
            sent_success: a.sent_success,
            sent_failed: a.sent_failed,
            ..Default::default()
        }),
        true,
    );
    r.put(field::gen(gen, generation::DONE), a.status);
    r.put(field::GENERATIONS_DONE, done + 1);
    r.put(field::SENT_SUCCESS, ss + a.sent_success as i64);
    r.put(field::SENT_FAILED, sf + a.sent_failed as i64);
    if policy.track && (a.status == "COMPLETE" || a.status == "FAILED") {
        let item = super::work_item(&r.batch, gen, None, Some(a.group));
        r.db.add_work("track", item, None);
    }
    if try_report(&mut r, policy) {
        return reply(["reported"]);
    }
    reply(["completed"])
}
