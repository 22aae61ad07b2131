//! `accept.lua`: accept a chunk and assign it to a generation, in one step;
//! a number gets the batch's message at most once (the batch-wide dedupe).

use super::numbers::{self, RECORD};
use super::settle::{make_ready, reject, settled, tombstoned};
use super::{tonumber, BatchPolicy, Run};
use crate::events::{ChunkAssigned, Event, GenerationClosed, GroupRequested};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// The arguments of `accept.lua` (the generation hint only saves a read, so
/// it is not one here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptArgs<'a> {
    /// The chunk's seq.
    pub seq: u32,
    /// Whether it is flagged last.
    pub last: bool,
    /// Its recipients' numbers as dedupe records, in chunk order
    /// ([`crate::store::batch::dedupe_records`]): the count is their number.
    pub records: &'a [u8],
    /// Its content digest.
    pub digest: &'a str,
    /// The provider's group cap.
    pub cap: u64,
    /// The batch options, canonical ([`crate::events::options::SendWindow::canonical`]).
    pub opts: &'a str,
}

/// What the caller found in its view of the batch's number log
/// ([`numbers::View`]): the copies in the chunk, and where the view ends.
/// `accept.lua` takes them only if the log still ends there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupeClaim {
    /// The view's length: the log's bytes it read.
    pub seen: u64,
    /// The stamp of the view's last frame ("" before any).
    pub stamp: String,
    /// The positions of the chunk's numbers the view has, or that an
    /// earlier number of the chunk repeats.
    pub duplicates: Vec<u32>,
    /// The chunk's frame for the log, with a new stamp.
    pub frame: Vec<u8>,
}

impl DedupeClaim {
    /// The claim for `records` (a chunk's, in order) by `view`, its frame
    /// stamped afresh.
    pub fn by(view: &numbers::View, records: &[u8]) -> DedupeClaim {
        DedupeClaim::stamped(view, records, &numbers::new_stamp())
    }

    /// [`DedupeClaim::by`] with the frame stamped `stamp` (16 hex digits,
    /// never used before on this log: the model checker's are its length).
    pub fn stamped(view: &numbers::View, records: &[u8], stamp: &str) -> DedupeClaim {
        DedupeClaim {
            seen: view.len(),
            stamp: view.stamp().to_string(),
            duplicates: view.duplicates(records),
            frame: numbers::frame(records, stamp),
        }
    }

    /// The claims for several chunks of a batch (`chunks`, each its
    /// records in order) to be asked in this order: each as if those before
    /// it were appended, so that each holds only if every one before it
    /// was taken ([`View::chain_duplicates`](numbers::View::chain_duplicates)).
    pub fn chain(view: &numbers::View, chunks: &[&[u8]]) -> Vec<DedupeClaim> {
        let mut seen = view.len();
        let mut stamp = view.stamp().to_string();
        view.chain_duplicates(chunks)
            .into_iter()
            .zip(chunks)
            .map(|(duplicates, records)| {
                let next = numbers::new_stamp();
                let claim = DedupeClaim {
                    seen,
                    stamp: std::mem::replace(&mut stamp, next.clone()),
                    duplicates,
                    frame: numbers::frame(records, &next),
                };
                seen += claim.frame.len() as u64;
                claim
            })
            .collect()
    }

    /// The claim for `records` by a view of the whole log (`log`): one that
    /// `accept` takes.
    pub fn current(log: &[u8], records: &[u8]) -> DedupeClaim {
        DedupeClaim::current_stamped(log, records, &numbers::new_stamp())
    }

    /// [`DedupeClaim::current`] with the frame stamped `stamp`.
    pub fn current_stamped(log: &[u8], records: &[u8], stamp: &str) -> DedupeClaim {
        let mut view = numbers::View::default();
        // A log the mirror wrote is whole frames; a malformed one only makes
        // the claim stale, which `accept` answers with `behind`.
        let _ = view.extend(log);
        DedupeClaim::stamped(&view, records, stamp)
    }

