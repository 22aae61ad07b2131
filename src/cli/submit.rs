//! `groupcast submit`: reads a recipients file (CSV or JSONL) and a template,
//! validates every row first, cuts chunks and appends them. On bad input it
//! names the file, line and field, exits 2, and appends nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, IsTerminal, Read};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;

use super::{CliError, RedisArgs};
use crate::events::chunk::{KakaoTemplate, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS};
use crate::events::{clip, ChunkError, QUOTE_MAX};
use crate::events::{Recipient, Template};
use crate::keys::validate_batch_id;
use crate::phone;
use crate::producer;

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

/// Reads and validates every recipient row.
pub fn read_recipients(path: &Path, template: &Template) -> Result<Vec<Recipient>, CliError> {
    let file = std::fs::File::open(path)
        .map_err(|e| usage(format!("{}: cannot read: {e}", path.display())))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let rows: Vec<(usize, BTreeMap<String, String>)> = match ext.as_str() {
        "csv" => read_csv(path, file)?,
        "jsonl" | "ndjson" | "json" => read_jsonl(path, file)?,
        other => {
            return Err(usage(format!(
                "{}: unknown recipients format {other:?}: use .csv (with a header) or .jsonl",
                path.display()
            )))
        }
    };
    if rows.is_empty() {
        return Err(usage(format!(
            "{}: no recipients in the file",
            path.display()
        )));
    }
    let names = template.placeholders();
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(rows.len());
    let mut out = Vec::with_capacity(rows.len());
    for (line, mut vars) in rows {
        let at = |field: &str, what: String| {
            usage(format!(
                "{}:{line}: field `{field}`: {what}",
                path.display()
            ))
        };
        let to = vars
            .remove("to")
            .ok_or_else(|| at("to", "missing".into()))?;
        let to = to.trim().replace('-', "");
        if !phone::is_valid_number(&to) {
            return Err(at(
                "to",
                format!(
                    "{:?} is not a valid phone number (digits only, 9 to 11, starting with 0)",
                    clip(&to, QUOTE_MAX)
                ),
            ));
        }
        if let Some(first) = seen.insert(to.clone(), line) {
            return Err(at("to", format!("{to} repeats line {first}")));
        }
        for n in &names {
            match vars.get(n) {
                None => return Err(at(n, format!("missing; the template uses #{{{n}}}"))),
                Some(v) if v.chars().count() > MAX_VAR_CHARS => {
                    return Err(at(n, format!("longer than {MAX_VAR_CHARS} characters")))
                }
                _ => {}
            }
        }
        out.push(Recipient { to, vars });
    }
    Ok(out)
}

type Rows = Vec<(usize, BTreeMap<String, String>)>;

fn read_csv(path: &Path, file: std::fs::File) -> Result<Rows, CliError> {
    let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(file);
    let headers = reader
        .headers()
        .map_err(|e| usage(format!("{}:1: unreadable CSV header: {e}", path.display())))?
        .clone();
    if !headers.iter().any(|h| h.trim() == "to") {
        return Err(usage(format!(
            "{}:1: the header has no `to` column",
            path.display()
        )));
    }
    let mut rows = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line() as usize).unwrap_or(line);
            usage(format!("{}:{line}: malformed CSV: {e}", path.display()))
        })?;
        let vars = headers
            .iter()
            .map(|h| h.trim().to_string())
            .zip(rec.iter().map(str::to_string))
            .collect();
        rows.push((line, vars));
    }
    Ok(rows)
}

fn read_jsonl(path: &Path, file: std::fs::File) -> Result<Rows, CliError> {
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| usage(format!("{}:{n}: cannot read: {e}", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| usage(format!("{}:{n}: malformed JSON: {e}", path.display())))?;
        let serde_json::Value::Object(map) = v else {
            return Err(usage(format!(
                "{}:{n}: expected a JSON object per line",
                path.display()
            )));
        };
        let mut vars = BTreeMap::new();
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
            vars.insert(k, s);
        }
        rows.push((n, vars));
    }
    Ok(rows)
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
    let recipients = read_recipients(&args.recipients, &template)?;
    let total = recipients.len();
    let chunks = producer::cut(&args.batch, &template, recipients, args.chunk_size);
    for c in &chunks {
        c.validate().map_err(|e| match e {
            ChunkError::TooLarge(_) => usage(format!("chunk {}: {e}: lower --chunk-size", c.seq)),
            e => usage(format!("chunk {}: {e}", c.seq)),
        })?;
    }
    let store = args.redis.connect().await?;
    let bar = if std::io::stderr().is_terminal() && !args.json {
        let b = indicatif::ProgressBar::new(chunks.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} chunks {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    for part in chunks.chunks(64) {
        producer::append_chunks(&store, part).await?;
        if let Some(b) = &bar {
            b.inc(part.len() as u64);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let stream = store.keys.ingest(store.keys.shard_of(&args.batch));
    if args.json {
        println!(
            "{}",
            serde_json::json!({"batch": args.batch, "recipients": total, "chunks": chunks.len(), "stream": stream})
        );
    } else {
        println!(
            "submitted batch {}: {total} recipients in {} chunks to {stream}",
            args.batch,
            chunks.len()
        );
    }
    Ok(())
}
