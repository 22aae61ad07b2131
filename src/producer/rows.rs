//! A recipients file's rows, one at a time and borrowed from the reader
//! (CSV with a header, or JSONL): the row's number, normalised, and its
//! variables, and what is wrong with either. A file written on Windows
//! keeps its line numbers ([`CrlfAsLf`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::input::{Format, Input, READ_BUFFER};
use super::problems::Problem;
use super::usage;
use super::InputError;
use crate::events::chunk::{RecipientFields, MAX_VAR_CHARS};
use crate::events::{clip, QUOTE_MAX};
use crate::phone::{self, Normalized};

/// One row of a recipients file, borrowed from the reader until the next.
pub(crate) struct Row<'r> {
    /// The line the row starts on (from 1).
    pub(crate) line: usize,
    /// The `to` field as written.
    pub(crate) to: Option<&'r str>,
    /// Its other fields.
    pub(crate) vars: Vars<'r>,
}

/// A row's fields other than `to`, by name: the template's variables.
#[derive(Clone, Copy)]
pub(crate) enum Vars<'r> {
    /// A CSV record and its columns (name order, each name once: a repeated
    /// column name keeps its last column).
    Csv {
        record: &'r csv::StringRecord,
        columns: &'r [(String, usize)],
    },
    /// A JSON object's fields (with `to`, skipped here).
    Json(&'r BTreeMap<String, String>),
}

impl<'r> Vars<'r> {
    /// The value of the variable `name`, if the row has it.
    pub(crate) fn get(self, name: &str) -> Option<&'r str> {
        match self {
            Vars::Csv { record, columns } => columns
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .ok()
                .and_then(|i| record.get(columns[i].1)),
            Vars::Json(fields) => fields
                .get(name)
                .filter(|_| name != "to")
                .map(String::as_str),
        }
    }

    /// How many variables the row has.
    pub(crate) fn len(self) -> usize {
        match self {
            Vars::Csv { columns, .. } => columns.len(),
            Vars::Json(fields) => fields.len() - usize::from(fields.contains_key("to")),
        }
    }

    /// In name order.
    pub(crate) fn iter(self) -> impl Iterator<Item = (&'r str, &'r str)> {
        let (csv, json) = match self {
            Vars::Csv { record, columns } => (Some((record, columns)), None),
            Vars::Json(fields) => (None, Some(fields)),
        };
        let csv = csv.into_iter().flat_map(|(record, columns)| {
            columns
                .iter()
                .map(move |(n, i)| (n.as_str(), record.get(*i).unwrap_or("")))
        });
        let json = json.into_iter().flat_map(|fields| {
            fields
                .iter()
                .filter(|(k, _)| *k != "to")
                .map(|(k, v)| (k.as_str(), v.as_str()))
        });
        csv.chain(json)
    }
}

/// A checked row as the chunk encoder reads it: the number as it will be
/// sent (in a caller's buffer) and the row's variables.
pub(crate) struct RowRecipient<'a> {
    /// The number, normalised.
    pub(crate) to: &'a str,
    /// The row's variables.
    pub(crate) vars: Vars<'a>,
}

impl RecipientFields for RowRecipient<'_> {
    fn to(&self) -> &str {
        self.to
    }
    fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name)
    }
    fn var_count(&self) -> usize {
        self.vars.len()
    }
    fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter()
    }
}