    /// `positions`: the duplicates as `accept.lua` gets them, `1,7`.
    pub fn positions(&self) -> String {
        self.duplicates
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The dedupe step: whether the claim is on the log's end (then its frame is
/// appended, and the state says where the log ends now). Returns the
/// copies' positions and the chunk's new recipients, or None: `behind`.
fn dedupe(r: &mut Run, count: i64, claim: &DedupeClaim) -> Option<(Vec<u32>, i64)> {
    let len = r.num(field::NUMBERS_LEN);
    let stamp = r.get(field::NUMBERS_STAMP).unwrap_or_default();
    if claim.seen as i64 != len || claim.stamp != stamp {
        return None;
    }
    r.b().numbers.extend_from_slice(&claim.frame);
    r.put(field::NUMBERS_LEN, len + claim.frame.len() as i64);
    let new_stamp = &claim.frame[claim.frame.len() - numbers::STAMP..];
    r.put(
        field::NUMBERS_STAMP,
        String::from_utf8_lossy(new_stamp).into_owned(),
    );
    Some((
        claim.duplicates.clone(),
        count - claim.duplicates.len() as i64,
    ))
}

/// `accept.lua`. Returns its reply: `assigned|duplicate, gen, group or '',
/// loaded 0|1, duplicate positions` or `conflict|rejected|refused, reason`
/// or `behind, the log's length` (the claim is not on the log's end).
pub fn accept(
    db: &mut super::Db,
    batch: &str,
    policy: &BatchPolicy,
    a: &AcceptArgs,
    claim: &DedupeClaim,
) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let ends = Ends::read(&r);
    if let Some(s) = r.get(&field::assignment(a.seq)) {
        return accept_again(&mut r, policy, a, &s, &ends);
    }
    if let Some(why) = ended_refusal(&r, &ends) {
        return refused(&r, &why);
    }
    let seen = Seen::read(&r, a.seq);
    match admission(a, &seen) {
        Admission::Admitted => {}
        Admission::Refused(why) => return refused(&r, &why),
        Admission::Rejected {
            kind,
            why,
            may_hole,
        } => return rejected(&mut r, policy, a, kind, why, may_hole),
    }
    let count = (a.records.len() / RECORD) as i64;
    let Some((dups, count)) = dedupe(&mut r, count, claim) else {
        return vec!["behind".into(), r.num(field::NUMBERS_LEN).to_string()];
    };
    let open = generation_for(&mut r, count, a.cap as i64);
    assign(&mut r, a, &seen, open, dups, count)
}

/// The reply `refused` (nothing recorded): the batch has ended or takes no
/// more chunks.
fn refused(r: &Run, why: &str) -> Vec<String> {
    vec!["refused".to_string(), format!("batch {} {why}", r.batch)]
}

/// The reply `rejected` or `conflict` (`kind`), recorded as input_rejected;
/// `may_hole`: the seq may be a hole from now on.
fn rejected(
    r: &mut Run,
    policy: &BatchPolicy,
    a: &AcceptArgs,
    kind: &str,
    why: String,
    may_hole: bool,
) -> Vec<String> {
    reject(
        r,
        policy,
        a.seq,
        a.digest,
        &why,
        may_hole,
        may_hole && a.last,
    );
    vec![kind.to_string(), why]
}

/// The marks of a batch that has ended: reported, closed or cancelled
/// (each with its reason).
struct Ends {
    report: Option<String>,
    closed: Option<String>,
    cancelled: Option<String>,
}

impl Ends {
    /// The marks, from the state.
    fn read(r: &Run) -> Ends {
        Ends {
            report: r.get(field::REPORT),
            closed: r.get(field::CLOSED),
            cancelled: r.get(field::CANCELLED),
        }
    }

