//! The batch protocol as a model: Redis (the scripts' keys, through the pure
//! functions of `groupcast::protocol`, plus the consumer groups' delivery
//! state), the workers (each op of `src/worker/` as a sequence of atomic
//! steps: one script call, one provider call, or one acknowledgement), the
//! provider (groups, members, sends), the report webhook, and the
//! environment: crashes, reclaims, provider failures and lost answers,
//! Redis losing its unsynced writes, the watchdog and retention.

#[path = "world/steps.rs"]
mod steps;
#[path = "world/transitions.rs"]
mod transitions;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

use std::time::Duration;

use groupcast::events::options::{AdOptions, BatchOptions, QuietHours, ScheduleArgs, SendWindow};
use groupcast::protocol::claim_send::{ClaimArgs, ClaimMode};
use groupcast::protocol::{self, BatchPolicy, Db};
use groupcast::store::batch::dedupe_records;
use groupcast::worker::ops::WorkItem;

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
    /// The send op without its claim (`claim_send.lua`): a cancel cannot
    /// stop a send that has passed its checks.
    SendWithoutClaim,
    /// A plain `XACK` of a settled entry, without checking that the last
    /// event its handling appended is still recorded (`ack_recorded.lua`).
    AckWithoutCheck,
    /// A refused chunk's `last` flag is ignored (the rule before it taught
    /// the batch its end): an invalid last chunk, or a `last` contradicting
    /// a higher seq already received, leaves the batch without an end.
    RefusedLastIgnored,
    /// A send given up counts its generation `unsent` even with its claim
    /// in place (no recall): a send that went out with its answer lost is
    /// reported as never sent.
    GiveUpIgnoresClaim,
    /// `park.lua` without its check of the end: a chunk accepted before a
    /// cancel parks after it, asking for a group (events after the report).
    ParkAfterTheEnd,
    /// `completed.lua` without its check of the send (the rule before it
    /// had one): a poll in hand while Redis lost the generation's
    /// `send_triggered` records it finished, and the batch reports with no
    /// send on record.
    CompletedWithoutSend,
    /// The claim decides no schedule (the rule before it did): the
    /// schedule is checked before the provider is read, then a claim taken
    /// later, with time passed in between, lets the send go.
    ScheduleNotInClaim,
    /// The send op starts the provider call whatever is left of its claim's
    /// lifetime (the claim's end, cut where quiet hours begin, ignored).
    SendPastClaim,
    /// `claim_send.lua` renews a claim in a cancelled batch whatever its
    /// lifetime (the rule before claims recorded their end): a send claimed
    /// before a cancel, its worker slow past its lifetime and past quiet
    /// hours, goes out long after the cancel.
    CancelledClaimRenewed,
    /// A create refused for good is dead-lettered with no record in the
    /// batch (the rule before `fail_generation.lua`): its chunks are never
    /// released, and the batch never reports.
    CreateGivenUpUnrecorded,
    /// The worker computes an advertising batch's window without the
    /// night-time rule (its own quiet hours only): a send ready at 21:00 KST
    /// goes out at night.
    NightRuleIgnored,
}

/// The batch's schedule on an abstract clock of whole hours: hour `h` is
/// the Redis time [`BASE_MS`] + `h` hours (UTC). Time passes an hour per
/// `Tick`, up to `hours`.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The last hour the clock reaches.
    pub hours: u8,
    /// `send_at`, an hour.
    pub send_at: Option<u8>,
    /// Quiet hours `opens..closes`, hours of the day (UTC).
    pub quiet: Option<(u8, u8)>,
    /// The hour the clock starts at.
    pub from: u8,
    /// An advertising batch (`Some(night_consent)`): the night-time rule
    /// holds it 21:00-08:00 Asia/Seoul, 12:00-23:00 on this UTC clock,
    /// unless its recipients consented.
    pub ad: Option<bool>,
}

