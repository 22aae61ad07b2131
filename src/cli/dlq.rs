//! `groupcast dlq list|show|redrive|purge`: work the dead letters.
//!
//! Every dead letter is read for what it holds (the batch, seq and op of
//! its payload) and judged: a redrive can help one that failed at the
//! provider or in transit, never one whose input is invalid, whose envelope
//! version this worker cannot read, that its batch already rejected, or
//! whose batch has ended. `redrive` skips those unless `--force`. `redrive`
//! and `purge` act on ids, a batch, a reason, or everything, after a
//! confirmation, and leave a `dead_letter_handled` event on each batch
//! concerned (`groupcast audit BATCH` shows who did what). See docs/dlq.md.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};

use clap::{Args, Subcommand};

use super::{human_duration, human_time, outln, print_table, CliError, RedisArgs};
use crate::events::chunk::ChunkRef;
use crate::events::{
    decode_payload, entry_millis, DeadLetterHandled, Event, ENVELOPE_VERSION, QUOTE_MAX,
};
use crate::keys::validate_batch_id;
use crate::projection::field;
use crate::store::queue::Entry;
use crate::store::Store;
use crate::worker::ops::{Op, WorkItem};

/// Dead-letter flags.
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: DlqAction,
}

/// Which dead letters, by what they hold.
#[derive(Debug, Clone, Default, Args)]
pub struct Filter {
    /// Only the dead letters of this batch.
    #[arg(long)]
    pub batch: Option<String>,
    /// Only the dead letters whose reason contains this text.
    #[arg(long)]
    pub reason: Option<String>,
}

/// Which dead letters a redrive or a purge acts on, and whether to ask.
#[derive(Debug, Clone, Default, Args)]
pub struct Selection {
    /// Dead letter ids (with --batch or --reason: only those of them).
    pub ids: Vec<String>,
    /// By batch and reason.
    #[command(flatten)]
    pub filter: Filter,
    /// Every dead letter.
    #[arg(long, conflicts_with_all = ["ids", "batch", "reason"])]
    pub all: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Dead-letter actions.
#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// List dead letters (every shard): id, age, batch, seq, op, whether a
    /// redrive can help, reason.
    List {
        /// By batch and reason.
        #[command(flatten)]
        filter: Filter,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with every field.
    Show {
        /// The dead letter's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back on the stream they came from (after fixing the
    /// cause), and remove them from the dead letters. A work item starts a
    /// fresh retry budget (--retry-for counts again from its next failure).
    /// Dead letters a redrive cannot help are skipped, saying why.
    Redrive {
        /// Which ones.
        #[command(flatten)]
        select: Selection,
        /// Redrive the ones a redrive cannot help too.
        #[arg(long)]
        force: bool,
    },
    /// Delete dead letters for good (their recipients are not sent).
    Purge {
        /// Which ones.
        #[command(flatten)]
        select: Selection,
    },
}

/// A dead letter's entry as JSON (payloads shown by size).
pub fn describe(e: &Entry) -> serde_json::Value {
    let original: serde_json::Map<String, serde_json::Value> = e
        .fields
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k, v)))
        .map(|(k, v)| {
            let shown = if k == "d" || k == "c" {
                format!("<{} bytes>", v.len())
            } else {
                String::from_utf8_lossy(v).into_owned()
            };
            (k.to_string(), serde_json::Value::String(shown))
        })
        .collect();
    serde_json::json!({
        "id": e.id,
        "time": human_time(entry_millis(&e.id)),
        "source": e.text("source"),
        "entry": e.text("entry"),
        // Letters written before reasons were redacted may hold a token.
        "reason": e.text("reason").map(|r| crate::redact::text(&r)),
        "deliveries": e.text("deliveries"),
        "consumer": e.text("consumer"),
        "original": original,
    })
}

