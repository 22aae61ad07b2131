//! `submit --ad`: an advertising batch, split by night-time consent.
//!
//! The night rule (no advertising between 21:00 and 08:00 in Korea, except
//! to recipients who gave separate consent to it) is per recipient, but a
//! provider group is sent as a unit and every chunk of a batch carries the
//! same options. So the checked file is split into two batches that name
//! each other (the options' `ad.pair`): `<batch>` gets the rows without
//! night consent (held by the night rule, never dropped), and
//! `<batch>.night-consent` the rows with it (not held at night). Each half
//! is written to a temporary JSONL file (numbers normalised, the consent
//! column left out) and submitted as usual. Nothing is appended until the
//! whole file is checked and split: a bad consent value appends nothing.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use super::{check_file, submit_file, summary, usage, BatchFile, FileEncoding, SubmitArgs};
use crate::cli::CliError;
use crate::events::options::{AdOptions, BatchOptions};
use crate::events::Template;
use crate::keys::validate_batch_id;
use crate::producer::check::Scan;
use crate::producer::cut_file::for_each_kept;
use crate::producer::input::Input;

/// The column that says whether a recipient consented to advertising at
/// night (values: [`night_consent`]).
pub(super) const NIGHT_CONSENT_COLUMN: &str = "night_consent";

/// What the batch of the recipients with night consent is called: the
/// batch id and this.
pub(super) const CONSENT_SUFFIX: &str = ".night-consent";

/// Reads a consent cell: yes (`Y`, `yes`, `1`, `true`, `O`, `동의`), no
/// (`N`, `no`, `0`, `false`, `X`, `미동의`, `거부`, or empty); case and
/// surrounding blanks do not matter. None: neither.
pub(super) fn night_consent(value: &str) -> Option<bool> {
    match value.trim().to_lowercase().as_str() {
        "y" | "yes" | "1" | "true" | "o" | "동의" => Some(true),
        "" | "n" | "no" | "0" | "false" | "x" | "미동의" | "거부" => Some(false),
        _ => None,
    }
}

/// A named temporary file, removed when dropped.
struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Best effort: the file is in the temporary directory either way.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One half of the split: its rows as JSONL, and how many.
struct Half {
    file: TempFile,
    rows: usize,
}

/// Writes the rows kept of a checked file into two JSONL files, by their
/// [`NIGHT_CONSENT_COLUMN`]: `(without consent, with it)`.
fn split(mut input: Input, scan: &Scan) -> Result<(Half, Half), CliError> {
    let path = input.path.clone();
    let create = |which: &str| {
        let file = TempFile {
            path: std::env::temp_dir().join(format!(
                "groupcast-ad-{}-{}-{which}.jsonl",
                std::process::id(),
                ulid::Ulid::new()
            )),
        };
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create_new(true);
        // Numbers and names: readable by this user alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let out = open
            .open(&file.path)
            .map_err(|e| CliError::Failed(format!("{}: cannot write: {e}", file.path.display())))?;
        Ok::<_, CliError>((file, BufWriter::new(out)))
    };
    let (held, mut held_out) = create("held")?;
    let (consented, mut consented_out) = create("night-consent")?;
    let (mut held_rows, mut consented_rows) = (0, 0);
    let failed = |what: &str| CliError::Failed(format!("{}: {what}", path.display()));
    for_each_kept(&mut input, &scan.repeated, failed, |r, _, line| {
        let cell = r.vars.get(NIGHT_CONSENT_COLUMN).unwrap_or("");
        let consent = night_consent(cell).ok_or_else(|| {
            usage(format!(
                "{}:{line}: field `{NIGHT_CONSENT_COLUMN}` {:?} is not a yes or a no: write Y or N (also 1/0, true/false, 동의/미동의; empty is no); nothing was appended",
                path.display(),
                crate::events::clip(cell, crate::events::QUOTE_MAX)
            ))
        })?;
        let mut row = serde_json::Map::new();
        row.insert("to".into(), r.to.into());
        for (k, v) in r.vars.iter().filter(|(k, _)| *k != NIGHT_CONSENT_COLUMN) {
            row.insert(k.into(), v.into());
        }
        let out = if consent {
            consented_rows += 1;
            &mut consented_out
        } else {
            held_rows += 1;
            &mut held_out
        };
        serde_json::to_writer(&mut *out, &row)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| CliError::Failed(format!("cannot write a temporary file: {e}")))
    })?;
    for out in [&mut held_out, &mut consented_out] {
        out.flush()
            .map_err(|e| CliError::Failed(format!("cannot write a temporary file: {e}")))?;
    }
    Ok((
        Half {
            file: held,
            rows: held_rows,
        },
        Half {
            file: consented,
            rows: consented_rows,
        },
    ))
}

/// Submits an advertising batch: the whole file checked, split by night
/// consent, and each half that has rows submitted as its own batch, the
/// two naming each other.
pub(super) async fn run(
    args: &SubmitArgs,
    file: BatchFile,
    template: Template,
    options: BatchOptions,
) -> Result<(), CliError> {
    let consented_id = format!("{}{CONSENT_SUFFIX}", file.batch);
    validate_batch_id(&consented_id).map_err(|e| {
        usage(format!(
            "--batch {:?} with --ad: the batch of the recipients with night consent would be {consented_id:?}: {e}; use a shorter id",
            file.batch
        ))
    })?;
    let (input, template, options, scan) = check_file(args, &file, template, options).await?;
    let notes = summary::notes(&input, &scan);
    let (held, consented) = tokio::task::spawn_blocking(move || split(input, &scan))
        .await
        .map_err(|e| CliError::Failed(format!("submit: the file reader stopped: {e}")))??;
    let both = held.rows > 0 && consented.rows > 0;
    let halves = [
        (&held, file.batch.clone(), false, consented_id.clone()),
        (&consented, consented_id, true, file.batch.clone()),
    ];
    for (half, batch, night_consent, pair) in halves {
        if half.rows == 0 {
            continue;
        }
        let options = BatchOptions {
            ad: Some(AdOptions {
                night_consent,
                pair: both.then_some(pair),
            }),
            ..options.clone()
        };
        let part = BatchFile {
            batch,
            path: half.file.path.clone(),
            encoding: FileEncoding::Utf8,
        };
        let checked = check_file(args, &part, template.clone(), options).await?;
        submit_file(args, &part, checked).await?;
    }
    if !args.json {
        let (start, end, tz) = crate::events::options::NIGHT_RULE;
        println!(
            "  advertising: {} recipient(s) without night-time consent in batch {} (held {start}-{end} {tz}, sent from {end}), {} with it{}",
            held.rows,
            file.batch,
            consented.rows,
            if consented.rows > 0 {
                format!(" in batch {}{CONSENT_SUFFIX}", file.batch)
            } else {
                format!(" (no row's `{NIGHT_CONSENT_COLUMN}` says yes)")
            }
        );
        for n in notes {
            println!("  {n}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consent_reads_as_people_write_it_and_anything_else_is_refused() {
        for yes in ["Y", "y", " yes ", "1", "TRUE", "O", "동의"] {
            assert_eq!(night_consent(yes), Some(true), "{yes}");
        }
        for no in ["N", "no", "0", "false", "X", "미동의", "거부", "", "  "] {
            assert_eq!(night_consent(no), Some(false), "{no}");
        }
        for neither in ["maybe", "2", "동의함?"] {
            assert_eq!(night_consent(neither), None, "{neither}");
        }
    }
}
