//! The first reading of a recipients file: every row checked, every
//! chunk sized as it will be encoded, and the numbers that repeat found
//! (one `u64` a row, sorted once); only when some number repeats is the
//! file read once more, to find the repeated rows' lines and count the
//! chunks without them.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::input::Input;
use super::problems::{Problem, Problems};
use super::rows::{RowRecipient, Rows};
use super::InputError;
use super::{usage, Duplicates};
use crate::events::chunk::{chunk_encoded_len, recipient_encoded_len, MAX_CHUNK_BYTES};
use crate::events::options::BatchOptions;
use crate::events::{ChunkError, Template};
use crate::phone::Normalized;

/// A valid number (9 to 11 ASCII digits) as one `u64`: its digits, and its
/// length above them, since `0212345678` and `00212345678` differ.
pub(crate) fn number_key(to: &str) -> u64 {
    let digits = to
        .bytes()
        .fold(0u64, |n, d| n * 10 + u64::from(d.wrapping_sub(b'0')));
    ((to.len() as u64) << 40) | digits
}

/// How many rows the file can have at most (a row takes 10 bytes at least:
/// 9 digits and a newline), capped: room reserved once for the numbers, so
/// that growing never copies them (only the rows there are touch memory).
fn rows_at_most(input: &Input) -> usize {
    const CAP: u64 = 1 << 26;
    let len = input.file.metadata().map(|m| m.len()).unwrap_or(0);
    (len / 10).min(CAP) as usize
}

/// What checking a recipients file found: enough to cut it again and to
/// notice if it changed in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The rows kept (to be sent).
    pub(crate) recipients: usize,
    /// The chunks they make.
    pub(crate) chunks: u32,
    /// The largest encoded chunk, in bytes.
    pub(crate) largest_chunk: usize,
    /// A sum over the kept rows' numbers, order-independent.
    pub(crate) fingerprint: u64,
}

/// Rows dropped because an earlier row has their number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// How many.
    pub(crate) rows: usize,
    /// The first [`DROPPED_SHOWN`]: (the line kept, the line dropped).
    pub(crate) first: Vec<(usize, usize)>,
}

/// How many dropped rows submit's summary names.
const DROPPED_SHOWN: usize = 5;

/// What the readings before the cut found.
#[derive(Debug)]
pub(crate) struct Scan {
    /// The rows kept and their chunks.
    pub(crate) checked: Checked,
    /// The rows of the file (the header and blank JSONL lines aside).
    pub(crate) rows: usize,
    /// The numbers (as [`number_key`]s) that more than one row has: only
    /// the first row of each is kept.
    pub(crate) repeated: HashSet<u64>,
    /// The later rows of the repeated numbers.
    pub(crate) dropped: Dropped,
    /// Mobile numbers whose lost leading 0 was put back.
    pub(crate) zeros_restored: usize,
}

