//! `groupcast results BATCH`: every recipient's outcome, exported.
//!
//! What is stored is what was not delivered: the results hash (failures
//! at registration and delivery, unknowns: written by delivery tracking;
//! recipients of cancelled or unsent generations: `not_sent`; duplicate
//! copies, each with its seq) and the batch's events (chunks given up:
//! `not_sent`; registration failures of generations never tracked). Those are streamed, a thousand
//! at a time. Delivered recipients are counted, not stored: `--from FILE`
//! (the batch's recipients file) lists any outcome, delivered included, by
//! looking each row up; its output is a recipients file of the rows that
//! match, with their variables, ready for a follow-up batch
//! (`groupcast submit --follow-up-of BATCH`).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::submit::follow_up::{each_rows, write_rows, FileRow};
use super::submit::FileEncoding;
use super::{CliError, RedisArgs};
use crate::events::Event;
use crate::keys::validate_batch_id;
use crate::phone::mask;
use crate::projection::field;
use crate::results::{Outcome, Record, Stage};
use crate::store::batch::BatchLog;

/// Results flags.
#[derive(Debug, Args)]
pub struct ResultsArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch.
    pub batch: String,
    /// Which recipients: failed, unknown, not_sent, delivered, duplicate,
    /// or all (delivered needs `--from`).
    #[arg(long, default_value = "failed", value_parser = parse_filter)]
    pub status: Filter,
    /// Only these provider codes, comma-separated (e.g. `3104,3043`).
    #[arg(long, value_delimiter = ',')]
    pub code: Vec<String>,
    /// `csv` or `jsonl`.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    pub format: Format,
    /// Show numbers in full (masked as 010****5678 by default).
    #[arg(long)]
    pub show_numbers: bool,
    /// The batch's recipients file: print its rows whose recipient matches
    /// (each once, with its variables), as a recipients file for a
    /// follow-up batch.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// The encoding of `--from` (as `submit --encoding`).
    #[arg(long, value_enum, default_value_t = FileEncoding::Auto)]
    pub encoding: FileEncoding,
}

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// CSV with a header.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

/// Which outcomes to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter(Vec<Outcome>);

impl Filter {
    fn wants(&self, o: Outcome) -> bool {
        self.0.contains(&o)
    }
}

