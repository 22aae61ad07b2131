//! The pure protocol functions (`src/protocol/`) against the real scripts
//! (`streams/scripts/`) on a real redis-server: long random sequences of
//! script calls, each run through both, comparing after every step the
//! reply, the state hash (projection and idempotency keys), the event
//! stream, the work stream, the parked hashes, the dedupe hash (every
//! bucket), the active set, the reports stream, the delayed set, the
//! tombstones and the retention TTL. A script changed without its mirror
//! fails here; so does a mirror changed without its script.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use groupcast::events::options::ScheduleArgs;
use groupcast::events::{
    decode_payload, entry_millis, BatchStalled, ChunkLoaded, ClaimGivenBack, Event, GroupDiscarded,
    Recorded, RegistrationFailure, ReportDelivered, SendRefused,
};
use groupcast::keys::Keyspace;
use groupcast::protocol::{
    self,
    accept::{AcceptArgs, DedupeClaim},
    completed::CompletedArgs,
    Db, GivenUp, WorkEntry,
};
use groupcast::store::batch::{
    dedupe_records, Accepted, Appended, BatchLog, BatchPolicy, Cancelling, Claim, ClaimArgs,
    ClaimMode, Claimed, Closing, Completion, GenerationFailure, GroupRecord, Loading, Parked,
    Rejection, Sealing, SendGiveUp, SendRecord,
};
use groupcast::store::queue::parse_entries;
use groupcast::store::Store;
use groupcast::worker::ops::WorkItem;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;

/// Steps per run, and runs (each on fresh batches, under a fresh prefix:
/// a batch soon has every seq and every generation decided, and most calls
/// after that are repeats).
const STEPS: usize = 80;
const RUNS: u64 = 130;
const SEQS: u32 = 6;
const GENS: u32 = 5;

/// One run's chunks: for each seq, its usual content and another one (a
/// conflicting copy), as recipient numbers drawn from a small pool, so that
/// a number comes again in other chunks (the batch-wide dedupe's case) and
/// within a chunk.
struct Chunks {
    cap: u64,
    /// A run whose calls refuse nothing (no conflicting copy, no wrong
    /// `last`, no chunk over the cap, no rejection, no failed recipient, no
    /// close): its batches can report `completed`.
    clean: bool,
    /// By seq: (usual numbers, other numbers).
    content: Vec<(Vec<String>, Vec<String>)>,
}

impl Chunks {
    fn new(rng: &mut StdRng) -> Chunks {
        // Small runs: a cap of 6 (generations turn over often), few numbers.
        // Large ones: chunks of up to 60 numbers out of 250.
        let (cap, pool_size) = if rng.random_bool(0.5) {
            (6u64, 10)
        } else {
            (90, 250)
        };
        let clean = rng.random_bool(0.3);
        // Half of them mobile (010-XXXX-XXXX).
        let pool: Vec<String> = (0..pool_size)
            .map(|_| {
                if rng.random_bool(0.5) {
                    format!("010{:08}", rng.random_range(0..4_000u64))
                } else {
                    format!("0{:010}", rng.random_range(0..10_000_000_000u64))
                }
            })
            .collect();
        let draw = |rng: &mut StdRng| -> Vec<String> {
            // Now and then one over the cap (refused).
            let n = if !clean && rng.random_bool(0.05) {
                cap as usize + 1
            } else {
                rng.random_range(1..=cap as usize * 2 / 3)
            };
            (0..n)
                .map(|_| pool[rng.random_range(0..pool.len())].clone())
                .collect()
        };
        let content = (0..SEQS + 1).map(|_| (draw(rng), draw(rng))).collect();
        Chunks {
            cap,
            clean,
            content,
        }
    }

    fn numbers(&self, seq: u32, usual: bool) -> &[String] {
        let (a, b) = &self.content[seq as usize];
        if usual {
            a
        } else {
            b
        }
    }

    fn records(&self, seq: u32, usual: bool) -> Vec<u8> {
        dedupe_records(self.numbers(seq, usual).iter().map(String::as_str))
    }
}

/// One script call, with its arguments.
#[derive(Debug, Clone)]
enum Call {
    Accept {
        seq: u32,
        last: bool,
        records: Vec<u8>,
        digest: String,
        /// The batch options, canonical.
        opts: String,
        /// The generation hint (it only saves a read: any value decides the same).
        hint: u32,
        /// The copies by a view of the number log, and where the view ends;
        /// None: a view of the whole log as the call finds it
        /// ([`with_claim`]).
        claim: Option<DedupeClaim>,
    },
    /// Several chunks of the batch in one call of `accept.lua` (each a
    /// `Call::Accept`, the first one's hint for all): the script asks them in
    /// turn while each is assigned; the model accepts them one by one.
    AcceptTogether(Vec<Call>),
    Reject {
        seq: u32,
        digest: String,
        reason: String,
        /// The refused chunk's `last` flag.
        last: bool,
    },
    Close {
        reason: String,
    },
    /// `seal`: the batch's last seq, declared after its chunks.
    Seal {
        last: u32,
    },
    Cancel {
        reason: String,
    },
    /// `claim_send` of a generation's send, or a check of its schedule.
    Claim {
        gen: u32,
        mode: ClaimMode,
        lifetime_ms: u64,
        /// The schedule, relative to `at`.
        sched: Sched,
        /// The Redis clock read before the call (ms): the schedule's origin.
        at: u64,
        /// The script's clock, for the model (from the script's reply).
        now: u64,
    },
    Park {
        seq: u32,
        gen: u32,
        payload: Vec<u8>,
    },
    RecordGroup {
        gen: u32,
        group: String,
    },
    /// `fail_generation`: a generation's creation given up for good.
    FailGeneration {
        gen: u32,
    },
    /// `give_up_send`: a generation's send, poll or recall given up, or
    /// the recall's finding that the group never went out.
    GiveUpSend {
        gen: u32,
        what: GivenUp,
        group: String,
    },
    Loaded(ChunkLoaded),
    Sent {
        gen: u32,
        group: String,
        outcome: String,
        poll: Vec<u8>,
    },
    Completed {
        gen: u32,
        group: String,
        status: String,
        ss: u64,
        sf: u64,
    },
    Append {
        key: String,
        event: Event,
    },
    /// Retention expires a reported batch's state and events (its dedupe
    /// hash is gone already; its tombstone stays).
    Expire,
}

/// A batch's schedule relative to the Redis clock at a call: hours away
/// from it, so that the decision is the same at any instant of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sched {
    /// No `send_at`, no quiet hours.
    None,
    /// `send_at` an hour ago.
    SendAtPast,
    /// `send_at` in an hour: held.
    SendAtFuture,
    /// Inside quiet hours: held until they end.
    QuietNow,
    /// Quiet hours open in an hour: free, a claim's lifetime cut there.
    QuietAhead,
    /// The window given closed an hour ago: stale.
    QuietPassed,
    /// `send_at` in an hour, inside quiet hours that open in half an hour.
    SendAtInQuiet,
}

const HOUR: u64 = 3_600_000;

impl Sched {
    fn args(self, at: u64) -> ScheduleArgs {
        let (send_at, quiet) = match self {
            Sched::None => (None, None),
            Sched::SendAtPast => (Some(at - HOUR), None),
            Sched::SendAtFuture => (Some(at + HOUR), None),
            Sched::QuietNow => (None, Some((at - HOUR, at - HOUR, at + HOUR))),
            Sched::QuietAhead => (None, Some((at, at + HOUR, at + 2 * HOUR))),
            Sched::QuietPassed => (None, Some((at - 2 * HOUR, at - 2 * HOUR, at - HOUR))),
            Sched::SendAtInQuiet => (
                Some(at + HOUR),
                Some((at + HOUR, at + HOUR / 2, at + 2 * HOUR)),
            ),
        };
        ScheduleArgs { send_at, quiet }
    }
}

/// A claim of an unscheduled batch's send.
fn claim(gen: u32) -> Call {
    Call::Claim {
        gen,
        mode: ClaimMode::Claim,
        lifetime_ms: 60_000,
        sched: Sched::None,
        at: 0,
        now: 0,
    }
}

fn claim_args(call: &Call) -> Option<(ClaimArgs, u64)> {
    match call {
        Call::Claim {
            gen,
            mode,
            lifetime_ms,
            sched,
            at,
            now,
        } => Some((
            ClaimArgs {
                gen: *gen,
                mode: *mode,
                lifetime_ms: *lifetime_ms,
                schedule: sched.args(*at),
            },
            *now,
        )),
        _ => None,
    }
}

/// Before a claim: the schedule's origin, the Redis clock.
async fn set_claim_clock(log: &BatchLog, call: &mut Call) {
    if let Call::Claim { at, .. } = call {
        *at = log.server_time_ms().await.expect("the Redis clock");
    }
}

/// After a claim: the model runs on the script's clock (from its reply),
/// else on the clock read before (a decision that did not depend on it).
fn set_model_clock(call: &mut Call, got: &[String]) {
    if let Call::Claim { at, now, .. } = call {
        let from_reply = match got.first().map(String::as_str) {
            Some("claimed") | Some("held") => got.get(3),
            _ => None,
        };
        *now = from_reply.and_then(|v| v.parse().ok()).unwrap_or(*at);
    }
}

/// The policy a step's scripts end batches by: with or without retention
/// and webhook (both the model and the scripts take it as an argument).
fn policy(rng: &mut StdRng) -> BatchPolicy {
    BatchPolicy {
        retention: Duration::from_secs(if rng.random_bool(0.5) { 3600 } else { 0 }),
        deliver: rng.random_bool(0.5),
        track: rng.random_bool(0.5),
    }
}