/// Adds a number to a fingerprint.
pub(crate) fn fingerprint(sum: u64, key: u64) -> u64 {
    sum.wrapping_add(key.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Counts kept rows into chunks as they will be encoded (given a batch and
/// a chunk size), with a fingerprint of their numbers.
struct Sizer<'a> {
    template: &'a Template,
    options: &'a BatchOptions,
    /// The batch and the chunk size, when chunks are counted.
    chunking: Option<(&'a str, usize)>,
    /// What is counted so far.
    checked: Checked,
    /// The rows in the chunk being counted.
    in_chunk: usize,
    /// Their encoded size.
    chunk_bytes: usize,
    /// The first chunk over [`MAX_CHUNK_BYTES`], as the error that says so.
    too_large: Option<InputError>,
}

impl<'a> Sizer<'a> {
    /// Nothing counted yet.
    fn new(
        template: &'a Template,
        options: &'a BatchOptions,
        chunking: Option<(&'a str, usize)>,
    ) -> Self {
        Sizer {
            template,
            options,
            chunking,
            checked: Checked {
                recipients: 0,
                chunks: 0,
                largest_chunk: 0,
                fingerprint: 0,
            },
            in_chunk: 0,
            chunk_bytes: 0,
            too_large: None,
        }
    }

    /// Counts one kept row.
    fn push(&mut self, r: &RowRecipient<'_>) {
        self.checked.recipients += 1;
        self.checked.fingerprint = fingerprint(self.checked.fingerprint, number_key(r.to));
        self.in_chunk += 1;
        self.chunk_bytes += recipient_encoded_len(r);
        if self.chunking.is_some_and(|(_, size)| self.in_chunk == size) {
            self.end_chunk();
        }
    }

    /// Ends the chunk being counted: its encoded size.
    fn end_chunk(&mut self) {
        let Some((batch, _)) = self.chunking else {
            return;
        };
        // `last` is one byte either way: the size does not depend on it.
        let len = chunk_encoded_len(
            batch,
            self.checked.chunks,
            false,
            self.template,
            self.options,
            self.in_chunk,
            self.chunk_bytes,
        );
        self.checked.largest_chunk = self.checked.largest_chunk.max(len);
        if len > MAX_CHUNK_BYTES && self.too_large.is_none() {
            self.too_large = Some(usage(format!(
                "chunk {}: {}: lower --chunk-size",
                self.checked.chunks,
                ChunkError::TooLarge(len)
            )));
        }
        self.checked.chunks += 1;
        (self.in_chunk, self.chunk_bytes) = (0, 0);
    }

    /// What was counted, and the first chunk too large, if any.
    fn finish(mut self) -> (Checked, Option<InputError>) {
        if self.in_chunk > 0 {
            self.end_chunk();
        }
        (self.checked, self.too_large)
    }
}

/// Checks every row and, given a batch and a chunk size, every chunk.
/// Every bad row is listed (up to [`LISTED`](super::problems::LISTED), all
/// counted); a number that an earlier row has is dropped (counted) or,
/// with [`Duplicates::Fail`], one more problem; then the first chunk too
/// large, if any.
pub(crate) fn check_recipients(
    input: &mut Input,
    template: &Template,
    options: &BatchOptions,
    chunking: Option<(&str, usize)>,
    duplicates: Duplicates,
) -> Result<Scan, InputError> {
    let path = input.path.clone();
    check_rows(input, template, options, chunking, duplicates).map_err(|r| r.into_error(&path))
}

/// Why [`check_rows`] refused a file: its rows' problems (kept as data, for
/// a caller that answers them as such), or the file's own error.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Bad rows: every problem counted, the first listed.
    Rows {
        /// The problems.
        problems: Problems,
        /// The rows read.
        rows: usize,
    },
    /// The file as a whole (unreadable, a header without a column the
    /// template uses, no recipients, a chunk too large).
    File(InputError),
}

impl From<InputError> for Refusal {
    fn from(e: InputError) -> Self {
        Refusal::File(e)
    }
}

impl Refusal {
    /// As `submit` says it: every listed problem on a line of its own.
    pub(crate) fn into_error(self, path: &Path) -> InputError {
        match self {
            Refusal::Rows { problems, rows } => problems.into_error(path, rows),
            Refusal::File(e) => e,
        }
    }
}

/// [`check_recipients`], with the rows' problems as data.
pub(crate) fn check_rows(
    input: &mut Input,
    template: &Template,
    options: &BatchOptions,
    chunking: Option<(&str, usize)>,
    duplicates: Duplicates,
) -> Result<Scan, Refusal> {
    let names = template.placeholders();
    let path = input.path.clone();
    let mut problems = Problems::default();
    let sizer = Sizer::new(template, options, chunking);
    let first = first_reading(input, &names, sizer, &mut problems)?;
    let repeated = repeated_numbers(first.numbers);
    let mut repeats = Repeats {
        repeated: &repeated,
        first_lines: HashMap::new(),
        dropped: Dropped::default(),
    };
    // With problems already, dropped rows would go unsaid: no need to look.
    let (checked, too_large) =
        if repeated.is_empty() || (problems.total > 0 && duplicates == Duplicates::Drop) {
            first.sizer.finish()
        } else {
            // The chunks counted above hold the later rows of each repeated
            // number: count them again without (when the file is to be sent).
            let sizer = Sizer::new(template, options, chunking);
            let found = (&mut repeats, &mut problems);
            repeats_reading(input, &names, duplicates, found, sizer)?
        };
    let dropped = repeats.dropped;
    if let Some(e) = refusal(problems, &path, first.rows, &checked, too_large) {
        return Err(e);
    }
    Ok(Scan {
        checked,
        rows: first.rows,
        repeated,
        dropped,
        zeros_restored: first.zeros_restored,
    })
}

/// What the first reading found, besides the problems.
struct FirstReading<'a> {
    /// The number of every row whose number is valid, as a [`number_key`],
    /// in file order.
    numbers: Vec<u64>,
    /// The good rows, counted into chunks (repeats included).
    sizer: Sizer<'a>,
    /// The rows read.
    rows: usize,
    /// Mobile numbers whose lost leading 0 was put back.
    zeros_restored: usize,
}

/// Reads every row of `input` once: adds each bad row's problems to
/// `problems`, counts the good rows into `sizer`, and keeps every valid
/// number. A header that lacks a column of `names` is the file's error.
fn first_reading<'a>(
    input: &mut Input,
    names: &[String],
    mut sizer: Sizer<'a>,
    problems: &mut Problems,
) -> Result<FirstReading<'a>, InputError> {
    let path = input.path.clone();
    // One per row: 8 bytes, where a set of the numbers as strings took ten
    // times that.
    let mut numbers: Vec<u64> = Vec::with_capacity(rows_at_most(input));
    let (mut rows_read, mut zeros_restored) = (0, 0);
    let mut rows = Rows::new(input)?;
    if let Some(n) = rows.missing_column(names) {
        return Err(usage(format!(
            "{}:1: the header has no `{n}` column; the template uses #{{{n}}}: add the column",
            path.display()
        )));
    }
    let mut number = String::new();
    while let Some(read) = rows.next(&path)? {
        rows_read += 1;
        let row = match read {
            Ok(row) => row,
            Err(p) => {
                problems.bad_rows += 1;
                problems.add(p);
                continue;
            }
        };
        let before = problems.total;
        match row.number(&mut number) {
            Ok(how) => {
                zeros_restored += usize::from(how == Normalized::ZeroRestored);
                numbers.push(number_key(&number));
            }
            Err(p) => problems.add(p),
        }
        row.var_problems(names, |p| problems.add(p));
        if problems.total > before {
            problems.bad_rows += 1;
        } else {
            sizer.push(&RowRecipient {
                to: &number,
                vars: row.vars,
            });
        }
    }
    Ok(FirstReading {
        numbers,
        sizer,
        rows: rows_read,
        zeros_restored,
    })
}

