//! Opening a recipients file so that it can be read more than once, as
//! UTF-8: a pipe is spooled to an unnamed temporary file; the encoding is
//! detected (or named by `--encoding`), and a file that is not UTF-8 is
//! transcoded once into such a file.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};

use encoding_rs::{DecoderResult, Encoding, EUC_KR, UTF_8};

use super::InputError;
use super::{usage, FileEncoding};

/// The read buffer: large reads, few system calls.
pub(crate) const READ_BUFFER: usize = 256 * 1024;

/// A recipients file, open: read from the start by each [`Rows`](super::rows::Rows).
#[derive(Debug)]
pub(crate) struct Input {
    /// The name given, for messages.
    pub(crate) path: PathBuf,
    /// UTF-8: the file itself, or a temporary copy of it.
    pub(crate) file: File,
    pub(crate) format: Format,
    /// Where the rows begin in `file`: past a UTF-8 byte order mark.
    pub(crate) start: u64,
    /// The encoding the file was read in.
    pub(crate) encoding: &'static Encoding,
}

/// A recipients file's format, by its extension.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Format {
    /// CSV with a header.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl Input {
    /// Opens the file. What cannot be read twice (a pipe, `/dev/stdin`) is
    /// copied into an unnamed temporary file first, and so is a file that
    /// is not UTF-8, decoded ([`decode`]).
    pub(crate) fn open(path: &Path, encoding: FileEncoding) -> Result<Input, InputError> {
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
        Input::of_file(path, file, format, encoding)
    }

    /// Reads `bytes` (a recipients file's content, in a request) as the
    /// file `name`, through an unnamed temporary file: the same readings
    /// as a file on disk, and memory flat however large.
    pub(crate) fn of_bytes(
        name: &Path,
        bytes: &[u8],
        format: Format,
        encoding: FileEncoding,
    ) -> Result<Input, InputError> {
        let cannot = |e: std::io::Error| usage(format!("{}: cannot spool: {e}", name.display()));
        let mut file = unnamed_temp_file().map_err(cannot)?;
        file.write_all(bytes).map_err(cannot)?;
        file.rewind().map_err(cannot)?;
        Input::of_file(name, file, format, encoding)
    }

    /// `file`, read as `encoding` (decoded to UTF-8 if need be).
    fn of_file(
        path: &Path,
        file: File,
        format: Format,
        encoding: FileEncoding,
    ) -> Result<Input, InputError> {
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
    pub(crate) fn stamp(&self) -> Option<(u64, std::time::SystemTime)> {
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
pub(crate) fn decode(
    path: &Path,
    mut file: File,
    choice: FileEncoding,
) -> Result<(File, u64, &'static Encoding), InputError> {
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
) -> Result<(File, u64, &'static Encoding), InputError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::options::BatchOptions;
    use crate::producer::check::check_recipients;
    use crate::producer::cut_file::read_recipients;
    use crate::producer::fixtures::{file, sms, usage_of};
    use crate::producer::Duplicates;

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
}
