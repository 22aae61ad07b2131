//! What submit's unit tests share: a template, a file written, a usage
//! error's message, a check and a cut of a file.

use std::path::{Path, PathBuf};

use super::check::{check_recipients, Scan};
use super::cut_file::cut_recipients;
use super::input::Input;
use super::InputError;
use super::{Duplicates, FileEncoding};
use crate::events::options::BatchOptions;
use crate::events::{Chunk, Template};

/// An SMS template with one variable, `name`.
pub(crate) fn sms() -> Template {
    Template {
        kind: "SMS".into(),
        from: "0212345678".into(),
        text: "Hi #{name}".into(),
        kakao_options: None,
    }
}

/// Writes `content` to `dir/name`; its path.
pub(crate) fn file(dir: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write");
    p
}

/// The message of a usage error (anything else fails the test).
pub(crate) fn usage_of<T: std::fmt::Debug>(r: Result<T, InputError>) -> String {
    match r {
        Err(InputError::Usage(m)) => m,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

/// Checks the file `p` with [`sms`], in chunks of `size`.
pub(crate) fn check(p: &Path, size: usize, duplicates: Duplicates) -> Result<Scan, InputError> {
    let mut input = Input::open(p, FileEncoding::Auto)?;
    check_recipients(
        &mut input,
        &sms(),
        &BatchOptions::default(),
        Some(("b", size)),
        duplicates,
    )
}

/// The chunks `cut_recipients` makes of a checked file, decoded.
pub(crate) fn cut(p: &Path, size: usize) -> Vec<Chunk> {
    let mut input = Input::open(p, FileEncoding::Auto).expect("open");
    let scan = check_recipients(
        &mut input,
        &sms(),
        &BatchOptions::default(),
        Some(("b", size)),
        Duplicates::Drop,
    )
    .expect("check");
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    cut_recipients(
        &mut input,
        "b",
        (&sms(), &BatchOptions::default()),
        size,
        &scan,
        &tx,
    )
    .expect("cut");
    drop(tx);
    let mut out = Vec::new();
    while let Ok(p) = rx.try_recv() {
        let c = Chunk::decode(&p).expect("decode");
        c.validate().expect("valid");
        assert!(p.len() <= scan.checked.largest_chunk);
        out.push(c);
    }
    assert_eq!(out.len(), scan.checked.chunks as usize);
    out
}