/// The numbers that more than one of `numbers` is: sorted once, then
/// neighbours compared (the vector is dropped on the way out).
fn repeated_numbers(mut numbers: Vec<u64>) -> HashSet<u64> {
    numbers.sort_unstable();
    numbers
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect()
}

/// The rows of the repeated numbers, as a reading meets them in file
/// order: the first row of each number is kept, the later ones dropped.
struct Repeats<'a> {
    /// The numbers (as [`number_key`]s) that more than one row has.
    repeated: &'a HashSet<u64>,
    /// The line of each repeated number's first row, once met.
    first_lines: HashMap<u64, usize>,
    dropped: Dropped,
}

impl Repeats<'_> {
    /// If the row on `line`, whose number is `key`, repeats an earlier
    /// row: that row's line (and the row is counted as dropped).
    fn earlier(&mut self, key: u64, line: usize) -> Option<usize> {
        if !self.repeated.contains(&key) {
            return None;
        }
        match self.first_lines.entry(key) {
            Entry::Vacant(v) => {
                v.insert(line);
                None
            }
            Entry::Occupied(o) => {
                let first = *o.get();
                self.dropped.rows += 1;
                if self.dropped.first.len() < DROPPED_SHOWN {
                    self.dropped.first.push((first, line));
                }
                Some(first)
            }
        }
    }
}

