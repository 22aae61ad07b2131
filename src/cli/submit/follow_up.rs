//! The rows of a batch's recipients file that a filter keeps, written back
//! as a recipients file: what `groupcast results --from FILE` prints for a
//! follow-up batch (`groupcast submit --follow-up-of`), each recipient once
//! and with the variables it was first sent with.

use std::io::Write;
use std::path::Path;

use super::FileEncoding;
use crate::cli::CliError;
use crate::producer::input::Input;
use crate::producer::rows::Rows;

/// How many rows are looked up at once.
pub(crate) const ROWS_PER_LOOKUP: usize = 1000;

/// One readable row: its number (normalised, as the batch stored it) and
/// its variables by name.
pub(crate) struct FileRow {
    /// The number, normalised.
    pub(crate) to: String,
    /// The other columns, by name.
    pub(crate) vars: Vec<(String, String)>,
}

/// Reads the recipients file `path` in groups of [`ROWS_PER_LOOKUP`]
/// readable rows (rows with a problem are skipped: submit never sent
/// them), calling `each` with every group; the memory held is one group.
pub(crate) fn each_rows(
    path: &Path,
    encoding: FileEncoding,
    mut each: impl FnMut(Vec<FileRow>) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut input = Input::open(path, encoding)?;
    let mut rows = Rows::new(&mut input)?;
    let mut group = Vec::with_capacity(ROWS_PER_LOOKUP);
    let mut number = String::new();
    while let Some(row) = rows.next(path)? {
        let Ok(row) = row else { continue };
        if row.number(&mut number).is_err() {
            continue;
        }
        group.push(FileRow {
            to: number.clone(),
            vars: row
                .vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        if group.len() == ROWS_PER_LOOKUP {
            each(std::mem::take(&mut group))?;
        }
    }
    if !group.is_empty() {
        each(group)?;
    }
    Ok(())
}

/// Writes rows as a CSV recipients file: `to`, then the variables of the
/// first row written, in its order. `header` says whether the header is
/// still to be written (it is, with the first row).
pub(crate) fn write_rows(
    out: &mut impl Write,
    rows: &[&FileRow],
    header: &mut Option<Vec<String>>,
    show: impl Fn(&str) -> String,
) -> std::io::Result<()> {
    let mut w = csv::WriterBuilder::new().from_writer(out);
    for row in rows {
        let names = header.get_or_insert_with(|| {
            let names: Vec<String> = row.vars.iter().map(|(k, _)| k.clone()).collect();
            let mut head = vec!["to".to_string()];
            head.extend(names.iter().cloned());
            // The header, once.
            let _ = w.write_record(&head);
            names
        });
        let mut record = vec![show(&row.to)];
        for n in names.iter() {
            let v = row
                .vars
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone());
            record.push(v.unwrap_or_default());
        }
        w.write_record(&record)?;
    }
    w.flush()
}