/// The night-time rule's hours on the model's UTC clock: 21:00-08:00 KST
/// (UTC+9, no daylight saving), told apart from the product's own
/// [`groupcast::events::options::NIGHT_RULE`], which the property checks.
const NIGHT_UTC: (u8, u8) = (12, 23);

/// Hour 0 of the model's clock: 2026-01-01T00:00:00Z.
pub const BASE_MS: u64 = 1_767_225_600_000;
const HOUR_MS: u64 = 3_600_000;
/// A claim's lifetime: an hour and a half (so that a claim outlives a tick
/// unless quiet hours cut it).
const CLAIM_LIFETIME_MS: u64 = 90 * 60 * 1000;

/// One ingest entry: a chunk as the producer wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkSpec {
    pub seq: u32,
    pub last: bool,
    /// Recipient numbers.
    pub to: Vec<u8>,
    /// It fails validation (an invalid number, say): `reject.lua` records
    /// it, and it is dead-lettered.
    pub invalid: bool,
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
    Option<u8>,
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
    /// Provider calls refused for good (no effect): a send's status read
    /// or send, a poll, a recall; the op is given up (`give_up_send`).
    pub refusals: u8,
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
    /// Operator closes (`groupcast close`), each at any time once the batch
    /// has recorded something.
    pub closes: u8,
    /// Operator cancels (`groupcast cancel`), each at any time before the
    /// batch reports.
    pub cancels: u8,
    /// A `send_at` and quiet hours, on a clock that runs (none: the clock
    /// stands still and nothing holds the send).
    pub schedule: Option<Schedule>,
    pub mutant: Option<Mutant>,
}

impl Schedule {
    /// The options a producer would write, resolved by the product (UTC);
    /// `mutant` may break how the worker resolves them.
    fn window(&self, mutant: Option<Mutant>) -> SendWindow {
        let hm = |h: u8| format!("{:02}:00", h % 24);
        let options = BatchOptions {
            send_at: self.send_at.map(|h| {
                jiff::Timestamp::from_millisecond(hour_ms(h) as i64)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            }),
            priority: None,
            quiet_hours: self.quiet.map(|(o, c)| QuietHours {
                start: hm(o),
                end: hm(c),
                tz: "UTC".into(),
            }),
            ad: self
                .ad
                .filter(|_| mutant != Some(Mutant::NightRuleIgnored))
                .map(|night_consent| AdOptions {
                    night_consent,
                    pair: None,
                }),
        };
        options
            .resolve()
            .unwrap_or_else(|e| panic!("the model's schedule {self:?}: {e}"))
    }

    /// Why nothing may be sent at hour `h` (told apart from the product's
    /// own decision, which the property checks).
    pub fn holds_at(&self, h: u8) -> Option<&'static str> {
        if self.send_at.is_some_and(|s| h < s) {
            return Some("before send_at");
        }
        let d = h % 24;
        let inside = |(o, c): (u8, u8)| {
            if o <= c {
                o <= d && d < c
            } else {
                d >= o || d < c
            }
        };
        if self.ad == Some(false) && inside(NIGHT_UTC) {
            return Some("inside the night-time advertising rule (21:00-08:00 KST)");
        }
        inside(self.quiet?).then_some("inside quiet hours")
    }
}

/// Redis time at hour `h` of the model's clock.
pub fn hour_ms(h: u8) -> u64 {
    BASE_MS + u64::from(h) * HOUR_MS
}