/// Parses `--status` (`failed`, `failed,unknown`, `all`, ...).
pub(crate) fn parse_filter(s: &str) -> Result<Filter, String> {
    if s == "all" {
        return Ok(Filter(Outcome::ALL.to_vec()));
    }
    s.split(',')
        .map(|part| {
            Outcome::parse(part.trim()).ok_or_else(|| {
                format!("{part:?}: expected failed, unknown, not_sent, delivered, duplicate or all")
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Filter)
}

/// One exported recipient.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Row {
    /// The number (masked unless `--show-numbers`).
    pub number: String,
    /// The outcome.
    pub outcome: String,
    /// `registration` or `delivery` (failures and unknowns).
    pub stage: String,
    /// The provider's code, or `given_up`.
    pub code: String,
    /// The generation.
    pub generation: Option<u32>,
    /// Its provider group.
    pub group_id: String,
    /// The provider's message id.
    pub message_id: String,
    /// The chunk: of a duplicate copy, and of recipients recorded from
    /// the events (registration failures, chunks given up).
    pub seq: Option<u32>,
    /// The provider's text for `code`, where tracking saw one.
    pub reason: String,
}

const HEADER: [&str; 9] = [
    "number",
    "outcome",
    "stage",
    "code",
    "generation",
    "group_id",
    "message_id",
    "seq",
    "reason",
];

/// Writes rows in the chosen format.
struct Out<W: Write> {
    w: W,
    format: Format,
    started: bool,
}

impl<W: Write> Out<W> {
    fn row(&mut self, r: &Row) -> Result<(), CliError> {
        let io = |e: std::io::Error| CliError::Failed(format!("results: cannot write: {e}"));
        match self.format {
            Format::Jsonl => {
                let line = serde_json::to_string(r).unwrap_or_default();
                writeln!(self.w, "{line}").map_err(io)
            }
            Format::Csv => {
                let mut c = csv::WriterBuilder::new().from_writer(&mut self.w);
                if !self.started {
                    c.write_record(HEADER).map_err(|e| io(e.into()))?;
                }
                let gen = r.generation.map(|g| g.to_string()).unwrap_or_default();
                let seq = r.seq.map(|s| s.to_string()).unwrap_or_default();
                c.write_record([
                    &r.number,
                    &r.outcome,
                    &r.stage,
                    &r.code,
                    &gen,
                    &r.group_id,
                    &r.message_id,
                    &seq,
                    &r.reason,
                ])
                .map_err(|e| io(e.into()))?;
                self.started = true;
                c.flush().map_err(io)
            }
        }
    }
}

/// Runs results.
pub(crate) async fn run(args: ResultsArgs) -> Result<(), CliError> {
    validate_batch_id(&args.batch)
        .map_err(|e| CliError::Usage(format!("invalid batch id: {e}")))?;
    let store = args.redis.connect().await?;
    let log = store.batch(&args.batch);
    if !log.has_results_or_state().await? {
        return Err(CliError::Failed(format!(
            "no batch {}: never seen here, or past its retention (outcomes are kept --results-retention after the delivery report); check the id and --prefix",
            args.batch
        )));
    }
    let p = log
        .read(&[field::REPORT.into(), field::DL_REPORT.into()])
        .await?;
    let delivery_done = p.get(field::DL_REPORT).is_some();
    match &args.from {
        Some(path) => from_file(&args, &log, path.clone(), delivery_done).await,
        None => stored(&args, &log).await,
    }
}

/// The stored outcomes (everything but delivered), to stdout.
async fn stored(args: &ResultsArgs, log: &BatchLog) -> Result<(), CliError> {
    if args.status.wants(Outcome::Delivered) && args.status.0.len() == 1 {
        return Err(CliError::Usage(
            "delivered recipients are counted, not stored one by one: pass --from FILE (the batch's recipients file) to list them".into(),
        ));
    }
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    export_stored(
        log,
        &args.status,
        &args.code,
        args.show_numbers,
        args.format,
        &mut w,
    )
    .await?;
    w.flush()
        .map_err(|e| CliError::Failed(format!("results: cannot write: {e}")))
}

/// Writes the stored outcomes of `log`'s batch that `status` and `codes`
/// (empty: any) select to `w`, a thousand at a time: the results hash, then
/// the events' given-up chunks and the registration failures delivery
/// tracking did not record. Shared by `groupcast results` and the board's
/// download.
pub(crate) async fn export_stored(
    log: &BatchLog,
    status: &Filter,
    codes: &[String],
    show_numbers: bool,
    format: Format,
    w: &mut impl Write,
) -> Result<(), CliError> {
    let sel = Selection {
        status,
        codes: codes.iter().map(String::as_str).collect(),
        show_numbers,
        tracked: log.tracked().await?,
    };
    let mut out = Out {
        w,
        format,
        started: false,
    };
    export_results_hash(log, &sel, &mut out).await?;
    export_load_failures(log, &sel, &mut out).await
}

/// What an export of stored outcomes selects, and what it shows them with.
struct Selection<'a> {
    /// The outcomes wanted.
    status: &'a Filter,
    /// The codes wanted (empty: any).
    codes: HashSet<&'a str>,
    /// Whether numbers are shown in full.
    show_numbers: bool,
    /// The batch's groups and the provider's texts for codes.
    tracked: crate::store::delivery::Tracked,
}

impl Selection<'_> {
    /// Whether code `c` is wanted.
    fn code_ok(&self, c: &str) -> bool {
        self.codes.is_empty() || self.codes.contains(c)
    }

    /// A number as shown: masked unless `--show-numbers`.
    fn show(&self, n: &str) -> String {
        if self.show_numbers {
            n.to_string()
        } else {
            mask(n)
        }
    }

    /// The provider's text for `code`, where tracking saw one.
    fn reason_of(&self, code: &str) -> String {
        self.tracked.reasons.get(code).cloned().unwrap_or_default()
    }

    /// The row of the results hash's record `r` of field `number`, if it
    /// is selected.
    fn stored_row(&self, number: &str, r: Record) -> Option<Row> {
        if !self.status.wants(r.outcome) || !self.code_ok(&r.code) {
            return None;
        }
        let failed = r.outcome == Outcome::Failed;
        Some(Row {
            number: self.show(Record::number_of(number)),
            outcome: r.outcome.name().into(),
            stage: if failed || r.outcome == Outcome::Unknown {
                r.stage.name().into()
            } else {
                String::new()
            },
            reason: if failed {
                self.reason_of(&r.code)
            } else {
                String::new()
            },
            code: r.code,
            generation: Some(r.gen),
            group_id: self.tracked.groups.get(&r.gen).cloned().unwrap_or_default(),
            message_id: r.message_id,
            seq: r.seq,
        })
    }

    /// The row of failure `f` of chunk `e`: `not_sent` when the chunk was
    /// given up (`given_up`), else a registration failure.
    fn failure_row(
        &self,
        e: &crate::events::ChunkLoaded,
        f: &crate::events::RegistrationFailure,
        given_up: bool,
    ) -> Row {
        let outcome = failure_outcome(given_up);
        Row {
            number: self.show(&f.to),
            outcome: outcome.name().into(),
            stage: if given_up {
                String::new()
            } else {
                Stage::Registration.name().into()
            },
            code: f.code.clone(),
            generation: Some(e.gen),
            group_id: e.group_id.clone(),
            message_id: String::new(),
            seq: Some(e.seq),
            reason: if given_up {
                e.given_up.clone().unwrap_or_default()
            } else {
                self.reason_of(&f.code)
            },
        }
    }
}

/// The outcome of a recipient listed failed in a `chunk_loaded` event:
/// not sent when its chunk was given up, else failed.
fn failure_outcome(given_up: bool) -> Outcome {
    if given_up {
        Outcome::NotSent
    } else {
        Outcome::Failed
    }
}