/// What a dead letter holds, read from its payload (never its recipients'
/// numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The batch, when the payload names one.
    pub batch: Option<String>,
    /// The chunk's seq (an ingest chunk, or a load item).
    pub seq: Option<u32>,
    /// `chunk` for an ingest entry, else the work item's op.
    pub op: String,
    /// One line: `chunk 3 (50 recipients, last)`, `create generation 0`.
    pub what: String,
    /// The chunk's content digest (an ingest chunk).
    pub digest: Option<String>,
    /// Why a redrive cannot help, known from the entry alone (the same
    /// entry is refused the same way).
    pub hopeless: Option<String>,
}

/// Reads a dead letter's payload.
pub fn holding(e: &Entry) -> Holding {
    let mut h = Holding {
        batch: None,
        seq: None,
        op: e.text("f:op").unwrap_or_else(|| "chunk".into()),
        what: String::new(),
        digest: None,
        hopeless: None,
    };
    let data = e.get("f:d");
    if e.get("f:op").is_some() {
        let item = data.map(|d| decode_payload::<WorkItem>("work item", d));
        match (Op::parse(&h.op), item) {
            (None, _) => h.hopeless = Some(format!("invalid input: unknown op {:?}", h.op)),
            (_, None) => h.hopeless = Some("invalid input: the work item has no payload".into()),
            (_, Some(Err(err))) => h.hopeless = Some(format!("invalid input: {err}")),
            (Some(_), Some(Ok(item))) => {
                h.what = match item.seq {
                    Some(seq) => format!("{} chunk {seq} of generation {}", h.op, item.gen),
                    None => format!("{} generation {}", h.op, item.gen),
                };
                h.batch = Some(item.batch);
                h.seq = item.seq;
            }
        }
        return h;
    }
    match e.get("f:v") {
        Some(v) if v == ENVELOPE_VERSION.as_bytes() => {}
        other => {
            let v = other.map(|v| crate::events::clip(&String::from_utf8_lossy(v), QUOTE_MAX));
            h.hopeless = Some(format!(
                "unknown envelope version {v:?} (this worker reads version {ENVELOPE_VERSION})"
            ));
            return h;
        }
    }
    if e.get("f:t") != Some(b"chunk".as_slice()) {
        h.hopeless = Some("invalid input: the entry is not a chunk".into());
        return h;
    }
    let Some(data) = data else {
        h.hopeless = Some("invalid input: the entry has no payload".into());
        return h;
    };
    let mut fallback = None;
    let chunk = match ChunkRef::decode_any(data, &mut fallback) {
        Ok(c) => c,
        Err(err) => {
            h.hopeless = Some(format!("invalid input: undecodable chunk: {err}"));
            return h;
        }
    };
    h.seq = Some(chunk.seq);
    h.what = format!(
        "chunk {} ({} recipients{})",
        chunk.seq,
        chunk.recipients.len(),
        if chunk.last { ", last" } else { "" }
    );
    if let Err(err) = validate_batch_id(chunk.batch) {
        h.hopeless = Some(format!("invalid input: invalid batch id: {err}"));
        return h;
    }
    h.batch = Some(chunk.batch.to_string());
    if let Err(err) = chunk.validate() {
        h.hopeless = Some(format!("invalid input: {err}"));
        return h;
    }
    h.digest = Some(chunk.digest());
    h
}

/// Whether a redrive can help a dead letter, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It failed at the provider or in transit: once the cause is fixed, a
    /// redrive can go through.
    Redrivable,
    /// A redrive cannot help: the same entry is refused the same way.
    Hopeless(String),
}

impl Verdict {
    /// Short form for the table: `yes`, `no`.
    fn short(&self) -> &'static str {
        match self {
            Verdict::Redrivable => "yes",
            Verdict::Hopeless(_) => "no",
        }
    }
}

