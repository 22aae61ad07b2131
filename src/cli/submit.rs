//! `groupcast submit`: reads a recipients file (CSV or JSONL) and a template,
//! checks every row first, cuts chunks and appends them. On bad input it
//! lists every problem of the file in one run (file, line, field, what to
//! do: the first [`LISTED`], then a count by kind), exits 2, and appends
//! nothing.
//!
//! Files are taken as people's tools write them: UTF-8 with or without a
//! byte order mark, or EUC-KR/CP949 (Excel's plain "CSV" on a Korean
//! Windows, most Korean CRMs' exports), detected or named by `--encoding`.
//! Numbers are normalised ([`phone::normalize_into`]): the normal form is
//! what is checked, deduplicated, stored and sent. A number that an earlier
//! row has is sent once: the later rows are dropped and counted (or listed
//! as problems with `--duplicates fail`).
//!
//! Memory stays flat whatever the file's size: the file is read twice, one
//! row at a time (a file not known to be EUC-KR is first validated as UTF-8
//! in one streaming pass; one that is not is transcoded once, see
//! [`decode`]). The first reading checks every row and every chunk; the
//! second cuts and encodes the chunks on a thread of its own while the
//! previous ones are appended, several per round trip, with backpressure
//! ([`Producer`]). The batch-wide duplicate check keeps one `u64` per row
//! (the number as a number, [`number_key`]), sorted once at the end; only
//! when some number repeats is the file read once more in between, to find
//! the repeated rows' lines (and, when they are dropped, to count the
//! chunks without them), keeping the repeated numbers alone.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use encoding_rs::{DecoderResult, Encoding, EUC_KR, UTF_8};
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
use crate::phone::{self, Normalized};
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
    /// Numbers may be written as people write them (`+82 10-1234-5678`,
    /// `010 1234 5678`, `1012345678`): they are normalised to `01012345678`.
    #[arg(long)]
    pub recipients: PathBuf,
    /// The recipients file's encoding: `auto` reads UTF-8 (with or without
    /// a byte order mark) and takes a file that is not UTF-8 for
    /// EUC-KR/CP949, as Excel and Korean CRMs save it.
    #[arg(long, value_enum, default_value_t = FileEncoding::Auto)]
    pub encoding: FileEncoding,
    /// A number that an earlier row of the file has (once normalised):
    /// `drop` the later rows (they are counted and reported; the number is
    /// sent once), or `fail` (they are listed as problems and nothing is
    /// appended).
    #[arg(long, value_enum, default_value_t = Duplicates::Drop)]
    pub duplicates: Duplicates,
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
    /// `2026-12-01T18:00:00+09:00`), at most 5 minutes in the past and 90
    /// days ahead. Groups are created and filled as chunks arrive; a
    /// generation ready after it goes at once.
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

/// The encoding of a recipients file (`--encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileEncoding {
    /// UTF-8 when the whole file is valid UTF-8 (or UTF-16 with its byte
    /// order mark), else EUC-KR/CP949.
    Auto,
    /// UTF-8, with or without a byte order mark.
    #[value(name = "utf-8", alias = "utf8")]
    Utf8,
    /// EUC-KR with its Windows extension CP949 (what the WHATWG Encoding
    /// standard calls EUC-KR): all 11,172 Hangul syllables.
    #[value(name = "euc-kr", alias = "cp949")]
    EucKr,
}

/// What `submit` does with a number that an earlier row has (`--duplicates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Duplicates {
    /// The later rows are dropped, counted and reported.
    Drop,
    /// The later rows are problems: nothing is appended.
    Fail,
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

/// How far in the past `--send-at` may be: a time typed a moment ago, or
/// "now" from a script, still goes (at once).
pub const SEND_AT_GRACE: Duration = Duration::from_secs(5 * 60);
/// How far ahead `--send-at` may be: beyond it a typo (2099 for 2026) is
/// far likelier than a plan, and the batch would hold its work that long.
pub const SEND_AT_HORIZON: Duration = Duration::from_secs(90 * 24 * 3600);

/// Checks `--send-at` (`send_at_ms`, Unix ms) against the clock reading
/// `now_ms`: at most [`SEND_AT_GRACE`] in the past and [`SEND_AT_HORIZON`]
/// ahead. The error says which bound and what to do.
pub fn check_send_at(send_at_ms: i64, now_ms: i64) -> Result<(), String> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let now = jiff::Timestamp::from_millisecond(now_ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{now_ms} ms"));
    if send_at_ms < now_ms.saturating_sub(ms(SEND_AT_GRACE)) {
        return Err(format!(
            "is in the past (now is {now} on the Redis server's clock), more than the 5 minutes allowed: \
             give a time to come, or leave --send-at out to send at once"
        ));
    }
    if send_at_ms > now_ms.saturating_add(ms(SEND_AT_HORIZON)) {
        return Err(format!(
            "is more than 90 days ahead (now is {now} on the Redis server's clock), the furthest allowed: \
             check the date (the year?), or submit the batch closer to its time"
        ));
    }
    Ok(())
}