/// `call` with its claim on the number log made: an accept without one gets
/// the claim of a view of the whole log of `batch` in `db` (the mirror's,
/// which the test keeps equal to Redis's).
fn with_claim(db: &Db, batch: &str, call: &Call) -> Call {
    let mut call = call.clone();
    let log = db.batch(batch).map_or(&[][..], |b| &b.numbers[..]);
    match &mut call {
        Call::Accept { records, claim, .. } if claim.is_none() => {
            *claim = Some(DedupeClaim::current(log, records));
        }
        Call::AcceptTogether(chunks) => {
            // Chained on a view of the whole log; the first keeps a stale
            // claim it was given (then the others are never asked).
            let mut view = groupcast::protocol::numbers::View::default();
            let _ = view.extend(log);
            let records: Vec<Vec<u8>> = chunks.iter().map(accept_records).collect();
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            let chain = DedupeClaim::chain(&view, &refs);
            for (k, (c, made)) in chunks.iter_mut().zip(chain).enumerate() {
                if let Call::Accept { claim, .. } = c {
                    if k > 0 || claim.is_none() {
                        *claim = Some(made);
                    }
                }
            }
        }
        _ => {}
    }
    call
}

/// An accept's records (none for another call).
fn accept_records(call: &Call) -> Vec<u8> {
    match call {
        Call::Accept { records, .. } => records.clone(),
        _ => Vec::new(),
    }
}

/// Between the answers of the chunks of an `AcceptTogether`, in a reply.
const THEN: &str = "then";

/// A claim by a view that is behind the log's end: the log without its
/// last frame, or with its stamp wrong. None when the log is empty.
fn stale_claim(db: &Db, batch: &str, records: &[u8], rng: &mut StdRng) -> Option<DedupeClaim> {
    let log = db
        .batch(batch)
        .map(|b| &b.numbers[..])
        .filter(|l| !l.is_empty())?;
    let mut claim = DedupeClaim::current(log, records);
    if rng.random_bool(0.5) {
        claim.stamp = "0123456789abcdef".into();
    } else {
        // The frames but the last: read them one by one.
        let mut view = groupcast::protocol::numbers::View::default();
        let frames = frames_of(log);
        let last = frames.last().map_or(0, |f| 4 + f.len() + 16);
        view.extend(&log[..log.len() - last]).expect("whole frames");
        claim = DedupeClaim::by(&view, records);
    }
    Some(claim)
}

/// A plausible accept of one chunk (a stale claim now and then).
fn pick_accept(
    rng: &mut StdRng,
    db: &Db,
    batch: &str,
    chunks: &Chunks,
    top: u32,
    gen: u32,
) -> Call {
    let seq = rng.random_range(0..SEQS);
    let usual = chunks.clean || rng.random_bool(0.9);
    Call::Accept {
        seq,
        last: if chunks.clean {
            seq == SEQS - 1
        } else {
            rng.random_bool(0.25)
        },
        records: chunks.records(seq, usual),
        digest: if usual {
            format!("d{seq}")
        } else {
            "other".into()
        },
        // Now and then a chunk whose options disagree with the batch's.
        opts: if usual || rng.random_bool(0.5) {
            "|normal|".into()
        } else {
            "1764579600000|bulk|".into()
        },
        // Now and then a caller behind the log's end.
        claim: if rng.random_bool(0.15) {
            stale_claim(db, batch, &chunks.records(seq, usual), rng)
        } else {
            None
        },
        hint: if rng.random_bool(0.7) { top } else { gen },
    }
}

/// A plausible call most of the time (the state guides the arguments), an
/// arbitrary one otherwise.
fn pick(rng: &mut StdRng, db: &Db, batch: &str, chunks: &Chunks) -> Call {
    let top = db
        .field(batch, "gen")
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(0);
    let gen = if rng.random_bool(0.8) {
        top.saturating_sub(rng.random_range(0..2))
    } else {
        rng.random_range(0..GENS)
    };
    let assigned: Vec<(u32, u32)> = (0..SEQS)
        .filter_map(|s| {
            let v = db.field(batch, &format!("s:{s}"))?;
            Some((s, v.split('|').next()?.parse().ok()?))
        })
        .collect();
    let (seq, sgen) = match assigned.len() {
        0 => (rng.random_range(0..SEQS), gen),
        n if rng.random_bool(0.85) => assigned[rng.random_range(0..n)],
        _ => (rng.random_range(0..SEQS), gen),
    };
    let group = format!("G{gen}-{}", rng.random_range(0..2));
    let kept = db
        .field(batch, &format!("g:{sgen}:group"))
        .map(str::to_string)
        .unwrap_or_else(|| format!("G{sgen}-0"));
    let choice = match rng.random_range(0..124) {
        // A clean run has no rejections, no close, no cancel and no
        // generation given up.
        100..=105 | 111..=119 if chunks.clean => rng.random_range(0..30),
        n => n,
    };
    match choice {
        0..=5 => {
            let n = rng.random_range(2..=4);
            let mut chunks: Vec<Call> = (0..n)
                .map(|_| pick_accept(rng, db, batch, chunks, top, gen))
                .collect();
            for c in chunks.iter_mut().skip(1) {
                if let Call::Accept { claim, .. } = c {
                    *claim = None;
                }
            }
            Call::AcceptTogether(chunks)
        }
        6..=29 => pick_accept(rng, db, batch, chunks, top, gen),
        100..=102 => {
            let seq = rng.random_range(0..SEQS + 1);
            Call::Reject {
                seq,
                digest: format!("bad{}", rng.random_range(0..2)),
                reason: "recipient 0 has an invalid number".into(),
                last: rng.random_bool(0.3),
            }
        }
        103..=104 => Call::Close {
            reason: "operator".into(),
        },
        // A clean run seals at its true last seq; others anywhere.
        120..=123 => Call::Seal {
            last: if chunks.clean {
                SEQS - 1
            } else {
                rng.random_range(0..SEQS + 1)
            },
        },
        105 => {
            if db.field(batch, "report").is_some() {
                Call::Expire
            } else {
                Call::Close {
                    reason: "quiet".into(),
                }
            }
        }
        89..=92 | 106..=110 => {
            let sched = match rng.random_range(0..12) {
                0..=4 => Sched::None,
                5 => Sched::SendAtPast,
                6 => Sched::SendAtFuture,
                7 | 8 => Sched::QuietNow,
                9 => Sched::QuietAhead,
                10 => Sched::QuietPassed,
                _ => Sched::SendAtInQuiet,
            };
            // Mostly a generation still to send (claims of sent or done
            // ones answer `done`).
            let open: Vec<u32> = (0..=top)
                .filter(|g| {
                    db.field(batch, &format!("g:{g}:done")).is_none()
                        && db.field(batch, &format!("k:send/{g}")).is_none()
                })
                .collect();
            let gen = match open.len() {
                0 => gen,
                n if rng.random_bool(0.8) => open[rng.random_range(0..n)],
                _ => gen,
            };
            Call::Claim {
                gen,
                mode: if rng.random_bool(0.8) {
                    ClaimMode::Claim
                } else {
                    ClaimMode::Check
                },
                // 0: a claim that ends as it is taken (after a cancel, the
                // next call finds it over).
                lifetime_ms: match rng.random_range(0..10) {
                    0..=5 => 5_000,
                    6..=7 => 0,
                    _ => 2 * HOUR,
                },
                sched,
                at: 0,
                now: 0,
            }
        }
        111 => Call::Cancel {
            reason: "wrong campaign".into(),
        },
        112..=113 => Call::FailGeneration { gen },
        114..=119 => {
            // Mostly a generation ready and not done (claimed, often): the
            // give-up's cases, rare otherwise.
            let open: Vec<u32> = (0..GENS)
                .filter(|g| {
                    db.field(batch, &format!("g:{g}:ready")).is_some()
                        && db.field(batch, &format!("g:{g}:done")).is_none()
                })
                .collect();
            let gen = match open.len() {
                0 => gen,
                n if rng.random_bool(0.8) => open[rng.random_range(0..n)],
                _ => gen,
            };
            Call::GiveUpSend {
                gen,
                // Mostly what the generation's state calls for: a send
                // while it is not sent, a recall's findings once its send
                // was given up, a poll once sent.
                what: {
                    let f = |n: &str| db.field(batch, &format!("g:{gen}:{n}"));
                    let directed = if f("failed") == Some("send") {
                        Some(if rng.random_bool(0.5) {
                            GivenUp::Unsent
                        } else {
                            GivenUp::Recall
                        })
                    } else if f("sent").is_some() {
                        Some(GivenUp::Poll)
                    } else if f("ready").is_some() {
                        Some(GivenUp::Send)
                    } else {
                        None
                    };
                    match (directed, rng.random_range(0..10)) {
                        (Some(w), 0..=7) => w,
                        (_, 0..=3) => GivenUp::Send,
                        (_, 4..=5) => GivenUp::Unsent,
                        (_, 6..=7) => GivenUp::Poll,
                        _ => GivenUp::Recall,
                    }
                },
                group: db
                    .field(batch, &format!("g:{gen}:group"))
                    .unwrap_or("")
                    .to_string(),
            }
        }
        30..=42 => Call::Park {
            seq,
            gen: sgen,
            payload: format!("chunk {seq}").into_bytes(),
        },
        43..=54 => Call::RecordGroup { gen, group },
        55..=72 => {
            // Now and then a chunk given up on: every recipient failed.
            let given_up = !chunks.clean && rng.random_bool(0.15);
            let failures = if chunks.clean {
                0
            } else {
                rng.random_range(0..3)
            };
            let failed: Vec<RegistrationFailure> = (0..failures)
                .map(|i| RegistrationFailure {
                    to: format!("0100000{seq}{i}"),
                    code: if given_up {
                        "given_up"
                    } else if i == 0 {
                        "3059"
                    } else {
                        "1062"
                    }
                    .into(),
                })
                .collect();
            Call::Loaded(ChunkLoaded {
                gen: sgen,
                seq,
                group_id: kept,
                registered: if given_up { 0 } else { rng.random_range(0..4) },
                duplicates: rng.random_range(0..2),
                failed,
                given_up: given_up.then(|| "add refused: 400".to_string()),
            })
        }
        73..=82 => Call::Sent {
            gen,
            group: db
                .field(batch, &format!("g:{gen}:group"))
                .unwrap_or("G?")
                .to_string(),
            outcome: if rng.random_bool(0.8) {
                "sent"
            } else {
                "already_sent"
            }
            .into(),
            poll: format!("poll|{batch}|{gen}").into_bytes(),
        },
        83..=88 => Call::Completed {
            gen,
            group: format!("G{gen}"),
            status: if rng.random_bool(0.8) {
                "COMPLETE"
            } else {
                "FAILED"
            }
            .into(),
            ss: rng.random_range(0..5),
            sf: rng.random_range(0..2),
        },
        _ => {
            // (`input_rejected` is not appended this way any more: the
            // scripts record refused chunks themselves, holes included.)
            let (key, event) = match rng.random_range(0..4) {
                0 => (
                    format!("discard/G{gen}-1"),
                    Event::GroupDiscarded(GroupDiscarded {
                        gen,
                        group_id: format!("G{gen}-1"),
                        kept: format!("G{gen}-0"),
                    }),
                ),
                1 => (
                    format!("stall/{}", rng.random_range(0..3)),
                    Event::BatchStalled(BatchStalled {
                        quiet_since_ms: 5,
                        quiet_for_ms: 7,
                    }),
                ),
                2 => (
                    "delivered".into(),
                    Event::ReportDelivered(ReportDelivered {
                        status: 200,
                        report: None,
                    }),
                ),
                _ => (
                    format!("refused/{gen}"),
                    Event::SendRefused(SendRefused {
                        gen,
                        group_id: format!("G{gen}"),
                        reason: "count".into(),
                    }),
                ),
            };
            Call::Append { key, event }
        }
    }
}

