//! The batch-wide dedupe: the batch's *number log* and a caller's view of it.
//!
//! A number gets a batch's message at most once. The numbers a batch has been
//! given live in one Redis string, its number log: each accepted chunk
//! appends one frame, `[count: u32 BE][count 5-byte records][16-hex stamp]`.
//! The caller, not the script, finds a chunk's copies: it holds a [`View`]
//! of the log (the numbers of every frame up to some length), names the
//! positions of the chunk's numbers that the view has, or that come earlier
//! in the chunk, and hands `accept.lua` the view's length and last stamp
//! with them. The script accepts only if the log still ends there (the state
//! keeps the log's length and last stamp: `dlen`, `dstamp`), and appends
//! the chunk's frame in the same step; otherwise it answers `behind`, and
//! the caller reads what it missed and tries again. So the dedupe stays
//! atomic with the accept, while Redis does no work per number: one
//! `APPEND` of the chunk's bytes, where a `BITFIELD` or a bucket lookup per
//! number cost about a microsecond of Redis CPU each.
//!
//! Why a stamp and not only a length: under `everysec` Redis can lose its
//! last writes, and the log can then grow back to the same length with
//! other frames. A stamp is random, made for one append, so a log that
//! still ends in a view's stamp at the view's length holds exactly the
//! view's frames (losing writes only ever drops a suffix).

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Bytes of one record: a number, 5 bytes big-endian
/// (`crate::store::batch::dedupe_record`).
pub const RECORD: usize = 5;
/// Bytes of a frame's count header.
const HEADER: usize = 4;
/// Bytes of a frame's stamp: 16 hex digits.
pub const STAMP: usize = 16;

/// The frame a chunk of `records` appends, ending in `stamp`
/// ([`new_stamp`]).
pub fn frame(records: &[u8], stamp: &str) -> Vec<u8> {
    let count = (records.len() / RECORD) as u32;
    let mut f = Vec::with_capacity(HEADER + records.len() + STAMP);
    f.extend_from_slice(&count.to_be_bytes());
    f.extend_from_slice(records);
    f.extend_from_slice(stamp.as_bytes());
    f
}

/// A fresh stamp: 64 random bits as 16 hex digits.
pub fn new_stamp() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// A log that is not a sequence of whole frames (a bug, or a key written by
/// something else).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the number log is malformed at byte {at}")]
pub struct Malformed {
    /// Where the first incomplete frame starts, counted from the log's start.
    pub at: u64,
}

/// Mobile numbers (010-XXXX-XXXX) as record values: a large view keeps
/// them in a bitmap, one bit each (12.5 MB), rather than in its set.
const MOBILE: std::ops::Range<u64> = 101_000_000_000..101_100_000_000;
/// Mobile numbers a view holds in its set before it moves them to the
/// bitmap (about 1.6 MB of set, which the bitmap then replaces).
const BITMAP_FROM: usize = 100_000;

/// A hasher for record values: they are already spread (phone numbers), so
/// one multiplication mixes them enough.
#[derive(Default)]
struct NumberHasher(u64);

impl Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
}

type NumberSet = HashSet<u64, BuildHasherDefault<NumberHasher>>;

/// The numbers of a prefix of a batch's number log: its first `len` bytes,
/// which end with the frame stamped `stamp`.
#[derive(Default)]
pub struct View {
    len: u64,
    stamp: String,
    set: NumberSet,
    /// The mobile numbers once there are many ([`BITMAP_FROM`]).
    mobile: Option<Vec<u64>>,
    mobile_in_set: usize,
}

/// A record's value.
fn value(rec: &[u8]) -> u64 {
    rec.iter().fold(0, |v, &b| v * 256 + u64::from(b))
}

impl View {
    /// The log's length this view has read up to.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view has read nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stamp of the view's last frame ("" before any).
    pub fn stamp(&self) -> &str {
        &self.stamp
    }

    /// Where to read the log from to extend this view: its last stamp, so
    /// that [`View::extend`] can check the log still holds it.
    pub fn read_from(&self) -> u64 {
        self.len.saturating_sub(STAMP as u64)
    }