    /// Whether the batch has ended in any way.
    fn any(&self) -> bool {
        self.report.is_some() || self.closed.is_some() || self.cancelled.is_some()
    }
}

/// A seq the batch already has (`s`: its `gen|count|digest`) comes again.
fn accept_again(
    r: &mut Run,
    policy: &BatchPolicy,
    a: &AcceptArgs,
    s: &str,
    ends: &Ends,
) -> Vec<String> {
    let seq = a.seq;
    // A repeat delivery: same content is a no-op, other content a conflict.
    let mut it = s.splitn(3, '|');
    let g = it.next().unwrap_or_default().to_string();
    let d = it.nth(1).unwrap_or_default().to_string();
    if d == a.digest {
        let group = r
            .get(&field::gen(&g, generation::GROUP))
            .unwrap_or_default();
        let loaded = r.get(&field::key(&event_key::loaded(&g, seq))).is_some();
        if let (Some(c), false) = (&ends.cancelled, loaded) {
            // Cancelled before it was loaded: it never will be.
            return refused(
                r,
                &format!("was cancelled ({c}): seq {seq} will not be loaded"),
            );
        }
        let positions = r.get(&field::duplicates_in(seq)).unwrap_or_default();
        return vec![
            "duplicate".into(),
            g,
            group,
            if loaded { "1" } else { "0" }.into(),
            positions,
        ];
    }
    if ends.any() {
        return refused(
            r,
            &format!("has ended: seq {seq} came again with other content"),
        );
    }
    let why = format!(
        "seq {seq} was already accepted with other content (digest {d}, this one {})",
        a.digest
    );
    rejected(r, policy, a, "conflict", why, false)
}

/// Why a batch that has ended takes no new seq, if it has.
fn ended_refusal(r: &Run, ends: &Ends) -> Option<String> {
    if let Some(o) = &ends.report {
        return Some(format!(
            "was already reported ({o}): it takes no more chunks"
        ));
    }
    if let Some(c) = &ends.cancelled {
        return Some(format!("was cancelled ({c}): it takes no more chunks"));
    }
    if let Some(c) = &ends.closed {
        return Some(format!("was closed ({c}): it takes no more chunks"));
    }
    let nothing = r.get(field::SEQS).is_none()
        && r.get(field::HOLES).is_none()
        && r.get(field::REJECTED).is_none();
    if tombstoned(r, nothing) {
        return Some(
            "was already reported (its events have expired): it takes no more chunks".into(),
        );
    }
    None
}

/// What the batch's state says about the seqs it has seen, as a new seq
/// reads it.
struct Seen {
    /// The seq flagged last, if one was.
    last: Option<i64>,
    /// The highest seq accepted.
    max: Option<i64>,
    /// The highest seq received (rejected ones too).
    rmax: Option<i64>,
    /// Seqs assigned.
    seqs: i64,
    /// Seqs refused for good (holes).
    holes: i64,
    /// Whether this seq is one of the holes.
    was_hole: bool,
    /// Recipients the batch already had, counted over its chunks.
    duplicates: i64,
    /// Recipients given to the batch.
    recipients: i64,
    /// The batch options, once a chunk set them.
    opts: Option<String>,
}

impl Seen {
    /// The state, as seq `seq` reads it.
    fn read(r: &Run, seq: u32) -> Seen {
        Seen {
            last: tonumber(r.get(field::LAST).as_deref()),
            max: tonumber(r.get(field::MAX).as_deref()),
            rmax: tonumber(r.get(field::REFUSED_MAX).as_deref()),
            seqs: r.num(field::SEQS),
            holes: r.num(field::HOLES),
            was_hole: r.get(&field::hole(seq)).as_deref() == Some("1"),
            duplicates: r.num(field::DUPLICATES),
            recipients: r.num(field::RECIPIENTS),
            opts: r.get(field::OPTIONS),
        }
    }
}

/// What `accept` decides about a seq new to a batch that has not ended.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// It goes on to the dedupe and a generation.
    Admitted,
    /// Refused, nothing recorded.
    Refused(String),
    /// Recorded as input_rejected, replied as `kind`.
    Rejected {
        kind: &'static str,
        why: String,
        may_hole: bool,
    },
}