/// Runs a call through the pure functions: the reply without its `ev=`/`w=` tail.
fn model(db: &mut Db, batch: &str, p: &BatchPolicy, cap: u64, call: &Call) -> Vec<String> {
    match call {
        Call::Accept {
            seq,
            last,
            records,
            digest,
            opts,
            hint: _,
            claim,
        } => {
            let got = protocol::accept(
                db,
                batch,
                p,
                &AcceptArgs {
                    seq: *seq,
                    last: *last,
                    records,
                    digest,
                    cap,
                    opts,
                },
                claim.as_ref().expect("a claim (with_claim)"),
            );
            // The store answers `behind` with what the view missed (the
            // log from its stamp on) rather than the log's length.
            if got[0] == "behind" {
                let log = db.batch(batch).map_or(&[][..], |b| &b.numbers[..]);
                let from = (claim.as_ref().map_or(0, |c| c.seen) as usize).saturating_sub(16);
                vec![
                    s("behind"),
                    hex::encode(log.get(from..).unwrap_or_default()),
                ]
            } else {
                got
            }
        }
        Call::AcceptTogether(chunks) => {
            let mut out = Vec::new();
            for (k, c) in chunks.iter().enumerate() {
                if k > 0 {
                    out.push(s(THEN));
                }
                let got = model(db, batch, p, cap, c);
                let went_on = got[0] == "assigned";
                out.extend(got);
                if !went_on {
                    break;
                }
            }
            out
        }
        Call::Reject {
            seq,
            digest,
            reason,
            last,
        } => protocol::reject(db, batch, p, *seq, digest, reason, *last),
        Call::Close { reason } => protocol::close(db, batch, p, reason),
        Call::Seal { last } => protocol::seal(db, batch, p, *last),
        Call::Cancel { reason } => protocol::cancel(db, batch, p, reason),
        Call::Claim { .. } => {
            let (args, now) = claim_args(call).expect("a claim");
            protocol::claim_send(db, batch, p, &args, now)
        }
        Call::Park { seq, gen, payload } => protocol::park(db, batch, *seq, *gen, payload),
        Call::RecordGroup { gen, group } => protocol::record_group(db, batch, *gen, group),
        Call::FailGeneration { gen } => {
            protocol::fail_generation(db, batch, p, *gen, "create refused: 403")
        }
        Call::GiveUpSend { gen, what, group } => {
            protocol::give_up_send(db, batch, p, *gen, *what, "send refused: 403", group)
        }
        Call::Loaded(e) => protocol::loaded(db, batch, p, e),
        Call::Sent {
            gen,
            group,
            outcome,
            poll,
        } => protocol::sent(db, batch, *gen, group, outcome, poll),
        Call::Completed {
            gen,
            group,
            status,
            ss,
            sf,
        } => protocol::completed(
            db,
            batch,
            p,
            &CompletedArgs {
                gen: *gen,
                group,
                status,
                sent_success: *ss,
                sent_failed: *sf,
            },
        ),
        Call::Append { key, event } => protocol::append(db, batch, key, event),
        Call::Expire => {
            // EXPIRE covers the state hash and the events only.
            if let Some(b) = db.batches.get_mut(batch) {
                b.state.clear();
                b.events.clear();
                b.expiring = false;
            }
            vec![s("expired")]
        }
    }
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// An accept's answer spelt as the script's reply (a `behind`'s bytes in hex).
fn spell(claimed: Claimed) -> Vec<String> {
    let positions = |d: Vec<u32>| d.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    match claimed {
        Claimed::Behind { missed } => vec![s("behind"), hex::encode(missed)],
        Claimed::Took(Accepted::Assigned {
            gen,
            group,
            duplicates,
        }) => vec![
            s("assigned"),
            s(gen),
            group.unwrap_or_default(),
            s("0"),
            positions(duplicates),
        ],
        Claimed::Took(Accepted::Duplicate {
            gen,
            group,
            loaded,
            duplicates,
        }) => vec![
            s("duplicate"),
            s(gen),
            group.unwrap_or_default(),
            s(if loaded { "1" } else { "0" }),
            positions(duplicates),
        ],
        Claimed::Took(Accepted::Conflict(r)) => vec![s("conflict"), r],
        Claimed::Took(Accepted::Rejected(r)) => vec![s("rejected"), r],
        Claimed::Took(Accepted::Refused(r)) => vec![s("refused"), r],
    }
}

/// Runs a call through the real scripts (the worker's own calls), its
/// answer spelt as the script's reply.
async fn real(store: &Store, log: &BatchLog, cap: u64, call: &Call) -> Vec<String> {
    let fail = "a script call on the private redis-server";
    match call {
        Call::Accept {
            seq,
            last,
            records,
            digest,
            opts,
            hint,
            claim,
        } => spell(
            log.accept_claimed(
                &AcceptArgs {
                    seq: *seq,
                    last: *last,
                    records,
                    digest,
                    cap,
                    opts,
                },
                claim.as_ref().expect("a claim (with_claim)"),
                *hint,
            )
            .await
            .expect(fail),
        ),
        Call::AcceptTogether(chunks) => {
            let args: Vec<(AcceptArgs, &DedupeClaim)> = chunks
                .iter()
                .filter_map(|c| match c {
                    Call::Accept {
                        seq,
                        last,
                        records,
                        digest,
                        opts,
                        claim,
                        ..
                    } => Some((
                        AcceptArgs {
                            seq: *seq,
                            last: *last,
                            records,
                            digest,
                            cap,
                            opts,
                        },
                        claim.as_ref().expect("a claim (with_claim)"),
                    )),
                    _ => None,
                })
                .collect();
            let hint = match chunks.first() {
                Some(Call::Accept { hint, .. }) => *hint,
                _ => 0,
            };
            let answers = log.accept_together(&args, hint).await.expect(fail);
            let mut out = Vec::new();
            for (k, claimed) in answers.into_iter().enumerate() {
                if k > 0 {
                    out.push(s(THEN));
                }
                out.extend(spell(claimed));
            }
            out
        }
        Call::Reject {
            seq,
            digest,
            reason,
            last,
        } => match log.reject(*seq, digest, reason, *last).await.expect(fail) {
            Rejection::Recorded => vec![s("rejected")],
            Rejection::Refused(r) => vec![s("refused"), r],
        },
        Call::Seal { last } => match log.seal(*last).await.expect(fail) {
            Sealing::Sealed(n) => vec![s("sealed"), s(n)],
            Sealing::Conflict(why) => vec![s("conflict"), why],
            Sealing::Ended(why) => vec![s("ended"), why],
        },
        Call::Close { reason } => match log.close(reason).await.expect(fail) {
            Closing::Closed { missing } => vec![s("closed"), s(missing)],
            Closing::AlreadyReported(o) => vec![s("reported"), o],
            Closing::Unknown => vec![s("unknown")],
        },
        Call::Cancel { reason } => match log.cancel(reason).await.expect(fail) {
            Cancelling::Cancelled {
                stopped,
                unsent,
                seen,
            } => vec![
                s("cancelled"),
                s(stopped),
                s(unsent),
                s(if seen { "1" } else { "0" }),
            ],
            Cancelling::AlreadyReported(o) => vec![s("reported"), o],
            Cancelling::Forgotten => vec![s("forgotten")],
        },
        Call::Claim { .. } => {
            let (args, _) = claim_args(call).expect("a claim");
            match log.claim_send(&args).await.expect(fail) {
                Claim::Claimed {
                    id,
                    n,
                    until_ms,
                    now_ms,
                    renewed,
                } => vec![
                    s("claimed"),
                    id,
                    s(until_ms),
                    s(now_ms),
                    s(n),
                    s(if renewed { "renewed" } else { "new" }),
                ],
                // (The typed call keeps no clock for these: compared
                // without it.)
                Claim::Free => vec![s("free")],
                Claim::Held {
                    at_ms,
                    reason,
                    now_ms,
                    given_back,
                } => vec![
                    s("held"),
                    s(at_ms),
                    reason,
                    s(now_ms),
                    s(if given_back { "1" } else { "0" }),
                ],
                Claim::Stale => vec![s("stale")],
                Claim::Cancelled(why) => vec![s("cancelled"), why],
                Claim::Done => vec![s("done")],
            }
        }
        Call::Expire => {
            let mut conn = store.raw_conn();
            let _: () = conn
                .del(&[&log.keys.state, &log.keys.events])
                .await
                .expect(fail);
            vec![s("expired")]
        }
        Call::Park { seq, gen, payload } => {
            match log.park(*seq, *gen, payload).await.expect(fail) {
                Parked::Parked => vec![s("parked")],
                Parked::Group(g) => vec![s("group"), g],
                Parked::AlreadyLoaded => vec![s("loaded")],
                Parked::Unassigned => vec![s("unassigned")],
                Parked::Failed => vec![s("failed")],
                Parked::Ended => vec![s("ended")],
            }
        }
        Call::RecordGroup { gen, group } => {
            match log.record_group(*gen, group).await.expect(fail) {
                GroupRecord::Won => vec![s("won"), group.clone()],
                GroupRecord::Lost { kept } => vec![s("lost"), kept],
                GroupRecord::Cancelled => vec![s("cancelled")],
                GroupRecord::Failed => vec![s("failed")],
            }
        }
        Call::FailGeneration { gen } => {
            match log
                .fail_generation(*gen, "create refused: 403")
                .await
                .expect(fail)
            {
                GenerationFailure::Failed { released } => vec![s("failed"), s(released)],
                GenerationFailure::AlreadyFailed => vec![s("duplicate")],
                GenerationFailure::HasGroup(g) => vec![s("group"), g],
                GenerationFailure::Ended => vec![s("ended")],
            }
        }
        Call::GiveUpSend { gen, what, group } => {
            match log
                .give_up_send(*gen, *what, "send refused: 403", group)
                .await
                .expect(fail)
            {
                SendGiveUp::Unsent(n) => vec![s("unsent"), s(n)],
                SendGiveUp::Unknown(n) => vec![s("unknown"), s(n)],
                SendGiveUp::Recalling => vec![s("recalling")],
                SendGiveUp::Sent => vec![s("sent")],
                SendGiveUp::Done => vec![s("done")],
                SendGiveUp::Stale => vec![s("stale")],
            }
        }
        Call::Loaded(e) => match log.record_loaded(e).await.expect(fail) {
            Loading::Loaded { ready } => vec![s("loaded"), s(if ready { "1" } else { "0" })],
            Loading::Duplicate => vec![s("duplicate")],
            Loading::Cancelled => vec![s("cancelled")],
        },
        Call::Sent {
            gen,
            group,
            outcome,
            poll,
        } => {
            match log
                .record_sent(*gen, group, outcome, 1000, poll)
                .await
                .expect(fail)
            {
                SendRecord::Recorded => vec![s("recorded")],
                SendRecord::Duplicate => vec![s("duplicate")],
                SendRecord::Done => vec![s("done")],
            }
        }
        Call::Completed {
            gen,
            group,
            status,
            ss,
            sf,
        } => match log
            .completed(*gen, group, status, *ss, *sf)
            .await
            .expect(fail)
        {
            Completion::Completed => vec![s("completed")],
            Completion::Reported => vec![s("reported")],
            Completion::Duplicate => vec![s("duplicate")],
            Completion::NotSent => vec![s("not_sent")],
        },
        Call::Append { key, event } => match log.append(key, event).await.expect(fail) {
            Appended::New(id) => vec![s("appended"), id],
            Appended::Duplicate(id) => vec![s("duplicate"), id],
        },
    }
}

/// Everything the scripts touch, read from Redis.
struct Seen {
    state: BTreeMap<String, String>,
    events: Vec<Recorded>,
    work: Vec<(String, String, WorkItem, Option<Vec<u8>>)>,
    parked: BTreeMap<u32, BTreeMap<String, Vec<u8>>>,
    numbers: Vec<u8>,
    active: BTreeSet<String>,
    reported: BTreeSet<String>,
    reports: Vec<(String, String, Event)>,
    delayed: BTreeSet<Vec<u8>>,
    expiring: bool,
}

async fn xrange(
    conn: &mut groupcast::store::RedisConn,
    key: &str,
) -> Vec<groupcast::store::queue::Entry> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    parse_entries(&v)
}