    /// Extends the view by `got`, the log read from [`View::read_from`] to
    /// its end. `Ok(false)`: the log no longer ends the view's way (it lost
    /// writes, or is shorter): the view must be read again from the start.
    pub fn extend(&mut self, got: &[u8]) -> Result<bool, Malformed> {
        let rest = if self.len == 0 {
            got
        } else {
            match got.strip_prefix(self.stamp.as_bytes()) {
                Some(rest) => rest,
                None => return Ok(false),
            }
        };
        let mut at = 0;
        while at < rest.len() {
            let malformed = Malformed {
                at: self.len + at as u64,
            };
            let head = rest.get(at..at + HEADER).ok_or(malformed.clone())?;
            let count = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let end = at + HEADER + count * RECORD + STAMP;
            let whole = rest.get(at..end).ok_or(malformed)?;
            self.add(&whole[HEADER..HEADER + count * RECORD]);
            self.stamp = String::from_utf8_lossy(&whole[whole.len() - STAMP..]).into_owned();
            at = end;
        }
        self.len += at as u64;
        Ok(true)
    }

    /// Extends the view by the frame it appended itself (`accept` took it).
    pub fn appended(&mut self, frame: &[u8]) {
        let records = &frame[HEADER..frame.len() - STAMP];
        self.add(records);
        self.stamp = String::from_utf8_lossy(&frame[frame.len() - STAMP..]).into_owned();
        self.len += frame.len() as u64;
    }

    /// The positions of `records` (a chunk's, in order) whose number the
    /// view holds, or an earlier record of the chunk has.
    pub fn duplicates(&self, records: &[u8]) -> Vec<u32> {
        self.chain_duplicates(&[records]).pop().unwrap_or_default()
    }

    /// [`View::duplicates`] for several chunks in a row, each as if those
    /// before it had been appended: a chunk's copies are also the numbers
    /// an earlier chunk of `chunks` has. (A process accepts the chunks of a
    /// batch that wait for its view together: `accept.lua` takes each one
    /// only after those before it.)
    pub fn chain_duplicates(&self, chunks: &[&[u8]]) -> Vec<Vec<u32>> {
        let total = chunks.iter().map(|c| c.len() / RECORD).sum();
        let mut earlier = NumberSet::with_capacity_and_hasher(total, Default::default());
        chunks
            .iter()
            .map(|records| {
                let mut dups = Vec::new();
                for (k, rec) in records.chunks_exact(RECORD).enumerate() {
                    let v = value(rec);
                    if self.holds(v) || !earlier.insert(v) {
                        dups.push(k as u32);
                    }
                }
                dups
            })
            .collect()
    }

    fn holds(&self, v: u64) -> bool {
        match &self.mobile {
            Some(bits) if MOBILE.contains(&v) => {
                let o = v - MOBILE.start;
                bits[(o / 64) as usize] & (1 << (o % 64)) != 0
            }
            _ => self.set.contains(&v),
        }
    }

