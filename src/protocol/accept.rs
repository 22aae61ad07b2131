//! `accept.lua`: accept a chunk and assign it to a generation, in one step.

use super::{reply, Run};
use crate::events::{ChunkAssigned, Event, GenerationClosed};

/// The arguments of `accept.lua` (the generation hint only saves a read, so
/// it is not one here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptArgs<'a> {
    /// The chunk's seq.
    pub seq: u32,
    /// Whether it is flagged last.
    pub last: bool,
    /// Its recipients.
    pub count: u32,
    /// Its content digest.
    pub digest: &'a str,
    /// The provider's group cap.
    pub cap: u64,
}

/// `accept.lua`. Returns its reply:
/// `assigned|duplicate, gen, group or '', loaded 0|1` or `conflict|rejected, reason`.
pub fn accept(db: &mut super::Db, batch: &str, a: &AcceptArgs) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let seq = i64::from(a.seq);
    let (count, cap) = (i64::from(a.count), a.cap as i64);
    if let Some(s) = r.get(&format!("s:{seq}")) {
        // A repeat delivery: same content is a no-op, other content a conflict.
        let mut it = s.splitn(3, '|');
        let g = it.next().unwrap_or_default().to_string();
        let d = it.nth(1).unwrap_or_default().to_string();
        if d != a.digest {
            return vec![
                "conflict".into(),
                format!(
                    "seq {seq} was already accepted with other content (digest {d}, this one {})",
                    a.digest
                ),
            ];
        }
        let group = r.get(&format!("g:{g}:group")).unwrap_or_default();
        let loaded = r.get(&format!("k:loaded/{g}/{seq}")).is_some();
        return vec![
            "duplicate".into(),
            g,
            group,
            if loaded { "1" } else { "0" }.into(),
        ];
    }
    let last = r.get("last").and_then(|v| v.parse::<i64>().ok());
    let max = r.get("max").and_then(|v| v.parse::<i64>().ok());
    if let Some(l) = last.filter(|&l| seq > l) {
        return vec![
            "rejected".into(),
            format!("seq {seq} is beyond the last seq {l}"),
        ];
    }
    if let Some(l) = last.filter(|&l| a.last && l != seq) {
        return vec![
            "rejected".into(),
            format!("seq {seq} is flagged last, but seq {l} already was"),
        ];
    }
    if let Some(m) = max.filter(|&m| a.last && m > seq) {
        return vec![
            "rejected".into(),
            format!("seq {seq} is flagged last, but seq {m} was already accepted"),
        ];
    }
    if count > cap {
        return vec![
            "rejected".into(),
            format!("chunk has {count} recipients, more than the group cap {cap}"),
        ];
    }

    let (mut gen, mut seqs, mut recipients) = (r.num("gen"), r.num("seqs"), r.num("recipients"));
    let gk = |gen: i64, f: &str| format!("g:{gen}:{f}");
    let (mut n, mut c, l) = (
        r.num(&gk(gen, "n")),
        r.num(&gk(gen, "c")),
        r.num(&gk(gen, "l")),
    );
    let mut group = r.get(&gk(gen, "group"));
    let closed = r.get(&gk(gen, "closed")).is_some();

    // Approving this chunk would pass the cap (or the generation takes no
    // more): this script is the one closer. Approval counters are never given back.
    if closed || (n > 0 && n + count > cap) {
        if !closed {
            r.emit(
                &format!("close/{gen}"),
                Event::GenerationClosed(GenerationClosed {
                    gen: gen as u32,
                    reason: "full".into(),
                    chunks: c as u32,
                    recipients: n as u32,
                }),
                true,
            );
            r.put(gk(gen, "closed"), "full");
            if l == c {
                r.make_ready(gen as u32, c as u32);
            }
        }
        (gen, n, c, group) = (gen + 1, 0, 0, None);
    }

    (n, c, seqs, recipients) = (n + count, c + 1, seqs + 1, recipients + count);
    let assigned_id = r.emit(
        &format!("assign/{seq}"),
        Event::ChunkAssigned(ChunkAssigned {
            seq: a.seq,
            gen: gen as u32,
            count: a.count,
            last: a.last,
            digest: a.digest.to_string(),
            duplicates: Vec::new(),
        }),
        true,
    );
    r.put(format!("s:{seq}"), format!("{gen}|{count}|{}", a.digest));
    r.put(gk(gen, "n"), n);
    r.put(gk(gen, "c"), c);
    r.put("gen", gen);
    r.put("seqs", seqs);
    r.put("recipients", recipients);
    if max.is_none_or(|m| seq > m) {
        r.put("max", seq);
    }
    let mut last = last;
    if a.last {
        r.put("last", seq);
        last = Some(seq);
    }
    if seqs == 1 {
        // The batch's first chunk: it is in flight from now (t0) on.
        r.put("t0", assigned_id);
        let b = r.batch.clone();
        r.db.active.insert(b);
    }
    // Every seq 0..last is assigned: this generation is the final one.
    if last.is_some_and(|l| seqs == l + 1) {
        r.emit(
            &format!("close/{gen}"),
            Event::GenerationClosed(GenerationClosed {
                gen: gen as u32,
                reason: "final".into(),
                chunks: c as u32,
                recipients: n as u32,
            }),
            true,
        );
        r.put(gk(gen, "closed"), "final");
    }
    r.flush();
    let g = gen.to_string();
    reply(["assigned", &g, group.as_deref().unwrap_or(""), "0"])
}