/// A dead letter, what it holds, and the verdict on it.
#[derive(Debug, Clone)]
pub struct Letter {
    /// Its shard.
    pub shard: u32,
    /// The dead letter.
    pub entry: Entry,
    /// What it holds.
    pub holding: Holding,
    /// Whether a redrive can help.
    pub verdict: Verdict,
    /// How long ago it was dead-lettered (ms, on its shard's clock).
    pub age_ms: u64,
}

impl Letter {
    /// As JSON: the entry ([`describe`]) with what it holds and the verdict.
    pub fn json(&self) -> serde_json::Value {
        let mut v = describe(&self.entry);
        v["batch"] = self.holding.batch.clone().into();
        v["seq"] = self.holding.seq.into();
        v["op"] = self.holding.op.clone().into();
        v["payload"] = self.holding.what.clone().into();
        v["ageMs"] = self.age_ms.into();
        v["redrivable"] = (self.verdict == Verdict::Redrivable).into();
        if let Verdict::Hopeless(why) = &self.verdict {
            v["notRedrivable"] = why.clone().into();
        }
        v
    }
}

/// Judges a dead letter against its batch's state: besides what the entry
/// itself shows, a batch that has ended takes nothing more (a chunk: the
/// batch was reported, cancelled or closed; a work item: it was reported),
/// and a chunk the batch rejected with this very content is rejected again.
async fn judge(store: &Store, h: &Holding) -> Result<Verdict, CliError> {
    if let Some(why) = &h.hopeless {
        return Ok(Verdict::Hopeless(why.clone()));
    }
    let Some(batch) = &h.batch else {
        return Ok(Verdict::Redrivable);
    };
    let rejected = match (h.seq, &h.digest) {
        (Some(seq), Some(d)) => Some(field::key(&format!("reject/{seq}/{d}"))),
        _ => None,
    };
    let mut names = vec![
        field::REPORT.to_string(),
        field::CANCELLED.to_string(),
        field::CLOSED.to_string(),
        field::HEARTBEAT.to_string(),
    ];
    names.extend(rejected.clone());
    let p = store.batch(batch).read(&names).await?;
    let chunk = h.op == "chunk";
    if let Some(outcome) = p.get(field::REPORT) {
        return Ok(Verdict::Hopeless(format!(
            "batch ended: {batch} was reported ({outcome})"
        )));
    }
    if chunk {
        if let Some(why) = p.get(field::CANCELLED) {
            return Ok(Verdict::Hopeless(format!(
                "batch ended: {batch} was cancelled ({why})"
            )));
        }
        if let Some(why) = p.get(field::CLOSED) {
            return Ok(Verdict::Hopeless(format!(
                "batch ended: {batch} was closed ({why})"
            )));
        }
        if rejected.is_some_and(|k| p.get(&k).is_some()) {
            return Ok(Verdict::Hopeless(format!(
                "invalid input: {batch} rejected this very chunk; send a corrected one"
            )));
        }
    } else if p.get(field::HEARTBEAT).is_none() {
        return Ok(Verdict::Hopeless(format!(
            "batch ended: {batch} has no state any more (past its retention)"
        )));
    }
    Ok(Verdict::Redrivable)
}

/// Every dead letter that `filter` lets through, read and judged, oldest
/// first per shard.
pub async fn letters(store: &Store, filter: &Filter) -> Result<Vec<Letter>, CliError> {
    let mut out = Vec::new();
    let mut now_of: BTreeMap<u32, u64> = BTreeMap::new();
    for (shard, entry) in store.dead_letter_entries().await? {
        if let Some(text) = &filter.reason {
            if !entry
                .text("reason")
                .unwrap_or_default()
                .contains(text.as_str())
            {
                continue;
            }
        }
        let holding = holding(&entry);
        if filter.batch.is_some() && holding.batch != filter.batch {
            continue;
        }
        let verdict = judge(store, &holding).await?;
        let now = match now_of.get(&shard) {
            Some(now) => *now,
            None => {
                let now = store.shard_time_ms(shard).await?;
                now_of.insert(shard, now);
                now
            }
        };
        let age_ms = now.saturating_sub(entry_millis(&entry.id));
        out.push(Letter {
            shard,
            entry,
            holding,
            verdict,
            age_ms,
        });
    }
    Ok(out)
}