async fn read(store: &Store, log: &BatchLog) -> Seen {
    let mut conn = store.raw_conn();
    let k = &log.keys;
    let state: BTreeMap<String, String> = conn.hgetall(&k.state).await.expect("HGETALL");
    let events = xrange(&mut conn, &k.events)
        .await
        .iter()
        .map(|e| Recorded::from_fields(&e.id, &e.fields).expect("an event that decodes"))
        .collect();
    let mut work = Vec::new();
    for e in xrange(&mut conn, &k.work).await {
        let op = String::from_utf8_lossy(e.get("op").expect("op")).into_owned();
        let item: WorkItem = decode_payload("work", e.get("d").expect("d")).expect("a work item");
        work.push((e.id.clone(), op, item, e.get("c").map(<[u8]>::to_vec)));
    }
    let mut parked = BTreeMap::new();
    for gen in 0..=GENS + 1 {
        let h: BTreeMap<String, Vec<u8>> = conn.hgetall(k.parked(gen)).await.expect("HGETALL");
        if !h.is_empty() {
            parked.insert(gen, h);
        }
    }
    let numbers: Option<Vec<u8>> = conn.get(&k.numbers).await.expect("GET");
    let active: BTreeSet<String> = conn.smembers(&k.active).await.expect("SMEMBERS");
    let reported: Vec<String> = conn.zrange(&k.reported, 0, -1).await.expect("ZRANGE");
    let reports = xrange(&mut conn, &k.reports)
        .await
        .iter()
        .map(|e| {
            let batch = String::from_utf8_lossy(e.get("batch").expect("batch")).into_owned();
            let report = Event::decode("batch_reported", e.get("d").expect("d")).expect("a report");
            (e.id.clone(), batch, report)
        })
        .collect();
    let delayed: Vec<Vec<u8>> = conn.zrange(&k.delayed, 0, -1).await.expect("ZRANGE");
    let ttl: i64 = conn.pttl(&k.state).await.expect("PTTL");
    Seen {
        state,
        events,
        work,
        parked,
        numbers: numbers.unwrap_or_default(),
        active,
        reported: reported.into_iter().collect(),
        reports,
        delayed: delayed.into_iter().collect(),
        expiring: ttl > 0,
    }
}

/// The model's id `<n>-0` of an event of `batch` → the real id at the same
/// place in the stream.
fn real_id<'a>(model: &protocol::BatchDb, seen: &'a Seen, id: &str) -> Option<&'a str> {
    let i = model.events.iter().position(|e| e.id == id)?;
    seen.events.get(i).map(|e| e.id.as_str())
}

/// The differences between the model and Redis, as readable lines.
fn compare(db: &Db, batch: &str, seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    let empty = protocol::BatchDb::default();
    let m = db.batch(batch).unwrap_or(&empty);
    // The state hash, with the model's ids and clock readings translated.
    let mut state = BTreeMap::new();
    for (f, v) in &m.state {
        let t = if f.starts_with("k:") {
            real_id(m, seen, v).map(str::to_string)
        } else if f == "hb" || f == "t0" {
            real_id(m, seen, &format!("{v}-0")).map(|id| entry_millis(id).to_string())
        } else {
            Some(v.clone())
        };
        state.insert(f.clone(), t.unwrap_or_else(|| format!("<no event {v}>")));
    }
    if state != seen.state {
        let all: BTreeSet<&String> = state.keys().chain(seen.state.keys()).collect();
        for f in all {
            if state.get(f) != seen.state.get(f) {
                out.push(format!(
                    "state {f}: model {:?}, redis {:?}",
                    state.get(f),
                    seen.state.get(f)
                ));
            }
        }
    }
    if m.events.len() != seen.events.len() {
        out.push(format!(
            "events: model has {}, redis {}",
            m.events.len(),
            seen.events.len()
        ));
    }
    for (i, (a, b)) in m.events.iter().zip(&seen.events).enumerate() {
        if a.key != b.key || a.event != b.event {
            out.push(format!(
                "event {i}: model {} {:?}, redis {} {:?}",
                a.key, a.event, b.key, b.event
            ));
        }
    }
    // The work stream holds every batch's items: compare in order.
    let work: Vec<(&str, &WorkItem, Option<&Vec<u8>>)> = db
        .work
        .iter()
        .map(
            |WorkEntry {
                 op, item, chunk, ..
             }| (op.as_str(), item, chunk.as_ref()),
        )
        .collect();
    let real_work: Vec<(&str, &WorkItem, Option<&Vec<u8>>)> = seen
        .work
        .iter()
        .map(|(_, op, item, c)| (op.as_str(), item, c.as_ref()))
        .collect();
    if work != real_work {
        out.push(format!("work: model {work:?}\n      redis {real_work:?}"));
    }
    let parked: BTreeMap<u32, BTreeMap<String, Vec<u8>>> = m
        .parked
        .iter()
        .map(|(g, h)| (*g, h.iter().cloned().collect()))
        .collect();
    if parked != seen.parked {
        out.push(format!("parked: model {parked:?}, redis {:?}", seen.parked));
    }
    if m.numbers != seen.numbers {
        out.push(format!(
            "number log: model {:?}\n        redis {:?}",
            m.numbers, seen.numbers
        ));
    }
    if db.reported != seen.reported {
        out.push(format!(
            "tombstones: model {:?}, redis {:?}",
            db.reported, seen.reported
        ));
    }
    if db.active != seen.active {
        out.push(format!(
            "active: model {:?}, redis {:?}",
            db.active, seen.active
        ));
    }
    let reports: Vec<(&str, &Event)> = db.reports.iter().map(|(_, b, e)| (b.as_str(), e)).collect();
    let real_reports: Vec<(&str, &Event)> = seen
        .reports
        .iter()
        .map(|(_, b, e)| (b.as_str(), e))
        .collect();
    if reports != real_reports {
        out.push(format!(
            "reports: model {reports:?}, redis {real_reports:?}"
        ));
    }
    if db.delayed != seen.delayed {
        out.push(format!(
            "delayed: model {:?}, redis {:?}",
            db.delayed, seen.delayed
        ));
    }
    if m.expiring != seen.expiring {
        out.push(format!(
            "retention TTL: model {}, redis {}",
            m.expiring, seen.expiring
        ));
    }
    out
}

