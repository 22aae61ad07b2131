//! The world as the checker explores it: the actions possible in a state,
//! the state each leads to, what identifies a state, the properties that
//! must hold, and each action in words.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

use groupcast::events::{BatchStalled, Event};
use groupcast::protocol;

use super::{Action, Answer, Delivery, GroupStatus, Held, Redis, WorkKey, World, BATCH, CHUNK_OPS};
use crate::checker::{put, Model};

impl Model for World {
    type Action = Action;

    fn actions(&self, out: &mut Vec<Action>) {
        let deliveries: Vec<(Held, Delivery)> = (0..self.redis.ingest.len())
            .map(|i| (Held::Ingest(i), self.redis.ingest[i]))
            .chain(
                self.redis
                    .db
                    .work
                    .iter()
                    .zip(&self.redis.work)
                    .map(|(e, d)| (Held::Work(e.id), *d)),
            )
            .collect();
        // Identical free workers: only the first free one reads.
        if let Some(w) = self.workers.iter().position(Option::is_none) {
            for (h, d) in &deliveries {
                let due = matches!(h, Held::Work(id) if self.due_after(*id).is_some());
                if *d == Delivery::New && !due {
                    out.push(Action::Read(w, *h));
                }
            }
        }
        for (w, job) in self.workers.iter().enumerate() {
            let Some(job) = job else { continue };
            if self.crashes > 0 {
                out.push(Action::Crash(w));
            }
            if self.waiting(job) {
                continue;
            }
            out.push(Action::Step(w, Answer::Ok));
            if self.calls_provider(job) {
                if self.failures > 0 {
                    out.push(Action::Step(w, Answer::Fail));
                }
                if self.lost_answers > 0 {
                    out.push(Action::Step(w, Answer::Lost));
                }
                if self.refusals > 0 && self.may_refuse(job) {
                    out.push(Action::Step(w, Answer::Refused));
                }
            }
        }
        for (h, d) in &deliveries {
            match d {
                Delivery::Pending(Some(_)) if self.held(*h) && self.steals == 0 => {}
                Delivery::Pending(_) => out.push(Action::Reclaim(*h)),
                _ => {}
            }
        }
        if !self.redis.db.delayed.is_empty() {
            out.push(Action::Promote);
        }
        if self.tracking() && self.redis != *self.synced {
            out.push(Action::Sync);
            if self.redis_losses > 0 {
                out.push(Action::LoseWrites);
            }
        }
        let reported = self.field("report").is_some();
        if self.watchdog > 0 && !reported && self.field("seqs").is_some() {
            out.push(Action::Watchdog);
        }
        // An operator closes a batch that has recorded something.
        let recorded = ["seqs", "holes", "rejected"]
            .iter()
            .any(|f| self.field(f).is_some());
        if self.closes > 0 && recorded && !reported {
            out.push(Action::Close);
        }
        if self.cancels > 0 && !reported {
            out.push(Action::Cancel);
        }
        if self
            .cfg
            .schedule
            .as_ref()
            .is_some_and(|c| self.clock < c.hours)
        {
            out.push(Action::Tick);
        }
        let quiet = deliveries.iter().all(|(_, d)| *d == Delivery::Acked)
            && self.workers.iter().all(Option::is_none);
        if self.cfg.retention && quiet && self.redis.db.batch(BATCH).is_some_and(|b| b.expiring) {
            out.push(Action::Expire);
        }
    }

