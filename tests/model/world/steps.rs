//! What a worker does, one atomic step at a time: each op of `src/worker/`
//! as its script calls, provider calls and acknowledgement.

use groupcast::events::{
    ChunkLoaded, Event, GroupDiscarded, RegistrationFailure, ReportDelivered, SendRefused,
};
use groupcast::protocol::claim_send::ClaimMode;
use groupcast::protocol::{
    self,
    accept::{AcceptArgs, DedupeClaim},
    completed::CompletedArgs,
    GivenUp,
};

use super::{Answer, Group, GroupStatus, Held, Job, Mutant, World, ACK, BATCH, CHUNK_OPS, DEAD};

impl World {
    /// One step of worker `w`; the last event it appended, if any, is the
    /// one its entry's acknowledgement will wait on.
    pub(super) fn step(&mut self, w: usize, answer: Answer) {
        self.redis.db.last_event = None;
        self.run_step(w, answer);
        if let Some(key) = self.redis.db.last_event.take() {
            if let Some(job) = self.workers[w].as_mut() {
                job.appended = Some(key);
            }
        }
    }

    fn run_step(&mut self, w: usize, answer: Answer) {
        let Some(mut job) = self.workers[w].clone() else {
            return;
        };
        match answer {
            Answer::Fail => self.failures -= 1,
            Answer::Lost => self.lost_answers -= 1,
            Answer::Refused => self.refusals -= 1,
            Answer::Ok => {}
        }
        let cap = self.cfg.cap;
        match (job.op, job.pc) {
            (CHUNK_OPS, 0) => {
                let Held::Ingest(i) = job.held else { return };
                let c = self.cfg.ingest[i].clone();
                let digest = Self::digest(&c);
                let policy = self.policy();
                if c.invalid {
                    // The loader's validation fails: recorded, dead-lettered.
                    let last = c.last && self.cfg.mutant != Some(Mutant::RefusedLastIgnored);
                    let r = protocol::reject(
                        &mut self.redis.db,
                        BATCH,
                        &policy,
                        c.seq,
                        &digest,
                        "invalid",
                        last,
                    );
                    self.sync_work();
                    let how = if r[0] == "rejected" {
                        "rejected"
                    } else {
                        "refused"
                    };
                    self.dead(w, format!("chunk {} {how}: invalid", c.seq));
                    return;
                }
                if self.cfg.mutant == Some(Mutant::RefusedLastIgnored) && c.last {
                    // The old rule: a flag below a seq already received is
                    // refused and teaches the batch nothing.
                    let known = self.field("last").is_some();
                    let above = ["max", "rmax"]
                        .iter()
                        .filter_map(|f| self.field(f).and_then(|v| v.parse::<u32>().ok()))
                        .any(|m| m > c.seq);
                    if !known && above {
                        protocol::reject(
                            &mut self.redis.db,
                            BATCH,
                            &policy,
                            c.seq,
                            &digest,
                            "flagged last below a seq received",
                            false,
                        );
                        self.sync_work();
                        self.dead(w, format!("chunk {} rejected: contradicting last", c.seq));
                        return;
                    }
                }
                let records = Self::records(&c.to);
                // The loader's view of the number log is the whole log (a
                // stale view only costs a `behind`: the conformance test
                // draws those); stamped by the log's length, so that equal
                // worlds stay equal.
                let log = self
                    .redis
                    .db
                    .batch(BATCH)
                    .map_or(&[][..], |b| &b.numbers[..]);
                let stamp = format!("{:016x}", log.len());
                let claim = DedupeClaim::current_stamped(log, &records, &stamp);
                let r = protocol::accept(
                    &mut self.redis.db,
                    BATCH,
                    &policy,
                    &AcceptArgs {
                        seq: c.seq,
                        last: c.last,
                        records: &records,
                        digest: &digest,
                        cap,
                        // The model's batches have no options (every chunk
                        // agrees); the conformance test draws conflicts.
                        opts: "|normal|",
                    },
                    &claim,
                );
                self.sync_work();
                match r[0].as_str() {
                    // The script recorded the refusal (a hole or not).
                    "conflict" | "rejected" => {
                        self.dead(w, format!("chunk {} rejected: {}", c.seq, r[1]));
                        return;
                    }
                    "refused" => {
                        self.dead(w, format!("chunk {} refused: {}", c.seq, r[1]));
                        return;
                    }
                    "duplicate" if r[3] == "1" => return self.ack(w),
                    _ => {}
                }
                job.gen = r[1].parse().unwrap_or(0);
                job.seq = c.seq;
                job.chunk = i;
                // Copies of numbers the batch already had are not added.
                let copies: Vec<usize> = r[4].split(',').filter_map(|p| p.parse().ok()).collect();
                job.to = (c.to.iter().enumerate())
                    .filter(|(k, _)| !copies.contains(k))
                    .map(|(_, t)| *t)
                    .collect();
                job.group = Some(r[2].clone()).filter(|g| !g.is_empty());
                if job.to.is_empty() {
                    // Nothing to add: recorded loaded at once.
                    job.registered = 0;
                    job.pc = 3;
                } else {
                    job.pc = if job.group.is_some() { 2 } else { 1 };
                }
            }
            (CHUNK_OPS, 1) => {
                // The mutant: park.lua without its check of the end (it
                // writes neither field, so they are put back as they were).
                let ended = match self.cfg.mutant {
                    Some(Mutant::ParkAfterTheEnd) => ["cancelled", "report"]
                        .map(|f| {
                            let b = self.redis.db.batches.get_mut(BATCH);
                            (f, b.and_then(|b| b.state.remove(f)))
                        })
                        .to_vec(),
                    _ => vec![],
                };
                let r = protocol::park(
                    &mut self.redis.db,
                    BATCH,
                    job.seq,
                    job.gen,
                    &Self::payload(&job),
                );
                for (f, v) in ended {
                    if let (Some(v), Some(b)) = (v, self.redis.db.batches.get_mut(BATCH)) {
                        b.state.insert(f.to_string(), v);
                    }
                }
                self.sync_work();
                match r[0].as_str() {
                    "group" => {
                        job.group = Some(r[1].clone());
                        job.pc = 2;
                    }
                    // Its assignment was lost: the loader accepts it again.
                    "unassigned" => job.pc = 0,
                    // Its generation's create was given up: the chunk ends
                    // given up (load_chunk::give_up_in_failed_generation).
                    "failed" => {
                        self.given_up_in_failed_generation(&job);
                        job.pc = ACK;
                    }
                    _ => return self.ack(w),
                }
            }
            // A load released without a group (its generation's create was
            // given up): the chunk ends given up.
            ("load", 2) if job.group.is_none() => {
                self.given_up_in_failed_generation(&job);
                job.pc = ACK;
            }
            // The add (chunk or load item), then loaded.lua.
            (CHUNK_OPS | "load", 2) => {
                let group = job.group.clone().unwrap_or_default();
                if self.cfg.everysec {
                    let assigned = self
                        .field(&format!("s:{}", job.seq))
                        .and_then(|s| s.split('|').next())
                        .and_then(|g| g.parse::<u32>().ok());
                    if assigned != Some(job.gen)
                        || self.field(&format!("g:{}:group", job.gen)) != Some(group.as_str())
                    {
                        // Stale: a load item is dropped; the ingest
                        // handler accepts its chunk again.
                        if job.op == CHUNK_OPS {
                            job.pc = 0;
                            self.workers[w] = Some(job);
                            return;
                        }
                        return self.ack(w);
                    }
                }
                let result = match answer {
                    // (An add is never refused this way: see `may_refuse`.)
                    Answer::Fail | Answer::Refused => Err(true),
                    Answer::Ok => self.add(&group, &job.to),
                    Answer::Lost => self.add(&group, &job.to).and(Err(true)),
                };
                match result {
                    Ok(n) => {
                        job.registered = n;
                        job.pc = 3;
                    }
                    Err(true) => {
                        let item = protocol::work_item(BATCH, job.gen, Some(job.seq), Some(&group));
                        return self.retry(w, "load", item, Some(Self::payload(&job)));
                    }
                    Err(false) => {
                        // Loaded by a racer, or the group deleted by a cancel.
                        if self
                            .field(&format!("k:loaded/{}/{}", job.gen, job.seq))
                            .is_some()
                            || self.field("cancelled").is_some()
                        {
                            return self.ack(w);
                        }
                        // Given up (load_chunk::give_up): recorded loaded with
                        // every recipient failed, then dead-lettered (one
                        // step: the loaded event is idempotent).
                        let e = Self::given_up(&job, &group, "refused");
                        let policy = self.policy();
                        protocol::loaded(&mut self.redis.db, BATCH, &policy, &e);
                        self.sync_work();
                        return self.dead(
                            w,
                            format!("chunk {} given up: group {group} refused it", job.seq),
                        );
                    }
                }
            }
            (CHUNK_OPS | "load", 3) => {
                let e = ChunkLoaded {
                    gen: job.gen,
                    seq: job.seq,
                    group_id: job.group.clone().unwrap_or_default(),
                    registered: job.registered,
                    duplicates: 0,
                    failed: vec![],
                    given_up: None,
                };
                if self.cfg.mutant == Some(Mutant::LoadedTwice) {
                    if let Some(b) = self.redis.db.batches.get_mut(BATCH) {
                        b.state.remove(&format!("k:loaded/{}/{}", job.gen, job.seq));
                    }
                }
                let policy = self.policy();
                protocol::loaded(&mut self.redis.db, BATCH, &policy, &e);
                self.sync_work();
                job.pc = ACK;
            }
            ("create", 0) => {
                if self.field(&format!("g:{}:group", job.gen)).is_some()
                    || self.field("cancelled").is_some()
                {
                    return self.ack(w);
                }
                if answer == Answer::Refused {
                    // Given up (create_group::give_up): recorded, then
                    // dead-lettered; the mutant only dead-letters it.
                    if self.cfg.mutant != Some(Mutant::CreateGivenUpUnrecorded) {
                        let policy = self.policy();
                        protocol::fail_generation(
                            &mut self.redis.db,
                            BATCH,
                            &policy,
                            job.gen,
                            "refused",
                        );
                        self.sync_work();
                    }
                    return self.dead(w, format!("create of generation {} given up", job.gen));
                }
                if answer != Answer::Fail {
                    self.groups.push(Group {
                        gen: job.gen,
                        members: vec![],
                        status: GroupStatus::Pending,
                        sends: 0,
                        complete_when_sent: false,
                    });
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "create", item, None);
                }
                job.group = Some(format!("P{}", self.groups.len() - 1));
                job.pc = 1;
            }
            ("create", 1) => {
                let group = job.group.clone().unwrap_or_default();
                if self.cfg.mutant == Some(Mutant::RecordGroupOverwrites) {
                    if let Some(b) = self.redis.db.batches.get_mut(BATCH) {
                        b.state.remove(&format!("g:{}:group", job.gen));
                    }
                }
                let r = protocol::record_group(&mut self.redis.db, BATCH, job.gen, &group);
                self.sync_work();
                // Lost the race, or the batch was cancelled: ours is deleted.
                job.pc = if r[0] == "won" { ACK } else { 2 };
            }
            ("create", 2) => {
                // The loser enqueues the deletion of its own group.
                let item = self.item(&job);
                self.redis.db.add_work("delete", item, None);
                self.sync_work();
                return self.ack(w);
            }
            ("send", 0) => {
                let g = job.gen;
                let marker = self.cfg.mutant != Some(Mutant::SendWithoutMarker);
                if marker && self.field(&format!("k:send/{g}")).is_some() {
                    return self.ack(w);
                }
                if self.field(&format!("k:ready/{g}")).is_none() {
                    // Stale (from lost writes): the generation gets its own
                    // send item when it is ready again.
                    return self.ack(w);
                }
                let Some(group) = self.field(&format!("g:{g}:group")).map(str::to_string) else {
                    return self.dead(w, format!("generation {g} ready without a group"));
                };
                job.group = Some(group);
                // The schedule, checked before the provider is read (unless
                // a claim is in place: its send may have gone out).
                if self.window.is_some() && !self.claim_live(g) {
                    let r = self.claim_call(g, ClaimMode::Check);
                    match r[0].as_str() {
                        "free" => {}
                        "held" | "stale" => {
                            let item = self.item(&job);
                            return self.retry_at(w, item, r[1].parse().ok());
                        }
                        _ => return self.ack(w),
                    }
                }
                job.pc = 1;
            }
            ("send", 1) => {
                // GET the group: not pending means sent; then the count check.
                let group = job.group.clone().unwrap_or_default();
                if answer == Answer::Refused {
                    return self.give_up_send(w, &job, GivenUp::Send);
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "send", item, None);
                }
                let gi = Self::group_index(&group).unwrap_or(0);
                let marker = self.cfg.mutant != Some(Mutant::SendWithoutMarker);
                if self.groups[gi].status == GroupStatus::Deleted {
                    // Only a cancel deletes a generation's own group.
                    return self.ack(w);
                }
                if marker && self.groups[gi].status != GroupStatus::Pending {
                    job.outcome = "already_sent";
                    job.pc = 3;
                } else {
                    let reg = protocol::num(self.field(&format!("g:{}:reg", job.gen)));
                    let unsure = protocol::num(self.field(&format!("g:{}:unsure", job.gen)));
                    let held = self.groups[gi].members.len() as i64;
                    if held < reg || held > reg + unsure {
                        let e = Event::SendRefused(SendRefused {
                            gen: job.gen,
                            group_id: group.clone(),
                            reason: "count".into(),
                        });
                        protocol::append(
                            &mut self.redis.db,
                            BATCH,
                            &format!("refused/{}", job.gen),
                            &e,
                        );
                        return self.give_up_send(w, &job, GivenUp::Send);
                    }
                    job.pc = 4;
                }
            }
            ("send", 4) => {
                // The claim, linearized with a cancel on the batch's state.
                if self.cfg.mutant != Some(Mutant::SendWithoutClaim) {
                    let r = self.claim_call(job.gen, ClaimMode::Claim);
                    match r[0].as_str() {
                        "claimed" => job.until = r[2].parse().ok(),
                        // Held: the claim given back; a retry at the end
                        // of the hold claims again.
                        "held" | "stale" => {
                            let item = self.item(&job);
                            return self.retry_at(w, item, r[1].parse().ok());
                        }
                        _ => return self.ack(w),
                    }
                }
                job.pc = 2;
            }
            ("send", 2) => {
                // The durability wait is a delayed retry of the whole item:
                // facts Redis lost meanwhile are read again from the top.
                if (self.send_facts(job.gen).iter()).any(|f| self.field(f).is_none()) {
                    job.pc = 0;
                    self.workers[w] = Some(job);
                    return;
                }
                // The provider call starts within the claim's lifetime, or
                // the item runs again, claiming again.
                let expired = job.until.is_some_and(|u| self.now_ms() >= u);
                if expired && self.cfg.mutant != Some(Mutant::SendPastClaim) {
                    let item = self.item(&job);
                    return self.retry(w, "send", item, None);
                }
                let group = job.group.clone().unwrap_or_default();
                let gi = Self::group_index(&group).unwrap_or(0);
                let resend = self.cfg.mutant == Some(Mutant::SendWithoutMarker);
                if answer == Answer::Refused {
                    return self.give_up_send(w, &job, GivenUp::Send);
                }
                if answer != Answer::Fail {
                    if self.groups[gi].status == GroupStatus::Pending || resend {
                        self.sent_now(job.gen, &group);
                        self.groups[gi].status = GroupStatus::Sent;
                        self.groups[gi].sends += 1;
                        self.groups[gi].complete_when_sent = self.complete(job.gen, gi);
                        job.outcome = "sent";
                    } else {
                        job.outcome = "already_sent";
                    }
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "send", item, None);
                }
                job.pc = 3;
            }
            // sent.lua: after the send, or a recall that found it sent.
            ("send", 3) | ("recall", 2) => {
                let group = job.group.clone().unwrap_or_default();
                let poll = format!("{}|{group}", job.gen).into_bytes();
                protocol::sent(
                    &mut self.redis.db,
                    BATCH,
                    job.gen,
                    &group,
                    job.outcome,
                    &poll,
                );
                job.pc = ACK;
            }
            ("poll", 0) => {
                if self.field(&format!("k:done/{}", job.gen)).is_some() {
                    return self.ack(w);
                }
                if answer == Answer::Refused {
                    return self.give_up_send(w, &job, GivenUp::Poll);
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "poll", item, None);
                }
                // A sent group is finished by the time it is polled.
                let policy = self.policy();
                // The mutant: completed.lua without its check of the send
                // (the marker is put in for the call, and taken out after).
                let marker = format!("k:send/{}", job.gen);
                let unsent = self.cfg.mutant == Some(Mutant::CompletedWithoutSend)
                    && self.field(&marker).is_none();
                if let (true, Some(b)) = (unsent, self.redis.db.batches.get_mut(BATCH)) {
                    b.state.insert(marker.clone(), "0-0".into());
                }
                protocol::completed(
                    &mut self.redis.db,
                    BATCH,
                    &policy,
                    &CompletedArgs {
                        gen: job.gen,
                        group: job.group.as_deref().unwrap_or(""),
                        status: "COMPLETE",
                        sent_success: 0,
                        sent_failed: 0,
                    },
                );
                if let (true, Some(b)) = (unsent, self.redis.db.batches.get_mut(BATCH)) {
                    b.state.remove(&marker);
                }
                self.sync_work();
                job.pc = ACK;
            }
            ("delete", 0) => {
                let group = job.group.clone().unwrap_or_default();
                if self.field(&format!("k:discard/{group}")).is_some() {
                    return self.ack(w);
                }
                if answer != Answer::Fail {
                    if let Some(gi) = Self::group_index(&group) {
                        if self.groups[gi].status == GroupStatus::Pending {
                            self.groups[gi].status = GroupStatus::Deleted;
                        }
                    }
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "delete", item, None);
                }
                job.pc = 1;
            }
            ("delete", 1) => {
                let group = job.group.clone().unwrap_or_default();
                let kept = self
                    .field(&format!("g:{}:group", job.gen))
                    .unwrap_or("")
                    .to_string();
                let e = Event::GroupDiscarded(GroupDiscarded {
                    gen: job.gen,
                    group_id: group.clone(),
                    kept,
                });
                protocol::append(&mut self.redis.db, BATCH, &format!("discard/{group}"), &e);
                return self.ack(w);
            }
            // A send given up under its claim: delete its group (it can
            // never go out), or find it sent.
            ("recall", 0) => {
                let g = job.gen;
                if self.field(&format!("k:done/{g}")).is_some()
                    || self.field(&format!("k:send/{g}")).is_some()
                {
                    return self.ack(w);
                }
                if answer == Answer::Refused {
                    return self.give_up_send(w, &job, GivenUp::Recall);
                }
                let group = job.group.clone().unwrap_or_default();
                let gi = Self::group_index(&group).unwrap_or(0);
                if answer != Answer::Fail && self.groups[gi].status == GroupStatus::Pending {
                    self.groups[gi].status = GroupStatus::Deleted;
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "recall", item, None);
                }
                job.pc = if self.groups[gi].status == GroupStatus::Sent {
                    job.outcome = "sent_before_give_up";
                    2
                } else {
                    1
                };
            }
            ("recall", 1) => {
                let policy = self.policy();
                let group = job.group.clone().unwrap_or_default();
                protocol::give_up_send(
                    &mut self.redis.db,
                    BATCH,
                    &policy,
                    job.gen,
                    GivenUp::Unsent,
                    "deleted",
                    &group,
                );
                self.sync_work();
                job.pc = ACK;
            }
            ("report", 0) => {
                if self.field("k:delivered").is_some() {
                    return self.ack(w);
                }
                if self.field("report").is_none() {
                    return self.dead(w, "report item without a report".into());
                }
                if answer != Answer::Fail {
                    self.webhook += 1;
                }
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "report", item, None);
                }
                job.pc = 1;
            }
            ("report", 1) => {
                let e = Event::ReportDelivered(ReportDelivered {
                    status: 200,
                    report: None,
                });
                protocol::append(&mut self.redis.db, BATCH, "delivered", &e);
                return self.ack(w);
            }
            (_, DEAD) => return self.dead(w, job.dead.clone().unwrap_or_default()),
            _ => return self.ack(w),
        }
        self.workers[w] = Some(job);
    }

    /// Whether every chunk now assigned to `gen` is wholly in group `gi`.
    pub(super) fn complete(&self, gen: u32, gi: usize) -> bool {
        let members = &self.groups[gi].members;
        self.cfg.ingest.iter().all(|c| {
            let assigned = self.field(&format!("s:{}", c.seq)).is_some_and(|s| {
                s.starts_with(&format!("{gen}|")) && s.ends_with(&Self::digest(c))
            });
            // (Less its copies of numbers the batch already had, `x:<seq>`.)
            let copies: Vec<usize> = (self.field(&format!("x:{}", c.seq)).unwrap_or(""))
                .split(',')
                .filter_map(|p| p.parse().ok())
                .collect();
            !assigned
                || (c.to.iter().enumerate())
                    .all(|(k, t)| copies.contains(&k) || members.contains(t))
        }) && self.field(&format!("g:{gen}:closed")).is_some()
    }

    /// Whether a step of `job` calls the provider (and can fail or lose its answer).
    pub(super) fn calls_provider(&self, job: &Job) -> bool {
        matches!(
            (job.op, job.pc),
            (CHUNK_OPS | "load", 2)
                | ("create", 0)
                | ("send", 1)
                | ("send", 2)
                | ("poll", 0)
                | ("delete", 0)
                | ("recall", 0)
                | ("report", 0)
        )
    }

    /// Whether a provider call of this step may be refused for good (the
    /// ops whose give-up `give_up_send` records).
    pub(super) fn may_refuse(&self, job: &Job) -> bool {
        matches!(
            (job.op, job.pc),
            ("create", 0) | ("send", 1) | ("send", 2) | ("poll", 0) | ("recall", 0)
        )
    }

    /// The chunk of `job` recorded given up in `group`: every recipient
    /// failed.
    fn given_up(job: &Job, group: &str, reason: &str) -> ChunkLoaded {
        ChunkLoaded {
            gen: job.gen,
            seq: job.seq,
            group_id: group.into(),
            registered: 0,
            duplicates: 0,
            failed: (job.to.iter())
                .map(|t| RegistrationFailure {
                    to: t.to_string(),
                    code: "given_up".into(),
                })
                .collect(),
            given_up: Some(reason.into()),
        }
    }

    /// A chunk of a generation whose create was given up: recorded loaded,
    /// every recipient failed (`loaded.lua`, with `given_up`).
    fn given_up_in_failed_generation(&mut self, job: &Job) {
        let e = Self::given_up(job, "", "create given up");
        let policy = self.policy();
        protocol::loaded(&mut self.redis.db, BATCH, &policy, &e);
        self.sync_work();
    }

    /// The provider sends generation `gen`'s group now: what the properties
    /// of the schedule and of a cancel must know (10, 14).
    fn sent_now(&mut self, gen: u32, group: &str) {
        let now = self.now_ms();
        if let Some(claimed) = &self.cancelled {
            match claimed.get(&gen) {
                None => {
                    self.late_send = Some(format!(
                        "group {group} (generation {gen}) was sent after the cancel, its send not claimed before it"
                    ))
                }
                Some(&until) if now >= until => {
                    self.late_send = Some(format!(
                        "group {group} (generation {gen}) was sent after the cancel at {:02}:00, past the lifetime of the claim taken before it",
                        self.clock
                    ))
                }
                Some(_) => {}
            }
        }
        let why = (self.cfg.schedule.as_ref()).and_then(|s| s.holds_at(self.clock));
        if let Some(why) = why {
            self.off_schedule_send = Some(format!(
                "group {group} (generation {gen}) was sent at {:02}:00, {why}",
                self.clock
            ));
        }
    }

    /// The consumer's give-up of a send, poll or recall item: recorded
    /// (`give_up_send`), then dead-lettered.
    fn give_up_send(&mut self, w: usize, job: &Job, what: GivenUp) {
        let policy = self.policy();
        let gen = job.gen;
        let group = (job.group.clone())
            .or_else(|| self.field(&format!("g:{gen}:group")).map(str::to_string))
            .unwrap_or_default();
        // The mutant: the claim in place is not looked at.
        let claimed = format!("g:{gen}:claimed");
        let hidden = match (self.cfg.mutant, what) {
            (Some(Mutant::GiveUpIgnoresClaim), GivenUp::Send) => self
                .redis
                .db
                .batches
                .get_mut(BATCH)
                .and_then(|b| b.state.remove(&claimed)),
            _ => None,
        };
        protocol::give_up_send(
            &mut self.redis.db,
            BATCH,
            &policy,
            gen,
            what,
            "refused",
            &group,
        );
        if let (Some(v), Some(b)) = (hidden, self.redis.db.batches.get_mut(BATCH)) {
            b.state.insert(claimed, v);
        }
        self.sync_work();
        self.dead(w, format!("{} of generation {gen} given up", what.as_str()));
    }

    pub(super) fn job_for(&self, held: Held) -> Job {
        let mut job = Job {
            held,
            op: CHUNK_OPS,
            pc: 0,
            gen: 0,
            seq: 0,
            chunk: 0,
            to: vec![],
            group: None,
            registered: 0,
            outcome: "",
            appended: None,
            dead: None,
            until: None,
        };
        if let Some(e) = match held {
            Held::Work(id) => self.redis.db.work.iter().find(|e| e.id == id),
            Held::Ingest(_) => None,
        } {
            job.op = match e.op.as_str() {
                "create" => "create",
                "load" => "load",
                "send" => "send",
                "poll" => "poll",
                "delete" => "delete",
                "recall" => "recall",
                _ => "report",
            };
            job.gen = e.item.gen;
            job.seq = e.item.seq.unwrap_or(0);
            job.group = e.item.group_id.clone();
            job.chunk = e.chunk.as_ref().map_or(0, |c| usize::from(c[0]));
            job.to = e.chunk.as_ref().map_or(vec![], |c| c[1..].to_vec());
            job.pc = if job.op == "load" { 2 } else { 0 };
        }
        job
    }
}
