//! `groupcast submit`: reads a recipients file (CSV or JSONL) and a template,
//! checks every row first, cuts chunks and appends them. On bad input it
//! lists every problem of the file in one run (file, line, field, what to
//! do: the first [`LISTED`], then a count by kind), exits 2, and appends
//! nothing.
//!
//! Files are taken as people's tools write them: UTF-8 with or without a
//! byte order mark, or EUC-KR/CP949 (Excel's plain "CSV" on a Korean
//! Windows, most Korean CRMs' exports), detected or named by `--encoding`.
//! Numbers are normalised
//! ([`phone::normalize_into`](crate::phone::normalize_into)): the normal
//! form is what is checked, deduplicated, stored and sent. A number that an
//! earlier row has is sent once: the later rows are dropped and counted (or
//! listed as problems with `--duplicates fail`).
//!
//! Memory stays flat whatever the file's size: the file is read twice, one
//! row at a time (a file not known to be EUC-KR is first validated as UTF-8
//! in one streaming pass; one that is not is transcoded once, see
//! [`decode`](crate::producer::input::decode)). The first reading checks
//! every row and every chunk; the second cuts and encodes the chunks on a
//! thread of its own while the previous ones are appended, several per
//! round trip, with backpressure ([`Producer`]). The batch-wide duplicate
//! check keeps one `u64` per row (the number as a number,
//! [`number_key`](crate::producer::check::number_key)), sorted once at the
//! end; only when some number repeats is the file read once more in
//! between, to find the repeated rows' lines (and, when they are dropped,
//! to count the chunks without them), keeping the repeated numbers alone.
//!
//! ## Layout
//!
//! One file a step of the way, in the order a file goes through them:
//!
//! - `mod.rs`: the flags ([`SubmitArgs`]) and [`run`], which takes the
//!   steps in turn, refuses a batch that has ended and appends the chunks.
//! - `options`: the batch options from the flags, and `--send-at`'s bounds.
//! - the file itself is read, checked and cut by the producer library
//!   ([`crate::producer`]: its `template`, `input`, `rows`, `problems`,
//!   `check` and `cut_file`; [`read_template`], [`read_recipients`]).
//! - `summary`: what submit prints once it is done.
//! - `advert`: `--ad`: the checked file split by night-time consent into
//!   two batches that name each other.
//! - `many`: several files (or a directory) in one run, each its own
//!   batch `<--batch>-<file stem>`: all checked, then appended through one
//!   producer.

mod advert;
pub(crate) mod body;
pub(crate) mod follow_up;
mod many;
mod options;
mod summary;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use indicatif::ProgressBar;
use tokio::sync::mpsc;

use super::{CliError, RedisArgs};
use crate::events::chunk::MAX_CHUNK_RECIPIENTS;
use crate::events::options::{BatchOptions, Priority};
use crate::events::Template;
use crate::keys::validate_batch_id;
use crate::producer::{Producer, DEFAULT_MAX_UNREAD_CHUNKS, ROUND_BYTES, ROUND_CHUNKS};

use crate::producer::check::{check_recipients, Scan};
use crate::producer::cut_file::cut_recipients;
use crate::producer::input::Input;
pub(crate) use options::refuse_a_far_send_at;

pub use crate::producer::problems::LISTED;
pub use crate::producer::template::{KakaoFile, TemplateFile, MAX_TEMPLATE_FILE_BYTES};
pub use crate::producer::{Duplicates, FileEncoding};
pub use options::{
    batch_options, check_send_at, options_from, OptionsGiven, SEND_AT_GRACE, SEND_AT_HORIZON,
};