/// Whether a new seq is admitted, given what the batch has seen.
fn admission(a: &AcceptArgs, seen: &Seen) -> Admission {
    let seq = i64::from(a.seq);
    let count = (a.records.len() / RECORD) as i64;
    let cap = a.cap as i64;
    let rejected = |kind, why, may_hole| Admission::Rejected {
        kind,
        why,
        may_hole,
    };
    if let Some(l) = seen.last.filter(|&l| seq > l) {
        return rejected(
            "rejected",
            format!("seq {seq} is beyond the last seq {l}"),
            false,
        );
    }
    if settled(false, seen.last, seen.seqs, seen.holes) {
        // Every seq 0..last is assigned or a hole: this one was refused before.
        return Admission::Refused(format!(
            "went on without seq {seq} (refused earlier): it takes no more chunks"
        ));
    }
    if let Some(l) = seen.last.filter(|&l| a.last && l != seq) {
        return rejected(
            "rejected",
            format!("seq {seq} is flagged last, but seq {l} already was"),
            true,
        );
    }
    if let Some(m) = seen.max.filter(|&m| a.last && m > seq) {
        return rejected(
            "rejected",
            format!("seq {seq} is flagged last, but seq {m} was already accepted"),
            true,
        );
    }
    if let Some(m) = seen.rmax.filter(|&m| a.last && m > seq) {
        return rejected(
            "rejected",
            format!("seq {seq} is flagged last, but seq {m} was already received"),
            true,
        );
    }
    if count > cap {
        return rejected(
            "rejected",
            format!("chunk has {count} recipients, more than the group cap {cap}"),
            true,
        );
    }
    if let Some(o) = seen.opts.as_deref().filter(|o| *o != a.opts) {
        return rejected(
            "conflict",
            format!(
                "seq {seq} has the batch options {}, but the batch has {o}",
                a.opts
            ),
            true,
        );
    }
    Admission::Admitted
}

/// The generation a chunk is assigned to, with its counters before it.
struct Open {
    gen: i64,
    /// Recipients approved.
    n: i64,
    /// Chunks approved.
    c: i64,
    /// Its provider group, once created.
    group: Option<String>,
    /// Whether its group was asked for (`k:create/<gen>`).
    requested: bool,
}

/// A field of generation `gen` in the state: `g:<gen>:<f>`.
fn gk(gen: i64, f: &str) -> String {
    field::gen(gen, f)
}

/// The generation a chunk of `count` new recipients goes to: the current
/// one, or the next when the current one is closed or would pass the cap
/// (closing it as full if it was not).
fn generation_for(r: &mut Run, count: i64, cap: i64) -> Open {
    let gen = r.num(field::GENERATION);
    let (n, c, l) = (
        r.num(&gk(gen, generation::RECIPIENTS)),
        r.num(&gk(gen, generation::CHUNKS)),
        r.num(&gk(gen, generation::LOADED)),
    );
    let group = r.get(&gk(gen, generation::GROUP));
    let gen_closed = r.get(&gk(gen, generation::CLOSED)).is_some();
    let reg = r.num(&gk(gen, generation::REGISTERED));
    let requested = r.get(&field::key(&event_key::create(gen))).is_some();

    // Approving this chunk would pass the cap (or the generation takes no
    // more): this script is the one closer. Approval counters are never given back.
    if gen_closed || (n > 0 && n + count > cap) {
        if !gen_closed {
            close_generation(r, gen, "full", c, n);
            if l == c {
                make_ready(r, gen as u32, c as u32, reg);
            }
        }
        return Open {
            gen: gen + 1,
            n: 0,
            c: 0,
            group: None,
            requested: false,
        };
    }
    Open {
        gen,
        n,
        c,
        group,
        requested,
    }
}

/// Closes generation `gen` for `reason` (`full` or `final`), with its
/// `chunks` and `recipients` approved.
fn close_generation(r: &mut Run, gen: i64, reason: &str, chunks: i64, recipients: i64) {
    r.emit(
        &event_key::close(gen),
        Event::GenerationClosed(GenerationClosed {
            gen: gen as u32,
            reason: reason.into(),
            chunks: chunks as u32,
            recipients: recipients as u32,
        }),
        true,
    );
    r.put(gk(gen, generation::CLOSED), reason);
}