impl Row<'_> {
    /// Writes the row's number, normalised, into `out`.
    pub(crate) fn number(&self, out: &mut String) -> Result<Normalized, Problem> {
        let Some(to) = self.to else {
            out.clear();
            return Err(Problem::field(
                self.line,
                "to",
                "missing number",
                "missing: every row needs the recipient's number".into(),
            ));
        };
        phone::normalize_into(to, out).map_err(|e| {
            Problem::field(
                self.line,
                "to",
                e.kind(),
                format!("{:?} {e}", clip(to.trim(), QUOTE_MAX)),
            )
        })
    }

    /// Calls `each` with the row's problems with its variables: one the
    /// template uses (`names`) missing, or any too long (every column but
    /// `to` travels with the recipient, and a chunk holding a value too
    /// long would be refused by the workers).
    pub(crate) fn var_problems(&self, names: &[String], mut each: impl FnMut(Problem)) {
        for n in names {
            if self.vars.get(n).is_none() {
                each(Problem::field(
                    self.line,
                    n,
                    "missing variable",
                    format!("missing; the template uses #{{{n}}}: give it a value"),
                ));
            }
        }
        for (n, v) in self.vars.iter() {
            if v.len() > MAX_VAR_CHARS && v.chars().count() > MAX_VAR_CHARS {
                each(Problem::field(
                    self.line,
                    n,
                    "variable too long",
                    format!(
                        "longer than {MAX_VAR_CHARS} characters: shorten it \
                         (every column but `to` goes with the recipient: remove the columns the template does not use)"
                    ),
                ));
            }
        }
    }
}

/// The rows of a recipients file, one at a time, from its start.
pub(crate) enum Rows<'a> {
    /// A CSV file's records, past its header.
    Csv(CsvRows<'a>),
    /// A JSONL file's lines, blank ones skipped.
    Jsonl(JsonlRows<'a>),
}

/// The rows of a CSV file.
pub(crate) struct CsvRows<'a> {
    reader: csv::Reader<CrlfAsLf<&'a File>>,
    /// The index of the `to` column (the last one of that name).
    to: usize,
    /// Every other column: its name (trimmed) and index.
    columns: Vec<(String, usize)>,
    /// The record last read, lent to its [`Row`].
    record: csv::StringRecord,
    /// Records read so far.
    records: usize,
}

/// The rows of a JSONL file.
pub(crate) struct JsonlRows<'a> {
    reader: BufReader<&'a File>,
    /// The line last read.
    text: String,
    /// Its fields, lent to its [`Row`].
    fields: BTreeMap<String, String>,
    /// Lines read so far.
    lines: usize,
}

/// Reads `inner` with every `\r\n` as `\n` (a lone `\r` is kept).
///
/// Why: the CSV reader counts a line when it reads a `\n`, and it ends a
/// CRLF record at its `\r`, so the `\n` is read with the next record and
/// every record of a file written on Windows (Excel's, a CRM's) would be
/// placed a line early in the problems listed. A `\r\n` inside a quoted
/// value becomes `\n` too, which a message does not miss.
struct CrlfAsLf<R> {
    inner: BufReader<R>,
    /// A `\r` read last, not passed on yet: a `\n` may follow.
    cr: bool,
}

impl<R: Read> CrlfAsLf<R> {
    fn new(inner: R) -> Self {
        CrlfAsLf {
            inner: BufReader::with_capacity(READ_BUFFER, inner),
            cr: false,
        }
    }
}

impl<R: Read> Read for CrlfAsLf<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            let avail = self.inner.fill_buf()?;
            let held = std::mem::take(&mut self.cr);
            if held && avail.first() != Some(&b'\n') {
                // A lone `\r` (at the end, or before anything else).
                out[0] = b'\r';
                return Ok(1);
            }
            if avail.is_empty() {
                return Ok(0);
            }
            let take = avail.len().min(out.len());
            let n = avail[..take]
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(take);
            out[..n].copy_from_slice(&avail[..n]);
            if n < take {
                self.cr = true;
                self.inner.consume(n + 1);
            } else {
                self.inner.consume(n);
            }
            if n > 0 {
                return Ok(n);
            }
        }
    }
}