/// Submit flags.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch (campaign) id: letters, digits, '.', '_', '-'; at most 128.
    /// With several recipients files (or a directory): the prefix of each
    /// file's batch id.
    #[arg(long)]
    pub batch: String,
    /// Recipients: CSV with a header (a `to` column plus one column per
    /// template variable) or JSONL (one object per line), by extension.
    /// Numbers may be written as people write them (`+82 10-1234-5678`,
    /// `010 1234 5678`, `1012345678`): they are normalised to `01012345678`.
    ///
    /// Given more than once, or naming a directory (its `.csv`, `.jsonl`
    /// and `.ndjson` files, in name order), each file is a batch of its
    /// own, `<--batch>-<file name without extension>` (`--batch promo
    /// --recipients seoul.csv --recipients busan.csv`: `promo-seoul`,
    /// `promo-busan`), with the same template and options, in one run.
    /// Every file is checked first: a bad one appends nothing of any.
    #[arg(long, required = true, action = clap::ArgAction::Append)]
    pub recipients: Vec<PathBuf>,
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
    /// `GROUPCAST_TIMEZONE`, else this machine's zone unless it is UTC:
    /// then `--quiet-hours` is refused until a zone is given).
    #[arg(long, value_name = "IANA")]
    pub timezone: Option<String>,
    /// An advertising batch (Korean law; docs/advertising.md): the text
    /// must begin with `(광고)` and carry a free opt-out line
    /// (`무료수신거부 080-...`); nothing goes out 21:00-08:00 Asia/Seoul
    /// except to rows whose `night_consent` column says yes (they go in a
    /// second batch, `<batch>.night-consent`); the others are held to 08:00.
    #[arg(long)]
    pub ad: bool,
    /// This batch follows up the recipients of another batch (a fallback
    /// resend to those `groupcast results BATCH --from FILE` listed): the
    /// batch records its origin and its reports name it.
    #[arg(long, value_name = "BATCH")]
    pub follow_up_of: Option<String>,
}

/// Reads a template file ([`crate::producer::template::read_template`]),
/// failing as the CLI does.
pub fn read_template(path: &std::path::Path) -> Result<Template, CliError> {
    Ok(crate::producer::template::read_template(path)?)
}

/// Reads a recipients file into memory
/// ([`crate::producer::cut_file::read_recipients`]), failing as the CLI does.
pub fn read_recipients(
    path: &std::path::Path,
    template: &Template,
) -> Result<Vec<crate::events::Recipient>, CliError> {
    Ok(crate::producer::cut_file::read_recipients(path, template)?)
}

/// A usage error: what was given is wrong, and the message says what to do.
fn usage(msg: String) -> CliError {
    CliError::Usage(msg)
}

/// Checks the flags that need no file and no server: the batch id, the
/// chunk size, the template and the batch options.
fn check_flags(args: &SubmitArgs) -> Result<(Template, BatchOptions), CliError> {
    validate_batch_id(&args.batch).map_err(|e| usage(format!("--batch {:?}: {e}", args.batch)))?;
    if args.chunk_size == 0 || args.chunk_size > MAX_CHUNK_RECIPIENTS {
        return Err(usage(format!(
            "--chunk-size {}: must be between 1 and {MAX_CHUNK_RECIPIENTS} (one provider request)",
            args.chunk_size
        )));
    }
    let template = read_template(&args.template)?;
    let options = batch_options(args)?;
    if options.ad.is_some() {
        crate::events::options::check_ad_text(&template.text)
            .map_err(|e| usage(format!("{}: {e}", args.template.display())))?;
    }
    Ok((template, options))
}