impl Config {
    /// Whether the batch ends without an operator: some chunk is flagged
    /// last (valid or not: a refused chunk's flag tells the end too, and a
    /// flag below a seq already received ends the batch at that seq), and
    /// every seq from 0 to the highest arrives. A batch that does not (a
    /// seq missing, no `last` anywhere) ends only when an operator closes it.
    pub fn ends_by_itself(&self) -> bool {
        let Some(top) = self.ingest.iter().map(|c| c.seq).max() else {
            return false;
        };
        self.ingest.iter().any(|c| c.last)
            && (0..=top).all(|s| self.ingest.iter().any(|c| c.seq == s))
    }
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
    /// The recipients it adds: the chunk's, less the copies of numbers the
    /// batch already had (the batch-wide dedupe).
    pub to: Vec<u8>,
    pub group: Option<String>,
    pub registered: u32,
    pub outcome: &'static str,
    /// The key and entry id of the last event its handling appended: its
    /// acknowledgement waits on it.
    pub appended: Option<(String, String)>,
    /// The reason of the dead letter its next step writes (`DEAD`).
    pub dead: Option<String>,
    /// The end of the claim the send holds (Redis ms): the provider call
    /// must start before it.
    pub until: Option<u64>,
}

/// How a provider call turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Ok,
    /// Failed with no effect (5xx, timeout before it arrived).
    Fail,
    /// The effect happened; the answer never came back.
    Lost,
    /// Refused for good (no effect): the op is given up.
    Refused,
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
    /// An operator closes the batch.
    Close,
    /// An operator cancels the batch.
    Cancel,
    /// An hour passes.
    Tick,
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
    pub refusals: u8,
    pub redis_losses: u8,
    pub watchdog: u8,
    pub closes: u8,
    pub cancels: u8,
    /// Once a cancel took effect: the generations whose send was claimed
    /// then (the only ones that may still be sent), with the end of the
    /// lifetime granted to that claim before the cancel.
    pub cancelled: Option<BTreeMap<u32, u64>>,
    /// A send the provider made after the cancel without a claim before it,
    /// or past that claim's lifetime.
    pub late_send: Option<String>,
    /// The hour (see [`Schedule`]).
    pub clock: u8,
    /// The latest end of a claim granted, by generation (what the workers
    /// were told, whatever Redis kept).
    pub granted: BTreeMap<u32, u64>,
    /// A send the provider made inside quiet hours or before `send_at`.
    pub off_schedule_send: Option<String>,
    /// The batch's options, resolved by the product's own code.
    pub window: Option<std::rc::Rc<SendWindow>>,
    /// Work entries retried for later (a send held by its schedule): the
    /// hour before which nobody reads them (`retry_later.lua`, then
    /// `promote.lua` when due).
    pub due: BTreeMap<u64, u8>,
}