    fn next(&self, a: &Action) -> World {
        let mut s = self.clone();
        match a {
            Action::Read(w, h) => {
                s.set_delivery(*h, Delivery::Pending(Some(*w as u8)));
                let job = s.job_for(*h);
                s.workers[*w] = Some(job);
            }
            Action::Step(w, answer) => s.step(*w, *answer),
            Action::Crash(w) => {
                s.crashes -= 1;
                if let Some(job) = s.workers[*w].take() {
                    if s.delivery(job.held) == Some(Delivery::Pending(Some(*w as u8))) {
                        s.set_delivery(job.held, Delivery::Pending(None));
                    }
                }
            }
            Action::Reclaim(h) => {
                // Taking an entry from a worker still on it spends a steal;
                // an entry whose worker crashed or moved on (its ack lost
                // with Redis's writes) is reclaimed once idle, freely.
                if s.held(*h) {
                    s.steals -= 1;
                }
                s.set_delivery(*h, Delivery::New);
            }
            Action::Promote => {
                if let Some(m) = s.redis.db.delayed.pop_first() {
                    let text = String::from_utf8_lossy(&m).into_owned();
                    let (gen, group) = text.split_once('|').unwrap_or(("0", ""));
                    let item =
                        protocol::work_item(BATCH, gen.parse().unwrap_or(0), None, Some(group));
                    s.redis.db.add_work("poll", item, None);
                    s.sync_work();
                }
            }
            Action::Sync => s.synced = std::rc::Rc::new(s.redis.clone()),
            Action::LoseWrites => {
                s.redis_losses -= 1;
                let clock = s.redis.db.clock;
                s.redis = (*s.synced).clone();
                // Entry ids come from the server's clock: never reused.
                s.redis.db.clock = clock;
                // Workers keep going with what they knew (an entry Redis
                // forgot is still in their hands; its ack is a no-op).
            }
            Action::Watchdog => {
                s.watchdog -= 1;
                let hb = s.field("hb").unwrap_or("0").to_string();
                let e = Event::BatchStalled(BatchStalled {
                    quiet_since_ms: 0,
                    quiet_for_ms: 0,
                });
                protocol::append(&mut s.redis.db, BATCH, &format!("stalled/{hb}"), &e);
            }
            Action::Expire => {
                s.redis.db.batches.remove(BATCH);
            }
            Action::Close => {
                s.closes -= 1;
                let policy = s.policy();
                protocol::close(&mut s.redis.db, BATCH, &policy, "operator");
                s.sync_work();
            }
            Action::Cancel => {
                s.cancels -= 1;
                let policy = s.policy();
                let r = protocol::cancel(&mut s.redis.db, BATCH, &policy, "operator");
                s.sync_work();
                if r[0] == "cancelled" && s.cancelled.is_none() {
                    let top = protocol::num(s.field("gen"));
                    s.cancelled = Some(
                        (0..=top as u32)
                            .filter(|g| s.claim_live(*g))
                            .map(|g| (g, s.granted.get(&g).copied().unwrap_or(u64::MAX)))
                            .collect(),
                    );
                }
            }
            Action::Tick => s.clock += 1,
        }
        // A report decided by this step (whichever script decided it).
        if s.redis.db.reports.len() > self.redis.db.reports.len() {
            if let Some((_, _, Event::BatchReported(r))) = s.redis.db.reports.last() {
                s.reports.insert(format!(
                    "{} chunks={} missing={}",
                    r.outcome, r.chunks, r.missing
                ));
            }
        }
        s
    }

