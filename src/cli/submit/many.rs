//! `submit` of several recipients files in one run: `--recipients` given
//! more than once, or naming a directory. Each file is a batch of its own,
//! `<--batch>-<file stem>`, with the same template and options.
//!
//! Every file is checked before anything is appended, as a single file's
//! every row is: a bad file (or a batch that has ended) appends nothing of
//! any file, and the error lists every bad file's problems, each naming its
//! file. Then one connection and one producer append the files' chunks in
//! order, the chunks of consecutive batches of one shard sharing round
//! trips, and one line (or JSON object) per batch says what was appended.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

use super::options::refuse_a_far_send_at;
use super::{
    append_rounds, check_file, ended_batches, producer, progress_bar, summary, usage, BatchFile,
    SubmitArgs,
};
use crate::cli::CliError;
use crate::events::options::BatchOptions;
use crate::events::Template;
use crate::keys::validate_batch_id;
use crate::producer::check::Scan;
use crate::producer::cut_file::cut_recipients;
use crate::producer::input::Input;
use crate::producer::{ROUND_BYTES, ROUND_CHUNKS};

/// The most files one `submit` takes: each stays open from its check to
/// its cutting, and a process may hold only so many files open.
pub(super) const MAX_FILES: usize = 500;

/// The extensions of the files taken from a directory (`.json` is left
/// out: a template is often kept beside the recipients files).
const DIRECTORY_EXTENSIONS: [&str; 3] = ["csv", "jsonl", "ndjson"];

/// The files `--recipients` names, each with its batch id, when they are
/// several or a directory; None when it names one file (submitted as
/// `--batch` itself).
pub(super) fn batch_files(args: &SubmitArgs) -> Result<Option<Vec<BatchFile>>, CliError> {
    if let [one] = args.recipients.as_slice() {
        if !one.is_dir() {
            return Ok(None);
        }
    }
    let mut paths = Vec::new();
    for given in &args.recipients {
        if given.is_dir() {
            let found = directory_files(given, &args.template)?;
            if found.is_empty() {
                return Err(usage(format!(
                    "--recipients {}: no .csv, .jsonl or .ndjson file in this directory",
                    given.display()
                )));
            }
            paths.extend(found);
        } else {
            paths.push(given.clone());
        }
    }
    if args.ad {
        return Err(usage(
            "--ad takes one recipients file at a time (each is split by night consent): submit the files one by one".into(),
        ));
    }
    if args.follow_up_of.is_some() {
        return Err(usage(
            "--follow-up-of takes one recipients file (the follow-up batch's): submit the files one by one".into(),
        ));
    }
    if paths.len() > MAX_FILES {
        return Err(usage(format!(
            "--recipients: {} files, more than the {MAX_FILES} one submit takes: submit them in several runs",
            paths.len()
        )));
    }
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let batch = batch_of(&args.batch, &path)?;
        if let Some(other) = seen.insert(batch.clone(), path.clone()) {
            return Err(usage(format!(
                "{} and {} would both be batch {batch}: each file's batch is --batch and its name without the extension; rename one (or give the same file once)",
                other.display(),
                path.display()
            )));
        }
        files.push(BatchFile {
            batch,
            path,
            encoding: args.encoding,
        });
    }
    Ok(Some(files))
}

/// The batch id of `path` among several files: `<prefix>-<file stem>`.
fn batch_of(prefix: &str, path: &Path) -> Result<String, CliError> {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return Err(usage(format!(
            "{}: the file's name gives no batch id: name it with letters, digits, '.', '_', '-'",
            path.display()
        )));
    };
    let batch = format!("{prefix}-{stem}");
    validate_batch_id(&batch).map_err(|e| {
        usage(format!(
            "{}: its batch would be {batch:?} (--batch, '-', the file's name without the extension): {e}; rename the file",
            path.display()
        ))
    })?;
    Ok(batch)
}

/// The recipients files of directory `dir` (not its subdirectories), in
/// name order: those with an extension of [`DIRECTORY_EXTENSIONS`], not
/// hidden, and not the template.
fn directory_files(dir: &Path, template: &Path) -> Result<Vec<PathBuf>, CliError> {
    let cannot =
        |e: std::io::Error| usage(format!("--recipients {}: cannot read: {e}", dir.display()));
    let template = std::fs::canonicalize(template).ok();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(cannot)? {
        let path = entry.map_err(cannot)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        if name.starts_with('.') || !DIRECTORY_EXTENSIONS.contains(&ext.as_str()) || !path.is_file()
        {
            continue;
        }
        if template.is_some() && std::fs::canonicalize(&path).ok() == template {
            continue;
        }
        files.push(path);
    }
    files.sort();
    Ok(files)
}

