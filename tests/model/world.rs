//! The batch protocol as a model: Redis (the scripts' keys, through the pure
//! functions of `groupcast::protocol`, plus the consumer groups' delivery
//! state), the workers (each op of `src/worker/` as a sequence of atomic
//! steps: one script call, one provider call, or one acknowledgement), the
//! provider (groups, members, sends), the report webhook, and the
//! environment: crashes, reclaims, provider failures and lost answers,
//! Redis losing its unsynced writes, the watchdog and retention.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

use groupcast::events::{
    BatchStalled, ChunkLoaded, Event, GroupDiscarded, InputRejected, ReportDelivered, SendRefused,
};
use groupcast::protocol::{self, accept::AcceptArgs, completed::CompletedArgs, Db};
use groupcast::worker::ops::WorkItem;

use super::checker::{put, Model};

pub const BATCH: &str = "b";

/// A deliberately broken variant, which the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// `record_group.lua` without its "already recorded" check.
    RecordGroupOverwrites,
    /// A failed load gives its approval back (`g:<gen>:n` decremented).
    GiveBackApproval,
    /// `loaded.lua` without its `loaded/<gen>/<seq>` key check.
    LoadedTwice,
    /// The send op without the `send/<gen>` marker and the provider's view:
    /// and a provider that sends a sent group again.
    SendWithoutMarker,
}

/// One ingest entry: a chunk as the producer wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkSpec {
    pub seq: u32,
    pub last: bool,
    /// Recipient numbers.
    pub to: Vec<u8>,
}

/// A work entry as the state's hash sees it: op, generation, seq, group,
/// chunk and how it was delivered.
type WorkKey<'a> = (
    &'a str,
    u32,
    Option<u32>,
    Option<&'a str>,
    Option<&'a Vec<u8>>,
    Delivery,
);

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: &'static str,
    pub workers: usize,
    /// The ingest stream, in order (duplicates, wrong `last` included).
    pub ingest: Vec<ChunkSpec>,
    pub cap: u64,
    /// Worker crashes (a crash may come between any two steps).
    pub crashes: u8,
    /// Reclaims of entries whose worker is still on them (lease expired).
    pub steals: u8,
    /// Provider calls that fail (no effect).
    pub failures: u8,
    /// Provider calls whose answer is lost (the effect happened).
    pub lost_answers: u8,
    /// Redis restarts losing every write since the last fsync (everysec).
    pub redis_losses: u8,
    /// Workers wait for the facts an add or a send rests on to be on disk.
    pub everysec: bool,
    /// A report webhook is configured.
    pub webhook: bool,
    /// Watchdog scans that may find the batch quiet.
    pub watchdog: u8,
    /// Retention may expire the reported batch's keys.
    pub retention: bool,
    pub mutant: Option<Mutant>,
}

/// An entry's consumer-group state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Delivery {
    New,
    /// Delivered to worker `w`, not acknowledged; `None` once it crashed.
    Pending(Option<u8>),
    Acked,
}

/// Redis: the scripts' keys and the consumer groups' state.
#[derive(Debug, Clone, PartialEq)]
pub struct Redis {
    pub db: Db,
    pub ingest: Vec<Delivery>,
    /// By work entry, in `db.work` order.
    pub work: Vec<Delivery>,
    /// Dead letters (their recipients, for "nothing lost").
    pub dead: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupStatus {
    Pending,
    Sent,
    Deleted,
}

/// A provider group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    pub gen: u32,
    pub members: Vec<u8>,
    pub status: GroupStatus,
    pub sends: u8,
    /// Every chunk then assigned to its generation was in it when sent.
    pub complete_when_sent: bool,
}

/// Which entry a worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Held {
    Ingest(usize),
    /// A work entry, by id (ids are never reused, even after lost writes).
    Work(u64),
}

/// A worker's job: the entry and where in its handler it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Job {
    pub held: Held,
    pub op: &'static str,
    pub pc: u8,
    pub gen: u32,
    pub seq: u32,
    /// The chunk (ingest index) a load carries.
    pub chunk: usize,
    pub group: Option<String>,
    pub registered: u32,
    pub outcome: &'static str,
}

