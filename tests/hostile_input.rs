//! Hostile input: every decoder and reader that takes bytes from outside is
//! fuzzed (arbitrary bytes, and structure-aware mutations of valid payloads),
//! every input limit is checked on both paths (`submit` and the worker), and
//! malicious entries on the streams are dead-lettered with a reason while a
//! good batch completes beside them.

mod common;
#[path = "hostile_input/msgpack.rs"]
mod msgpack;

#[path = "hostile_input/decoders.rs"]
mod decoders;
#[path = "hostile_input/limits.rs"]
mod limits;
#[path = "hostile_input/readers.rs"]
mod readers;
#[path = "hostile_input/streams.rs"]
mod streams;

use std::path::{Path, PathBuf};

/// The longest error message a hostile input may produce: messages quote
/// input, and input can be megabytes.
const MAX_MESSAGE: usize = 2048;

/// Writes `content` to the file `name` in `dir`.
fn tmp_file(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write");
    p
}