impl<'a> Rows<'a> {
    /// Starts reading `input` from its beginning (for a CSV, its header).
    pub(crate) fn new(input: &'a mut Input) -> Result<Rows<'a>, InputError> {
        let path = input.path.as_path();
        input
            .file
            .seek(SeekFrom::Start(input.start))
            .map_err(|e| usage(format!("{}: cannot read: {e}", path.display())))?;
        let file = &input.file;
        Ok(match input.format {
            Format::Csv => Rows::Csv(CsvRows::new(file, path)?),
            Format::Jsonl => Rows::Jsonl(JsonlRows {
                reader: BufReader::with_capacity(READ_BUFFER, file),
                text: String::new(),
                fields: BTreeMap::new(),
                lines: 0,
            }),
        })
    }

    /// The first of `names` that a CSV header has no column for: every row
    /// would lack it, so it is one problem, the header's.
    pub(crate) fn missing_column<'n>(&self, names: &'n [String]) -> Option<&'n str> {
        let Rows::Csv(CsvRows { columns, .. }) = self else {
            return None;
        };
        names
            .iter()
            .find(|n| {
                columns
                    .binary_search_by(|(c, _)| c.as_str().cmp(n.as_str()))
                    .is_err()
            })
            .map(String::as_str)
    }

    /// The next row, if any: a row, or what makes it unreadable (a row
    /// with the wrong number of fields, a line that is not a JSON object).
    /// Reading goes on after such a row; an error is the file's (it cannot
    /// be read).
    pub(crate) fn next(
        &mut self,
        path: &Path,
    ) -> Result<Option<Result<Row<'_>, Problem>>, InputError> {
        match self {
            Rows::Csv(rows) => rows.next(path),
            Rows::Jsonl(rows) => rows.next(path),
        }
    }
}

impl<'a> CsvRows<'a> {
    /// Reads the header of `file` (named `path`): it must have a `to`
    /// column; every other column is a variable.
    fn new(file: &'a File, path: &Path) -> Result<CsvRows<'a>, InputError> {
        let mut reader = csv::ReaderBuilder::new()
            .flexible(false)
            .buffer_capacity(READ_BUFFER)
            .from_reader(CrlfAsLf::new(file));
        let headers = reader
            .headers()
            .map_err(|e| usage(format!("{}:1: unreadable CSV header: {e}", path.display())))?;
        // By name, the last column of each name.
        let by_name: BTreeMap<String, usize> = headers
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim().to_string(), i))
            .collect();
        let Some(&to) = by_name.get("to") else {
            return Err(usage(format!(
                "{}:1: the header has no `to` column (the recipients' numbers)",
                path.display()
            )));
        };
        Ok(CsvRows {
            reader,
            to,
            columns: by_name.into_iter().filter(|(n, _)| n != "to").collect(),
            record: csv::StringRecord::new(),
            records: 0,
        })
    }

    /// The next record, as [`Rows::next`] says.
    fn next(&mut self, path: &Path) -> Result<Option<Result<Row<'_>, Problem>>, InputError> {
        let line = self.records + 2;
        match self.reader.read_record(&mut self.record) {
            Ok(false) => Ok(None),
            Ok(true) => {
                self.records += 1;
                let line = self.record.position().map_or(line, |p| p.line() as usize);
                Ok(Some(Ok(Row {
                    line,
                    to: self.record.get(self.to),
                    vars: Vars::Csv {
                        record: &self.record,
                        columns: &self.columns,
                    },
                })))
            }
            Err(e) if matches!(e.kind(), csv::ErrorKind::Io(_)) => {
                Err(usage(format!("{}: cannot read: {e}", path.display())))
            }
            Err(e) => {
                self.records += 1;
                let line = e.position().map_or(line, |p| p.line() as usize);
                Ok(Some(Err(malformed_record(line, &e))))
            }
        }
    }
}

/// The problem of a record the CSV reader could not read, with what to do
/// when it can tell (a comma in a value left unquoted).
fn malformed_record(line: usize, e: &csv::Error) -> Problem {
    let what = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!(
            "malformed CSV: {len} field(s) where the header has {expected_len}: \
             quote a value that has a comma (\"Kim, Minji\"), or remove the extra field"
        ),
        _ => format!("malformed CSV: {e}"),
    };
    Problem::row(line, "malformed row", what)
}