const CHUNK_OPS: &str = "chunk";
/// The step that acknowledges the entry (after a script's write: a crash in
/// between redelivers an entry whose effect is recorded).
const ACK: u8 = 9;
/// The step that dead-letters the entry (after a script's write, like `ACK`).
const DEAD: u8 = 10;

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
            refusals: cfg.refusals,
            redis_losses: cfg.redis_losses,
            watchdog: cfg.watchdog,
            closes: cfg.closes,
            cancels: cfg.cancels,
            cancelled: None,
            late_send: None,
            clock: cfg.schedule.as_ref().map_or(0, |s| s.from),
            granted: BTreeMap::new(),
            off_schedule_send: None,
            due: BTreeMap::new(),
            window: (cfg.schedule.as_ref()).map(|s| std::rc::Rc::new(s.window(cfg.mutant))),
            cfg: std::rc::Rc::new(cfg),
        }
    }

    /// Redis time now.
    pub(crate) fn now_ms(&self) -> u64 {
        hour_ms(self.clock)
    }

    /// Whether generation `gen` holds a claim not given back.
    fn claim_live(&self, gen: u32) -> bool {
        protocol::num(self.field(&format!("g:{gen}:claimed")))
            > protocol::num(self.field(&format!("g:{gen}:back")))
    }

    /// `claim_send.lua` now, with the batch's schedule as the worker
    /// computes it from a clock reading (none for the mutant's claim).
    fn claim_call(&mut self, gen: u32, mode: ClaimMode) -> Vec<String> {
        let now = self.now_ms();
        let schedule = match (&self.window, self.cfg.mutant) {
            (Some(_), Some(Mutant::ScheduleNotInClaim)) if mode == ClaimMode::Claim => {
                ScheduleArgs::default()
            }
            (Some(w), _) => w.schedule_args(now),
            (None, _) => ScheduleArgs::default(),
        };
        let args = ClaimArgs {
            gen,
            mode,
            lifetime_ms: CLAIM_LIFETIME_MS,
            schedule,
        };
        let policy = self.policy();
        // The mutant: the end recorded with the claim is not looked at.
        let until = format!("g:{gen}:until");
        let hidden = match self.cfg.mutant {
            Some(Mutant::CancelledClaimRenewed) => {
                (self.redis.db.batches.get_mut(BATCH)).and_then(|b| b.state.remove(&until))
            }
            _ => None,
        };
        let r = protocol::claim_send(&mut self.redis.db, BATCH, &policy, &args, now);
        // A generation stopped here has its group's delete enqueued.
        self.sync_work();
        if let (Some(v), Some(b)) = (hidden, self.redis.db.batches.get_mut(BATCH)) {
            b.state.entry(until).or_insert(v);
        }
        if r[0] == "claimed" {
            let end = r[2].parse().unwrap_or(0);
            let e = self.granted.entry(gen).or_insert(end);
            *e = (*e).max(end);
        }
        r
    }

    /// The keys of events appended after the report, other than its
    /// delivery and the deletion of groups (entry ids only grow, even
    /// across lost writes).
    pub(crate) fn after_the_report(&self) -> Vec<&str> {
        let Some(b) = self.redis.db.batch(BATCH) else {
            return vec![];
        };
        let id = |v: &str| v.split('-').next().and_then(|n| n.parse::<u64>().ok());
        let Some(report) = b.state.get("k:report").and_then(|v| id(v)) else {
            return vec![];
        };
        (b.state.iter())
            .filter(|(k, v)| k.starts_with("k:") && id(v).is_some_and(|i| i > report))
            .map(|(k, _)| &k[2..])
            .filter(|k| *k != "delivered" && !k.starts_with("discard/"))
            .collect()
    }

    /// A generation the provider finished (`completed.lua`: done
    /// `COMPLETE` or `FAILED`) whose `send_triggered` is not recorded
    /// before its `group_completed`.
    pub(crate) fn done_without_send(&self) -> Option<u32> {
        let b = self.redis.db.batch(BATCH)?;
        let id = |k: String| {
            let v = b.state.get(&k)?;
            v.split('-').next().and_then(|n| n.parse::<u64>().ok())
        };
        let mut finished = (b.state.iter()).filter_map(|(k, v)| {
            let gen = k.strip_prefix("g:")?.strip_suffix(":done")?;
            matches!(v.as_str(), "COMPLETE" | "FAILED").then(|| gen.parse::<u32>().ok())?
        });
        finished.find(|g| {
            !matches!(
                (id(format!("k:send/{g}")), id(format!("k:done/{g}"))),
                (Some(sent), Some(done)) if sent < done
            )
        })
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

    /// A worker's key for symmetry (naming no worker): its job, and the
    /// entries pending for it, by content, in Redis and on disk.
    pub(crate) fn worker_key(&self, w: usize) -> u64 {
        use std::hash::Hasher;
        let mut h = crate::checker::Fx::default();
        if let Some(j) = &self.workers[w] {
            let held = match j.held {
                Held::Ingest(i) => (1u8, i),
                Held::Work(_) => (2u8, 0),
            };
            (
                held,
                j.op,
                j.pc,
                j.gen,
                j.seq,
                j.chunk,
                &j.to,
                &j.group,
                j.registered,
                j.outcome,
                // Ids are not part of a state's identity: only the key, and
                // whether Redis still holds the event under that id.
                j.appended
                    .as_ref()
                    .map(|(k, _)| (k, self.recorded(&j.appended))),
            )
                .hash(&mut h);
            (&j.dead, j.until).hash(&mut h);
        }
        let mine = Delivery::Pending(Some(w as u8));
        let pending = |r: &Redis, h: &mut crate::checker::Fx| {
            for (i, d) in r.ingest.iter().enumerate() {
                if *d == mine {
                    (0u8, i).hash(h);
                }
            }
            let mut work: Vec<_> = (r.db.work.iter().zip(&r.work))
                .filter(|(_, d)| **d == mine)
                .map(|(e, _)| {
                    (
                        e.op.as_str(),
                        e.item.gen,
                        e.item.seq,
                        e.item.group_id.as_deref(),
                    )
                })
                .collect();
            work.sort();
            work.hash(h);
        };
        pending(&self.redis, &mut h);
        if self.tracking() {
            255u8.hash(&mut h);
            pending(&self.synced, &mut h);
        }
        h.finish()
    }

    /// Whether what Redis has on disk still matters: under `everysec`, while
    /// a loss can still come. Once none can, every write may as well be on
    /// disk at once: a durability wait only delays a step past a `Sync`,
    /// which is always possible, so the same orderings are reached.
    pub(crate) fn tracking(&self) -> bool {
        self.cfg.everysec && self.redis_losses > 0
    }

    /// Whether a worker is on entry `h` now.
    fn held(&self, h: Held) -> bool {
        self.workers.iter().flatten().any(|j| j.held == h)
    }

    /// Whether the worker's next step waits for Redis to have on disk the
    /// facts it rests on (`durability_wait`): an add, on the chunk's
    /// assignment and its generation's group; a send, on `ready`.
    fn waiting(&self, job: &Job) -> bool {
        if !self.tracking() {
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
            // After the claim: the ready event and the claim on disk (when
            // they are gone, the step runs the item again from its top).
            ("send", 2) => {
                let facts = self.send_facts(job.gen);
                facts.iter().all(|f| self.field(f).is_some())
                    && !facts.iter().all(|f| self.synced_has(f))
            }
            _ => false,
        }
    }

    /// What a send rests on: its generation's `ready` event and its claim
    /// (none, for the mutant that sends without one).
    pub(crate) fn send_facts(&self, gen: u32) -> Vec<String> {
        let mut f = vec![format!("k:ready/{gen}")];
        if self.cfg.mutant != Some(Mutant::SendWithoutClaim) {
            f.push(format!("k:claim/{gen}"));
        }
        f
    }

    /// How the scripts end the batch here.
    fn policy(&self) -> BatchPolicy {
        BatchPolicy {
            retention: Duration::from_secs(u64::from(self.cfg.retention)),
            deliver: self.cfg.webhook,
            ..BatchPolicy::default()
        }
    }

    /// A parked or load payload: the ingest index, then the recipients to add.
    fn payload(job: &Job) -> Vec<u8> {
        let mut p = vec![job.chunk as u8];
        p.extend_from_slice(&job.to);
        p
    }

    /// A chunk's numbers as the worker spells them.
    fn records(to: &[u8]) -> Vec<u8> {
        let numbers: Vec<String> = to.iter().map(|t| format!("0700000{t:03}")).collect();
        dedupe_records(numbers.iter().map(String::as_str))
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

    /// Whether worker `w`'s entry is settled now (acknowledged, or
    /// dead-lettered). Under `everysec` that happens only while the last
    /// event its handling appended is still recorded (`ack_recorded.lua`,
    /// `dead_letter.lua`); one that is gone leaves the entry pending, to be
    /// reclaimed and handled again (false, the worker freed). While a loss
    /// can still come, an event appended in this very step is settled in a
    /// step of its own (false, `hold` sets the job up for it): the script's
    /// answer comes first, the settling after it, and Redis may restart
    /// from disk in between.
    fn settles_now(&mut self, w: usize, hold: impl FnOnce(&mut Job)) -> bool {
        let appended_now = self.redis.db.last_event.take();
        if !self.cfg.everysec {
            return true;
        }
        let Some(job) = self.workers[w].as_mut() else {
            return false;
        };
        if appended_now.is_some() {
            job.appended = appended_now;
            if self.redis_losses > 0 {
                hold(job);
                return false;
            }
        }
        let appended = job.appended.clone();
        let gone = appended.is_some() && !self.recorded(&appended);
        if gone && self.cfg.mutant != Some(Mutant::AckWithoutCheck) {
            self.workers[w] = None;
            return false;
        }
        true
    }

    /// The acknowledgement of an entry whose handling is done (the
    /// consumer's `Acker`), when it [settles now](World::settles_now).
    pub(super) fn ack(&mut self, w: usize) {
        if self.settles_now(w, |job| job.pc = ACK) {
            self.xack(w);
        }
    }

    /// Whether Redis holds event `appended` (key, entry id) under that id:
    /// gone, or appended again since (after a loss, by another handling),
    /// it does not.
    fn recorded(&self, appended: &Option<(String, String)>) -> bool {
        appended.as_ref().is_some_and(|(k, id)| {
            self.redis.db.field(BATCH, &format!("k:{k}")) == Some(id.as_str())
        })
    }

    /// XACK: of a pending entry (whoever it is pending for); an entry
    /// whose delivery Redis lost is not pending, and stays as it is.
    /// (`retry_later.lua` acknowledges in its own step.)
    fn xack(&mut self, w: usize) {
        if let Some(job) = self.workers[w].take() {
            if let Some(Delivery::Pending(_)) = self.delivery(job.held) {
                self.set_delivery(job.held, Delivery::Acked);
            }
        }
    }

    /// The retry a failed handler schedules (acknowledged, back later as a
    /// new entry: retry_later.lua, then promote.lua).
    /// A send held by its schedule until `at` (Redis ms, a script's
    /// answer): retried then, not before.
    fn retry_at(&mut self, w: usize, item: WorkItem, at: Option<u64>) {
        self.retry(w, "send", item, None);
        let hour = at.map(|at| (0..=u8::MAX).find(|h| hour_ms(*h) >= at).unwrap_or(u8::MAX));
        if let (Some(h), Some(e)) = (hour, self.redis.db.work.last()) {
            if h > self.clock {
                self.due.insert(e.id, h);
            }
        }
    }

    /// The hour before which work entry `id` is not read, if still ahead.
    fn due_after(&self, id: u64) -> Option<u8> {
        self.due.get(&id).copied().filter(|h| *h > self.clock)
    }

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
        self.xack(w);
    }

    /// The dead letter of an entry (`dead_letter.lua`, which acknowledges
    /// it in the same step), when it [settles now](World::settles_now).
    pub(super) fn dead(&mut self, w: usize, what: String) {
        let held = what.clone();
        if self.settles_now(w, |job| {
            job.pc = DEAD;
            job.dead = Some(held);
        }) {
            self.redis.dead.push(what);
            self.xack(w);
        }
    }

    fn item(&self, job: &Job) -> WorkItem {
        protocol::work_item(
            BATCH,
            job.gen,
            Some(job.seq).filter(|_| job.op == "load"),
            job.group.as_deref(),
        )
    }

    /// The provider's answer to an add of recipients `to` into `group`:
    /// `Err(true)` retryable, `Err(false)` refused (the group is not pending).
    fn add(&mut self, group: &str, to: &[u8]) -> Result<u32, bool> {
        let Some(g) = group
            .strip_prefix('P')
            .and_then(|i| i.parse::<usize>().ok())
        else {
            return Err(false);
        };
        if self.groups[g].status != GroupStatus::Pending {
            return Err(false);
        }
        for t in to {
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
}