/// Reads `input` again, only when some number repeats: finds the lines of
/// the repeated rows (into `repeats`; with [`Duplicates::Fail`], each a
/// problem too) and, while there are no problems, counts the chunks
/// without the rows dropped.
fn repeats_reading(
    input: &mut Input,
    names: &[String],
    duplicates: Duplicates,
    (repeats, problems): (&mut Repeats<'_>, &mut Problems),
    mut sizer: Sizer<'_>,
) -> Result<(Checked, Option<InputError>), InputError> {
    let path = input.path.clone();
    let mut rows = Rows::new(input)?;
    let mut number = String::new();
    while let Some(read) = rows.next(&path)? {
        let Ok(row) = read else { continue };
        if row.number(&mut number).is_err() {
            continue;
        }
        if let Some(first) = repeats.earlier(number_key(&number), row.line) {
            if duplicates == Duplicates::Fail {
                let mut bad_already = false;
                row.var_problems(names, |_| bad_already = true);
                problems.bad_rows += usize::from(!bad_already);
                problems.add(Problem::field(
                    row.line,
                    "to",
                    "repeated number",
                    format!(
                        "{number} repeats line {first}: remove one of the rows \
                         (or leave out --duplicates fail to send the number once)"
                    ),
                ));
            }
            continue;
        }
        if problems.total == 0 {
            sizer.push(&RowRecipient {
                to: &number,
                vars: row.vars,
            });
        }
    }
    Ok(sizer.finish())
}

/// Why the file is refused, if it is, in this order: its problems (all
/// listed), no one to send to, the first chunk too large.
fn refusal(
    problems: Problems,
    path: &Path,
    rows: usize,
    checked: &Checked,
    too_large: Option<InputError>,
) -> Option<Refusal> {
    if problems.total > 0 {
        return Some(Refusal::Rows { problems, rows });
    }
    if checked.recipients == 0 {
        return Some(Refusal::File(usage(format!(
            "{}: no recipients in the file",
            path.display()
        ))));
    }
    too_large.map(Refusal::File)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::cut_file::read_recipients;
    use crate::producer::fixtures::{check, cut, file, sms, usage_of};

    #[test]
    fn numbers_of_different_lengths_have_different_keys() {
        assert_ne!(number_key("0212345678"), number_key("00212345678"));
        assert_ne!(number_key("021234567"), number_key("0021234567"));
        assert_eq!(number_key("01099999999"), number_key("01099999999"));
    }

    #[test]
    fn a_repeat_far_apart_is_dropped_or_refused_with_both_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        for i in 0..5_000 {
            csv.push_str(&format!("010{i:08},n\n"));
        }
        csv.push_str("010-0000-0007,again\n");
        let p = file(dir.path(), "r.csv", &csv);
        let r = read_recipients(&p, &sms()).expect("read");
        assert_eq!(r.len(), 5_000, "the later row is dropped");
        assert_eq!(r[7].vars["name"], "n", "the first row is the one kept");
        let scan = check(&p, 1_000, Duplicates::Drop).expect("check");
        assert_eq!(
            scan.dropped,
            Dropped {
                rows: 1,
                first: vec![(9, 5002)]
            }
        );
        assert_eq!((scan.rows, scan.checked.recipients), (5_001, 5_000));
        let m = usage_of(check(&p, 1_000, Duplicates::Fail));
        assert!(
            m.contains(":5002: field `to`: 01000000007 repeats line 9"),
            "{m}"
        );
        assert!(m.ends_with("5001 row(s), 1 bad, 1 problem(s): 1 repeated number; nothing was appended: fix them and submit again"), "{m}");
    }

    #[test]
    fn duplicates_are_found_in_normal_form_and_the_chunks_counted_without_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        for i in 0..20 {
            csv.push_str(&format!("010-0000-{i:04},first{i}\n"));
        }
        // The same five numbers again, as other people write them.
        for (i, written) in [
            "+82 10-0000-0000",
            "1000000001",
            "010 0000 0002",
            "(010) 0000-0003",
            "010.0000.0004",
        ]
        .iter()
        .enumerate()
        {
            csv.push_str(&format!("{written},again{i}\n"));
        }
        let p = file(dir.path(), "d.csv", &csv);
        let scan = check(&p, 10, Duplicates::Drop).expect("check");
        assert_eq!(scan.dropped.rows, 5);
        assert_eq!(
            scan.dropped.first,
            [(2, 22), (3, 23), (4, 24), (5, 25), (6, 26)]
        );
        assert_eq!((scan.checked.recipients, scan.checked.chunks), (20, 2));
        let chunks = cut(&p, 10);
        let shape: Vec<_> = chunks
            .iter()
            .map(|c| (c.seq, c.last, c.recipients.len()))
            .collect();
        assert_eq!(shape, [(0, false, 10), (1, true, 10)]);
        let names: Vec<&str> = chunks
            .iter()
            .flat_map(|c| c.recipients.iter())
            .map(|r| r.vars["name"].as_str())
            .collect();
        assert!(names.iter().all(|n| n.starts_with("first")), "{names:?}");
        let m = usage_of(check(&p, 10, Duplicates::Fail));
        assert_eq!(m.lines().count(), 6, "{m}");
        assert!(
            m.contains(":26: field `to`: 01000000004 repeats line 6"),
            "{m}"
        );
    }

    #[test]
    fn a_header_without_a_template_variable_is_one_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "r.csv",
            "to,nom\n01012345678,a\n01012345679,b\n",
        );
        let m = usage_of(check(&p, 10, Duplicates::Drop));
        assert!(
            m.ends_with("r.csv:1: the header has no `name` column; the template uses #{name}: add the column"),
            "{m}"
        );
    }

    #[test]
    fn repeats_take_their_place_in_file_order_among_the_other_problems() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "a.jsonl",
            "{\"to\": \"01000000001\", \"name\": \"a\"}\n\
             {\"to\": \"01000000002\", \"name\": \"b\"}\n\
             {\"to\": \"01000000001\", \"name\": \"c\"}\n\
             \n\
             {\"to\": \"01000000003\"}\n\
             {\"to\": \"01000000002\"}\n",
        );
        let m = usage_of(check(&p, 10, Duplicates::Fail));
        let lines: Vec<&str> = m.lines().collect();
        assert!(lines[0].ends_with(":3: field `to`: 01000000001 repeats line 1: remove one of the rows (or leave out --duplicates fail to send the number once)"), "{m}");
        assert!(
            lines[1]
                .ends_with(":5: field `name`: missing; the template uses #{name}: give it a value"),
            "{m}"
        );
        assert!(lines[2].contains(":6: field `name`: missing"), "{m}");
        assert!(
            lines[3].contains(":6: field `to`: 01000000002 repeats line 2"),
            "{m}"
        );
        assert!(
            lines[4]
                .contains("5 row(s), 3 bad, 4 problem(s): 2 missing variable, 2 repeated number"),
            "{m}"
        );
        // Dropped by default: the other problems alone.
        let m = usage_of(check(&p, 10, Duplicates::Drop));
        assert!(
            m.contains("5 row(s), 2 bad, 2 problem(s): 2 missing variable"),
            "{m}"
        );
    }

    #[test]
    fn numbers_from_excel_are_normalised_and_what_was_restored_is_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "excel.csv",
            "to,name\n1012345678,a\n+82 10-1234-5679,b\n010 1234 5670,c\n(010) 1234-5671,d\n1612345678,e\n",
        );
        let r = read_recipients(&p, &sms()).expect("read");
        let to: Vec<&str> = r.iter().map(|r| r.to.as_str()).collect();
        assert_eq!(
            to,
            [
                "01012345678",
                "01012345679",
                "01012345670",
                "01012345671",
                "01612345678"
            ]
        );
        assert_eq!(
            check(&p, 10, Duplicates::Drop)
                .expect("check")
                .zeros_restored,
            2
        );
    }
}