impl JsonlRows<'_> {
    /// The next line that is not blank, as [`Rows::next`] says.
    fn next(&mut self, path: &Path) -> Result<Option<Result<Row<'_>, Problem>>, InputError> {
        loop {
            self.text.clear();
            let n = self.lines + 1;
            let read = self
                .reader
                .read_line(&mut self.text)
                .map_err(|e| usage(format!("{}:{n}: cannot read: {e}", path.display())))?;
            if read == 0 {
                return Ok(None);
            }
            self.lines = n;
            if self.text.trim().is_empty() {
                continue;
            }
            return Ok(Some(match jsonl_fields(n, &self.text) {
                Ok(f) => {
                    self.fields = f;
                    Ok(Row {
                        line: n,
                        to: self.fields.get("to").map(String::as_str),
                        vars: Vars::Json(&self.fields),
                    })
                }
                Err(p) => Err(p),
            }));
        }
    }
}

/// One JSONL line's fields.
fn jsonl_fields(n: usize, text: &str) -> Result<BTreeMap<String, String>, Problem> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        Problem::row(
            n,
            "malformed row",
            format!("malformed JSON: {e}: write one object per line"),
        )
    })?;
    let serde_json::Value::Object(map) = v else {
        return Err(Problem::row(
            n,
            "malformed row",
            "expected a JSON object per line".into(),
        ));
    };
    let mut fields = BTreeMap::new();
    for (k, v) in map {
        let s = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(Problem::field(
                    n,
                    &k,
                    "malformed row",
                    format!(
                        "{} is not a string or number",
                        clip(&other.to_string(), QUOTE_MAX)
                    ),
                ))
            }
        };
        fields.insert(k, s);
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::producer::cut_file::read_recipients;
    use crate::producer::fixtures::{check, file, sms, usage_of};
    use crate::producer::Duplicates;

    #[test]
    fn rows_of_a_windows_file_are_on_their_own_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "crlf.csv",
            "to,name\r\n01000000001,a\r\n0100,b\r\n01000000003,\"two\r\nlines\"\r\n0101,c\r\n01000000001,d\r",
        );
        let m = usage_of(check(&p, 10, Duplicates::Fail));
        let lines: Vec<&str> = m.lines().collect();
        assert!(lines[0].ends_with("crlf.csv:3: field `to`: \"0100\" has 4 digits: a Korean number has 9 to 11 (e.g. 010-1234-5678, 02-123-4567): check for a missing or extra digit"), "{m}");
        assert!(lines[1].contains("crlf.csv:6: field `to`"), "{m}");
        assert!(
            lines[2].contains("crlf.csv:7: field `to`: 01000000001 repeats line 2"),
            "{m}"
        );
        let mut read = String::new();
        CrlfAsLf::new(&b"a\r\nb\rc\r"[..])
            .read_to_string(&mut read)
            .expect("read");
        assert_eq!(read, "a\nb\rc\r");
        // One byte at a time, as a reader may ask.
        let mut bytes = Vec::new();
        let mut r = CrlfAsLf::new(&b"x\r\n\r\ny\r"[..]);
        let mut one = [0u8; 1];
        while r.read(&mut one).expect("read") == 1 {
            bytes.push(one[0]);
        }
        assert_eq!(bytes, b"x\n\ny\r");
    }

    #[test]
    fn every_column_but_the_number_is_a_variable_the_last_of_a_name_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "r.csv",
            "name, to ,extra,name\nfirst, 010-1234-5678 ,x,last\n",
        );
        let r = read_recipients(&p, &sms()).expect("read");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].to, "01012345678");
        let vars: Vec<(&str, &str)> = r[0]
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(vars, [("extra", "x"), ("name", "last")]);
    }
}