/// How a provider call turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Ok,
    /// Failed with no effect (5xx, timeout before it arrived).
    Fail,
    /// The effect happened; the answer never came back.
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// A free worker reads an entry.
    Read(usize, Held),
    /// A worker takes its next step (a provider call answers `Answer`).
    Step(usize, Answer),
    Crash(usize),
    /// XAUTOCLAIM: the entry is delivered again.
    Reclaim(Held),
    /// The delayed set's first poll is due.
    Promote,
    /// Redis's fsync (everysec).
    Sync,
    /// Redis restarts from disk: unsynced writes are gone.
    LoseWrites,
    Watchdog,
    Expire,
}

#[derive(Debug, Clone)]
pub struct World {
    pub cfg: std::rc::Rc<Config>,
    pub redis: Redis,
    /// What Redis has on disk (shared until the next write is synced).
    pub synced: std::rc::Rc<Redis>,
    pub workers: Vec<Option<Job>>,
    pub groups: Vec<Group>,
    pub webhook: u8,
    /// Distinct reports decided (never taken back, even by lost writes).
    pub reports: BTreeSet<String>,
    pub crashes: u8,
    pub steals: u8,
    pub failures: u8,
    pub lost_answers: u8,
    pub redis_losses: u8,
    pub watchdog: u8,
}

const CHUNK_OPS: &str = "chunk";
/// The step that acknowledges the entry (after a script's write: a crash in
/// between redelivers an entry whose effect is recorded).
const ACK: u8 = 9;

impl World {
    pub fn new(cfg: Config) -> World {
        let db = Db {
            skip_events: true,
            ..Db::default()
        };
        let redis = Redis {
            db,
            ingest: vec![Delivery::New; cfg.ingest.len()],
            work: vec![],
            dead: vec![],
        };
        World {
            redis: redis.clone(),
            synced: std::rc::Rc::new(redis),
            workers: vec![None; cfg.workers],
            groups: vec![],
            webhook: 0,
            reports: BTreeSet::new(),
            crashes: cfg.crashes,
            steals: cfg.steals,
            failures: cfg.failures,
            lost_answers: cfg.lost_answers,
            redis_losses: cfg.redis_losses,
            watchdog: cfg.watchdog,
            cfg: std::rc::Rc::new(cfg),
        }
    }

    fn field(&self, f: &str) -> Option<&str> {
        self.redis.db.field(BATCH, f)
    }

    fn synced_has(&self, f: &str) -> bool {
        self.synced.db.field(BATCH, f).is_some()
    }

    /// Sets an entry's delivery state (nothing, for an entry Redis lost).
    fn set_delivery(&mut self, held: Held, d: Delivery) {
        match held {
            Held::Ingest(i) => self.redis.ingest[i] = d,
            Held::Work(id) => {
                if let Some(i) = self.redis.db.work.iter().position(|e| e.id == id) {
                    self.redis.work[i] = d;
                }
            }
        }
    }

    fn delivery(&self, held: Held) -> Option<Delivery> {
        match held {
            Held::Ingest(i) => Some(self.redis.ingest[i]),
            Held::Work(id) => {
                let i = self.redis.db.work.iter().position(|e| e.id == id)?;
                Some(self.redis.work[i])
            }
        }
    }

    /// Whether a worker is on entry `h` now.
    fn held(&self, h: Held) -> bool {
        self.workers.iter().flatten().any(|j| j.held == h)
    }

    /// Whether the worker's next step waits for Redis to have on disk the
    /// facts it rests on (`durability_wait`): an add, on the chunk's
    /// assignment and its generation's group; a send, on `ready`.
    fn waiting(&self, job: &Job) -> bool {
        if !self.cfg.everysec {
            return false;
        }
        match (job.op, job.pc) {
            (CHUNK_OPS | "load", 2) => {
                let assigned = self
                    .field(&format!("s:{}", job.seq))
                    .and_then(|s| s.split('|').next())
                    .and_then(|g| g.parse::<u32>().ok());
                let matches = assigned == Some(job.gen)
                    && self.field(&format!("g:{}:group", job.gen)) == job.group.as_deref();
                matches
                    && !(self.synced_has(&format!("k:assign/{}", job.seq))
                        && self.synced_has(&format!("k:group/{}", job.gen)))
            }
            ("send", 0) => {
                self.field(&format!("k:send/{}", job.gen)).is_none()
                    && self.field(&format!("k:ready/{}", job.gen)).is_some()
                    && !self.synced_has(&format!("k:ready/{}", job.gen))
            }
            _ => false,
        }
    }