/// Writes the selected records of the results hash.
async fn export_results_hash<W: Write>(
    log: &BatchLog,
    sel: &Selection<'_>,
    out: &mut Out<W>,
) -> Result<(), CliError> {
    let mut cursor = 0;
    loop {
        let (next, pairs) = log.scan_results(cursor).await?;
        for (number, record) in pairs {
            let Some(r) = Record::decode(&record) else {
                continue;
            };
            if let Some(row) = sel.stored_row(&number, r) {
                out.row(&row)?;
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(())
}

/// Writes the events' selected failures the results hash lacks: chunks
/// given up, and registration failures tracking did not record (their
/// generation was never tracked).
async fn export_load_failures<W: Write>(
    log: &BatchLog,
    sel: &Selection<'_>,
    out: &mut Out<W>,
) -> Result<(), CliError> {
    for recorded in log.events().await?.into_iter().flatten() {
        let Event::ChunkLoaded(e) = recorded.event else {
            continue;
        };
        let given_up = e.given_up.is_some();
        if e.failed.is_empty() || !sel.status.wants(failure_outcome(given_up)) {
            continue;
        }
        // A number the results hash has is listed from there: tracking
        // read it (a given-up add may in fact have registered some).
        let numbers: Vec<&str> = e.failed.iter().map(|f| f.to.as_str()).collect();
        let known = log.results_of(&numbers).await?;
        for (f, known) in e.failed.iter().zip(known) {
            if known.is_some() || !sel.code_ok(&f.code) {
                continue;
            }
            out.row(&sel.failure_row(&e, f, given_up))?;
        }
    }
    Ok(())
}

/// The rows of the recipients file whose outcome matches, as a recipients
/// file.
async fn from_file(
    args: &ResultsArgs,
    log: &BatchLog,
    path: PathBuf,
    delivery_done: bool,
) -> Result<(), CliError> {
    if args.status.wants(Outcome::Delivered) && !delivery_done {
        return Err(CliError::Failed(format!(
            "batch {}'s delivery results are not all in yet (no delivery report): who was delivered is not known; try again later, or ask for failed or unknown",
            args.batch
        )));
    }
    // Given-up recipients (not sent), from the events: few.
    let mut not_sent: BTreeMap<String, String> = BTreeMap::new();
    for recorded in log.events().await?.into_iter().flatten() {
        if let Event::ChunkLoaded(e) = recorded.event {
            for f in &e.failed {
                let kind = if e.given_up.is_some() {
                    "given_up"
                } else {
                    "reg"
                };
                not_sent.insert(f.to.clone(), format!("{kind}|{}", f.code));
            }
        }
    }
    // Read on a blocking thread, looked up here, a group at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<FileRow>>(2);
    let encoding = args.encoding;
    let reader = tokio::task::spawn_blocking(move || {
        each_rows(&path, encoding, |group| {
            tx.blocking_send(group)
                .map_err(|_| CliError::Failed("results: stopped".into()))
        })
    });
    let codes: HashSet<&str> = args.code.iter().map(String::as_str).collect();
    let mut seen: HashSet<String> = HashSet::new();
    let mut header = None;
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let show = |n: &str| {
        if args.show_numbers {
            n.to_string()
        } else {
            mask(n)
        }
    };
    let mut matched = 0u64;
    while let Some(group) = rx.recv().await {
        let numbers: Vec<&str> = group.iter().map(|r| r.to.as_str()).collect();
        let records = log.results_of(&numbers).await?;
        let mut keep = Vec::new();
        for (row, record) in group.iter().zip(records) {
            // A later copy of a number is the batch's duplicate.
            let first = seen.insert(row.to.clone());
            let (outcome, code) = if !first {
                (Outcome::Duplicate, String::new())
            } else if let Some(r) = record.as_deref().and_then(Record::decode) {
                (r.outcome, r.code)
            } else if let Some(k) = not_sent.get(&row.to) {
                match k.split_once('|') {
                    Some(("given_up", c)) => (Outcome::NotSent, c.to_string()),
                    Some((_, c)) => (Outcome::Failed, c.to_string()),
                    None => (Outcome::Failed, String::new()),
                }
            } else {
                (Outcome::Delivered, String::new())
            };
            if args.status.wants(outcome) && (codes.is_empty() || codes.contains(code.as_str())) {
                keep.push(row);
            }
        }
        matched += keep.len() as u64;
        write_rows(&mut w, &keep, &mut header, show)
            .map_err(|e| CliError::Failed(format!("results: cannot write: {e}")))?;
    }
    reader
        .await
        .map_err(|e| CliError::Failed(format!("results: the file reader stopped: {e}")))??;
    w.flush()
        .map_err(|e| CliError::Failed(format!("results: cannot write: {e}")))?;
    eprintln!(
        "groupcast: {matched} recipient(s) of batch {} matched{}",
        args.batch,
        if args.show_numbers {
            ""
        } else {
            " (numbers masked: pass --show-numbers for a file to submit)"
        }
    );
    Ok(())
}
