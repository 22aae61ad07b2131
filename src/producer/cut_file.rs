//! The second reading of a checked recipients file: the rows kept (the
//! later rows of a repeated number skipped), cut into chunks and encoded
//! as they come, the file found the same as when it was checked before the
//! last chunk goes.

use std::collections::HashSet;
use std::path::Path;

use super::check::{check_recipients, fingerprint, number_key, Checked, Scan};
use super::input::Input;
use super::rows::{RowRecipient, Rows};
use super::InputError;
use super::{usage, Duplicates, FileEncoding};
use crate::events::chunk::ChunkEncoder;
use crate::events::options::BatchOptions;
use crate::events::{Recipient, Template};

/// Reads and validates every recipient row, and returns those that would
/// be sent (numbers normalised, later rows of a repeated number dropped),
/// for tests and small files: `submit` itself never holds the whole file.
pub(crate) fn read_recipients(
    path: &Path,
    template: &Template,
) -> Result<Vec<Recipient>, InputError> {
    let mut input = Input::open(path, FileEncoding::Auto)?;
    let scan = check_recipients(
        &mut input,
        template,
        &BatchOptions::default(),
        None,
        Duplicates::Drop,
    )?;
    kept_recipients(&mut input, &scan, |what| {
        usage(format!("{}: {what}", path.display()))
    })
}

/// The rows of a checked `input` that would be sent, in memory (for a
/// small file, or one chunk's body): see [`for_each_kept`].
pub(crate) fn kept_recipients<E>(
    input: &mut Input,
    scan: &Scan,
    bad: impl Fn(&str) -> E,
) -> Result<Vec<Recipient>, E> {
    let mut out = Vec::with_capacity(scan.checked.recipients);
    for_each_kept(input, &scan.repeated, bad, |r, _, _| {
        out.push(Recipient {
            to: r.to.to_string(),
            vars: r
                .vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        Ok(())
    })?;
    Ok(out)
}

/// Reads `input` again and calls `each` with every row kept, in file order:
/// its number normalised, the later rows of a number in `repeated` skipped
/// (as [`check_recipients`] counted them), with its key ([`number_key`])
/// and the line it starts on. A row that is now unreadable or bad is
/// `bad`'s error.
pub(crate) fn for_each_kept<E>(
    input: &mut Input,
    repeated: &HashSet<u64>,
    bad: impl Fn(&str) -> E,
    mut each: impl FnMut(&RowRecipient<'_>, u64, usize) -> Result<(), E>,
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
            row.line,
        )?;
    }
    Ok(())
}

/// Reads the checked file again and sends its chunks, encoded, to `out`, in
/// order. The last chunk is sent only once the whole file has been read
/// again and found the same as when it was checked.
pub(crate) fn cut_recipients(
    input: &mut Input,
    batch: &str,
    (template, options): (&Template, &BatchOptions),
    size: usize,
    scan: &Scan,
    out: &tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), InputError> {
    let checked = &scan.checked;
    let path = input.path.clone();
    let changed = |what: &str| {
        InputError::Failed(format!(
            "{}: the file changed while it was submitted ({what}); the batch's last chunk was not appended, so it will not complete: submit the file again under another batch id",
            path.display()
        ))
    };
    // Stopped early: the appending side gave up (and says why).
    let stopped = || InputError::Failed("submit stopped".into());
    let last_seq = checked.chunks.saturating_sub(1);
    let start = |seq: u32| {
        ChunkEncoder::new(
            batch,
            seq,
            seq == last_seq,
            template,
            options,
            chunk_recipients(checked, size, seq),
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
    for_each_kept(input, &scan.repeated, changed, |r, key, _| {
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

/// How many recipients chunk `seq` of a file `checked` holds, cut `size` a
/// chunk: `size`, but the last chunk holds the rest.
fn chunk_recipients(checked: &Checked, size: usize, seq: u32) -> usize {
    let last_seq = checked.chunks.saturating_sub(1);
    if seq < last_seq {
        size
    } else {
        checked.recipients - size * last_seq as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Chunk;
    use crate::producer::fixtures::{check, cut, file, sms};

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