    fn digest(c: &ChunkSpec) -> String {
        format!(
            "d{}{}",
            c.seq,
            c.to.iter().map(|t| t.to_string()).collect::<String>()
        )
    }

    /// The chunk recipients of ingest entry `i`.
    fn to(&self, i: usize) -> &[u8] {
        &self.cfg.ingest[i].to
    }

    fn sync_work(&mut self) {
        let n = self.redis.db.work.len();
        self.redis.work.resize(n, Delivery::New);
    }

    /// XACK.
    fn ack(&mut self, w: usize) {
        if let Some(job) = self.workers[w].take() {
            self.set_delivery(job.held, Delivery::Acked);
        }
    }

    /// The retry a failed handler schedules (acknowledged, back later as a
    /// new entry: retry_later.lua, then promote.lua).
    fn retry(&mut self, w: usize, op: &str, item: WorkItem, chunk: Option<Vec<u8>>) {
        if self.cfg.mutant == Some(Mutant::GiveBackApproval) && op == "load" {
            let f = format!("g:{}:n", item.gen);
            let n = protocol::num(self.field(&f))
                - self
                    .to(usize::from(chunk.as_ref().map_or(0, |c| c[0])))
                    .len() as i64;
            if let Some(b) = self.redis.db.batches.get_mut(BATCH) {
                b.state.insert(f, n.to_string());
            }
        }
        self.redis.db.add_work(op, item, chunk);
        self.sync_work();
        self.ack(w);
    }

    fn dead(&mut self, w: usize, what: String) {
        self.redis.dead.push(what);
        self.ack(w);
    }

    fn item(&self, job: &Job) -> WorkItem {
        protocol::work_item(
            BATCH,
            job.gen,
            Some(job.seq).filter(|_| job.op == "load"),
            job.group.as_deref(),
        )
    }

    /// The provider's answer to an add of chunk `chunk` into `group`:
    /// `Err(true)` retryable, `Err(false)` refused (the group is not pending).
    fn add(&mut self, group: &str, chunk: usize) -> Result<u32, bool> {
        let Some(g) = group
            .strip_prefix('P')
            .and_then(|i| i.parse::<usize>().ok())
        else {
            return Err(false);
        };
        if self.groups[g].status != GroupStatus::Pending {
            return Err(false);
        }
        let to = self.cfg.ingest[chunk].to.clone();
        for t in &to {
            // 1026: already in this group.
            if !self.groups[g].members.contains(t) {
                self.groups[g].members.push(*t);
            }
        }
        self.groups[g].members.sort();
        Ok(to.len() as u32)
    }

    fn group_index(id: &str) -> Option<usize> {
        id.strip_prefix('P').and_then(|i| i.parse().ok())
    }