/// A file checked, with what its summary needs.
struct Checked {
    file: BatchFile,
    input: Input,
    scan: Scan,
    stamp: Option<(u64, std::time::SystemTime)>,
    notes: Vec<String>,
    read_as: &'static str,
}

/// Checks every file, and says every problem of every bad one.
async fn check_all(
    args: &SubmitArgs,
    files: Vec<BatchFile>,
    template: &Template,
    options: &BatchOptions,
) -> Result<Vec<Checked>, CliError> {
    let n = files.len();
    let mut checked = Vec::with_capacity(n);
    let mut refused = Vec::new();
    for file in files {
        match check_file(args, &file, template.clone(), options.clone()).await {
            Ok((input, _, _, scan)) => checked.push(Checked {
                stamp: input.stamp(),
                notes: summary::notes(&input, &scan),
                read_as: input.encoding.name(),
                file,
                input,
                scan,
            }),
            Err(e) => refused.push((file.path, e)),
        }
    }
    if refused.is_empty() {
        return Ok(checked);
    }
    let all_usage = refused.iter().all(|(_, e)| matches!(e, CliError::Usage(_)));
    let mut msg = String::new();
    for (path, e) in &refused {
        let shown = path.display().to_string();
        let e = e.to_string();
        if e.contains(&shown) {
            msg.push_str(&e);
        } else {
            msg.push_str(&format!("{shown}: {e}"));
        }
        msg.push('\n');
    }
    msg.push_str(&format!(
        "{} of {n} file(s) refused: nothing of any file was appended: fix them and submit again",
        refused.len()
    ));
    Err(if all_usage {
        CliError::Usage(msg)
    } else {
        CliError::Failed(msg)
    })
}

