//! The README's first campaign works as written: its shell block runs, in a
//! fresh directory, against a private Redis, with the built `groupcast` on
//! the path, exactly as a newcomer would paste it.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

/// The block after the README's `<!-- first-campaign` marker.
fn first_campaign_block(readme: &str) -> String {
    let after = readme
        .split_once("<!-- first-campaign")
        .expect("README has a <!-- first-campaign --> marker before its first campaign")
        .1;
    let body = after
        .split_once("```sh\n")
        .expect("a ```sh block follows the marker")
        .1;
    body.split_once("\n```")
        .expect("the block is closed")
        .0
        .to_string()
}

#[test]
fn the_readmes_first_campaign_works_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    let block = first_campaign_block(&readme);
    let server = common::redis();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin_dir = std::path::Path::new(BIN).parent().expect("bin dir");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Its own process group, so that a block that hangs (a worker that never
    // reports) is killed whole, background jobs included.
    let child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("GROUPCAST_REDIS_URL", server.url())
        .env("GROUPCAST_PREFIX", "first")
        .env_remove("GROUPCAST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run bash");
    let pid = child.id();
    // A watchdog thread: the block takes a few seconds; two minutes means it
    // hangs.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            // SAFETY: kill(2) on the process group we created; no memory
            // is touched.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("wait for bash");
    let _ = done_tx.send(());
    let _ = guard.join();
    // The background jobs the block killed at its end, or left behind.
    // SAFETY: as above.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the first campaign failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout
            .contains("batch first-campaign: completed; 1 of 1 chunks, 3 recipients, 3 registered"),
        "status shows the report:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("batch_reported"),
        "audit shows the report event:\n{stdout}"
    );
    assert!(
        !stdout.contains("010-1234-5678") && !stdout.contains("01012345678"),
        "audit masks the numbers:\n{stdout}"
    );
}