/// The dead letters a selection names. Refuses a selection that names
/// nothing (no id, no filter, no `--all`).
async fn selected(store: &Store, select: &Selection) -> Result<Vec<Letter>, CliError> {
    let f = &select.filter;
    if select.ids.is_empty() && f.batch.is_none() && f.reason.is_none() && !select.all {
        return Err(CliError::Usage(
            "say which dead letters: ids, --batch BATCH, --reason TEXT, or --all".into(),
        ));
    }
    let mut found = letters(store, f).await?;
    if !select.ids.is_empty() {
        found.retain(|l| select.ids.contains(&l.entry.id));
        let missing: Vec<&String> = select
            .ids
            .iter()
            .filter(|id| !found.iter().any(|l| &&l.entry.id == id))
            .collect();
        if !missing.is_empty() {
            return Err(CliError::Failed(format!(
                "no dead letter {} (see `groupcast dlq list`); nothing done",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(found)
}

/// Asks `question` on the terminal; `--yes` answers for the operator.
/// Without a terminal and without `--yes`, refuses: a script must say so.
fn confirm(question: &str, yes: bool) -> Result<bool, CliError> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(format!(
            "{question} Not confirmed: stdin is not a terminal; add --yes to do it without asking"
        )));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Failed(format!("reading the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "Yes"))
}

/// Who is acting, for the audit event.
fn operator() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into())
}

/// Records `action` on `letter` in its batch's events (when the batch has
/// a state: one past its retention gets none back). Answers whether it was
/// recorded.
async fn record(store: &Store, letter: &Letter, action: &str) -> Result<bool, CliError> {
    let Some(batch) = &letter.holding.batch else {
        return Ok(false);
    };
    let log = store.batch(batch);
    if log
        .read(&[field::HEARTBEAT.to_string()])
        .await?
        .fields
        .is_empty()
    {
        return Ok(false);
    }
    let what = match letter.holding.what.as_str() {
        "" => letter.holding.op.clone(),
        w => w.to_string(),
    };
    let event = Event::DeadLetterHandled(DeadLetterHandled {
        action: action.into(),
        entry: letter.entry.id.clone(),
        what,
        reason: letter.entry.text("reason").unwrap_or_default(),
        by: operator(),
    });
    log.append(&format!("dlq/{action}/{}", letter.entry.id), &event)
        .await?;
    Ok(true)
}

/// Prints the letters about to be acted on, one line each.
fn preview(letters: &[&Letter]) {
    for l in letters {
        outln!(
            "  {} {} {} {}",
            l.entry.id,
            l.holding.batch.as_deref().unwrap_or("-"),
            if l.holding.what.is_empty() {
                l.holding.op.as_str()
            } else {
                l.holding.what.as_str()
            },
            l.entry.text("reason").unwrap_or_default()
        );
    }
}

/// Runs a dead-letter action.
pub async fn run(args: DlqArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    match args.action {
        DlqAction::List { filter, json } => list(&store, &filter, json).await,
        DlqAction::Show { id, json } => show(&store, &id, json).await,
        DlqAction::Redrive { select, force } => redrive(&store, &select, force).await,
        DlqAction::Purge { select } => purge(&store, &select).await,
    }
}

/// `dlq list`: the dead letters `filter` selects, as a table or JSON lines.
async fn list(store: &Store, filter: &Filter, json: bool) -> Result<(), CliError> {
    let letters = letters(store, filter).await?;
    if json {
        for l in &letters {
            outln!("{}", l.json());
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = letters.iter().map(list_row).collect();
    print_table(
        &["id", "age", "batch", "seq", "op", "redrive", "reason"],
        &rows,
    );
    let hopeless = letters
        .iter()
        .filter(|l| l.verdict != Verdict::Redrivable)
        .count();
    outln!(
        "{} dead letter(s), {hopeless} that a redrive cannot help (`dlq show ID` says why)",
        rows.len()
    );
    Ok(())
}

/// A dead letter's row in `dlq list`.
fn list_row(l: &Letter) -> Vec<String> {
    vec![
        l.entry.id.clone(),
        human_duration(l.age_ms),
        l.holding.batch.clone().unwrap_or_else(|| "-".into()),
        l.holding.seq.map_or("-".into(), |s| s.to_string()),
        l.holding.op.clone(),
        l.verdict.short().into(),
        l.entry.text("reason").unwrap_or_default(),
    ]
}

/// `dlq show ID`: one dead letter with every field.
async fn show(store: &Store, id: &str, json: bool) -> Result<(), CliError> {
    let letters = letters(store, &Filter::default()).await?;
    let l = letters
        .iter()
        .find(|l| l.entry.id == id)
        .ok_or_else(|| CliError::Failed(format!("no dead letter {id}")))?;
    let d = l.json();
    if json {
        outln!("{d}");
    } else {
        outln!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
    }
    Ok(())
}

/// The letters a redrive goes on with (all of them with `force`), and the
/// lines saying which were skipped and why.
fn redrivable(found: &[Letter], force: bool) -> (Vec<&Letter>, Vec<String>) {
    let (mut go, mut skipped) = (Vec::new(), Vec::new());
    for l in found {
        match &l.verdict {
            Verdict::Hopeless(why) if !force => skipped.push(format!(
                "skipped {}: a redrive cannot help ({why}); purge it, or --force to redrive it anyway",
                l.entry.id
            )),
            _ => go.push(l),
        }
    }
    (go, skipped)
}

/// `dlq redrive`: puts the selected dead letters back on the streams they
/// came from, once confirmed.
async fn redrive(store: &Store, select: &Selection, force: bool) -> Result<(), CliError> {
    let found = selected(store, select).await?;
    let (go, skipped) = redrivable(&found, force);
    for line in skipped {
        outln!("{line}");
    }
    if go.is_empty() {
        outln!("0 dead letter(s) redriven");
        return Ok(());
    }
    preview(&go);
    if !confirm(
        &format!("Redrive these {} dead letter(s)?", go.len()),
        select.yes,
    )? {
        outln!("nothing redriven");
        return Ok(());
    }
    let mut n = 0;
    for l in go {
        let Some(source) = store
            .redrive_letter(l.shard, &l.entry)
            .await
            .map_err(|err| CliError::Redis(format!("redriving {}: {err}", l.entry.id)))?
        else {
            outln!("skipped {}: it names no source stream", l.entry.id);
            continue;
        };
        record(store, l, "redrive").await?;
        outln!("redrove {} to {source}", l.entry.id);
        n += 1;
    }
    outln!("{n} dead letter(s) redriven");
    Ok(())
}

/// `dlq purge`: deletes the selected dead letters for good, once confirmed.
async fn purge(store: &Store, select: &Selection) -> Result<(), CliError> {
    let found = selected(store, select).await?;
    if found.is_empty() {
        outln!("0 dead letter(s) purged");
        return Ok(());
    }
    let all: Vec<&Letter> = found.iter().collect();
    preview(&all);
    if !confirm(
        &format!(
            "Delete these {} dead letter(s) for good? Their recipients are not sent.",
            all.len()
        ),
        select.yes,
    )? {
        outln!("nothing purged");
        return Ok(());
    }
    let mut n = 0;
    for l in all {
        // Recorded first: a purge that fails after it leaves the
        // letter and an event saying it was purged, visibly; the
        // other order could lose the trace of a deletion.
        record(store, l, "purge").await?;
        if store.purge_letter(l.shard, &l.entry.id).await? {
            n += 1;
        }
    }
    outln!("{n} dead letter(s) purged");
    Ok(())
}
