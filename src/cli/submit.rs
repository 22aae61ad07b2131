//! `groupcast submit`: reads a recipients file (CSV or JSONL) and a template,
//! validates every row first, cuts chunks and appends them. On bad input it
//! names the file, line and field, exits 2, and appends nothing.
//!
//! Memory stays flat whatever the file's size: the file is read twice, one
//! row at a time. The first reading checks every row and every chunk; the
//! second cuts and encodes the chunks on a thread of its own while the
//! previous ones are appended, several per round trip, with backpressure
//! ([`Producer`]). The batch-wide duplicate check keeps one `u64` per row
//! (the number as a number, [`number_key`]), sorted once at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::{CliError, RedisArgs};
use crate::events::chunk::{
    chunk_encoded_len, recipient_encoded_len, ChunkEncoder, KakaoTemplate, RecipientFields,
    MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use crate::events::options::{BatchOptions, Priority, QuietHours};
use crate::events::{clip, ChunkError, QUOTE_MAX};
use crate::events::{Recipient, Template};
use crate::keys::validate_batch_id;
use crate::phone;
use crate::producer::{Producer, DEFAULT_MAX_UNREAD_CHUNKS, ROUND_BYTES, ROUND_CHUNKS};

/// Submit flags.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch (campaign) id: letters, digits, '.', '_', '-'; at most 128.
    #[arg(long)]
    pub batch: String,
    /// Recipients: CSV with a header (a `to` column plus one column per
    /// template variable) or JSONL (one object per line), by extension.
    #[arg(long)]
    pub recipients: PathBuf,
    /// The message template: JSON in the provider's shape
    /// (`type`, `from`, `text` with `#{name}` placeholders, optional `kakaoOptions`).
    #[arg(long)]
    pub template: PathBuf,
    /// Recipients per chunk (1 to 10,000).
    #[arg(long, default_value_t = 1_000)]
    pub chunk_size: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Pause while the batch's ingest stream holds this many chunks that no
    /// worker has read yet (so that Redis holds the work in flight, not the
    /// whole file); 0: append everything without waiting.
    #[arg(long, default_value_t = DEFAULT_MAX_UNREAD_CHUNKS)]
    pub max_unread_chunks: u64,
    /// Send no group before this instant (RFC 3339 with an offset, e.g.
    /// `2026-12-01T18:00:00+09:00`). Groups are created and filled as chunks
    /// arrive; a generation ready after it goes at once.
    #[arg(long, value_name = "RFC3339")]
    pub send_at: Option<String>,
    /// The batch's lane: `urgent` work goes ahead of `normal` (the default),
    /// `normal` ahead of `bulk`.
    #[arg(long, value_parser = ["urgent", "normal", "bulk"])]
    pub priority: Option<String>,
    /// A daily window in which nothing is sent, `HH:MM-HH:MM` (in
    /// `--timezone`; across midnight when the start is after the end, e.g.
    /// `21:00-08:00`): a send that would fall inside waits for its end.
    #[arg(long, value_name = "HH:MM-HH:MM")]
    pub quiet_hours: Option<String>,
    /// The IANA time zone of `--quiet-hours`, e.g. `Asia/Seoul` (default:
    /// this machine's zone).
    #[arg(long, value_name = "IANA")]
    pub timezone: Option<String>,
}