/// Opens the recipients file and checks every row and chunk of it, on a
/// blocking thread: opening may transcode the whole file, and checking
/// reads it through.
async fn check_file(
    args: &SubmitArgs,
    file: &BatchFile,
    template: Template,
    options: BatchOptions,
) -> Result<(Input, Template, BatchOptions, Scan), CliError> {
    let (path, encoding, duplicates) = (file.path.clone(), file.encoding, args.duplicates);
    let (batch, size) = (file.batch.clone(), args.chunk_size);
    tokio::task::spawn_blocking(move || {
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
    .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")))?
}

/// Refuses to submit to a batch that takes no more chunks (reported,
/// cancelled, or reported with its events expired): its chunks would only
/// be refused by the workers and end in the dead letters, while `submit`
/// said it submitted them.
async fn refuse_an_ended_batch(store: &crate::store::Store, b: &str) -> Result<(), CliError> {
    match ended_batches(store, &[b.to_string()]).await?.pop() {
        Some((_, why)) => Err(CliError::Failed(why)),
        None => Ok(()),
    }
}

/// The batches of `batches` that take no more chunks (by index), each with
/// why, as [`refuse_an_ended_batch`] says it: one round trip a shard.
pub(crate) async fn ended_batches(
    store: &crate::store::Store,
    batches: &[String],
) -> Result<Vec<(usize, String)>, CliError> {
    use crate::projection::field;
    let read = store
        .read_batches(batches, &[field::REPORT.into(), field::CANCELLED.into()])
        .await?;
    let mut ended = Vec::new();
    for (i, (p, tombstoned)) in read.into_iter().enumerate() {
        let why = if let Some(why) = p.cancelled() {
            format!("was cancelled ({why})")
        } else if let Some(outcome) = p.report() {
            format!("was already reported ({outcome})")
        } else if tombstoned {
            "was already reported (its events have expired)".into()
        } else {
            continue;
        };
        let b = &batches[i];
        ended.push((
            i,
            format!("batch {b} {why}: it takes no more chunks; submit them under a new batch id"),
        ));
    }
    Ok(ended)
}

/// Records that `batch` follows up recipients of `origin` (listed in
/// `path`), before its first chunk: its reports name the origin.
async fn record_origin(
    store: &crate::store::Store,
    batch: &str,
    origin: &str,
    path: &std::path::Path,
) -> Result<(), CliError> {
    validate_batch_id(origin).map_err(|e| usage(format!("--follow-up-of {origin:?}: {e}")))?;
    if origin == batch {
        return Err(usage(format!(
            "--follow-up-of {origin}: a batch cannot follow itself up; give the follow-up its own --batch"
        )));
    }
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let event = crate::events::Event::BatchOrigin(crate::events::BatchOrigin {
        batch: origin.to_string(),
        filter: format!("recipients in {file}"),
    });
    let lane_log = store.batch_in_its_lane(batch).await?;
    lane_log
        .append(crate::projection::event_key::ORIGIN, &event)
        .await?;
    Ok(())
}

/// A producer that waits while `max_unread` chunks are unread, and says
/// once (after [`TELL_WAIT_AFTER`]) that it is waiting for the workers.
fn producer(store: crate::store::Store, max_unread: u64) -> Producer {
    let mut told = false;
    Producer::new(store).max_unread(max_unread).on_wait(move |w| {
        if !told && w.waited >= TELL_WAIT_AFTER {
            told = true;
            eprintln!(
                "groupcast: waiting: {} chunks unread in {} (--max-unread-chunks {}); is a `groupcast worker` running?",
                w.unread, w.stream, w.max_unread
            );
        }
    })
}

/// A progress bar over the chunks, on a terminal and without `--json`.
fn progress_bar(chunks: u32, json: bool) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() || json {
        return None;
    }
    let b = ProgressBar::new(u64::from(chunks));
    b.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} chunks {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(b)
}

/// Appends the chunks that come out of `rx`, in order, up to `per_round`
/// of them a round trip: whatever is ready when a round starts goes in it,
/// as long as it goes to the same shard's stream. `files` says, in order,
/// each file's shard and how many chunks it has; `appended` counts the
/// chunks appended.
async fn append_rounds(
    rx: &mut mpsc::Receiver<Vec<u8>>,
    per_round: usize,
    producer: &mut Producer,
    (lane, files): (Priority, &[(u32, u32)]),
    bar: Option<&ProgressBar>,
    appended: &mut u64,
) -> Result<(), CliError> {
    let mut shards = files
        .iter()
        .flat_map(|&(shard, chunks)| std::iter::repeat_n(shard, chunks as usize))
        .peekable();
    let more = || CliError::Failed("submit: more chunks were cut than checked".into());
    let mut round = Vec::with_capacity(per_round);
    while let Some(first) = rx.recv().await {
        let shard = shards.next().ok_or_else(more)?;
        round.push(first);
        // Room under the backpressure bound first: the chunks cut while
        // the stream is looked at go in this round, not the next.
        producer.ready(shard, lane, per_round).await?;
        // Whatever else is ready for the same stream goes in the same
        // round trip.
        while round.len() < per_round && shards.peek() == Some(&shard) {
            match rx.try_recv() {
                Ok(p) => {
                    shards.next();
                    round.push(p);
                }
                Err(_) => break,
            }
        }
        let n = round.len() as u64;
        producer
            .append_encoded(shard, lane, std::mem::take(&mut round))
            .await?;
        *appended += n;
        if let Some(b) = bar {
            b.inc(n);
        }
    }
    Ok(())
}

/// A recipients file and the batch its rows go to.
struct BatchFile {
    /// The batch id.
    batch: String,
    /// The file.
    path: PathBuf,
    /// Its encoding.
    encoding: FileEncoding,
}

/// Runs submit: checks the flags and the whole file, then cuts the file
/// on a thread of its own while its chunks are appended, and says what it
/// did. An advertising batch (`--ad`) is split by night consent first.
pub async fn run(args: SubmitArgs) -> Result<(), CliError> {
    let (template, options) = check_flags(&args)?;
    if let Some(files) = many::batch_files(&args)? {
        return many::run(&args, files, template, options).await;
    }
    let file = BatchFile {
        batch: args.batch.clone(),
        path: args.recipients.first().cloned().unwrap_or_default(),
        encoding: args.encoding,
    };
    if options.ad.is_some() {
        return advert::run(&args, file, template, options).await;
    }
    let checked = check_file(&args, &file, template, options).await?;
    submit_file(&args, &file, checked).await
}

/// Appends a checked file's chunks to `file.batch`, and says what it did.
async fn submit_file(
    args: &SubmitArgs,
    file: &BatchFile,
    (input, template, options, scan): (Input, Template, BatchOptions, Scan),
) -> Result<(), CliError> {
    let stamp = input.stamp();
    let read_as = input.encoding.name();
    let shown_options = options.clone();

    let store = args.redis.connect().await?;
    refuse_an_ended_batch(&store, &file.batch).await?;
    if let Some(origin) = &args.follow_up_of {
        record_origin(&store, &file.batch, origin, &file.path).await?;
    }
    let shard = store.keys.shard_of(&file.batch);
    refuse_a_far_send_at(&store, shard, &options).await?;
    let lane = options.priority();
    let stream = store.keys.ingest_in(shard, lane);
    let notes = summary::notes(&input, &scan);
    let mut producer = producer(store, args.max_unread_chunks);
    let bar = progress_bar(scan.checked.chunks, args.json);
    let scan_chunks = scan.checked.chunks;

    // Room for about ROUND_BYTES of encoded chunks between the reader and
    // the appender (at least one round of small chunks).
    let per_round = (ROUND_BYTES / scan.checked.largest_chunk.max(1)).clamp(1, ROUND_CHUNKS);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(per_round);
    let (batch, size) = (file.batch.clone(), args.chunk_size);
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
    let appended = append_rounds(
        &mut rx,
        per_round,
        &mut producer,
        (lane, &[(shard, scan_chunks)]),
        bar.as_ref(),
        &mut 0,
    )
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
    let summary = summary::Summary {
        batch: &file.batch,
        stream: &stream,
        read_as,
        options: &shown_options,
        file: None,
    };
    summary.print(&scan, notes, args.json);
    Ok(())
}

/// How long submit waits for the workers before it says so.
const TELL_WAIT_AFTER: Duration = Duration::from_secs(2);