/// Submits several files, each its own batch: every file checked, every
/// batch found open, then all the chunks appended through one producer.
pub(super) async fn run(
    args: &SubmitArgs,
    files: Vec<BatchFile>,
    template: Template,
    options: BatchOptions,
) -> Result<(), CliError> {
    let mut checked = check_all(args, files, &template, &options).await?;
    let store = args.redis.connect().await?;
    refuse_ended(&store, &checked).await?;
    let lane = options.priority();
    let mut shards: Vec<u32> = checked
        .iter()
        .map(|c| store.keys.shard_of(&c.file.batch))
        .collect();
    // The send time is the same for every batch: checked once a shard.
    let mut timed = shards.clone();
    timed.sort_unstable();
    timed.dedup();
    for shard in timed {
        refuse_a_far_send_at(&store, shard, &options).await?;
    }
    let streams: Vec<String> = shards
        .iter()
        .map(|&s| store.keys.ingest_in(s, lane))
        .collect();
    let plan: Vec<(u32, u32)> = shards
        .drain(..)
        .zip(checked.iter().map(|c| c.scan.checked.chunks))
        .collect();
    let total_chunks: u32 = plan.iter().map(|&(_, n)| n).sum();
    let largest = checked
        .iter()
        .map(|c| c.scan.checked.largest_chunk)
        .max()
        .unwrap_or(1);
    let mut producer = producer(store, args.max_unread_chunks);
    let bar = progress_bar(total_chunks, args.json);

    let per_round = (ROUND_BYTES / largest.max(1)).clamp(1, ROUND_CHUNKS);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(per_round);
    let (mut inputs, mut scans) = (Vec::new(), Vec::new());
    let mut shown = Vec::new();
    for c in checked.drain(..) {
        inputs.push((c.input, c.file.batch.clone(), c.stamp));
        scans.push(c.scan);
        shown.push((c.file, c.notes, c.read_as));
    }
    let cutting = (template, options.clone(), args.chunk_size);
    let reader = tokio::task::spawn_blocking(move || cut_all(inputs, scans, cutting, &tx));
    let mut appended = 0u64;
    let result = append_rounds(
        &mut rx,
        per_round,
        &mut producer,
        (lane, &plan),
        bar.as_ref(),
        &mut appended,
    )
    .await;
    drop(rx);
    let read = reader
        .await
        .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")));
    let scans = match result.and(read?) {
        Ok(scans) => scans,
        Err(e) => return Err(stopped_part_way(e, &shown, &plan, appended)),
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    print_summaries(args, &options, shown, &scans, &streams);
    Ok(())
}

/// Refuses the run when a batch of `checked` has ended, naming each
/// such file.
async fn refuse_ended(store: &crate::store::Store, checked: &[Checked]) -> Result<(), CliError> {
    let ids: Vec<String> = checked.iter().map(|c| c.file.batch.clone()).collect();
    let ended = ended_batches(store, &ids).await?;
    if ended.is_empty() {
        return Ok(());
    }
    let mut msg = String::new();
    for (i, why) in ended {
        msg.push_str(&format!("{}: {why}\n", checked[i].file.path.display()));
    }
    msg.push_str("nothing of any file was appended");
    Err(CliError::Failed(msg))
}

/// A file to cut: its input, its batch, and its stamp when checked.
type ToCut = (Input, String, Option<(u64, std::time::SystemTime)>);

/// Cuts every file into chunks sent to `out` (the file reader's side, off
/// the runtime), with `cutting`'s template, options and chunk size, once
/// every file is found as it was checked. Returns the scans.
fn cut_all(
    mut inputs: Vec<ToCut>,
    scans: Vec<Scan>,
    (template, options, size): (Template, BatchOptions, usize),
    out: &mpsc::Sender<Vec<u8>>,
) -> Result<Vec<Scan>, CliError> {
    // Every file as it was checked, before any is cut.
    for (input, _, stamp) in &inputs {
        if input.stamp() != *stamp {
            return Err(CliError::Failed(format!(
                "{}: the file changed while it was submitted; nothing of any file was appended",
                input.path.display()
            )));
        }
    }
    for ((input, batch, _), scan) in inputs.iter_mut().zip(&scans) {
        cut_recipients(input, batch, (&template, &options), size, scan, out)?;
    }
    Ok(scans)
}

/// Prints each batch's summary (one line or JSON object), then the totals.
fn print_summaries(
    args: &SubmitArgs,
    options: &BatchOptions,
    shown: Vec<(BatchFile, Vec<String>, &'static str)>,
    scans: &[Scan],
    streams: &[String],
) {
    let (mut recipients, mut chunks) = (0, 0);
    for (((file, notes, read_as), scan), stream) in shown.into_iter().zip(scans).zip(streams) {
        recipients += scan.checked.recipients;
        chunks += scan.checked.chunks;
        let summary = summary::Summary {
            batch: &file.batch,
            stream,
            read_as,
            options,
            file: Some(&file.path),
        };
        summary.print(scan, notes, args.json);
    }
    if !args.json {
        println!(
            "submitted {} batches: {recipients} recipients in {chunks} chunks",
            scans.len()
        );
    }
}

/// The error of a run that stopped after `appended` chunks: which batches
/// were appended in full, which in part, which not at all.
fn stopped_part_way(
    e: CliError,
    files: &[(BatchFile, Vec<String>, &'static str)],
    plan: &[(u32, u32)],
    appended: u64,
) -> CliError {
    let (mut full, mut part, mut none) = (Vec::new(), Vec::new(), Vec::new());
    let mut before = 0u64;
    for ((file, _, _), &(_, chunks)) in files.iter().zip(plan) {
        let end = before + u64::from(chunks);
        let which = if appended >= end {
            &mut full
        } else if appended > before {
            &mut part
        } else {
            &mut none
        };
        which.push(file.batch.as_str());
        before = end;
    }
    if full.is_empty() && part.is_empty() {
        return e;
    }
    let list = |b: &[&str]| b.join(", ");
    let mut msg = format!("{e}\n");
    if !full.is_empty() {
        msg.push_str(&format!("submitted in full: {}\n", list(&full)));
    }
    if !part.is_empty() {
        msg.push_str(&format!(
            "submitted in part (without its last chunk, it will not complete; submit its file again under another batch id): {}\n",
            list(&part)
        ));
    }
    if !none.is_empty() {
        msg.push_str(&format!("not submitted: {}\n", list(&none)));
    }
    let msg = msg.trim_end().to_string();
    match e {
        CliError::Usage(_) => CliError::Usage(msg),
        CliError::Redis(_) => CliError::Redis(msg),
        CliError::Failed(_) => CliError::Failed(msg),
    }
}