/// Assigns the chunk to generation `open` with its `count` new recipients
/// (`dups`: the positions of the others): records it, closes the
/// generation when it is the final one, and replies `assigned`.
fn assign(
    r: &mut Run,
    a: &AcceptArgs,
    seen: &Seen,
    open: Open,
    dups: Vec<u32>,
    count: i64,
) -> Vec<String> {
    let seq = i64::from(a.seq);
    let Open {
        gen,
        n,
        c,
        group,
        requested,
    } = open;
    let (n, c, seqs, recipients) = (n + count, c + 1, seen.seqs + 1, seen.recipients + count);
    let mut holes = seen.holes;
    let positions = dups
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if !dups.is_empty() {
        r.put(field::duplicates_in(seq), &positions);
        r.put(field::DUPLICATES, seen.duplicates + dups.len() as i64);
    }
    if seen.was_hole {
        // A corrected copy of a seq refused earlier: no longer a hole.
        r.put(field::hole(seq), 0);
        holes -= 1;
        r.put(field::HOLES, holes);
    }
    let assigned_id = r.emit(
        &event_key::assign(seq),
        Event::ChunkAssigned(ChunkAssigned {
            seq: a.seq,
            gen: gen as u32,
            count: count as u32,
            last: a.last,
            digest: a.digest.to_string(),
            duplicates: dups,
            opts: seen.opts.is_none().then(|| a.opts.to_string()),
        }),
        true,
    );
    if group.is_none() && !requested && count > 0 {
        // The generation's first chunk with numbers to add asks for its
        // group now, so that it can wait for it in its worker rather than park.
        r.emit(
            &event_key::create(gen),
            Event::GroupRequested(GroupRequested { gen: gen as u32 }),
            true,
        );
        let item = super::work_item(&r.batch, gen as u32, None, None);
        r.db.add_work("create", item, None);
    }
    r.put(
        field::assignment(seq),
        format!("{gen}|{count}|{}", a.digest),
    );
    if seen.opts.is_none() {
        r.put(field::OPTIONS, a.opts);
    }
    r.put(gk(gen, generation::RECIPIENTS), n);
    r.put(gk(gen, generation::CHUNKS), c);
    r.put(field::GENERATION, gen);
    r.put(field::SEQS, seqs);
    r.put(field::RECIPIENTS, recipients);
    if seen.max.is_none_or(|m| seq > m) {
        r.put(field::MAX, seq);
    }
    let mut last = seen.last;
    if a.last {
        r.put(field::LAST, seq);
        last = Some(seq);
    }
    if seqs == 1 {
        // The batch's first chunk: it is in flight from now (t0) on.
        r.put(field::FIRST_ACCEPTED, assigned_id);
        let b = r.batch.clone();
        r.db.active.insert(b);
    }
    // Every seq 0..last is assigned (or a hole): this generation is the final one.
    if settled(false, last, seqs, holes) {
        close_generation(r, gen, "final", c, n);
    }
    r.flush();
    vec![
        "assigned".into(),
        gen.to_string(),
        group.unwrap_or_default(),
        "0".into(),
        positions,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> Seen {
        Seen {
            last: None,
            max: None,
            rmax: None,
            seqs: 0,
            holes: 0,
            was_hole: false,
            duplicates: 0,
            recipients: 0,
            opts: None,
        }
    }

    #[test]
    fn a_new_seq_is_admitted_unless_the_batch_says_otherwise() {
        let records = [0u8; 2 * RECORD];
        let a = AcceptArgs {
            seq: 3,
            last: true,
            records: &records,
            digest: "d",
            cap: 2,
            opts: "0|0|0",
        };
        assert_eq!(admission(&a, &seen()), Admission::Admitted);
        let beyond = Seen {
            last: Some(2),
            ..seen()
        };
        assert!(matches!(
            admission(&a, &beyond),
            Admission::Rejected {
                kind: "rejected",
                may_hole: false,
                ..
            }
        ));
        let done = Seen {
            last: Some(3),
            seqs: 4,
            ..seen()
        };
        assert!(matches!(admission(&a, &done), Admission::Refused(_)));
        let other = Seen {
            opts: Some("1|0|0".into()),
            ..seen()
        };
        assert!(matches!(
            admission(&a, &other),
            Admission::Rejected {
                kind: "conflict",
                may_hole: true,
                ..
            }
        ));
        let small = AcceptArgs { cap: 1, ..a };
        assert!(matches!(
            admission(&small, &seen()),
            Admission::Rejected {
                kind: "rejected",
                may_hole: true,
                ..
            }
        ));
    }
}