/// The model's reply as the typed call reports it: entry ids translated to
/// Redis's, a claim's `free` and `stale` without their clock.
async fn translate(
    db: &Db,
    batch: &str,
    store: &Store,
    log: &BatchLog,
    call: &Call,
    want: &[String],
) -> Vec<String> {
    match (call, want) {
        (Call::Append { .. }, [t, id]) | (Call::Claim { .. }, [t, id, ..])
            if t == "appended" || t == "duplicate" || t == "claimed" =>
        {
            let seen = read(store, log).await;
            let m = db.batch(batch).expect("appended");
            let mut out = want.to_vec();
            out[0] = t.clone();
            out[1] = real_id(m, &seen, id).unwrap_or("?").to_string();
            out
        }
        (Call::Claim { .. }, [t, _]) if t == "free" || t == "stale" => vec![t.clone()],
        _ => want.to_vec(),
    }
}

/// Writes to the real stderr, past the test harness's output capture.
fn shout(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pure_functions_decide_as_the_scripts_do() {
    let server = common::redis();
    let seed0: u64 = std::env::var("CONFORMANCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(13);
    let mut steps = 0usize;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    // The outcomes reported.
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut copies = 0usize;
    // Refused chunks whose `last` flag taught their batch its end, and
    // those whose flag contradicted a higher seq.
    let (mut learned, mut contradicted) = (0usize, 0usize);
    for run in 0..RUNS {
        let seed = seed0 + run;
        let store = Store::connect(&server.url(), Keyspace::new(format!("c{run}"), 1))
            .await
            .expect("connect to the private redis-server");
        let mut db = Db::default();
        let mut rng = StdRng::seed_from_u64(seed);
        let chunks = Chunks::new(&mut rng);
        // The numbers each batch was given, by this test's own count: the
        // dedupe must name exactly the copies of these (not only agree with
        // its mirror).
        let mut given: BTreeMap<String, BTreeSet<Vec<u8>>> = BTreeMap::new();
        // Two batches per run share the shard's work, active and reports keys.
        let names = [format!("c{seed}a"), format!("c{seed}b")];
        let mut history: Vec<String> = Vec::new();
        for step in 0..STEPS {
            let batch = &names[usize::from(rng.random_bool(0.3))];
            let p = policy(&mut rng);
            let store = store.clone().with_policy(p);
            let log = store.batch(batch);
            let mut call = with_claim(&db, batch, &pick(&mut rng, &db, batch, &chunks));
            let reports = db.reports.len();
            let knew_last = db.field(batch, "last").is_some();
            let knew_conflict = db.field(batch, "last_conflict").is_some();
            let events = db.batch(batch).map_or(0, |b| b.events.len());
            set_claim_clock(&log, &mut call).await;
            let got = real(&store, &log, chunks.cap, &call).await;
            set_model_clock(&mut call, &got);
            let want = model(&mut db, batch, &p, chunks.cap, &call);
            if !knew_last
                && db.field(batch, "last").is_some()
                && matches!(want[0].as_str(), "rejected" | "conflict")
            {
                learned += 1;
            }
            if !knew_conflict && db.field(batch, "last_conflict").is_some() {
                contradicted += 1;
            }
            for (_, _, e) in &db.reports[reports..] {
                if let Event::BatchReported(r) = e {
                    *outcomes.entry(r.outcome.clone()).or_default() += 1;
                }
            }
            let mut kind = format!(
                "{}:{}",
                format!("{call:?}").split([' ', '(']).next().unwrap_or(""),
                want[0]
            );
            // The claim's finer decisions: renewed, given back, stopped.
            let stopped = db.batch(batch).is_some_and(|b| {
                b.events[events.min(b.events.len())..].iter().any(|e| {
                    matches!(
                        e.event,
                        Event::ClaimGivenBack(ClaimGivenBack { stopped: true, .. })
                    )
                })
            });
            match (&call, want.as_slice()) {
                (Call::Claim { .. }, [_, _, _, _, _, how]) if how == "renewed" => {
                    kind = "Claim:renewed".into()
                }
                (Call::Claim { .. }, [_, _, _, _, back]) if back == "1" => {
                    kind = "Claim:given_back".into()
                }
                (Call::Claim { .. }, [t, ..]) if t == "cancelled" && stopped => {
                    let expired = db.batch(batch).is_some_and(|b| {
                        b.events[events.min(b.events.len())..].iter().any(|e| {
                            matches!(&e.event, Event::ClaimGivenBack(c) if c.reason == "expired")
                        })
                    });
                    kind = if expired {
                        "Claim:expired_stopped".into()
                    } else {
                        "Claim:given_back_stopped".into()
                    }
                }
                _ => {}
            }
            *kinds.entry(kind).or_default() += 1;
            history.push(format!("{batch} {call:?} -> {want:?}"));
            let mut diffs = Vec::new();
            // `append` and a claim answer with an entry id: translate the model's.
            let want_cmp = translate(&db, batch, &store, &log, &call, &want).await;
            if want_cmp != got {
                diffs.push(format!("reply: model {want_cmp:?}, redis {got:?}"));
            }
            // Each chunk assigned, with its answer (an AcceptTogether's are
            // between THENs, for the chunks asked).
            let answered: Vec<(&Call, &[String])> = match &call {
                Call::Accept { .. } => vec![(&call, &got[..])],
                Call::AcceptTogether(chunks) => {
                    chunks.iter().zip(got.split(|g| g == THEN)).collect()
                }
                _ => Vec::new(),
            };
            for (c, answer) in answered {
                let (Call::Accept { records, .. }, Some("assigned")) =
                    (c, answer.first().map(String::as_str))
                else {
                    continue;
                };
                let seen = given.entry(batch.clone()).or_default();
                let expected: Vec<String> = records
                    .chunks(5)
                    .enumerate()
                    .filter(|(_, r)| !seen.insert(r.to_vec()))
                    .map(|(k, _)| k.to_string())
                    .collect();
                copies += expected.len();
                if answer.get(4).map(String::as_str) != Some(expected.join(",").as_str()) {
                    diffs.push(format!(
                        "dedupe: copies at {:?}, the batch's numbers say {expected:?}",
                        answer.get(4)
                    ));
                }
            }
            let seen = read(&store, &log).await;
            diffs.extend(
                compare(&db, batch, &seen)
                    .into_iter()
                    .map(|d| format!("{batch}: {d}")),
            );
            steps += 1;
            if !diffs.is_empty() {
                let tail: Vec<&String> = history.iter().rev().take(12).rev().collect();
                panic!(
                    "seed {seed}, step {step}: the model and the scripts disagree\n{}\nlast calls:\n  {}",
                    diffs.join("\n"),
                    tail.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
                );
            }
        }
    }
    shout(&format!(
        "conformance: steps={steps} seeds={seed0}..{} calls={kinds:?} outcomes={outcomes:?} copies={copies} ends learned from refused chunks={learned} (contradicting a higher seq={contradicted}) ",
        seed0 + RUNS - 1
    ));
    // Every kind of decision was exercised, not only the easy ones.
    for k in [
        "Accept:assigned",
        "Accept:duplicate",
        "Accept:conflict",
        "Accept:rejected",
        "Accept:refused",
        "Reject:rejected",
        "Reject:refused",
        "Seal:sealed",
        "Seal:conflict",
        "Seal:ended",
        "Close:closed",
        "Close:reported",
        "Close:unknown",
        "Cancel:cancelled",
        "Cancel:reported",
        "Claim:claimed",
        "Claim:cancelled",
        "Claim:renewed",
        "Claim:free",
        "Claim:held",
        "Claim:given_back",
        "Claim:stale",
        "Claim:done",
        "Loaded:cancelled",
        "RecordGroup:cancelled",
        "RecordGroup:failed",
        "Park:failed",
        "Park:ended",
        "FailGeneration:failed",
        "FailGeneration:duplicate",
        "FailGeneration:group",
        "FailGeneration:ended",
        // (Its rarer paths: `every_send_give_up_decides_as_its_mirror`.)
        "GiveUpSend:unknown",
        "GiveUpSend:done",
        "GiveUpSend:stale",
        "Expire:expired",
        "Accept:behind",
        "Park:parked",
        "Park:group",
        "Park:unassigned",
        "RecordGroup:won",
        "RecordGroup:lost",
        "Loaded:loaded",
        "Loaded:duplicate",
        "Sent:recorded",
        "Sent:duplicate",
        "Sent:done",
        "Completed:completed",
        "Completed:reported",
        "Completed:duplicate",
        "Append:appended",
        "Append:duplicate",
    ] {
        assert!(kinds.get(k).is_some_and(|&n| n > 0), "no {k} in {kinds:?}");
    }
    assert!(
        learned > 0 && contradicted > 0,
        "no refused chunk taught its batch its end ({learned}), or none contradicted a higher seq ({contradicted})"
    );
    for o in ["completed", "partial", "failed", "cancelled"] {
        assert!(
            outcomes.get(o).is_some_and(|&n| n > 0),
            "no {o} report in {outcomes:?}"
        );
    }
    assert!(copies > 100, "only {copies} copies found by the dedupe");
    assert!(steps >= 10_000);
}

/// `close` on a batch whose highest seq is in the thousands (a large batch,
/// last seq unknown): the script reads the seqs in pages (one HMGET of them
/// all passed Lua's unpack limit and failed), and decides as its mirror.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_reads_thousands_of_seqs() {
    let server = common::redis();
    let p = BatchPolicy::default();
    let store = Store::connect(&server.url(), Keyspace::new("big", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(p);
    let batch = "many-seqs";
    let log = store.batch(batch);
    let mut db = Db::default();
    let calls = [
        Call::Accept {
            seq: 0,
            last: false,
            records: dedupe_records(["07000000001"]),
            digest: "d0".into(),
            opts: "|normal|".into(),
            hint: 0,
            claim: None,
        },
        Call::Reject {
            seq: 2500,
            digest: "bad".into(),
            reason: "invalid".into(),
            last: false,
        },
        Call::Accept {
            seq: 9999,
            last: false,
            records: dedupe_records(["07000000002"]),
            digest: "d9999".into(),
            opts: "|normal|".into(),
            hint: 0,
            claim: None,
        },
        Call::Close {
            reason: "operator".into(),
        },
    ];
    for call in &calls {
        let call = &with_claim(&db, batch, call);
        let want = model(&mut db, batch, &p, 10, call);
        let got = real(&store, &log, 10, call).await;
        assert_eq!(want, got, "{call:?}");
        let diffs = compare(&db, batch, &read(&store, &log).await);
        assert!(diffs.is_empty(), "{call:?}: {}", diffs.join("\n"));
    }
    // 0..9999, less the two assigned and the hole.
    assert_eq!(
        db.field(batch, "missing"),
        Some("9997"),
        "{:?}",
        db.field(batch, "missing")
    );
}

/// `close` on a batch holding seq 4,000,000,000 (a producer bug), and on
/// one with more gaps than a close lists: the script counts the gaps
/// between the seqs that arrived (never a loop up to the highest seq), keeps
/// the first ranges and the counts, prints counts past 2^31 as integers, and
/// decides as its mirror.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_counts_a_huge_gap_as_ranges() {
    let server = common::redis();
    let p = BatchPolicy::default();
    let store = Store::connect(&server.url(), Keyspace::new("gap", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(p);
    let accept = |seq: u32, last: bool| Call::Accept {
        seq,
        last,
        records: dedupe_records([format!("070{:08}", seq % 100_000_000).as_str()]),
        digest: format!("d{seq}"),
        opts: "|normal|".into(),
        hint: 0,
        claim: None,
    };
    let close = Call::Close {
        reason: "operator".into(),
    };
    let cases: [(&str, Vec<Call>); 2] = [
        (
            "huge",
            vec![
                accept(0, false),
                accept(1, false),
                Call::Reject {
                    seq: 7,
                    digest: "bad".into(),
                    reason: "invalid".into(),
                    last: false,
                },
                accept(4_000_000_000, true),
                close.clone(),
                close.clone(),
            ],
        ),
        // Every other seq of 0..=300: 150 gaps, 100 listed.
        (
            "sparse",
            (0..=150)
                .map(|i| accept(2 * i, i == 150))
                .chain([close.clone()])
                .collect(),
        ),
    ];
    // One shard: both batches' keys and the shard's queues, compared.
    let mut db = Db::default();
    for (batch, calls) in &cases {
        let log = store.batch(batch);
        for call in calls {
            let call = &with_claim(&db, batch, call);
            let want = model(&mut db, batch, &p, 10, call);
            let got = real(&store, &log, 10, call).await;
            assert_eq!(want, got, "{batch} {call:?}");
            let diffs = compare(&db, batch, &read(&store, &log).await);
            assert!(diffs.is_empty(), "{batch} {call:?}: {}", diffs.join("\n"));
        }
        let closed = db
            .batch(batch)
            .expect("recorded")
            .events
            .iter()
            .find_map(|r| match &r.event {
                Event::BatchClosed(e) => Some(e.clone()),
                _ => None,
            })
            .expect("a batch_closed");
        match *batch {
            "huge" => {
                // 2..=3,999,999,999 less the hole 7.
                assert_eq!(db.field(batch, "missing"), Some("3999999997"));
                assert_eq!(closed.missing_ranges, vec![[2, 6], [8, 3_999_999_999]]);
                assert_eq!(
                    (closed.missing_count, closed.missing_ranges_total),
                    (3_999_999_997, 2)
                );
            }
            _ => {
                assert_eq!(db.field(batch, "missing"), Some("150"));
                assert_eq!(closed.missing_ranges.len(), 100);
                assert_eq!(closed.missing_ranges[99], [199, 199]);
                assert_eq!(
                    (closed.missing_count, closed.missing_ranges_total),
                    (150, 150)
                );
            }
        }
    }
}

/// Runs `calls` through the model and the scripts on `batch`, comparing
/// every reply and everything the scripts touch after each call.
async fn replay_both(store: &Store, db: &mut Db, batch: &str, cap: u64, calls: &[Call]) {
    let log = store.batch(batch);
    let p = BatchPolicy::default();
    for call in calls {
        let mut call = with_claim(db, batch, call);
        set_claim_clock(&log, &mut call).await;
        let got = real(store, &log, cap, &call).await;
        set_model_clock(&mut call, &got);
        let want = model(db, batch, &p, cap, &call);
        let want = translate(db, batch, store, &log, &call, &want).await;
        let seen = read(store, &log).await;
        assert_eq!(want, got, "{batch}: {call:?}");
        let diffs = compare(db, batch, &seen);
        assert!(diffs.is_empty(), "{batch}: {call:?}: {}", diffs.join("\n"));
    }
}

/// `cancel` of a batch with more than a thousand generations (a cap of one
/// recipient): the script reads the generations in pages, stops every one
/// neither done nor claimed, deletes the groups of those that have one, and
/// decides as its mirror. Then a batch never seen (remembered: it reports at
/// once and its chunks are refused), and one reported whose events expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reads_thousands_of_generations_and_remembers_unseen_batches() {
    let server = common::redis();
    let store = Store::connect(&server.url(), Keyspace::new("cancel", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(BatchPolicy::default());
    let mut db = Db::default();
    let batch = "many-gens";
    let mut calls = Vec::new();
    for seq in 0..1100u32 {
        calls.push(Call::Accept {
            seq,
            last: false,
            records: dedupe_records([format!("0700{seq:07}").as_str()]),
            digest: format!("d{seq}"),
            opts: "|normal|".into(),
            hint: seq.saturating_sub(1),
            claim: None,
        });
    }
    for gen in [3u32, 700, 1098] {
        calls.push(Call::RecordGroup {
            gen,
            group: format!("G{gen}"),
        });
        calls.push(Call::Loaded(ChunkLoaded {
            gen,
            seq: gen,
            group_id: format!("G{gen}"),
            registered: 1,
            duplicates: 0,
            failed: Vec::new(),
            given_up: None,
        }));
    }
    // Generation 3 is claimed and sent (left alone); 700 claimed only.
    calls.push(claim(3));
    calls.push(claim(700));
    calls.push(Call::Sent {
        gen: 3,
        group: "G3".into(),
        outcome: "sent".into(),
        poll: b"poll|3".to_vec(),
    });
    calls.push(Call::Cancel {
        reason: "wrong campaign".into(),
    });
    calls.push(Call::Cancel {
        reason: "again".into(),
    });
    calls.push(claim(5));
    calls.push(claim(700));
    // The send claimed before the cancel goes out, and is recorded.
    calls.push(Call::Sent {
        gen: 700,
        group: "G700".into(),
        outcome: "sent".into(),
        poll: b"poll|700".to_vec(),
    });
    calls.push(Call::Completed {
        gen: 3,
        group: "G3".into(),
        status: "COMPLETE".into(),
        ss: 1,
        sf: 0,
    });
    calls.push(Call::Completed {
        gen: 700,
        group: "G700".into(),
        status: "COMPLETE".into(),
        ss: 1,
        sf: 0,
    });
    calls.push(Call::Cancel {
        reason: "after the report".into(),
    });
    replay_both(&store, &mut db, batch, 1, &calls).await;
    // 1100 generations, 3 and 700 claimed: 1098 stopped, the groups of 1098
    // (loaded) deleted; one registered recipient unsent.
    assert_eq!(db.field(batch, "stopped"), Some("1098"));
    assert_eq!(db.field(batch, "unsent"), Some("1"));
    assert_eq!(db.field(batch, "report"), Some("cancelled"));
    let deletes: Vec<u32> = db
        .work
        .iter()
        .filter(|w| w.op == "delete")
        .map(|w| w.item.gen)
        .collect();
    assert_eq!(deletes, vec![1098]);

    // Never seen: remembered, reported at once, its chunks refused.
    let unseen = "never-seen";
    replay_both(
        &store,
        &mut db,
        unseen,
        1,
        &[
            Call::Cancel {
                reason: "typo upstream".into(),
            },
            Call::Cancel {
                reason: "typo upstream".into(),
            },
            Call::Accept {
                seq: 0,
                last: true,
                records: dedupe_records(["07000000001"]),
                digest: "d0".into(),
                opts: "|normal|".into(),
                hint: 0,
                claim: None,
            },
            Call::Reject {
                seq: 1,
                digest: "bad".into(),
                reason: "invalid".into(),
                last: false,
            },
            Call::Expire,
            Call::Cancel {
                reason: "once more".into(),
            },
            Call::Accept {
                seq: 0,
                last: true,
                records: dedupe_records(["07000000001"]),
                digest: "d0".into(),
                opts: "|normal|".into(),
                hint: 0,
                claim: None,
            },
        ],
    )
    .await;
    assert!(db.reported.contains(unseen));
}

/// The records of each frame of a number log, in order.
fn frames_of(log: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < log.len() {
        let n = u32::from_be_bytes(log[at..at + 4].try_into().expect("4 bytes")) as usize;
        frames.push(&log[at + 4..at + 4 + 5 * n]);
        at += 4 + 5 * n + 16;
    }
    frames
}

/// The positions of `numbers` that `given` has, or an earlier one of
/// `numbers`: the copies the dedupe must name. `given` takes them all.
fn copies_in(numbers: &[String], given: &mut std::collections::HashSet<String>) -> Vec<u32> {
    numbers
        .iter()
        .enumerate()
        .filter(|(_, n)| !given.insert(n.to_string()))
        .map(|(k, _)| k as u32)
        .collect()
}

/// Two stores on `server` in keyspace `name`: two processes, each with
/// its own views of the number logs.
async fn two_processes(
    server: &groupcast_rigs::redis_server::RedisServer,
    name: &str,
) -> (Store, Store) {
    let connect = || async {
        Store::connect(&server.url(), Keyspace::new(name, 1))
            .await
            .expect("connect to the private redis-server")
    };
    (connect().await, connect().await)
}

/// A large batch whose chunks two processes accept in turn, each through
/// its own view of the number log (`BatchLog::accept_chunk`): past 100,000
/// mobile numbers a view keeps them in a bitmap; copies given before and
/// after, and within a chunk, are named exactly; each process reads on past
/// the other's frames (a `behind` when it raced it), and after the log lost
/// its last frame (as Redis can under `everysec`) the view that held it
/// reads the log again rather than trust it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_name_every_copy_of_a_large_batch() {
    let server = common::redis();
    let (one, two) = two_processes(&server, "large").await;
    let batch = "large";
    let logs = [one.batch(batch), two.batch(batch)];
    // Number i: mobile (spread over the range) four times in five, else 070.
    let number = |i: u64| {
        if i % 5 == 0 {
            format!("070{:08}", i)
        } else {
            format!("010{:08}", i * 7_919 % 100_000_000)
        }
    };
    let per_chunk = 5_000u64;
    let before = 150_000 / per_chunk;
    let mut chunks: Vec<Vec<String>> = (0..before)
        .map(|c| (c * per_chunk..(c + 1) * per_chunk).map(number).collect())
        .collect();
    // Half of chunk 0 again, half new; then one with copies of both, of
    // itself, and new numbers.
    let fresh = before * per_chunk;
    chunks.push(
        (0..2_500)
            .map(number)
            .chain((fresh..fresh + 2_500).map(number))
            .collect(),
    );
    chunks.push(
        (fresh..fresh + 1_000)
            .chain(50_000..51_000)
            .chain(fresh + 2_500..fresh + 4_000)
            .chain(fresh + 2_500..fresh + 3_000)
            .map(number)
            .collect(),
    );
    // One process two chunks in a row now and then, the other otherwise.
    let who = |seq: usize| (seq / 2 + seq) % 2;
    let mut given: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut copies = 0;
    let mut log_records = Vec::new();
    for (seq, numbers) in chunks.iter().enumerate() {
        let records = dedupe_records(numbers.iter().map(String::as_str));
        let args = AcceptArgs {
            seq: seq as u32,
            // None flagged last: the batch takes another chunk at the end.
            last: false,
            records: &records,
            digest: &format!("d{seq}"),
            cap: per_chunk,
            opts: "|normal|",
        };
        let log = &logs[who(seq)];
        let got = log.accept_chunk(&args, 0).await.expect("accept");
        let Accepted::Assigned { duplicates, .. } = got else {
            panic!("seq {seq}: {got:?}");
        };
        let expected = copies_in(numbers, &mut given);
        copies += expected.len();
        assert_eq!(duplicates, expected, "seq {seq}: copies");
        log_records.extend_from_slice(&records);
    }
    // 2,500 + 1,000 + 1,000 + 500 copies.
    assert_eq!(copies, 5_000);
    // The log holds every chunk's numbers, in order, a frame each.
    let mut conn = one.raw_conn();
    let key = &logs[0].keys.numbers;
    let log: Vec<u8> = conn.get(key).await.expect("GET");
    assert_eq!(frames_of(&log).concat(), log_records);

    // Redis loses the last frame (and the state its writes): the process
    // that appended it still holds it in its view.
    let last_frame = 4 + 5 * chunks[chunks.len() - 1].len() + 16;
    let kept = &log[..log.len() - last_frame];
    let state = &logs[0].keys.state;
    let _: () = conn.set(key, kept).await.expect("SET");
    let _: () = conn
        .hset_multiple(
            state,
            &[
                ("dlen", kept.len().to_string()),
                (
                    "dstamp",
                    String::from_utf8_lossy(&kept[kept.len() - 16..]).into_owned(),
                ),
            ],
        )
        .await
        .expect("HSET");
    // Another chunk of the same size with numbers of the lost one: they are
    // not copies any more (the lost chunk is accepted again later).
    let lost = &chunks[chunks.len() - 1];
    let records = dedupe_records(lost.iter().map(String::as_str));
    let args = AcceptArgs {
        seq: 999,
        last: false,
        records: &records,
        digest: "again",
        cap: per_chunk,
        opts: "|normal|",
    };
    let holder = &logs[who(chunks.len() - 1)];
    let got = holder.accept_chunk(&args, 0).await.expect("accept");
    let Accepted::Assigned { duplicates, .. } = got else {
        panic!("after the loss: {got:?}");
    };
    // Its copies are those the log still had, and its own repeats.
    let mut kept_numbers = given.clone();
    for n in lost {
        kept_numbers.remove(n);
    }
    for n in chunks[..chunks.len() - 1].iter().flatten() {
        kept_numbers.insert(n.clone());
    }
    let expected = copies_in(lost, &mut kept_numbers);
    assert_eq!(duplicates, expected, "copies after the loss");
}

/// Two processes, each accepting many chunks of one batch at once (the
/// chunks waiting for a process's view are asked together, in one round
/// trip, each claimed as if those before it were taken): every number is
/// new in exactly one chunk, and each chunk's copies are exactly those of
/// the chunks the log holds before it. The chunks overlap by half, so most
/// of a round's claims depend on the ones before them in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_accepted_together_by_two_processes_name_every_copy() {
    let server = common::redis();
    let (one, two) = two_processes(&server, "together").await;
    let batch = "together";
    let logs = [one.batch(batch), two.batch(batch)];
    let (chunks, per_chunk) = (40u32, 1_000u64);
    // Chunk c: numbers c·500 .. c·500 + 1,000 (half the next chunk's), a
    // few of its own twice.
    let numbers = move |c: u32| -> Vec<String> {
        let from = u64::from(c) * per_chunk / 2;
        (from..from + per_chunk)
            .chain(from..from + 3)
            .map(|i| format!("010{:08}", i * 7_919 % 100_000_000))
            .collect()
    };
    let mut tasks = Vec::new();
    for seq in 0..chunks {
        let log = logs[seq as usize % 2].clone();
        tasks.push(tokio::spawn(async move {
            let records = dedupe_records(numbers(seq).iter().map(String::as_str));
            let args = AcceptArgs {
                seq,
                last: false,
                records: &records,
                digest: &format!("d{seq}"),
                cap: 1_000_000,
                opts: "|normal|",
            };
            (seq, log.accept_chunk(&args, 0).await)
        }));
    }
    let mut copies_of: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for t in tasks {
        let (seq, got) = t.await.expect("task");
        let Ok(Accepted::Assigned { duplicates, .. }) = got else {
            panic!("seq {seq}: {got:?}");
        };
        copies_of.insert(seq, duplicates);
    }
    // The log's frames, in order, each matched to its chunk by its numbers.
    let mut conn = one.raw_conn();
    let log: Vec<u8> = conn.get(&logs[0].keys.numbers).await.expect("GET");
    let by_records: BTreeMap<Vec<u8>, u32> = (0..chunks)
        .map(|c| (dedupe_records(numbers(c).iter().map(String::as_str)), c))
        .collect();
    let order: Vec<u32> = frames_of(&log)
        .into_iter()
        .map(|f| *by_records.get(f).expect("a frame is a chunk's"))
        .collect();
    assert_eq!(order.len(), chunks as usize, "one frame a chunk: {order:?}");
    let mut given = std::collections::HashSet::new();
    for seq in &order {
        let expected = copies_in(&numbers(*seq), &mut given);
        assert_eq!(copies_of[seq], expected, "seq {seq}: copies");
    }
    let all: std::collections::HashSet<String> = (0..chunks).flat_map(numbers).collect();
    assert_eq!(given, all, "every number is new in exactly one chunk");
    // Asked together: fewer calls of accept.lua than chunks (one a round,
    // and one more after each race with the other process).
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let calls = calls_of(&stats, "evalsha");
    assert!(
        (1..chunks / 2).contains(&calls),
        "{calls} calls of accept.lua for {chunks} chunks"
    );
    // And each call reads the batch's state once and writes it at most
    // once, however many chunks it carries.
    let (reads, writes) = (calls_of(&stats, "hmget"), calls_of(&stats, "hset"));
    assert!(
        reads <= calls && writes <= calls,
        "{reads} HMGET and {writes} HSET for {calls} calls of accept.lua"
    );
}

/// How many times `command` ran, from an `INFO commandstats` answer.
fn calls_of(stats: &str, command: &str) -> u32 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The idempotency keys of a batch's events in the model, in order.
fn event_keys<'a>(db: &'a Db, batch: &str) -> Vec<&'a str> {
    let events = db.batch(batch).map_or(&[][..], |b| b.events.as_slice());
    events.iter().map(|e| e.key.as_str()).collect()
}

/// A claim in place at a cancel lives no longer than it was given: a
/// renewal after the cancel keeps its end (a long lifetime asked, the
/// recorded end answered), and a call past the end gives the claim back
/// (`expired`) and stops the generation, where it used to renew it and
/// send. (Lifetime 0: the claim ends at the instant it is taken, so the
/// next call, at that instant or later, finds it over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_past_its_end_after_a_cancel_stops_its_generation() {
    let server = common::redis();
    let store = Store::connect(&server.url(), Keyspace::new("claims", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(BatchPolicy::default());
    let lasting = |gen, lifetime_ms| Call::Claim {
        gen,
        mode: ClaimMode::Claim,
        lifetime_ms,
        sched: Sched::None,
        at: 0,
        now: 0,
    };
    let cancel = Call::Cancel {
        reason: "wrong campaign".into(),
    };
    // Renewed after the cancel: never past the end given before it.
    let mut db = Db::default();
    let calls = [
        ready_generation("d0"),
        vec![lasting(0, 60_000), cancel.clone(), lasting(0, 3_600_000)],
    ]
    .concat();
    replay_both(&store, &mut db, "renewed", 10, &calls).await;
    let after = (store.batch("renewed").server_time_ms().await).expect("the Redis clock");
    let until = |db: &Db, b| db.field(b, "g:0:until").and_then(|v| v.parse::<u64>().ok());
    let granted = until(&db, "renewed").expect("the claim's end recorded");
    assert!(
        granted <= after + 60_000,
        "renewed after the cancel: its end {granted} is past the minute given before it (now {after})"
    );
    assert_eq!(
        db.field("renewed", "report"),
        None,
        "a claim in place: nothing reported yet"
    );
    // Past its end after the cancel: given back, the generation stopped
    // (another key space: the first batch's work stays in its own).
    let store = Store::connect(&server.url(), Keyspace::new("claims-expired", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(BatchPolicy::default());
    let mut db = Db::default();
    let calls = [
        ready_generation("d0"),
        vec![lasting(0, 0), cancel, lasting(0, 60_000)],
    ]
    .concat();
    replay_both(&store, &mut db, "expired", 10, &calls).await;
    let kinds = event_keys(&db, "expired");
    assert_eq!(
        kinds,
        [
            "assign/0",
            "create/0",
            "close/0",
            "group/0",
            "loaded/0/0",
            "ready/0",
            "claim/0",
            "cancelled",
            "back/0/1",
            "done/0",
            "report",
        ],
        "{kinds:?}"
    );
    assert_eq!(db.field("expired", "report"), Some("cancelled"));
    assert_eq!(db.field("expired", "stopped"), Some("1"));
    let back = (db.batch("expired").expect("the batch").events.iter())
        .find(|e| e.key == "back/0/1")
        .map(|e| e.event.clone());
    match back {
        Some(Event::ClaimGivenBack(b)) => {
            assert_eq!((b.reason.as_str(), b.stopped), ("expired", true), "{b:?}");
            assert_eq!(
                Some(b.at_ms),
                until(&db, "expired"),
                "given back at the claim's end"
            );
        }
        other => panic!("claim_given_back expected, got {other:?}"),
    }
}

/// A claim's lifetime, step by step, on one generation (each step compared
/// with the script): taken, renewed, a check inside quiet hours leaves it in
/// place (it comes before the provider's status is read), a claim inside
/// them gives it back, taken again (claim 2), the batch cancelled while it is in place
/// (left alone), then a retry finds quiet hours: the claim is given back
/// and the generation stopped there, and the batch reports `cancelled`
/// with nothing sent. (The random walk above reaches every decision but
/// this last one, which needs a cancel between two claims.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_given_back_after_a_cancel_stops_its_generation() {
    let server = common::redis();
    let store = Store::connect(&server.url(), Keyspace::new("claims", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(BatchPolicy::default());
    let mut db = Db::default();
    let batch = "held";
    let held = |mode| Call::Claim {
        gen: 0,
        mode,
        lifetime_ms: 5_000,
        sched: Sched::QuietNow,
        at: 0,
        now: 0,
    };
    let calls = [
        ready_generation("d0"),
        vec![
            claim(0),
            claim(0),
            held(ClaimMode::Check),
            held(ClaimMode::Claim),
            claim(0),
            Call::Cancel {
                reason: "wrong campaign".into(),
            },
            held(ClaimMode::Claim),
            claim(0),
        ],
    ]
    .concat();
    replay_both(&store, &mut db, batch, 10, &calls).await;
    let kinds = event_keys(&db, batch);
    assert_eq!(
        kinds,
        [
            "assign/0",
            "create/0",
            "close/0",
            "group/0",
            "loaded/0/0",
            "ready/0",
            "claim/0",
            "schedule/0",
            "back/0/1",
            "claim/0/2",
            "cancelled",
            "back/0/2",
            "done/0",
            "report",
        ],
        "{kinds:?}"
    );
    assert_eq!(db.field(batch, "stopped"), Some("1"));
    assert_eq!(db.field(batch, "unsent"), Some("2"));
    assert_eq!(db.field(batch, "report"), Some("cancelled"));
    let deletes: Vec<u32> = db
        .work
        .iter()
        .filter(|w| w.op == "delete")
        .map(|w| w.item.gen)
        .collect();
    assert_eq!(deletes, vec![0]);
}

/// A batch of one chunk (two recipients), its generation `G0` loaded and
/// ready: the start of the scripted sequences below.
fn ready_generation(digest: &str) -> Vec<Call> {
    vec![
        Call::Accept {
            seq: 0,
            last: true,
            records: dedupe_records(["07000000001", "07000000002"]),
            digest: digest.into(),
            opts: "|normal|".into(),
            hint: 0,
            claim: None,
        },
        Call::RecordGroup {
            gen: 0,
            group: "G0".into(),
        },
        Call::Loaded(ChunkLoaded {
            gen: 0,
            seq: 0,
            group_id: "G0".into(),
            registered: 2,
            duplicates: 0,
            failed: Vec::new(),
            given_up: None,
        }),
    ]
}

/// Every path of `give_up_send`, scripted (the random walk above reaches
/// them only now and then: a generation is ready and not yet sent for a
/// short while), each call decided alike by the script and its mirror: a
/// send given up with no claim (unsent at once, its group deleted); under a
/// claim (recalling; no claim taken after; the recall's findings: deleted,
/// or sent and then its poll given up, or the recall given up), with a
/// cancel meanwhile; and items resting on facts not recorded (stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_send_give_up_decides_as_its_mirror() {
    let server = common::redis();
    let store = Store::connect(&server.url(), Keyspace::new("giveup", 1))
        .await
        .expect("connect to the private redis-server")
        .with_policy(BatchPolicy::default());
    let mut db = Db::default();
    let give_up = |what| Call::GiveUpSend {
        gen: 0,
        what,
        group: "G0".into(),
    };
    let sent = Call::Sent {
        gen: 0,
        group: "G0".into(),
        outcome: "sent_before_give_up".into(),
        poll: b"poll|0".to_vec(),
    };
    let cancel = Call::Cancel {
        reason: "wrong campaign".into(),
    };
    use GivenUp::*;
    let scripts: Vec<(&str, Vec<Call>, &str, &str)> = vec![
        // Stale items first, then no claim: unsent at once.
        (
            "no-claim",
            [
                vec![give_up(Send), give_up(Poll), give_up(Unsent)],
                ready_generation("d1"),
                vec![give_up(Send), give_up(Send), claim(0)],
            ]
            .concat(),
            "unsent",
            "failed",
        ),
        // Under a claim: recalling, no claim after, then deleted.
        (
            "recalled",
            [
                ready_generation("d2"),
                vec![claim(0), give_up(Send), give_up(Send), claim(0)],
                vec![give_up(Unsent), give_up(Recall)],
            ]
            .concat(),
            "unsent",
            "failed",
        ),
        // Found sent: polled; the poll given up.
        (
            "found-sent",
            [
                ready_generation("d3"),
                vec![claim(0), give_up(Send), sent, give_up(Send), give_up(Poll)],
            ]
            .concat(),
            "unknown",
            "partial",
        ),
        // A cancel while recalling; the recall given up.
        (
            "cancelled",
            [
                ready_generation("d4"),
                vec![claim(0), give_up(Send), cancel, give_up(Recall)],
            ]
            .concat(),
            "unknown",
            "cancelled",
        ),
    ];
    for (batch, calls, done, report) in scripts {
        replay_both(&store, &mut db, batch, 10, &calls).await;
        assert_eq!(db.field(batch, "g:0:done"), Some(done), "{batch}");
        assert_eq!(db.field(batch, "report"), Some(report), "{batch}");
    }
    assert_eq!(db.field("no-claim", "unsent"), Some("2"));
    assert_eq!(db.field("recalled", "unsent"), Some("2"));
    assert_eq!(db.field("found-sent", "unknown"), Some("2"));
    let work = |op: &str| -> Vec<&str> {
        (db.work.iter())
            .filter(|w| w.op == op)
            .map(|w| w.item.batch.as_str())
            .collect()
    };
    // The group of a send given up with no claim is deleted; a recall is
    // asked for each send given up under its claim, once.
    assert_eq!(work("delete"), vec!["no-claim"]);
    assert_eq!(work("recall"), vec!["recalled", "found-sent", "cancelled"]);
}