    fn identity<H: Hasher>(&self, h: &mut H) {
        // Workers are interchangeable: a state is identified up to their
        // order. Each worker gets a key that names no worker (its job, and
        // the entries pending for it, by content); workers are hashed in
        // the order of their keys, and an entry pending for worker `w` names
        // `w`'s rank in that order. Workers with equal keys are symmetric,
        // so that ties do not matter.
        let n = self.workers.len();
        let keys: Vec<u64> = (0..n).map(|w| self.worker_key(w)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&w| keys[w]);
        let mut rank = [0u8; 8];
        for (r, &w) in order.iter().enumerate() {
            rank[w] = r as u8;
        }
        let canon = |d: Delivery| match d {
            Delivery::Pending(Some(w)) => Delivery::Pending(Some(rank[usize::from(w)])),
            d => d,
        };
        // Redis: the state hash without ids and clock readings (which only
        // order events), the work entries by content, parked, delayed.
        let id_free = |r: &Redis, h: &mut H| {
            for (name, b) in &r.db.batches {
                put(h, name);
                for (f, v) in &b.state {
                    put(h, f);
                    if !(f.starts_with("k:") || f == "hb" || f == "t0") {
                        put(h, v);
                    }
                }
                put(h, &b.parked.len());
                for (g, p) in &b.parked {
                    put(h, g);
                    let mut seqs: Vec<&String> = p.iter().map(|(s, _)| s).collect();
                    seqs.sort();
                    put(h, &seqs);
                }
                put(h, &b.numbers);
                put(h, &b.expiring);
            }
            put(h, &r.db.reported);
            let mut work: Vec<WorkKey<'_>> =
                r.db.work
                    .iter()
                    .zip(&r.work)
                    .map(|(e, d)| {
                        (
                            e.op.as_str(),
                            e.item.gen,
                            e.item.seq,
                            e.item.group_id.as_deref(),
                            e.chunk.as_ref(),
                            canon(*d),
                            self.due_after(e.id),
                        )
                    })
                    .collect();
            work.sort();
            put(h, &work);
            for d in &r.ingest {
                put(h, &canon(*d));
            }
            put(h, &r.db.delayed);
            put(h, &r.db.active);
            put(h, &r.dead);
        };
        id_free(&self.redis, h);
        // Ids only order events, but whether one came after the report is
        // part of a state's identity (property 13).
        put(h, &self.after_the_report());
        if self.tracking() {
            id_free(&self.synced, h);
        }
        for &w in &order {
            match &self.workers[w] {
                Some(j) => {
                    put(h, &keys[w]);
                    put(h, &self.delivery(j.held).map(canon));
                }
                None => put(h, &0u8),
            }
        }
        put(h, &self.groups);
        put(h, &(self.webhook, &self.reports));
        put(
            h,
            &(
                self.crashes,
                self.steals,
                self.failures,
                self.lost_answers,
                self.refusals,
                self.redis_losses,
                self.watchdog,
                self.closes,
                self.cancels,
            ),
        );
        put(h, &(&self.cancelled, &self.late_send));
        put(h, &(self.clock, &self.granted, &self.off_schedule_send));
    }