/// The batch options from the flags, checked.
pub fn batch_options(args: &SubmitArgs) -> Result<BatchOptions, CliError> {
    let quiet_hours = match (&args.quiet_hours, &args.timezone) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(usage(
                "--timezone is the zone of --quiet-hours: give --quiet-hours too".into(),
            ))
        }
        (Some(window), tz) => {
            let Some((start, end)) = window.split_once('-') else {
                return Err(usage(format!(
                    "--quiet-hours {window:?}: expected HH:MM-HH:MM, e.g. 21:00-08:00"
                )));
            };
            let tz = match tz {
                Some(tz) => tz.clone(),
                None => jiff::tz::TimeZone::system()
                    .iana_name()
                    .map(str::to_string)
                    .ok_or_else(|| {
                        usage(
                            "--quiet-hours: this machine's time zone has no IANA name: pass --timezone (e.g. Asia/Seoul)"
                                .into(),
                        )
                    })?,
            };
            Some(QuietHours {
                start: start.trim().into(),
                end: end.trim().into(),
                tz,
            })
        }
    };
    let options = BatchOptions {
        send_at: args.send_at.clone(),
        priority: args.priority.as_deref().and_then(Priority::parse),
        quiet_hours,
    };
    options.resolve().map_err(|e| usage(e.to_string()))?;
    Ok(options)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TemplateFile {
    #[serde(rename = "type")]
    kind: String,
    from: String,
    text: String,
    #[serde(default)]
    kakao_options: Option<KakaoFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KakaoFile {
    pf_id: String,
    template_id: String,
}

fn usage(msg: String) -> CliError {
    CliError::Usage(msg)
}

/// The largest template file read: room for a text of [`MAX_TEXT_CHARS`]
/// characters, each escaped as `\uXXXX`, and the other fields.
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 64 * 1024;

/// Reads and checks a template file.
pub fn read_template(path: &Path) -> Result<Template, CliError> {
    let cannot = |e: std::io::Error| usage(format!("{}: cannot read: {e}", path.display()));
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(MAX_TEMPLATE_FILE_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(cannot)?;
    if text.len() as u64 > MAX_TEMPLATE_FILE_BYTES {
        return Err(usage(format!(
            "{}: the template file is over {MAX_TEMPLATE_FILE_BYTES} bytes (its text may have at most {MAX_TEXT_CHARS} characters)",
            path.display()
        )));
    }
    let t: TemplateFile = serde_json::from_str(&text).map_err(|e| {
        usage(format!(
            "{}:{}: not a template ({e}); expected {{\"type\": \"ATA\", \"from\": \"...\", \"text\": \"...\", \"kakaoOptions\": {{\"pfId\": \"...\", \"templateId\": \"...\"}}}}",
            path.display(),
            e.line()
        ))
    })?;
    let template = Template {
        kind: t.kind,
        from: t.from,
        text: t.text,
        kakao_options: t.kakao_options.map(|k| KakaoTemplate {
            pf_id: k.pf_id,
            template_id: k.template_id,
        }),
    };
    template
        .validate()
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok(template)
}

/// Reads and validates every recipient row, and returns them all (for
/// tests and small files: `submit` itself never holds the whole file).
pub fn read_recipients(path: &Path, template: &Template) -> Result<Vec<Recipient>, CliError> {
    let mut input = Input::open(path)?;
    check_recipients(&mut input, template, &BatchOptions::default(), None)?;
    let mut rows = Rows::new(&mut input)?;
    let mut number = String::new();
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        row.number(path, &mut number)?;
        out.push(Recipient {
            to: number.clone(),
            vars: row
                .vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
    }
    Ok(out)
}

/// A recipients file, open: read from the start by each [`Rows`].
struct Input {
    /// The name given, for messages.
    path: PathBuf,
    file: File,
    format: Format,
}

/// A recipients file's format, by its extension.
#[derive(Debug, Clone, Copy)]
enum Format {
    /// CSV with a header.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl Input {
    /// Opens the file. What cannot be read twice (a pipe, `/dev/stdin`) is
    /// copied into an unnamed temporary file first.
    fn open(path: &Path) -> Result<Input, CliError> {
        let cannot = |e: std::io::Error| usage(format!("{}: cannot read: {e}", path.display()));
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let format = match ext.as_str() {
            "csv" => Format::Csv,
            "jsonl" | "ndjson" | "json" => Format::Jsonl,
            other => {
                return Err(usage(format!(
                    "{}: unknown recipients format {other:?}: use .csv (with a header) or .jsonl",
                    path.display()
                )))
            }
        };
        let mut file = File::open(path).map_err(cannot)?;
        if !file.metadata().map_err(cannot)?.is_file() {
            file = spool(&mut file).map_err(cannot)?;
        }
        Ok(Input {
            path: path.to_path_buf(),
            file,
            format,
        })
    }

    /// The file's size and modification time, to notice a change between
    /// the two readings.
    fn stamp(&self) -> Option<(u64, std::time::SystemTime)> {
        let m = self.file.metadata().ok()?;
        Some((m.len(), m.modified().ok()?))
    }
}

/// Copies `from` into a temporary file that has no name (removed as soon as
/// it is created, so that nothing is left behind), positioned at its start.
fn spool(from: &mut File) -> std::io::Result<File> {
    let path = std::env::temp_dir().join(format!(
        "groupcast-submit-{}-{}",
        std::process::id(),
        ulid::Ulid::new()
    ));
    let mut to = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    std::io::copy(from, &mut to)?;
    to.rewind()?;
    Ok(to)
}

/// One row of a recipients file, borrowed from the reader until the next.
struct Row<'r> {
    line: usize,
    /// The `to` field as written.
    to: Option<&'r str>,
    vars: Vars<'r>,
}

/// A row's fields other than `to`, by name: the template's variables.
#[derive(Clone, Copy)]
enum Vars<'r> {
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
    fn get(self, name: &str) -> Option<&'r str> {
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

    fn len(self) -> usize {
        match self {
            Vars::Csv { columns, .. } => columns.len(),
            Vars::Json(fields) => fields.len() - usize::from(fields.contains_key("to")),
        }
    }

    /// In name order.
    fn iter(self) -> impl Iterator<Item = (&'r str, &'r str)> {
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
struct RowRecipient<'a> {
    to: &'a str,
    vars: Vars<'a>,
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
    /// Writes the row's number into `out` (without spaces around or
    /// dashes) and checks it.
    fn number(&self, path: &Path, out: &mut String) -> Result<(), CliError> {
        let to = self
            .to
            .ok_or_else(|| field_error(path, self.line, "to", "missing".into()))?;
        out.clear();
        out.extend(to.trim().chars().filter(|&c| c != '-'));
        if !phone::is_valid_number(out) {
            return Err(field_error(
                path,
                self.line,
                "to",
                format!(
                    "{:?} is not a valid phone number (digits only, 9 to 11, starting with 0)",
                    clip(out, QUOTE_MAX)
                ),
            ));
        }
        Ok(())
    }

    /// Checks that the row has every variable the template uses, none too
    /// long.
    fn check_vars(&self, path: &Path, names: &[String]) -> Result<(), CliError> {
        for n in names {
            match self.vars.get(n) {
                None => {
                    return Err(field_error(
                        path,
                        self.line,
                        n,
                        format!("missing; the template uses #{{{n}}}"),
                    ))
                }
                Some(v) if v.len() > MAX_VAR_CHARS && v.chars().count() > MAX_VAR_CHARS => {
                    return Err(field_error(
                        path,
                        self.line,
                        n,
                        format!("longer than {MAX_VAR_CHARS} characters"),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The rows of a recipients file, one at a time, from its start.
struct Rows<'a> {
    path: &'a Path,
    source: Source<'a>,
}

enum Source<'a> {
    Csv {
        reader: csv::Reader<&'a File>,
        /// The index of the `to` column (the last one of that name).
        to: usize,
        /// Every other column: its name (trimmed) and index.
        columns: Vec<(String, usize)>,
        record: csv::StringRecord,
        /// Records read so far.
        records: usize,
    },
    Jsonl {
        reader: BufReader<&'a File>,
        text: String,
        fields: BTreeMap<String, String>,
        /// Lines read so far.
        lines: usize,
    },
}

/// The read buffer: large reads, few system calls.
const READ_BUFFER: usize = 256 * 1024;

impl<'a> Rows<'a> {
    /// Starts reading `input` from its beginning (for a CSV, its header).
    fn new(input: &'a mut Input) -> Result<Rows<'a>, CliError> {
        let path = input.path.as_path();
        input
            .file
            .rewind()
            .map_err(|e| usage(format!("{}: cannot read: {e}", path.display())))?;
        let file = &input.file;
        let source = match input.format {
            Format::Csv => {
                let mut reader = csv::ReaderBuilder::new()
                    .flexible(false)
                    .buffer_capacity(READ_BUFFER)
                    .from_reader(file);
                let headers = reader.headers().map_err(|e| {
                    usage(format!("{}:1: unreadable CSV header: {e}", path.display()))
                })?;
                // By name, the last column of each name.
                let by_name: BTreeMap<String, usize> = headers
                    .iter()
                    .enumerate()
                    .map(|(i, h)| (h.trim().to_string(), i))
                    .collect();
                let Some(&to) = by_name.get("to") else {
                    return Err(usage(format!(
                        "{}:1: the header has no `to` column",
                        path.display()
                    )));
                };
                Source::Csv {
                    reader,
                    to,
                    columns: by_name.into_iter().filter(|(n, _)| n != "to").collect(),
                    record: csv::StringRecord::new(),
                    records: 0,
                }
            }
            Format::Jsonl => Source::Jsonl {
                reader: BufReader::with_capacity(READ_BUFFER, file),
                text: String::new(),
                fields: BTreeMap::new(),
                lines: 0,
            },
        };
        Ok(Rows { path, source })
    }

    /// The next row, if any.
    fn next(&mut self) -> Result<Option<Row<'_>>, CliError> {
        let path = self.path;
        match &mut self.source {
            Source::Csv {
                reader,
                to,
                columns,
                record,
                records,
            } => {
                let line = *records + 2;
                let more = reader.read_record(record).map_err(|e| {
                    let line = e.position().map(|p| p.line() as usize).unwrap_or(line);
                    usage(format!("{}:{line}: malformed CSV: {e}", path.display()))
                })?;
                if !more {
                    return Ok(None);
                }
                *records += 1;
                Ok(Some(Row {
                    line,
                    to: record.get(*to),
                    vars: Vars::Csv { record, columns },
                }))
            }
            Source::Jsonl {
                reader,
                text,
                fields,
                lines,
            } => loop {
                text.clear();
                let n = *lines + 1;
                let read = reader
                    .read_line(text)
                    .map_err(|e| usage(format!("{}:{n}: cannot read: {e}", path.display())))?;
                if read == 0 {
                    return Ok(None);
                }
                *lines = n;
                if text.trim().is_empty() {
                    continue;
                }
                *fields = jsonl_fields(path, n, text)?;
                return Ok(Some(Row {
                    line: n,
                    to: fields.get("to").map(String::as_str),
                    vars: Vars::Json(fields),
                }));
            },
        }
    }
}

/// One JSONL line's fields.
fn jsonl_fields(path: &Path, n: usize, text: &str) -> Result<BTreeMap<String, String>, CliError> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| usage(format!("{}:{n}: malformed JSON: {e}", path.display())))?;
    let serde_json::Value::Object(map) = v else {
        return Err(usage(format!(
            "{}:{n}: expected a JSON object per line",
            path.display()
        )));
    };
    let mut fields = BTreeMap::new();
    for (k, v) in map {
        let s = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(usage(format!(
                    "{}:{n}: field `{}`: {} is not a string or number",
                    path.display(),
                    clip(&k, QUOTE_MAX),
                    clip(&other.to_string(), QUOTE_MAX)
                )))
            }
        };
        fields.insert(k, s);
    }
    Ok(fields)
}

/// The error for `field` of line `line`.
fn field_error(path: &Path, line: usize, field: &str, what: String) -> CliError {
    usage(format!(
        "{}:{line}: field `{field}`: {what}",
        path.display()
    ))
}

/// A valid number (9 to 11 ASCII digits) as one `u64`: its digits, and its
/// length above them, since `0212345678` and `00212345678` differ.
fn number_key(to: &str) -> u64 {
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
struct Checked {
    recipients: usize,
    chunks: u32,
    /// The largest encoded chunk, in bytes.
    largest_chunk: usize,
    /// A sum over the rows' numbers, order-independent.
    fingerprint: u64,
}

/// Adds a number to a fingerprint.
fn fingerprint(sum: u64, key: u64) -> u64 {
    sum.wrapping_add(key.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Checks every row and, given a batch and a chunk size, every chunk: the
/// first bad row in file order (a repeated number included), else the first
/// chunk too large.
fn check_recipients(
    input: &mut Input,
    template: &Template,
    options: &BatchOptions,
    chunking: Option<(&str, usize)>,
) -> Result<Checked, CliError> {
    let (batch, size) = chunking.unwrap_or(("", usize::MAX));
    let names = template.placeholders();
    // One per row: 8 bytes, where a set of the numbers as strings took ten
    // times that.
    let mut numbers: Vec<u64> = Vec::with_capacity(rows_at_most(input));
    let mut checked = Checked {
        recipients: 0,
        chunks: 0,
        largest_chunk: 0,
        fingerprint: 0,
    };
    let mut too_large: Option<CliError> = None;
    let (mut in_chunk, mut chunk_bytes) = (0usize, 0usize);
    let mut end_chunk = |checked: &mut Checked, n: usize, bytes: usize| {
        if chunking.is_none() {
            return;
        }
        // `last` is one byte either way: the size does not depend on it.
        let len = chunk_encoded_len(batch, checked.chunks, false, template, options, n, bytes);
        checked.largest_chunk = checked.largest_chunk.max(len);
        if len > MAX_CHUNK_BYTES && too_large.is_none() {
            too_large = Some(usage(format!(
                "chunk {}: {}: lower --chunk-size",
                checked.chunks,
                ChunkError::TooLarge(len)
            )));
        }
        checked.chunks += 1;
    };
    let scanned = (|| {
        let path = input.path.clone();
        let mut rows = Rows::new(input)?;
        let mut number = String::new();
        while let Some(row) = rows.next()? {
            row.number(&path, &mut number)?;
            let key = number_key(&number);
            numbers.push(key);
            row.check_vars(&path, &names)?;
            checked.recipients += 1;
            checked.fingerprint = fingerprint(checked.fingerprint, key);
            in_chunk += 1;
            chunk_bytes += recipient_encoded_len(&RowRecipient {
                to: &number,
                vars: row.vars,
            });
            if in_chunk == size {
                end_chunk(&mut checked, in_chunk, chunk_bytes);
                (in_chunk, chunk_bytes) = (0, 0);
            }
        }
        if in_chunk > 0 {
            end_chunk(&mut checked, in_chunk, chunk_bytes);
        }
        Ok::<(), CliError>(())
    })();
    // A number repeated before the first bad row is the first error, as it
    // would have been found first reading row by row with every number at
    // hand.
    if let Err(e) = scanned {
        return Err(first_repeat(input, &mut numbers).unwrap_or(e));
    }
    if let Some(e) = first_repeat(input, &mut numbers) {
        return Err(e);
    }
    if checked.recipients == 0 {
        return Err(usage(format!(
            "{}: no recipients in the file",
            input.path.display()
        )));
    }
    match too_large {
        Some(e) => Err(e),
        None => Ok(checked),
    }
}

/// The first row (in file order) whose number an earlier row has, among
/// the rows whose numbers are `numbers` (sorted here): `None` when they are
/// all different. Only then is the file read again, for the lines.
fn first_repeat(input: &mut Input, numbers: &mut [u64]) -> Option<CliError> {
    numbers.sort_unstable();
    let repeated: HashSet<u64> = numbers
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if repeated.is_empty() {
        return None;
    }
    let path = input.path.clone();
    let mut first_lines: HashMap<u64, usize> = HashMap::new();
    let mut rows = Rows::new(input).ok()?;
    let mut number = String::new();
    while let Ok(Some(row)) = rows.next() {
        if row.number(&path, &mut number).is_err() {
            continue;
        }
        let key = number_key(&number);
        if !repeated.contains(&key) {
            continue;
        }
        if let Some(first) = first_lines.insert(key, row.line) {
            return Some(field_error(
                &path,
                row.line,
                "to",
                format!("{number} repeats line {first}"),
            ));
        }
    }
    None
}

/// Reads the checked file again and sends its chunks, encoded, to `out`, in
/// order. The last chunk is sent only once the whole file has been read
/// again and found the same as when it was checked.
fn cut_recipients(
    input: &mut Input,
    batch: &str,
    (template, options): (&Template, &BatchOptions),
    size: usize,
    checked: &Checked,
    out: &tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), CliError> {
    let path = input.path.clone();
    let changed = |what: &str| {
        CliError::Failed(format!(
            "{}: the file changed while it was submitted ({what}); the batch's last chunk was not appended, so it will not complete: submit the file again under another batch id",
            path.display()
        ))
    };
    // Stopped early: the appending side gave up (and says why).
    let stopped = || CliError::Failed("submit stopped".into());
    let last_seq = checked.chunks.saturating_sub(1);
    let start = |seq: u32| {
        let n = if seq < last_seq {
            size
        } else {
            checked.recipients - size * last_seq as usize
        };
        ChunkEncoder::new(
            batch,
            seq,
            seq == last_seq,
            template,
            options,
            n,
            checked.largest_chunk,
        )
    };
    let mut seen = Checked {
        recipients: 0,
        chunks: 0,
        largest_chunk: checked.largest_chunk,
        fingerprint: 0,
    };
    let mut chunk = start(0);
    let mut in_chunk = 0;
    let mut last = None;
    {
        let mut rows = Rows::new(input).map_err(|_| changed("unreadable"))?;
        let mut number = String::new();
        while let Some(row) = rows.next().map_err(|_| changed("a row is now bad"))? {
            row.number(&path, &mut number)
                .map_err(|_| changed("a row is now bad"))?;
            if seen.chunks > last_seq {
                return Err(changed("more rows"));
            }
            seen.recipients += 1;
            seen.fingerprint = fingerprint(seen.fingerprint, number_key(&number));
            chunk.push(&RowRecipient {
                to: &number,
                vars: row.vars,
            });
            in_chunk += 1;
            if in_chunk == size || seen.recipients == checked.recipients {
                let full = std::mem::replace(&mut chunk, start(seen.chunks + 1));
                let bytes = full.finish().ok_or_else(|| changed("other rows"))?;
                if seen.chunks == last_seq {
                    last = Some(bytes);
                } else {
                    out.blocking_send(bytes).map_err(|_| stopped())?;
                }
                seen.chunks += 1;
                in_chunk = 0;
            }
        }
    }
    match last {
        Some(bytes) if seen == *checked => {
            out.blocking_send(bytes).map_err(|_| stopped())?;
            Ok(())
        }
        _ => Err(changed("other rows")),
    }
}

/// Refuses to submit to a batch that takes no more chunks (reported,
/// cancelled, or reported with its events expired): its chunks would only
/// be refused by the workers and end in the dead letters, while `submit`
/// said it submitted them.
async fn refuse_an_ended_batch(store: &crate::store::Store, b: &str) -> Result<(), CliError> {
    use crate::projection::field;
    let p = store
        .batch(b)
        .read(&[field::REPORT.into(), field::CANCELLED.into()])
        .await?;
    let ended = if let Some(why) = p.cancelled() {
        format!("was cancelled ({why})")
    } else if let Some(outcome) = p.report() {
        format!("was already reported ({outcome})")
    } else if store.is_tombstoned(b).await? {
        "was already reported (its events have expired)".into()
    } else {
        return Ok(());
    };
    Err(CliError::Failed(format!(
        "batch {b} {ended}: it takes no more chunks; submit them under a new batch id"
    )))
}

/// Runs submit.
pub async fn run(args: SubmitArgs) -> Result<(), CliError> {
    validate_batch_id(&args.batch).map_err(|e| usage(format!("--batch {:?}: {e}", args.batch)))?;
    if args.chunk_size == 0 || args.chunk_size > MAX_CHUNK_RECIPIENTS {
        return Err(usage(format!(
            "--chunk-size {}: must be between 1 and {MAX_CHUNK_RECIPIENTS} (one provider request)",
            args.chunk_size
        )));
    }
    let template = read_template(&args.template)?;
    let options = batch_options(&args)?;
    let mut input = Input::open(&args.recipients)?;
    let (batch, size) = (args.batch.clone(), args.chunk_size);
    let (input, template, options, checked) = tokio::task::spawn_blocking(move || {
        let checked = check_recipients(&mut input, &template, &options, Some((&batch, size)))?;
        Ok::<_, CliError>((input, template, options, checked))
    })
    .await
    .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")))??;
    let stamp = input.stamp();

    let store = args.redis.connect().await?;
    refuse_an_ended_batch(&store, &args.batch).await?;
    let shard = store.keys.shard_of(&args.batch);
    let lane = options.priority();
    let stream = store.keys.ingest_in(shard, lane);
    let json = args.json;
    let mut told = false;
    let mut producer = Producer::new(store)
        .max_unread(args.max_unread_chunks)
        .on_wait(move |w| {
            if !told && w.waited >= TELL_WAIT_AFTER {
                told = true;
                eprintln!(
                    "groupcast: waiting: {} chunks unread in {} (--max-unread-chunks {}); is a `groupcast worker` running?",
                    w.unread, w.stream, w.max_unread
                );
            }
        });
    let bar = if std::io::stderr().is_terminal() && !json {
        let b = indicatif::ProgressBar::new(u64::from(checked.chunks));
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} chunks {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };

    // Room for about ROUND_BYTES of encoded chunks between the reader and
    // the appender (at least one round of small chunks).
    let per_round = (ROUND_BYTES / checked.largest_chunk.max(1)).clamp(1, ROUND_CHUNKS);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(per_round);
    let (batch, size, expected) = (args.batch.clone(), args.chunk_size, checked.clone());
    let reader = tokio::task::spawn_blocking(move || {
        let mut input = input;
        if input.stamp() != stamp {
            return Err(CliError::Failed(format!(
                "{}: the file changed while it was submitted; nothing was appended",
                input.path.display()
            )));
        }
        cut_recipients(
            &mut input,
            &batch,
            (&template, &options),
            size,
            &expected,
            &tx,
        )
    });
    let mut round = Vec::with_capacity(per_round);
    let appended = async {
        while let Some(first) = rx.recv().await {
            round.push(first);
            // Whatever else is ready goes in the same round trip.
            while round.len() < per_round {
                match rx.try_recv() {
                    Ok(p) => round.push(p),
                    Err(_) => break,
                }
            }
            let n = round.len() as u64;
            producer
                .append_encoded(shard, lane, std::mem::take(&mut round))
                .await?;
            if let Some(b) = &bar {
                b.inc(n);
            }
        }
        Ok::<(), CliError>(())
    }
    .await;
    // Dropping the receiver stops the reader if the appending failed.
    drop(rx);
    let read = reader
        .await
        .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")));
    appended?;
    read??;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let (total, chunks) = (checked.recipients, checked.chunks);
    if json {
        println!(
            "{}",
            serde_json::json!({"batch": args.batch, "recipients": total, "chunks": chunks, "stream": stream})
        );
    } else {
        println!(
            "submitted batch {}: {total} recipients in {chunks} chunks to {stream}",
            args.batch,
        );
    }
    Ok(())
}

/// How long submit waits for the workers before it says so.
const TELL_WAIT_AFTER: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Chunk;

    fn sms() -> Template {
        Template {
            kind: "SMS".into(),
            from: "0212345678".into(),
            text: "Hi #{name}".into(),
            kakao_options: None,
        }
    }

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn usage_of(r: Result<Vec<Recipient>, CliError>) -> String {
        match r {
            Err(CliError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn numbers_of_different_lengths_have_different_keys() {
        assert_ne!(number_key("0212345678"), number_key("00212345678"));
        assert_ne!(number_key("021234567"), number_key("0021234567"));
        assert_eq!(number_key("01099999999"), number_key("01099999999"));
    }

    #[test]
    fn a_repeat_far_apart_is_found_with_both_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        for i in 0..5_000 {
            csv.push_str(&format!("010{i:08},n\n"));
        }
        csv.push_str("010-0000-0007,again\n");
        let p = file(dir.path(), "r.csv", &csv);
        let m = usage_of(read_recipients(&p, &sms()));
        assert!(
            m.ends_with(":5002: field `to`: 01000000007 repeats line 9"),
            "{m}"
        );
    }

    #[test]
    fn the_first_error_in_file_order_wins_repeats_included() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A repeat on line 4, a missing variable on line 5: the repeat.
        let p = file(
            dir.path(),
            "a.jsonl",
            "{\"to\": \"01000000001\", \"name\": \"a\"}\n\
             {\"to\": \"01000000002\", \"name\": \"b\"}\n\
             {\"to\": \"01000000001\", \"name\": \"c\"}\n\
             \n\
             {\"to\": \"01000000003\"}\n",
        );
        let m = usage_of(read_recipients(&p, &sms()));
        assert!(
            m.ends_with(":3: field `to`: 01000000001 repeats line 1"),
            "{m}"
        );
        // A malformed line before any repeat: the malformed line.
        let p = file(
            dir.path(),
            "b.csv",
            "to,name\n01000000001,a\n01000000002,b,c\n01000000001,d\n",
        );
        let m = usage_of(read_recipients(&p, &sms()));
        assert!(m.contains("b.csv:3: malformed CSV"), "{m}");
        // A repeat and a missing variable on the same line: the repeat.
        let p = file(
            dir.path(),
            "c.jsonl",
            "{\"to\": \"01000000001\", \"name\": \"a\"}\n{\"to\": \"01000000001\"}\n",
        );
        let m = usage_of(read_recipients(&p, &sms()));
        assert!(
            m.ends_with(":2: field `to`: 01000000001 repeats line 1"),
            "{m}"
        );
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

    #[test]
    fn chunks_are_counted_and_sized_as_they_will_be_encoded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        for i in 0..25 {
            csv.push_str(&format!("010{i:08},name{i}\n"));
        }
        let p = file(dir.path(), "r.csv", &csv);
        let mut input = Input::open(&p).expect("open");
        let checked = check_recipients(
            &mut input,
            &sms(),
            &BatchOptions::default(),
            Some(("b", 10)),
        )
        .expect("check");
        assert_eq!((checked.recipients, checked.chunks), (25, 3));
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        cut_recipients(
            &mut input,
            "b",
            (&sms(), &BatchOptions::default()),
            10,
            &checked,
            &tx,
        )
        .expect("cut");
        drop(tx);
        let mut sizes = Vec::new();
        let mut seqs = Vec::new();
        while let Ok(p) = rx.try_recv() {
            let c = Chunk::decode(&p).expect("decode");
            c.validate().expect("valid");
            seqs.push((c.seq, c.last, c.recipients.len()));
            sizes.push(p.len());
        }
        assert_eq!(seqs, [(0, false, 10), (1, false, 10), (2, true, 5)]);
        assert_eq!(checked.largest_chunk, sizes.into_iter().max().unwrap_or(0));
    }

    #[test]
    fn a_file_changed_between_the_readings_keeps_the_last_chunk_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "r.csv",
            "to,name\n01000000001,a\n01000000002,b\n",
        );
        let mut input = Input::open(&p).expect("open");
        let checked =
            check_recipients(&mut input, &sms(), &BatchOptions::default(), Some(("b", 1)))
                .expect("check");
        std::fs::write(&p, "to,name\n01000000001,a\n01000000003,b\n").expect("rewrite");
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let e = cut_recipients(
            &mut input,
            "b",
            (&sms(), &BatchOptions::default()),
            1,
            &checked,
            &tx,
        )
        .expect_err("changed");
        assert!(e.to_string().contains("changed"), "{e}");
        drop(tx);
        let mut sent = Vec::new();
        while let Ok(p) = rx.try_recv() {
            sent.push(Chunk::decode(&p).expect("decode").last);
        }
        assert_eq!(sent, [false], "only the first chunk, never the last");
    }
}