    /// One step of worker `w`.
    fn step(&mut self, w: usize, answer: Answer) {
        let Some(mut job) = self.workers[w].clone() else {
            return;
        };
        match answer {
            Answer::Fail => self.failures -= 1,
            Answer::Lost => self.lost_answers -= 1,
            Answer::Ok => {}
        }
        let cap = self.cfg.cap;
        match (job.op, job.pc) {
            (CHUNK_OPS, 0) => {
                let Held::Ingest(i) = job.held else { return };
                let c = self.cfg.ingest[i].clone();
                let digest = Self::digest(&c);
                let r = protocol::accept(
                    &mut self.redis.db,
                    BATCH,
                    &AcceptArgs {
                        seq: c.seq,
                        last: c.last,
                        count: c.to.len() as u32,
                        digest: &digest,
                        cap,
                    },
                );
                self.sync_work();
                match r[0].as_str() {
                    "conflict" | "rejected" => {
                        let key = format!("reject/{}/{digest}", c.seq);
                        let e = Event::InputRejected(InputRejected {
                            seq: Some(c.seq),
                            reason: r[1].clone(),
                            hole: false,
                        });
                        protocol::append(&mut self.redis.db, BATCH, &key, &e);
                        // Then dead-lettered (one more step, folded here:
                        // the append is idempotent, so a crash before the
                        // dead letter only repeats it).
                        self.dead(w, format!("chunk {} rejected: {}", c.seq, r[1]));
                        return;
                    }
                    "duplicate" if r[3] == "1" => return self.ack(w),
                    _ => {}
                }
                job.gen = r[1].parse().unwrap_or(0);
                job.seq = c.seq;
                job.chunk = i;
                job.group = Some(r[2].clone()).filter(|g| !g.is_empty());
                job.pc = if job.group.is_some() { 2 } else { 1 };
            }
            (CHUNK_OPS, 1) => {
                let r = protocol::park(
                    &mut self.redis.db,
                    BATCH,
                    job.seq,
                    job.gen,
                    &[job.chunk as u8],
                );
                self.sync_work();
                match r[0].as_str() {
                    "group" => {
                        job.group = Some(r[1].clone());
                        job.pc = 2;
                    }
                    _ => return self.ack(w),
                }
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
                        return self.ack(w);
                    }
                }
                let result = match answer {
                    Answer::Fail => Err(true),
                    Answer::Ok => self.add(&group, job.chunk),
                    Answer::Lost => self.add(&group, job.chunk).and(Err(true)),
                };
                match result {
                    Ok(n) => {
                        job.registered = n;
                        job.pc = 3;
                    }
                    Err(true) => {
                        let item = protocol::work_item(BATCH, job.gen, Some(job.seq), Some(&group));
                        return self.retry(w, "load", item, Some(vec![job.chunk as u8]));
                    }
                    Err(false) => {
                        if self
                            .field(&format!("k:loaded/{}/{}", job.gen, job.seq))
                            .is_some()
                        {
                            return self.ack(w);
                        }
                        return self.dead(w, format!("chunk {} refused by group {group}", job.seq));
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
                protocol::loaded(&mut self.redis.db, BATCH, &e);
                self.sync_work();
                job.pc = ACK;
            }
            ("create", 0) => {
                if self.field(&format!("g:{}:group", job.gen)).is_some() {
                    return self.ack(w);
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
                    return self.dead(w, format!("send of generation {g}, not ready"));
                }
                let Some(group) = self.field(&format!("g:{g}:group")).map(str::to_string) else {
                    return self.dead(w, format!("generation {g} ready without a group"));
                };
                job.group = Some(group);
                job.pc = 1;
            }
            ("send", 1) => {
                // GET the group: not pending means sent; then the count check.
                let group = job.group.clone().unwrap_or_default();
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "send", item, None);
                }
                let gi = Self::group_index(&group).unwrap_or(0);
                let marker = self.cfg.mutant != Some(Mutant::SendWithoutMarker);
                if marker && self.groups[gi].status != GroupStatus::Pending {
                    job.outcome = "already_sent";
                    job.pc = 3;
                } else {
                    let reg = protocol::num(self.field(&format!("g:{}:reg", job.gen)));
                    if self.groups[gi].members.len() as i64 != reg {
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
                        return self.dead(w, format!("send of {group} refused: counts differ"));
                    }
                    job.pc = 2;
                }
            }
            ("send", 2) => {
                let group = job.group.clone().unwrap_or_default();
                let gi = Self::group_index(&group).unwrap_or(0);
                let resend = self.cfg.mutant == Some(Mutant::SendWithoutMarker);
                if answer != Answer::Fail {
                    if self.groups[gi].status == GroupStatus::Pending || resend {
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
            ("send", 3) => {
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
                if answer != Answer::Ok {
                    let item = self.item(&job);
                    return self.retry(w, "poll", item, None);
                }
                // A sent group is finished by the time it is polled.
                let r = protocol::completed(
                    &mut self.redis.db,
                    BATCH,
                    &CompletedArgs {
                        gen: job.gen,
                        group: job.group.as_deref().unwrap_or(""),
                        status: "COMPLETE",
                        sent_success: 0,
                        sent_failed: 0,
                        retention_secs: u64::from(self.cfg.retention),
                        deliver: self.cfg.webhook,
                    },
                );
                self.sync_work();
                if r[0] == "reported" {
                    let report = self.field("report").unwrap_or("").to_string();
                    let n = self.field("seqs").unwrap_or("").to_string();
                    self.reports.insert(format!("{report} chunks={n}"));
                }
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
                let e = Event::ReportDelivered(ReportDelivered { status: 200 });
                protocol::append(&mut self.redis.db, BATCH, "delivered", &e);
                return self.ack(w);
            }
            _ => return self.ack(w),
        }
        self.workers[w] = Some(job);
    }

    /// Whether every chunk now assigned to `gen` is wholly in group `gi`.
    fn complete(&self, gen: u32, gi: usize) -> bool {
        let members = &self.groups[gi].members;
        self.cfg.ingest.iter().all(|c| {
            let assigned = self.field(&format!("s:{}", c.seq)).is_some_and(|s| {
                s.starts_with(&format!("{gen}|")) && s.ends_with(&Self::digest(c))
            });
            !assigned || c.to.iter().all(|t| members.contains(t))
        }) && self.field(&format!("g:{gen}:closed")).is_some()
    }

    /// Whether a step of `job` calls the provider (and can fail or lose its answer).
    fn calls_provider(&self, job: &Job) -> bool {
        matches!(
            (job.op, job.pc),
            (CHUNK_OPS | "load", 2)
                | ("create", 0)
                | ("send", 1)
                | ("send", 2)
                | ("poll", 0)
                | ("delete", 0)
                | ("report", 0)
        )
    }

    fn job_for(&self, held: Held) -> Job {
        let mut job = Job {
            held,
            op: CHUNK_OPS,
            pc: 0,
            gen: 0,
            seq: 0,
            chunk: 0,
            group: None,
            registered: 0,
            outcome: "",
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
                _ => "report",
            };
            job.gen = e.item.gen;
            job.seq = e.item.seq.unwrap_or(0);
            job.group = e.item.group_id.clone();
            job.chunk = e.chunk.as_ref().map_or(0, |c| usize::from(c[0]));
            job.pc = if job.op == "load" { 2 } else { 0 };
        }
        job
    }
}

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
                if *d == Delivery::New {
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
        if self.cfg.everysec && self.redis != *self.synced {
            out.push(Action::Sync);
            if self.redis_losses > 0 {
                out.push(Action::LoseWrites);
            }
        }
        let reported = self.field("report").is_some();
        if self.watchdog > 0 && !reported && self.field("seqs").is_some() {
            out.push(Action::Watchdog);
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
        }
        s
    }

    fn identity<H: Hasher>(&self, h: &mut H) {
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
                put(h, &b.expiring);
            }
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
                            *d,
                        )
                    })
                    .collect();
            work.sort();
            put(h, &work);
            put(h, &r.ingest);
            put(h, &r.db.delayed);
            put(h, &r.db.active);
            put(h, &r.dead);
        };
        id_free(&self.redis, h);
        if self.cfg.everysec {
            id_free(&self.synced, h);
        }
        for job in &self.workers {
            match job {
                Some(j) => {
                    // A work entry by its content (in the job), not its id.
                    let held = match j.held {
                        Held::Ingest(i) => (0u8, i),
                        Held::Work(_) => (1u8, 0),
                    };
                    put(h, &held);
                    put(h, &self.delivery(j.held));
                    put(
                        h,
                        &(
                            j.op,
                            j.pc,
                            j.gen,
                            j.seq,
                            j.chunk,
                            &j.group,
                            j.registered,
                            j.outcome,
                        ),
                    );
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
                self.redis_losses,
                self.watchdog,
            ),
        );
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
        let rejected = self
            .redis
            .dead
            .iter()
            .filter(|d| d.contains("rejected"))
            .count();
        if rejected == 0 && sent != wanted {
            return Some(format!("recipients {wanted:?} wanted, {sent:?} sent"));
        }
        // Losing racers' groups hold nobody and are never sent.
        for (i, g) in self.groups.iter().enumerate() {
            if g.status == GroupStatus::Pending && !g.members.is_empty() {
                return Some(format!("group P{i} holds recipients but was never sent"));
            }
        }
        None
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
                        ("send", 2) => format!("provider send {:?}", j.group),
                        ("send", 3) => "sent.lua".into(),
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
        }
    }
}

impl Hash for World {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.identity(h);
    }
}