    fn always(&self) -> Option<String> {
        let cap = self.cfg.cap as usize;
        for (i, g) in self.groups.iter().enumerate() {
            // 6. No generation over the cap.
            if g.members.len() > cap {
                return Some(format!(
                    "group P{i} holds {} recipients, over the cap {cap}",
                    g.members.len()
                ));
            }
            // 2. Sent only when complete, and once.
            if g.sends > 1 {
                return Some(format!("group P{i} was sent {} times", g.sends));
            }
            if g.sends == 1 && !g.complete_when_sent {
                return Some(format!(
                    "group P{i} (generation {}) was sent before every chunk assigned to it was loaded",
                    g.gen
                ));
            }
            // 1. One group per generation: no other group of it holds anyone.
            for (j, o) in self.groups.iter().enumerate().skip(i + 1) {
                if o.gen == g.gen && !g.members.is_empty() && !o.members.is_empty() {
                    return Some(format!(
                        "generation {}: groups P{i} and P{j} both hold recipients",
                        g.gen
                    ));
                }
            }
        }
        // 3. A recipient in at most one group.
        let mut seen = BTreeSet::new();
        for (i, g) in self.groups.iter().enumerate() {
            for t in &g.members {
                if !seen.insert(*t) {
                    return Some(format!(
                        "recipient {t} is registered in two groups (one is P{i})"
                    ));
                }
            }
        }
        // 9. A parked chunk is assigned to the generation it waits in (a
        // chunk parked without its assignment is never loaded: the release
        // of its load finds it stale).
        if let Some(b) = self.redis.db.batch(BATCH) {
            for (gen, parked) in &b.parked {
                for (seq, _) in parked {
                    let s = b.state.get(&format!("s:{seq}"));
                    if s.and_then(|s| s.split('|').next()) != Some(gen.to_string().as_str()) {
                        return Some(format!(
                            "chunk {seq} is parked for generation {gen} but assigned {s:?}"
                        ));
                    }
                }
            }
        }
        // 12. A generation counted `unsent` (its send given up) was never
        // sent: the report's `unsent` is the truth.
        for (i, g) in self.groups.iter().enumerate() {
            let done = self.field(&format!("g:{}:done", g.gen));
            let kept = self.field(&format!("g:{}:group", g.gen)) == Some(&format!("P{i}"));
            if kept && done == Some("unsent") && g.status == GroupStatus::Sent {
                return Some(format!(
                    "generation {} is counted unsent, but its group P{i} was sent",
                    g.gen
                ));
            }
        }
        // 15. A group the provider finished is recorded so only after its
        // send: the log never shows a generation done without it.
        if let Some(gen) = self.done_without_send() {
            return Some(format!(
                "generation {gen} is recorded finished by the provider, with no send before it"
            ));
        }
        // 13. Nothing after the end: no event is appended after the report
        // but its delivery and the deletion of groups.
        let late = self.after_the_report();
        if !late.is_empty() {
            return Some(format!("events after the report: {late:?}"));
        }
        // 10. Nothing is sent after a cancel unless its send was claimed
        // before it, and started within the lifetime that claim was given.
        if let Some(v) = &self.late_send {
            return Some(v.clone());
        }
        // 14. Nothing is sent inside quiet hours or before `send_at`.
        if let Some(v) = &self.off_schedule_send {
            return Some(v.clone());
        }
        // 4. The report decided once.
        if self.reports.len() > 1 {
            return Some(format!(
                "the report was decided {} times: {:?}",
                self.reports.len(),
                self.reports
            ));
        }
        if self.webhook > 1 && !self.cfg.webhook {
            return Some("a report reached a webhook nobody configured".into());
        }
        None
    }

