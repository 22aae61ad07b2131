//! What submit says once its chunks are appended: the counts, and notes
//! on how the file was read (its encoding, the rows dropped, the numbers
//! mended), as text or as JSON.

use encoding_rs::UTF_8;

use crate::events::options::BatchOptions;
use crate::producer::check::Scan;
use crate::producer::input::Input;

/// What submit says it did, besides the counts: how the file was read,
/// what was dropped, what was restored.
pub(super) fn notes(input: &Input, scan: &Scan) -> Vec<String> {
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

/// What submit appended, to say so.
pub(super) struct Summary<'a> {
    /// The batch.
    pub(super) batch: &'a str,
    /// The ingest stream its chunks went to.
    pub(super) stream: &'a str,
    /// The encoding the file was read in.
    pub(super) read_as: &'a str,
    /// The batch's options.
    pub(super) options: &'a BatchOptions,
    /// The file, when it is one of several (said, and a JSON field).
    pub(super) file: Option<&'a std::path::Path>,
}

impl Summary<'_> {
    /// Prints what submit did: the batch, its counts and the stream the
    /// chunks went to, its options when they hold it (times in the batch's
    /// zone, with the offset), then the `notes` (as text), or all of it as
    /// JSON.
    pub(super) fn print(&self, scan: &Scan, notes: Vec<String>, json: bool) {
        let (batch, stream) = (self.batch, self.stream);
        let (total, chunks) = (scan.checked.recipients, scan.checked.chunks);
        let window = self.options.resolve().unwrap_or_default();
        let shown = (window.holds() || window.ad.is_some()).then(|| window.describe());
        if json {
            let d = &scan.dropped;
            let mut line = serde_json::json!({
                    "batch": batch,
                    "recipients": total,
                    "chunks": chunks,
                    "stream": stream,
                    "rows": scan.rows,
                    "encoding": self.read_as,
                    "duplicatesDropped": d.rows,
                    "duplicateLines": d.first.iter().map(|(kept, later)| serde_json::json!({"kept": kept, "dropped": later})).collect::<Vec<_>>(),
                    "leadingZerosRestored": scan.zeros_restored,
                    "options": shown,
                    "pair": window.ad.as_ref().and_then(|a| a.pair.clone()),
            });
            if let (Some(file), Some(fields)) = (self.file, line.as_object_mut()) {
                fields.insert("file".into(), file.display().to_string().into());
            }
            println!("{line}");
        } else {
            let from = self
                .file
                .map(|f| format!(" from {}", f.display()))
                .unwrap_or_default();
            println!(
                "submitted batch {batch}{from}: {total} recipients in {chunks} chunks to {stream}"
            );
            if let Some(shown) = shown {
                println!("  {shown}");
            }
            for n in notes {
                println!("  {n}");
            }
        }
    }
}