    fn add(&mut self, records: &[u8]) {
        if self.mobile.is_none() {
            self.set.reserve(records.len() / RECORD);
        }
        for rec in records.chunks_exact(RECORD) {
            let v = value(rec);
            match &mut self.mobile {
                Some(bits) if MOBILE.contains(&v) => {
                    let o = v - MOBILE.start;
                    bits[(o / 64) as usize] |= 1 << (o % 64);
                }
                _ => {
                    if self.set.insert(v) && MOBILE.contains(&v) {
                        self.mobile_in_set += 1;
                    }
                }
            }
        }
        if self.mobile.is_none() && self.mobile_in_set >= BITMAP_FROM {
            let words = ((MOBILE.end - MOBILE.start) / 64 + 1) as usize;
            let mut bits = vec![0u64; words];
            self.set.retain(|&v| {
                let mobile = MOBILE.contains(&v);
                if mobile {
                    let o = v - MOBILE.start;
                    bits[(o / 64) as usize] |= 1 << (o % 64);
                }
                !mobile
            });
            self.mobile = Some(bits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: u64) -> Vec<u8> {
        v.to_be_bytes()[8 - RECORD..].to_vec()
    }

    fn records(vs: &[u64]) -> Vec<u8> {
        vs.iter().flat_map(|&v| rec(v)).collect()
    }

    #[test]
    fn a_view_reads_frames_and_names_copies_in_the_log_and_in_the_chunk() {
        let mut log = frame(&records(&[7, 8]), "aaaaaaaaaaaaaaaa");
        log.extend(frame(&records(&[9]), "bbbbbbbbbbbbbbbb"));
        let mut v = View::default();
        assert_eq!(v.extend(&log), Ok(true));
        assert_eq!(v.len(), log.len() as u64);
        assert_eq!(v.stamp(), "bbbbbbbbbbbbbbbb");
        // 8 is in the log; the second 10 repeats the first.
        assert_eq!(v.duplicates(&records(&[10, 8, 10, 11])), vec![1, 2]);
        // Read on from its stamp: a new frame is taken.
        let next = frame(&records(&[10]), "cccccccccccccccc");
        let mut tail = log[v.read_from() as usize..].to_vec();
        tail.extend(&next);
        assert_eq!(v.extend(&tail), Ok(true));
        assert_eq!(v.duplicates(&records(&[10])), vec![0]);
        assert_eq!(v.len(), (log.len() + next.len()) as u64);
    }

    #[test]
    fn chained_chunks_name_the_copies_of_those_before_them() {
        let mut v = View::default();
        v.extend(&frame(&records(&[7]), "aaaaaaaaaaaaaaaa"))
            .unwrap();
        let (a, b, c) = (records(&[8, 7, 8]), records(&[9, 8]), records(&[10, 9, 7]));
        let chained = v.chain_duplicates(&[&a, &b, &c]);
        assert_eq!(chained, vec![vec![1, 2], vec![1], vec![1, 2]]);
        // The first is the view's own answer; each later one is the answer
        // of a view that appended those before it.
        assert_eq!(chained[0], v.duplicates(&a));
        v.appended(&frame(&a, "bbbbbbbbbbbbbbbb"));
        assert_eq!(chained[1], v.duplicates(&b));
        v.appended(&frame(&b, "cccccccccccccccc"));
        assert_eq!(chained[2], v.duplicates(&c));
    }

    #[test]
    fn a_log_that_lost_the_views_last_frame_is_read_again() {
        let first = frame(&records(&[7]), "aaaaaaaaaaaaaaaa");
        let mut v = View::default();
        v.extend(&first).unwrap();
        v.appended(&frame(&records(&[8]), "bbbbbbbbbbbbbbbb"));
        // Redis lost the second frame and took another of the same size.
        let mut log = first.clone();
        log.extend(frame(&records(&[9]), "cccccccccccccccc"));
        assert_eq!(v.extend(&log[v.read_from() as usize..]), Ok(false));
        // Shorter than the view: nothing where its stamp was.
        assert_eq!(v.extend(&first[first.len()..]), Ok(false));
    }

    #[test]
    fn a_cut_frame_is_malformed() {
        let log = frame(&records(&[7, 8]), "aaaaaaaaaaaaaaaa");
        let mut v = View::default();
        assert_eq!(v.extend(&log[..log.len() - 1]), Err(Malformed { at: 0 }));
    }

    #[test]
    fn many_mobile_numbers_move_to_the_bitmap_and_are_still_found() {
        let mobile: Vec<u64> = (0..BITMAP_FROM as u64)
            .map(|k| MOBILE.start + k * 997)
            .collect();
        let mut v = View::default();
        v.appended(&frame(&records(&mobile), "aaaaaaaaaaaaaaaa"));
        v.appended(&frame(&records(&[5, MOBILE.end - 1]), "bbbbbbbbbbbbbbbb"));
        assert!(v.mobile.is_some());
        assert!(v.set.len() <= 2, "the set kept {} numbers", v.set.len());
        let asked = records(&[MOBILE.start + 997, 5, MOBILE.start + 1, MOBILE.end - 1]);
        assert_eq!(v.duplicates(&asked), vec![0, 1, 3]);
    }
}