    fn eventually(&self) -> Option<String> {
        // 7. The batch ends: one report.
        if self.reports.len() != 1 {
            return Some(format!(
                "no report at the end (dead letters: {:?}; groups: {:?})",
                self.redis.dead, self.groups
            ));
        }
        if self.cfg.webhook && self.webhook == 0 {
            return Some("the report never reached the webhook".into());
        }
        // 11. A cancelled batch reports `cancelled`; its stopped
        // generations' groups are deleted, never sent.
        if self.cancelled.is_some() {
            let report = self.reports.iter().next().map_or("", String::as_str);
            if !report.starts_with("cancelled ") {
                return Some(format!("cancelled, but the report says {report:?}"));
            }
            for (i, g) in self.groups.iter().enumerate() {
                let unknown = self.field(&format!("g:{}:done", g.gen)) == Some("unknown");
                if g.status == GroupStatus::Pending && !g.members.is_empty() && !unknown {
                    return Some(format!(
                        "cancelled: group P{i} holds recipients, neither sent nor deleted"
                    ));
                }
            }
            return None;
        }
        // 5. Nothing lost: every recipient of every accepted chunk is in a sent group.
        let sent: BTreeSet<u8> = self
            .groups
            .iter()
            .filter(|g| g.status == GroupStatus::Sent)
            .flat_map(|g| g.members.iter().copied())
            .collect();
        let wanted: BTreeSet<u8> = self
            .cfg
            .ingest
            .iter()
            .flat_map(|c| c.to.iter().copied())
            .collect();
        // Unless a chunk was refused or given up, or an operator closed the
        // batch (a refused chunk is dead-lettered with its reason).
        let lossy = self.closes < self.cfg.closes
            || (self.redis.dead.iter())
                .any(|d| d.contains("rejected") || d.contains("refused") || d.contains("given up"));
        if !lossy && sent != wanted {
            return Some(format!("recipients {wanted:?} wanted, {sent:?} sent"));
        }
        // 8. The report tells the truth: `completed` only when every
        // recipient of the batch's chunks was sent; and when nothing was
        // refused, given up or closed, it is `completed`.
        let report = self.reports.iter().next().map_or("", String::as_str);
        let outcome = report.split(' ').next().unwrap_or("");
        // (A chunk past the last seq the batch accepted, which a wrong
        // `last` makes, is refused, and dead-lettered: the batch ended
        // before it. The batch must have known its last seq.)
        if outcome == "completed" {
            let n: u32 = (report.split(' '))
                .find_map(|f| f.strip_prefix("chunks="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let of_batch: BTreeSet<u8> = (self.cfg.ingest.iter())
                .filter(|c| c.seq < n)
                .flat_map(|c| c.to.iter().copied())
                .collect();
            if !of_batch.is_subset(&sent) {
                return Some(format!(
                    "the report says {report:?}, but of recipients {of_batch:?} only {sent:?} were sent"
                ));
            }
            if !(self.cfg.ingest.iter()).any(|c| c.last && c.seq + 1 == n) {
                return Some(format!(
                    "the report says {report:?}, but no chunk {} flagged last was there",
                    n.saturating_sub(1)
                ));
            }
            for c in self.cfg.ingest.iter().filter(|c| c.seq >= n) {
                let named = format!("chunk {} ", c.seq);
                if !self.redis.dead.iter().any(|d| d.starts_with(&named)) {
                    return Some(format!(
                        "the report says {report:?}, but chunk {} is neither in it nor dead-lettered",
                        c.seq
                    ));
                }
            }
        }
        if !lossy && self.redis.dead.is_empty() && outcome != "completed" {
            return Some(format!(
                "the report says {report:?}, but every recipient was sent"
            ));
        }
        // Losing racers' groups hold nobody and are never sent. (A group
        // whose recall was given up stays as it is: counted `unknown`.)
        for (i, g) in self.groups.iter().enumerate() {
            let unknown = self.field(&format!("g:{}:done", g.gen)) == Some("unknown");
            if g.status == GroupStatus::Pending && !g.members.is_empty() && !unknown {
                return Some(format!("group P{i} holds recipients but was never sent"));
            }
        }
        None
    }

    fn fair(&self, a: &Action) -> bool {
        match a {
            Action::Read(..) | Action::Promote | Action::Sync | Action::Watchdog => true,
            Action::Tick => true,
            Action::Expire => true,
            Action::Step(_, answer) => *answer == Answer::Ok,
            // A redelivery of an entry nobody is on is the system's own
            // recovery; taking one from a worker still on it is a fault.
            Action::Reclaim(h) => !self.held(*h),
            Action::Crash(_) | Action::LoseWrites => false,
            // A close is what ends a batch whose chunks do not all arrive
            // (or that no chunk says is over); any other batch, whatever
            // its `last` flags and refused chunks, must end without one.
            Action::Close | Action::Cancel => !self.cfg.ends_by_itself(),
        }
    }

    fn goal(&self) -> bool {
        self.reports.len() == 1 && (!self.cfg.webhook || self.webhook > 0)
    }

    fn stuck(&self) -> String {
        let fields: Vec<String> = ["seqs", "last", "gen", "closed", "report", "holes"]
            .iter()
            .filter_map(|f| self.field(f).map(|v| format!("{f}={v}")))
            .collect();
        format!(
            "reports {:?}; batch {:?}; workers {:?}; ingest {:?}; work {:?}; dead letters {:?}; groups {:?}",
            self.reports,
            fields,
            self.workers
                .iter()
                .map(|j| j.as_ref().map(|j| (j.op, j.pc, j.gen, j.seq)))
                .collect::<Vec<_>>(),
            self.redis.ingest,
            (self.redis.db.work.iter())
                .zip(&self.redis.work)
                .map(|(e, d)| format!("{}:{}:{:?}:{:?}", e.op, e.item.gen, e.item.seq, d))
                .collect::<Vec<_>>(),
            self.redis.dead,
            self.groups
        )
    }

    fn describe(&self, a: &Action) -> String {
        match a {
            Action::Read(w, Held::Ingest(i)) => {
                let c = &self.cfg.ingest[*i];
                format!(
                    "worker {w} reads chunk seq={} last={} to={:?}",
                    c.seq, c.last, c.to
                )
            }
            Action::Read(w, Held::Work(id)) => {
                let Some(e) = self.redis.db.work.iter().find(|e| e.id == *id) else {
                    return format!("worker {w} reads work entry {id}");
                };
                format!(
                    "worker {w} reads work `{}` gen={} seq={:?} group={:?}",
                    e.op, e.item.gen, e.item.seq, e.item.group_id
                )
            }
            Action::Step(w, answer) => {
                let j = self.workers[*w].as_ref();
                let what = j.map_or("?".into(), |j| {
                    let step = match (j.op, j.pc) {
                        (CHUNK_OPS, 0) => "accept.lua".to_string(),
                        (CHUNK_OPS, 1) => "park.lua".to_string(),
                        (_, 2) if j.op == CHUNK_OPS || j.op == "load" => {
                            format!("provider add seq {} to {:?}", j.seq, j.group)
                        }
                        (_, 3) if j.op == CHUNK_OPS || j.op == "load" => {
                            format!("loaded.lua seq {}", j.seq)
                        }
                        ("create", 0) => "provider create group".into(),
                        ("create", 1) => format!("record_group.lua {:?}", j.group),
                        ("create", 2) => "enqueue delete of the losing group".into(),
                        ("send", 0) => "send: read marker, ready, group".into(),
                        ("send", 1) => format!("provider GET {:?} + count check", j.group),
                        ("send", 2)
                            if j.until.is_some_and(|u| self.now_ms() >= u)
                                && self.cfg.mutant != Some(super::Mutant::SendPastClaim) =>
                        {
                            "the claim's lifetime is over: the item runs again".into()
                        }
                        ("send", 2) => format!("provider send {:?}", j.group),
                        ("send", 3) => "sent.lua".into(),
                        ("send", 4) => "claim_send.lua".into(),
                        ("poll", 0) => "provider GET, completed.lua".into(),
                        ("delete", 0) => format!("provider delete {:?}", j.group),
                        ("delete", 1) => "append group_discarded".into(),
                        ("report", 0) => "POST report to webhook".into(),
                        ("report", 1) => "append report_delivered".into(),
                        _ => "ack".into(),
                    };
                    format!("{} gen={}: {step}", j.op, j.gen)
                });
                let ans = match answer {
                    Answer::Ok => "",
                    Answer::Fail => " [provider fails]",
                    Answer::Lost => " [provider answer lost]",
                    Answer::Refused => " [provider refuses for good]",
                };
                format!("worker {w} {what}{ans}")
            }
            Action::Crash(w) => format!("worker {w} crashes"),
            Action::Reclaim(h) => format!("reclaim {h:?} (visibility timeout)"),
            Action::Promote => "promote the due poll".into(),
            Action::Sync => "redis fsyncs".into(),
            Action::LoseWrites => "redis restarts and loses its unsynced writes".into(),
            Action::Watchdog => "watchdog finds the batch quiet".into(),
            Action::Expire => "retention expires the batch's keys".into(),
            Action::Close => "an operator closes the batch".into(),
            Action::Cancel => "an operator cancels the batch".into(),
            Action::Tick => format!("an hour passes: {:02}:00", self.clock + 1),
        }
    }
}

impl Hash for World {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.identity(h);
    }
}
