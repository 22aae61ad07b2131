//! Missing seqs as ranges.
//!
//! A batch's seqs run from 0 to its last one, and a producer bug can make
//! that last one 4,000,000,000 with three chunks sent. Nothing that reads a
//! batch may work in proportion to its highest seq: what is missing is
//! computed from what *arrived* (sorted, then the gaps between), kept as
//! inclusive ranges `[from, to]`, and listed at most [`MISSING_RANGES_MAX`]
//! of them (the first), with the count of seqs and of ranges in all.
//! `close.lua` does the same in the script (and its mirror
//! `protocol::close` calls [`missing_ranges`]).

use serde::Serialize;

/// The most ranges of missing seqs an event, a report or a page lists (the
/// first ones): with at most 100 pairs of 10-digit numbers, a list stays
/// under 2.5 kB whatever the batch.
pub(crate) const MISSING_RANGES_MAX: usize = 100;

/// The seqs missing from `0..=top`, as ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Missing {
    /// How many seqs are missing in all.
    pub count: u64,
    /// The first ranges `[from, to]` (inclusive, ascending, disjoint, not
    /// adjacent), at most the limit asked for.
    pub ranges: Vec<[u32; 2]>,
    /// How many ranges there are in all (more than listed when cut).
    pub ranges_total: u64,
}

impl Missing {
    /// Whether no seq is missing.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The ranges as text, `5`, `7-9`, comma separated, saying how many
    /// more there are when the list was cut.
    pub fn text(&self) -> String {
        let mut s: Vec<String> = self
            .ranges
            .iter()
            .map(|&[a, b]| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        let more = self.ranges_total.saturating_sub(self.ranges.len() as u64);
        if more > 0 {
            s.push(format!("... ({more} more range(s))"));
        }
        s.join(", ")
    }
}

/// The seqs of `0..=top` not in `present`, as ranges, listing at most `max`
/// of them. `present` may be in any order, hold copies and seqs above
/// `top` (ignored). The work is proportional to `present`'s length (it is
/// sorted), never to `top`. `top` `None`: nothing is missing.
pub(crate) fn missing_ranges(
    present: impl IntoIterator<Item = u32>,
    top: Option<u32>,
    max: usize,
) -> Missing {
    let Some(top) = top else {
        return Missing::default();
    };
    let mut seen: Vec<u32> = present.into_iter().filter(|&s| s <= top).collect();
    seen.sort_unstable();
    seen.dedup();
    let mut out = Missing::default();
    // The next seq not yet known to be present or counted.
    let mut next: u64 = 0;
    let add = |from: u64, to: u64, out: &mut Missing| {
        out.count += to - from + 1;
        out.ranges_total += 1;
        if out.ranges.len() < max {
            out.ranges.push([from as u32, to as u32]);
        }
    };
    for s in seen {
        let s = u64::from(s);
        if s > next {
            add(next, s - 1, &mut out);
        }
        next = s + 1;
    }
    if next <= u64::from(top) {
        add(next, u64::from(top), &mut out);
    }
    out
}

/// Whether every range of `inner` lies within some range of `outer` (both
/// as [`missing_ranges`] lists them: ascending and disjoint). Linear.
pub(crate) fn covered(inner: &[[u32; 2]], outer: &[[u32; 2]]) -> bool {
    let mut o = outer.iter().peekable();
    inner.iter().all(|&[a, b]| {
        while o.peek().is_some_and(|&&[_, to]| to < a) {
            o.next();
        }
        o.peek().is_some_and(|&&[from, to]| from <= a && b <= to)
    })
}

/// The ranges of a sorted list of seqs (events recorded before ranges
/// listed every missing seq one by one). Linear in the list.
pub(crate) fn ranges_of(seqs: &[u32]) -> Vec<[u32; 2]> {
    let mut out: Vec<[u32; 2]> = Vec::new();
    for &s in seqs {
        match out.last_mut() {
            Some(r) if u64::from(r[1]) + 1 == u64::from(s) => r[1] = s,
            _ => out.push([s, s]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_between_what_arrived() {
        let m = missing_ranges([4, 0, 1, 1, 9], Some(12), 10);
        assert_eq!(m.ranges, vec![[2, 3], [5, 8], [10, 12]]);
        assert_eq!((m.count, m.ranges_total), (9, 3));
        assert_eq!(m.text(), "2-3, 5-8, 10-12");
        assert_eq!(missing_ranges([0, 1, 2], Some(2), 10), Missing::default());
        assert_eq!(missing_ranges([], None, 10), Missing::default());
        let m = missing_ranges([], Some(0), 10);
        assert_eq!((m.ranges, m.count), (vec![[0, 0]], 1));
    }

    #[test]
    fn a_huge_gap_is_one_range_and_the_list_is_cut() {
        let m = missing_ranges([0, 1, 4_000_000_000], Some(4_000_000_000), 10);
        assert_eq!(m.ranges, vec![[2, 3_999_999_999]]);
        assert_eq!(m.count, 3_999_999_998);
        let m = missing_ranges([0], Some(u32::MAX), 10);
        assert_eq!(m.count, u64::from(u32::MAX));
        assert_eq!(m.ranges, vec![[1, u32::MAX]]);
        let m = missing_ranges((0..50).map(|i| i * 2), Some(200), 3);
        assert_eq!(m.ranges, vec![[1, 1], [3, 3], [5, 5]]);
        assert_eq!((m.ranges_total, m.count), (50, 151));
        assert!(m.text().ends_with("... (47 more range(s))"), "{}", m.text());
    }

    #[test]
    fn coverage_and_old_lists() {
        assert_eq!(
            ranges_of(&[2, 3, 4, 7, 9, 10]),
            vec![[2, 4], [7, 7], [9, 10]]
        );
        assert!(covered(&[[2, 3], [9, 9]], &[[2, 4], [7, 7], [9, 10]]));
        assert!(!covered(&[[2, 5]], &[[2, 4], [5, 5]]));
        assert!(!covered(&[[8, 8]], &[[2, 4], [9, 10]]));
        assert!(covered(&[], &[]));
    }
}