/// Refuses a `--send-at` out of [`check_send_at`]'s bounds, on the clock
/// the workers hold the batch by: the Redis server's of its shard.
async fn refuse_a_far_send_at(
    store: &crate::store::Store,
    shard: u32,
    options: &BatchOptions,
) -> Result<(), CliError> {
    let (Some(text), Ok(window)) = (&options.send_at, options.resolve()) else {
        return Ok(());
    };
    let Some(at) = window.send_at else {
        return Ok(());
    };
    let now = store.shard_time_ms(shard).await?;
    check_send_at(at, i64::try_from(now).unwrap_or(i64::MAX))
        .map_err(|why| usage(format!("--send-at {text} {why}")))
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

/// Reads and validates every recipient row, and returns those that would
/// be sent (numbers normalised, later rows of a repeated number dropped),
/// for tests and small files: `submit` itself never holds the whole file.
pub fn read_recipients(path: &Path, template: &Template) -> Result<Vec<Recipient>, CliError> {
    let mut input = Input::open(path, FileEncoding::Auto)?;
    let scan = check_recipients(
        &mut input,
        template,
        &BatchOptions::default(),
        None,
        Duplicates::Drop,
    )?;
    let mut out = Vec::new();
    for_each_kept(
        &mut input,
        &scan.repeated,
        |what| usage(format!("{}: {what}", path.display())),
        |r, _| {
            out.push(Recipient {
                to: r.to.to_string(),
                vars: r
                    .vars
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            });
            Ok(())
        },
    )?;
    Ok(out)
}

/// A recipients file, open: read from the start by each [`Rows`].
#[derive(Debug)]
struct Input {
    /// The name given, for messages.
    path: PathBuf,
    /// UTF-8: the file itself, or a temporary copy of it.
    file: File,
    format: Format,
    /// Where the rows begin in `file`: past a UTF-8 byte order mark.
    start: u64,
    /// The encoding the file was read in.
    encoding: &'static Encoding,
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
    /// copied into an unnamed temporary file first, and so is a file that
    /// is not UTF-8, decoded ([`decode`]).
    fn open(path: &Path, encoding: FileEncoding) -> Result<Input, CliError> {
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
        let (file, start, encoding) = decode(path, file, encoding)?;
        Ok(Input {
            path: path.to_path_buf(),
            file,
            format,
            start,
            encoding,
        })
    }

    /// The file's size and modification time, to notice a change between
    /// the two readings.
    fn stamp(&self) -> Option<(u64, std::time::SystemTime)> {
        let m = self.file.metadata().ok()?;
        Some((m.len(), m.modified().ok()?))
    }
}

/// A temporary file that has no name (removed as soon as it is created, so
/// that nothing is left behind).
fn unnamed_temp_file() -> std::io::Result<File> {
    let path = std::env::temp_dir().join(format!(
        "groupcast-submit-{}-{}",
        std::process::id(),
        ulid::Ulid::new()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Copies `from` into an unnamed temporary file, positioned at its start.
fn spool(from: &mut File) -> std::io::Result<File> {
    let mut to = unnamed_temp_file()?;
    std::io::copy(from, &mut to)?;
    to.rewind()?;
    Ok(to)
}

/// How a recipients file is read, by `choice`: the file itself when it is
/// UTF-8 (its rows past a byte order mark: the returned offset), else a
/// copy transcoded to UTF-8; and the encoding it was read in.
///
/// Why a transcoded copy rather than a decoding reader under each reading:
/// the file is read twice or three times (checked, repeats looked up, cut),
/// and every reading, the CSV and JSON readers, and the check that the file
/// did not change in between then work on UTF-8 bytes as they do for a
/// UTF-8 file, with one code path; decoding happens once. The copy costs
/// disk (1.5 times the file for Hangul, 2 bytes in EUC-KR and 3 in UTF-8),
/// not memory, as the copy of a pipe does. A UTF-8 file is not copied: it
/// is validated in one streaming pass first, which also decides `auto`.
fn decode(
    path: &Path,
    mut file: File,
    choice: FileEncoding,
) -> Result<(File, u64, &'static Encoding), CliError> {
    let cannot = |e: std::io::Error| usage(format!("{}: cannot read: {e}", path.display()));
    let mut head = Vec::with_capacity(3);
    (&mut file).take(3).read_to_end(&mut head).map_err(cannot)?;
    file.rewind().map_err(cannot)?;
    let bom = Encoding::for_bom(&head);
    let malformed = match (choice, bom) {
        (FileEncoding::EucKr, _) => None,
        // UTF-16 says so with its mark (Excel's "Unicode text"): no guess.
        (FileEncoding::Auto, Some((enc, _))) if enc != UTF_8 => {
            return transcode_or_refuse(path, file, enc, "")
        }
        _ => Some(first_invalid_utf8(&mut file).map_err(cannot)?),
    };
    match malformed {
        Some(None) => {
            let start = match bom {
                Some((enc, len)) if enc == UTF_8 => len as u64,
                _ => 0,
            };
            Ok((file, start, UTF_8))
        }
        Some(Some(at)) if choice == FileEncoding::Utf8 => {
            let line = line_of(&mut file, at).map_err(cannot)?;
            Err(usage(format!(
                "{}:{line}: not UTF-8 (byte {at}), although --encoding utf-8 says so: \
                 if the file is EUC-KR/CP949 (Excel's plain \"CSV\"), pass --encoding euc-kr or leave --encoding out",
                path.display()
            )))
        }
        Some(Some(at)) => {
            let line = line_of(&mut file, at).map_err(cannot)?;
            let why = format!(" (it is not UTF-8 either: line {line}, byte {at})");
            transcode_or_refuse(path, file, EUC_KR, &why)
        }
        None => transcode_or_refuse(path, file, EUC_KR, ""),
    }
}

/// [`transcode`]s `file` from `encoding`, or refuses it where it is not
/// `encoding` (`also` says what else it is not).
fn transcode_or_refuse(
    path: &Path,
    mut file: File,
    encoding: &'static Encoding,
    also: &str,
) -> Result<(File, u64, &'static Encoding), CliError> {
    let cannot = |e: std::io::Error| usage(format!("{}: cannot read: {e}", path.display()));
    match transcode(&mut file, encoding).map_err(cannot)? {
        Ok(utf8) => Ok((utf8, 0, encoding)),
        Err(at) => {
            let line = line_of(&mut file, at).map_err(cannot)?;
            Err(usage(format!(
                "{}:{line}: not {} (byte {at}){also}: save the file as \"CSV UTF-8\" (Excel: Save As, \
                 CSV UTF-8) and submit it again, or name its encoding with --encoding",
                path.display(),
                encoding.name()
            )))
        }
    }
}

/// The offset of the first byte of `r` (read from where it is to its end)
/// that does not belong to valid UTF-8, if any: one pass, one buffer.
fn first_invalid_utf8(r: &mut impl Read) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; READ_BUFFER];
    // `buf[..kept]`: the start of a character cut by the previous read.
    let (mut kept, mut offset) = (0usize, 0u64);
    loop {
        let n = match r.read(&mut buf[kept..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((kept > 0).then_some(offset));
        }
        let len = kept + n;
        match std::str::from_utf8(&buf[..len]) {
            Ok(_) => (kept, offset) = (0, offset + len as u64),
            Err(e) if e.error_len().is_some() => return Ok(Some(offset + e.valid_up_to() as u64)),
            Err(e) => {
                let valid = e.valid_up_to();
                buf.copy_within(valid..len, 0);
                (kept, offset) = (len - valid, offset + valid as u64);
            }
        }
    }
}

/// The line (from 1) that byte `offset` of `file` is on, in an encoding
/// that writes a newline as the byte `\n` (UTF-8, EUC-KR). Rewinds.
fn line_of(file: &mut File, offset: u64) -> std::io::Result<usize> {
    file.rewind()?;
    let mut lines = 1;
    {
        let mut reader = BufReader::with_capacity(READ_BUFFER, (&*file).take(offset));
        loop {
            let buf = reader.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            lines += buf.iter().filter(|&&b| b == b'\n').count();
            let n = buf.len();
            reader.consume(n);
        }
    }
    file.rewind()?;
    Ok(lines)
}

/// Decodes `from` (from its start) from `encoding` into an unnamed
/// temporary file, as UTF-8, positioned at its start; `Ok(Err(offset))` at
/// the first bytes that are not `encoding` (nothing is replaced: a name
/// would be sent garbled).
fn transcode(from: &mut File, encoding: &'static Encoding) -> std::io::Result<Result<File, u64>> {
    from.rewind()?;
    let mut to = unnamed_temp_file()?;
    let mut decoder = encoding.new_decoder_with_bom_removal();
    let mut src = vec![0u8; READ_BUFFER];
    let mut dst = vec![0u8; 3 * READ_BUFFER + 16];
    let mut consumed = 0u64;
    {
        let mut out = std::io::BufWriter::with_capacity(READ_BUFFER, &mut to);
        loop {
            let n = match from.read(&mut src) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let last = n == 0;
            let mut input = &src[..n];
            loop {
                let (result, read, written) =
                    decoder.decode_to_utf8_without_replacement(input, &mut dst, last);
                out.write_all(&dst[..written])?;
                consumed += read as u64;
                input = &input[read..];
                match result {
                    DecoderResult::InputEmpty => break,
                    DecoderResult::OutputFull => continue,
                    DecoderResult::Malformed(bad, after) => {
                        return Ok(Err(consumed - u64::from(after) - u64::from(bad)))
                    }
                }
            }
            if last {
                break;
            }
        }
        out.flush()?;
    }
    from.rewind()?;
    to.rewind()?;
    Ok(Ok(to))
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
    /// Writes the row's number, normalised, into `out`.
    fn number(&self, out: &mut String) -> Result<Normalized, Problem> {
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
    fn var_problems(&self, names: &[String], mut each: impl FnMut(Problem)) {
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

/// How many problems of a file are listed (in file order); all are counted.
pub const LISTED: usize = 100;

/// What is wrong with one row, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Problem {
    line: usize,
    /// The field, when the problem is one field's.
    field: Option<String>,
    /// A short name of the kind of problem, to count them by.
    kind: &'static str,
    /// What is wrong and what to do.
    what: String,
}

impl Problem {
    fn field(line: usize, field: &str, kind: &'static str, what: String) -> Problem {
        Problem {
            line,
            field: Some(clip(field, QUOTE_MAX)),
            kind,
            what,
        }
    }

    fn row(line: usize, kind: &'static str, what: String) -> Problem {
        Problem {
            line,
            field: None,
            kind,
            what,
        }
    }

    /// As printed: `path:line: field `name`: what`.
    fn show(&self, path: &Path) -> String {
        match &self.field {
            Some(f) => format!(
                "{}:{}: field `{f}`: {}",
                path.display(),
                self.line,
                self.what
            ),
            None => format!("{}:{}: {}", path.display(), self.line, self.what),
        }
    }
}

/// The problems of a file: the first [`LISTED`] in file order, every one
/// counted by kind (memory bounded however many there are).
#[derive(Debug, Default)]
struct Problems {
    listed: Vec<Problem>,
    by_kind: BTreeMap<&'static str, usize>,
    total: usize,
    /// Rows with at least one problem.
    bad_rows: usize,
}

impl Problems {
    /// Counts `p`, and lists it when it is among the first [`LISTED`] by
    /// line. Within one reading problems come in file order; a later
    /// reading's (the repeated numbers) may go before some already listed.
    fn add(&mut self, p: Problem) {
        self.total += 1;
        *self.by_kind.entry(p.kind).or_default() += 1;
        if self.listed.len() == LISTED && self.listed.last().is_some_and(|l| l.line <= p.line) {
            return;
        }
        let at = self.listed.partition_point(|l| l.line <= p.line);
        self.listed.insert(at, p);
        self.listed.truncate(LISTED);
    }

    /// The error that lists them, with a summary line: how many rows, how
    /// many bad, how many problems of each kind.
    fn into_error(self, path: &Path, rows: usize) -> CliError {
        let mut msg = String::new();
        for p in &self.listed {
            let _ = writeln!(msg, "{}", p.show(path));
        }
        if self.total > self.listed.len() {
            let _ = writeln!(msg, "… and {} more", self.total - self.listed.len());
        }
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        let _ = write!(
            msg,
            "{}: {rows} row(s), {} bad, {} problem(s): {}; nothing was appended: fix them and submit again",
            path.display(),
            self.bad_rows,
            self.total,
            kinds.join(", ")
        );
        usage(msg)
    }
}

/// The rows of a recipients file, one at a time, from its start.
struct Rows<'a> {
    source: Source<'a>,
}

enum Source<'a> {
    Csv {
        reader: csv::Reader<CrlfAsLf<&'a File>>,
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
    fn new(input: &'a mut Input) -> Result<Rows<'a>, CliError> {
        let path = input.path.as_path();
        input
            .file
            .seek(SeekFrom::Start(input.start))
            .map_err(|e| usage(format!("{}: cannot read: {e}", path.display())))?;
        let file = &input.file;
        let source = match input.format {
            Format::Csv => {
                let mut reader = csv::ReaderBuilder::new()
                    .flexible(false)
                    .buffer_capacity(READ_BUFFER)
                    .from_reader(CrlfAsLf::new(file));
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
                        "{}:1: the header has no `to` column (the recipients' numbers)",
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
        Ok(Rows { source })
    }

    /// The first of `names` that a CSV header has no column for: every row
    /// would lack it, so it is one problem, the header's.
    fn missing_column<'n>(&self, names: &'n [String]) -> Option<&'n str> {
        let Source::Csv { columns, .. } = &self.source else {
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
    fn next(&mut self, path: &Path) -> Result<Option<Result<Row<'_>, Problem>>, CliError> {
        match &mut self.source {
            Source::Csv {
                reader,
                to,
                columns,
                record,
                records,
            } => {
                let line = *records + 2;
                match reader.read_record(record) {
                    Ok(false) => Ok(None),
                    Ok(true) => {
                        *records += 1;
                        let line = record.position().map_or(line, |p| p.line() as usize);
                        Ok(Some(Ok(Row {
                            line,
                            to: record.get(*to),
                            vars: Vars::Csv { record, columns },
                        })))
                    }
                    Err(e) if matches!(e.kind(), csv::ErrorKind::Io(_)) => {
                        Err(usage(format!("{}: cannot read: {e}", path.display())))
                    }
                    Err(e) => {
                        *records += 1;
                        let line = e.position().map_or(line, |p| p.line() as usize);
                        let what = match e.kind() {
                            csv::ErrorKind::UnequalLengths {
                                expected_len, len, ..
                            } => format!(
                                "malformed CSV: {len} field(s) where the header has {expected_len}: \
                                 quote a value that has a comma (\"Kim, Minji\"), or remove the extra field"
                            ),
                            _ => format!("malformed CSV: {e}"),
                        };
                        Ok(Some(Err(Problem::row(line, "malformed row", what))))
                    }
                }
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
                return Ok(Some(match jsonl_fields(n, text) {
                    Ok(f) => {
                        *fields = f;
                        Ok(Row {
                            line: n,
                            to: fields.get("to").map(String::as_str),
                            vars: Vars::Json(fields),
                        })
                    }
                    Err(p) => Err(p),
                }));
            },
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
    /// The rows kept (to be sent).
    recipients: usize,
    chunks: u32,
    /// The largest encoded chunk, in bytes.
    largest_chunk: usize,
    /// A sum over the kept rows' numbers, order-independent.
    fingerprint: u64,
}

/// Rows dropped because an earlier row has their number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Dropped {
    rows: usize,
    /// The first [`DROPPED_SHOWN`]: (the line kept, the line dropped).
    first: Vec<(usize, usize)>,
}

/// How many dropped rows submit's summary names.
const DROPPED_SHOWN: usize = 5;

/// What the readings before the cut found.
#[derive(Debug)]
struct Scan {
    checked: Checked,
    /// The rows of the file (the header and blank JSONL lines aside).
    rows: usize,
    /// The numbers (as [`number_key`]s) that more than one row has: only
    /// the first row of each is kept.
    repeated: HashSet<u64>,
    dropped: Dropped,
    /// Mobile numbers whose lost leading 0 was put back.
    zeros_restored: usize,
}

/// Adds a number to a fingerprint.
fn fingerprint(sum: u64, key: u64) -> u64 {
    sum.wrapping_add(key.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Counts kept rows into chunks as they will be encoded (given a batch and
/// a chunk size), with a fingerprint of their numbers.
struct Sizer<'a> {
    template: &'a Template,
    options: &'a BatchOptions,
    chunking: Option<(&'a str, usize)>,
    checked: Checked,
    in_chunk: usize,
    chunk_bytes: usize,
    too_large: Option<CliError>,
}

impl<'a> Sizer<'a> {
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

    fn push(&mut self, r: &RowRecipient<'_>) {
        self.checked.recipients += 1;
        self.checked.fingerprint = fingerprint(self.checked.fingerprint, number_key(r.to));
        self.in_chunk += 1;
        self.chunk_bytes += recipient_encoded_len(r);
        if self.chunking.is_some_and(|(_, size)| self.in_chunk == size) {
            self.end_chunk();
        }
    }

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
    fn finish(mut self) -> (Checked, Option<CliError>) {
        if self.in_chunk > 0 {
            self.end_chunk();
        }
        (self.checked, self.too_large)
    }
}

/// Checks every row and, given a batch and a chunk size, every chunk.
/// Every bad row is listed (up to [`LISTED`], all counted); a number that
/// an earlier row has is dropped (counted) or, with [`Duplicates::Fail`],
/// one more problem; then the first chunk too large, if any.
fn check_recipients(
    input: &mut Input,
    template: &Template,
    options: &BatchOptions,
    chunking: Option<(&str, usize)>,
    duplicates: Duplicates,
) -> Result<Scan, CliError> {
    let names = template.placeholders();
    let path = input.path.clone();
    // One per row: 8 bytes, where a set of the numbers as strings took ten
    // times that.
    let mut numbers: Vec<u64> = Vec::with_capacity(rows_at_most(input));
    let mut problems = Problems::default();
    let mut sizer = Sizer::new(template, options, chunking);
    let (mut rows_read, mut zeros_restored) = (0, 0);
    {
        let mut rows = Rows::new(input)?;
        if let Some(n) = rows.missing_column(&names) {
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
            row.var_problems(&names, |p| problems.add(p));
            if problems.total > before {
                problems.bad_rows += 1;
            } else {
                sizer.push(&RowRecipient {
                    to: &number,
                    vars: row.vars,
                });
            }
        }
    }
    numbers.sort_unstable();
    let repeated: HashSet<u64> = numbers
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    drop(numbers);
    let mut dropped = Dropped::default();
    // With problems already, dropped rows would go unsaid: no need to look.
    let (checked, too_large) =
        if repeated.is_empty() || (problems.total > 0 && duplicates == Duplicates::Drop) {
            sizer.finish()
        } else {
            // The chunks counted above hold the later rows of each repeated
            // number: count them again without (when the file is to be sent).
            let mut sizer = Sizer::new(template, options, chunking);
            let mut first_lines: HashMap<u64, usize> = HashMap::new();
            let mut rows = Rows::new(input)?;
            let mut number = String::new();
            while let Some(read) = rows.next(&path)? {
                let Ok(row) = read else { continue };
                if row.number(&mut number).is_err() {
                    continue;
                }
                let key = number_key(&number);
                if repeated.contains(&key) {
                    match first_lines.entry(key) {
                        Entry::Vacant(v) => {
                            v.insert(row.line);
                        }
                        Entry::Occupied(o) => {
                            let first = *o.get();
                            dropped.rows += 1;
                            if dropped.first.len() < DROPPED_SHOWN {
                                dropped.first.push((first, row.line));
                            }
                            if duplicates == Duplicates::Fail {
                                let mut bad_already = false;
                                row.var_problems(&names, |_| bad_already = true);
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
                    }
                }
                if problems.total == 0 {
                    sizer.push(&RowRecipient {
                        to: &number,
                        vars: row.vars,
                    });
                }
            }
            sizer.finish()
        };
    if problems.total > 0 {
        return Err(problems.into_error(&path, rows_read));
    }
    if checked.recipients == 0 {
        return Err(usage(format!(
            "{}: no recipients in the file",
            path.display()
        )));
    }
    if let Some(e) = too_large {
        return Err(e);
    }
    Ok(Scan {
        checked,
        rows: rows_read,
        repeated,
        dropped,
        zeros_restored,
    })
}

/// Reads `input` again and calls `each` with every row kept, in file order:
/// its number normalised, the later rows of a number in `repeated` skipped
/// (as [`check_recipients`] counted them). A row that is now unreadable or
/// bad is `bad`'s error.
fn for_each_kept<E>(
    input: &mut Input,
    repeated: &HashSet<u64>,
    bad: impl Fn(&str) -> E,
    mut each: impl FnMut(&RowRecipient<'_>, u64) -> Result<(), E>,
) -> Result<(), E> {
    let path = input.path.clone();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut rows = Rows::new(input).map_err(|_| bad("unreadable"))?;
    let mut number = String::new();
    while let Some(read) = rows.next(&path).map_err(|_| bad("unreadable"))? {
        let row = read.map_err(|_| bad("a row is now bad"))?;
        row.number(&mut number)
            .map_err(|_| bad("a row is now bad"))?;
        let key = number_key(&number);
        if repeated.contains(&key) && !seen.insert(key) {
            continue;
        }
        each(
            &RowRecipient {
                to: &number,
                vars: row.vars,
            },
            key,
        )?;
    }
    Ok(())
}

/// Reads the checked file again and sends its chunks, encoded, to `out`, in
/// order. The last chunk is sent only once the whole file has been read
/// again and found the same as when it was checked.
fn cut_recipients(
    input: &mut Input,
    batch: &str,
    (template, options): (&Template, &BatchOptions),
    size: usize,
    scan: &Scan,
    out: &tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), CliError> {
    let checked = &scan.checked;
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
    for_each_kept(input, &scan.repeated, changed, |r, key| {
        if seen.chunks > last_seq {
            return Err(changed("more rows"));
        }
        seen.recipients += 1;
        seen.fingerprint = fingerprint(seen.fingerprint, key);
        chunk.push(r);
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
        Ok(())
    })?;
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

/// What submit says it did, besides the counts: how the file was read,
/// what was dropped, what was restored.
fn notes(input: &Input, scan: &Scan) -> Vec<String> {
    let mut notes = Vec::new();
    if input.encoding != UTF_8 {
        notes.push(format!(
            "read {} as {}",
            input.path.display(),
            input.encoding.name()
        ));
    }
    let d = &scan.dropped;
    if d.rows > 0 {
        let pairs: Vec<String> = d
            .first
            .iter()
            .map(|(kept, later)| format!("line {later} repeats line {kept}"))
            .collect();
        notes.push(format!(
            "{} duplicate row(s) dropped, their number sent once ({}{}; --duplicates fail refuses them instead)",
            d.rows,
            pairs.join(", "),
            if d.rows > d.first.len() { ", …" } else { "" }
        ));
    }
    if scan.zeros_restored > 0 {
        notes.push(format!(
            "{} mobile number(s) had lost their leading 0 (a spreadsheet drops it) and got it back",
            scan.zeros_restored
        ));
    }
    notes
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
    let (path, encoding, duplicates) = (args.recipients.clone(), args.encoding, args.duplicates);
    let (batch, size) = (args.batch.clone(), args.chunk_size);
    // Opening may transcode the whole file: off the async threads too.
    let (input, template, options, scan) = tokio::task::spawn_blocking(move || {
        let mut input = Input::open(&path, encoding)?;
        let scan = check_recipients(
            &mut input,
            &template,
            &options,
            Some((&batch, size)),
            duplicates,
        )?;
        Ok::<_, CliError>((input, template, options, scan))
    })
    .await
    .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")))??;
    let stamp = input.stamp();
    let read_as = input.encoding.name();

    let store = args.redis.connect().await?;
    refuse_an_ended_batch(&store, &args.batch).await?;
    let shard = store.keys.shard_of(&args.batch);
    refuse_a_far_send_at(&store, shard, &options).await?;
    let lane = options.priority();
    let stream = store.keys.ingest_in(shard, lane);
    let json = args.json;
    let notes = notes(&input, &scan);
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
        let b = indicatif::ProgressBar::new(u64::from(scan.checked.chunks));
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
    let per_round = (ROUND_BYTES / scan.checked.largest_chunk.max(1)).clamp(1, ROUND_CHUNKS);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(per_round);
    let (batch, size) = (args.batch.clone(), args.chunk_size);
    let reader = tokio::task::spawn_blocking(move || {
        let mut input = input;
        if input.stamp() != stamp {
            return Err(CliError::Failed(format!(
                "{}: the file changed while it was submitted; nothing was appended",
                input.path.display()
            )));
        }
        cut_recipients(&mut input, &batch, (&template, &options), size, &scan, &tx)?;
        Ok(scan)
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
    let scan = read??;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let (total, chunks) = (scan.checked.recipients, scan.checked.chunks);
    if json {
        let d = &scan.dropped;
        println!(
            "{}",
            serde_json::json!({
                "batch": args.batch,
                "recipients": total,
                "chunks": chunks,
                "stream": stream,
                "rows": scan.rows,
                "encoding": read_as,
                "duplicatesDropped": d.rows,
                "duplicateLines": d.first.iter().map(|(kept, later)| serde_json::json!({"kept": kept, "dropped": later})).collect::<Vec<_>>(),
                "leadingZerosRestored": scan.zeros_restored,
            })
        );
    } else {
        println!(
            "submitted batch {}: {total} recipients in {chunks} chunks to {stream}",
            args.batch,
        );
        for n in notes {
            println!("  {n}");
        }
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

    fn file(dir: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, content).expect("write");
        p
    }

    fn usage_of<T: std::fmt::Debug>(r: Result<T, CliError>) -> String {
        match r {
            Err(CliError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    fn check(p: &Path, size: usize, duplicates: Duplicates) -> Result<Scan, CliError> {
        let mut input = Input::open(p, FileEncoding::Auto)?;
        check_recipients(
            &mut input,
            &sms(),
            &BatchOptions::default(),
            Some(("b", size)),
            duplicates,
        )
    }

    /// The chunks `cut_recipients` makes of a checked file, decoded.
    fn cut(p: &Path, size: usize) -> Vec<Chunk> {
        let mut input = Input::open(p, FileEncoding::Auto).expect("open");
        let scan = check_recipients(
            &mut input,
            &sms(),
            &BatchOptions::default(),
            Some(("b", size)),
            Duplicates::Drop,
        )
        .expect("check");
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        cut_recipients(
            &mut input,
            "b",
            (&sms(), &BatchOptions::default()),
            size,
            &scan,
            &tx,
        )
        .expect("cut");
        drop(tx);
        let mut out = Vec::new();
        while let Ok(p) = rx.try_recv() {
            let c = Chunk::decode(&p).expect("decode");
            c.validate().expect("valid");
            assert!(p.len() <= scan.checked.largest_chunk);
            out.push(c);
        }
        assert_eq!(out.len(), scan.checked.chunks as usize);
        out
    }

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
    fn every_problem_of_a_file_is_listed_in_one_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        let mut bad_lines = Vec::new();
        for i in 0..1_000usize {
            let line = i + 2;
            // 40 bad rows, scattered, of several kinds.
            let row = match i {
                _ if i % 25 != 7 => format!("010{i:08},n{i}\n"),
                _ if i % 4 == 0 => format!("01012{i},n{i}\n"),
                _ if i % 4 == 1 => format!("010-1234-56x{i},n{i}\n"),
                _ if i % 4 == 2 => format!("010{i:08},n{i},extra\n"),
                _ => format!("+1 555 {i:04},n{i}\n"),
            };
            if i % 25 == 7 {
                bad_lines.push(line);
            }
            csv.push_str(&row);
        }
        assert_eq!(bad_lines.len(), 40);
        let p = file(dir.path(), "bad.csv", &csv);
        let m = usage_of(check(&p, 100, Duplicates::Drop));
        let listed: Vec<usize> = m
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{}:", p.display())))
            .filter_map(|l| l.split(':').next()?.parse().ok())
            .collect();
        assert_eq!(listed, bad_lines, "{m}");
        let summary = m.lines().last().unwrap_or_default();
        assert!(
            summary.contains("1000 row(s), 40 bad, 40 problem(s): "),
            "{summary}"
        );
        for kind in [
            "10 character not allowed in a number",
            "10 foreign number",
            "10 malformed row",
            "10 number of wrong length",
        ] {
            assert!(summary.contains(kind), "{kind}: {summary}");
        }
        assert!(
            m.contains("remove the extra field") && m.contains("only Korean numbers"),
            "every problem says what to do: {m}"
        );
    }

    #[test]
    fn the_listing_is_bounded_and_says_how_many_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut jsonl = String::new();
        for i in 0..300 {
            // Every row bad; one twice (no number, no name).
            match i {
                0 => jsonl.push_str("{}\n"),
                _ => jsonl.push_str(&format!("{{\"to\": \"0101234\", \"name\": \"n{i}\"}}\n")),
            }
        }
        let p = file(dir.path(), "r.jsonl", &jsonl);
        let m = usage_of(check(&p, 100, Duplicates::Drop));
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines.len(), LISTED + 2, "{m}");
        assert!(
            lines[0].ends_with(":1: field `to`: missing: every row needs the recipient's number"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains(":1: field `name`: missing"),
            "{}",
            lines[1]
        );
        assert!(
            lines[LISTED - 1].contains(":99: field `to`"),
            "{}",
            lines[LISTED - 1]
        );
        assert_eq!(lines[LISTED], "… and 201 more");
        assert!(lines[LISTED + 1].contains(
            "300 row(s), 300 bad, 301 problem(s): 1 missing number, 1 missing variable, 299 number of wrong length"
        ), "{}", lines[LISTED + 1]);
    }

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

    /// Korean names, as a CRM writes them in EUC-KR: a syllable outside
    /// KS X 1001's 2,350 (똠, CP949's extension) included.
    const NAMES: [&str; 4] = ["김민지", "이서준", "박똠양", "최"];

    fn euc_kr(text: &str) -> Vec<u8> {
        let (bytes, _, unmappable) = EUC_KR.encode(text);
        assert!(!unmappable, "{text}");
        assert!(std::str::from_utf8(&bytes).is_err(), "not UTF-8 any more");
        bytes.into_owned()
    }

    #[test]
    fn an_euc_kr_file_is_detected_and_its_names_read_intact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("고객번호,name,to,등급\n");
        for (i, n) in NAMES.iter().enumerate() {
            csv.push_str(&format!("C{i},{n},010-2000-000{i},골드\r\n"));
        }
        let p = file(dir.path(), "crm.csv", euc_kr(&csv));
        let r = read_recipients(&p, &sms()).expect("read");
        let names: Vec<&str> = r.iter().map(|r| r.vars["name"].as_str()).collect();
        assert_eq!(names, NAMES);
        assert_eq!(r[3].to, "01020000003");
        assert_eq!(r[0].vars["등급"], "골드");
        let mut input = Input::open(&p, FileEncoding::EucKr).expect("open");
        assert_eq!(input.encoding, EUC_KR);
        check_recipients(
            &mut input,
            &sms(),
            &BatchOptions::default(),
            None,
            Duplicates::Drop,
        )
        .expect("named");
        // Said to be UTF-8, it is refused where it is not, with what to do.
        let m = usage_of(Input::open(&p, FileEncoding::Utf8));
        assert!(
            m.contains("crm.csv:1: not UTF-8 (byte 0), although --encoding utf-8 says so")
                && m.contains("--encoding euc-kr"),
            "{m}"
        );
    }

    #[test]
    fn a_file_neither_utf8_nor_euc_kr_is_refused_with_its_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = b"to,name\n01012345678,Kim\n01012345679,".to_vec();
        // Not UTF-8, and 0xFF is no EUC-KR lead byte either.
        bytes.extend([0xb1, 0xe8, 0xff, 0xff, b'\n']);
        let p = file(dir.path(), "odd.csv", bytes);
        let m = usage_of(Input::open(&p, FileEncoding::Auto));
        assert!(
            m.contains("odd.csv:3: not EUC-KR (byte 38) (it is not UTF-8 either: line 3, byte 36)")
                && m.contains("CSV UTF-8"),
            "{m}"
        );
    }

    #[test]
    fn utf8_with_a_byte_order_mark_and_utf16_excel_text_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "to,name\n01012345678,김민지\n";
        let p = file(dir.path(), "bom.csv", format!("\u{feff}{text}"));
        let r = read_recipients(&p, &sms()).expect("read");
        assert_eq!(
            (r[0].to.as_str(), r[0].vars["name"].as_str()),
            ("01012345678", "김민지")
        );
        let p = file(
            dir.path(),
            "bom.jsonl",
            "\u{feff}{\"to\": \"01012345678\", \"name\": \"김민지\"}\n",
        );
        assert_eq!(read_recipients(&p, &sms()).expect("read").len(), 1);
        let mut utf16 = vec![0xff, 0xfe];
        utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        let p = file(dir.path(), "u16.csv", utf16);
        let r = read_recipients(&p, &sms()).expect("read");
        assert_eq!(r[0].vars["name"], "김민지");
    }

    #[test]
    fn characters_across_read_buffers_are_validated_and_transcoded_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Rows of Hangul past several read buffers, so that characters of
        // two or three bytes fall across the buffers' edges.
        let mut csv = String::from("to,name\n");
        let mut expected = Vec::new();
        let mut i = 0;
        while csv.len() < 3 * READ_BUFFER + 7 {
            let name = format!("{}{}", NAMES[i % 4], "가".repeat(i % 3));
            csv.push_str(&format!("010{i:08},{name}\n"));
            expected.push(name);
            i += 1;
        }
        for (name, bytes) in [("u.csv", csv.clone().into_bytes()), ("e.csv", euc_kr(&csv))] {
            let p = file(dir.path(), name, &bytes);
            let r = read_recipients(&p, &sms()).expect("read");
            let names: Vec<&str> = r.iter().map(|r| r.vars["name"].as_str()).collect();
            assert_eq!(names, expected, "{name}");
        }
        let mut bad = csv.into_bytes();
        let at = 2 * READ_BUFFER + 1;
        bad[at] = 0xff;
        assert_eq!(
            first_invalid_utf8(&mut std::io::Cursor::new(&bad)).expect("read"),
            Some(at as u64)
        );
        // A character cut off at the very end.
        let cut = "to,name\n01012345678,김".as_bytes();
        assert_eq!(
            first_invalid_utf8(&mut &cut[..cut.len() - 1]).expect("read"),
            Some(cut.len() as u64 - 3)
        );
    }

    #[test]
    fn send_at_is_bounded_by_a_grace_behind_and_a_horizon_ahead() {
        let now = 1_796_000_000_000i64;
        let minute = 60_000;
        let day = 24 * 60 * minute;
        for ok in [now, now - 5 * minute, now + 90 * day, now + minute] {
            assert_eq!(check_send_at(ok, now), Ok(()), "{}", ok - now);
        }
        let past = check_send_at(now - 5 * minute - 1, now).expect_err("past");
        assert!(
            past.contains("in the past") && past.contains("5 minutes"),
            "{past}"
        );
        assert!(past.contains("now is 2026-"), "{past}");
        let far = check_send_at(now + 90 * day + 1, now).expect_err("far");
        assert!(far.contains("more than 90 days ahead"), "{far}");
    }

    #[test]
    fn chunks_are_counted_and_sized_as_they_will_be_encoded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        for i in 0..25 {
            csv.push_str(&format!("010{i:08},name{i}\n"));
        }
        let p = file(dir.path(), "r.csv", &csv);
        let scan = check(&p, 10, Duplicates::Drop).expect("check");
        assert_eq!((scan.checked.recipients, scan.checked.chunks), (25, 3));
        let seqs: Vec<_> = cut(&p, 10)
            .iter()
            .map(|c| (c.seq, c.last, c.recipients.len()))
            .collect();
        assert_eq!(seqs, [(0, false, 10), (1, false, 10), (2, true, 5)]);
    }

    #[test]
    fn a_file_changed_between_the_readings_keeps_the_last_chunk_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = file(
            dir.path(),
            "r.csv",
            "to,name\n01000000001,a\n01000000002,b\n",
        );
        let mut input = Input::open(&p, FileEncoding::Auto).expect("open");
        let scan = check_recipients(
            &mut input,
            &sms(),
            &BatchOptions::default(),
            Some(("b", 1)),
            Duplicates::Drop,
        )
        .expect("check");
        std::fs::write(&p, "to,name\n01000000001,a\n01000000003,b\n").expect("rewrite");
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let e = cut_recipients(
            &mut input,
            "b",
            (&sms(), &BatchOptions::default()),
            1,
            &scan,
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
