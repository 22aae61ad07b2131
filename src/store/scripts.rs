//! The server-side scripts, from `streams/scripts/`.
//!
//! Each runs with `EVALSHA`; `redis::Script` loads it on a `NOSCRIPT` answer
//! (a restarted server, a failed-over node, a cluster node seeing it first)
//! and tries again, so scripts are loaded on demand wherever their slot lives.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../../streams/scripts/prelude.lua");
const SETTLE: &str = include_str!("../../streams/scripts/settle.lua");
const APPEND: &str = include_str!("../../streams/scripts/append.lua");

fn batch_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// A script that can end a batch: it shares `settle.lua` (and its keys).
fn settling_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{SETTLE}\n{body}"))
}

/// Every script, compiled once.
pub struct Scripts {
    /// `accept.lua`.
    pub accept: Script,
    /// `park.lua`.
    pub park: Script,
    /// `record_group.lua`.
    pub record_group: Script,
    /// `loaded.lua`.
    pub loaded: Script,
    /// `reject.lua`.
    pub reject: Script,
    /// `close.lua`.
    pub close: Script,
    /// `seal.lua`.
    pub seal: Script,
    /// `cancel.lua`.
    pub cancel: Script,
    /// `claim_send.lua`.
    pub claim_send: Script,
    /// `sent.lua`.
    pub sent: Script,
    /// `completed.lua`.
    pub completed: Script,
    /// `append.lua`.
    pub append: Script,
    /// `dead_letter.lua`.
    pub dead_letter: Script,
    /// `retry_later.lua`.
    pub retry_later: Script,
    /// `promote.lua`.
    pub promote: Script,
    /// `rate_limit.lua`.
    pub rate_limit: Script,
    /// `learn_rate.lua`.
    pub learn_rate: Script,
    /// `stalled.lua`, the guard, then `append.lua`: the watchdog's
    /// `batch_stalled` append.
    pub stalled: Script,
    /// `lease.lua`.
    pub lease: Script,
    /// `release.lua`.
    pub release: Script,
    /// `renew_lease.lua`.
    pub renew_lease: Script,
    /// `restore.lua`.
    pub restore: Script,
    /// `ack_recorded.lua`.
    pub ack_recorded: Script,
    /// `fail_generation.lua`.
    pub fail_generation: Script,
    /// `give_up_send.lua`.
    pub give_up_send: Script,
    /// `note.lua`.
    pub note: Script,
    /// `track_page.lua`.
    pub track_page: Script,
    /// `delivered.lua`.
    pub delivered: Script,
}

/// The scripts.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    accept: settling_script(include_str!("../../streams/scripts/accept.lua")),
    park: batch_script(include_str!("../../streams/scripts/park.lua")),
    record_group: batch_script(include_str!("../../streams/scripts/record_group.lua")),
    loaded: settling_script(include_str!("../../streams/scripts/loaded.lua")),
    reject: settling_script(include_str!("../../streams/scripts/reject.lua")),
    close: settling_script(include_str!("../../streams/scripts/close.lua")),
    seal: settling_script(include_str!("../../streams/scripts/seal.lua")),
    cancel: settling_script(include_str!("../../streams/scripts/cancel.lua")),
    claim_send: settling_script(include_str!("../../streams/scripts/claim_send.lua")),
    sent: batch_script(include_str!("../../streams/scripts/sent.lua")),
    completed: settling_script(include_str!("../../streams/scripts/completed.lua")),
    append: batch_script(APPEND),
    dead_letter: Script::new(include_str!("../../streams/scripts/dead_letter.lua")),
    retry_later: Script::new(include_str!("../../streams/scripts/retry_later.lua")),
    promote: Script::new(include_str!("../../streams/scripts/promote.lua")),
    rate_limit: Script::new(include_str!("../../streams/scripts/rate_limit.lua")),
    learn_rate: Script::new(include_str!("../../streams/scripts/learn_rate.lua")),
    stalled: batch_script(&format!(
        "{}\n{APPEND}",
        include_str!("../../streams/scripts/stalled.lua")
    )),
    lease: Script::new(include_str!("../../streams/scripts/lease.lua")),
    release: Script::new(include_str!("../../streams/scripts/release.lua")),
    renew_lease: Script::new(include_str!("../../streams/scripts/renew_lease.lua")),
    restore: Script::new(include_str!("../../streams/scripts/restore.lua")),
    ack_recorded: Script::new(include_str!("../../streams/scripts/ack_recorded.lua")),
    fail_generation: settling_script(include_str!("../../streams/scripts/fail_generation.lua")),
    give_up_send: settling_script(include_str!("../../streams/scripts/give_up_send.lua")),
    note: Script::new(include_str!("../../streams/scripts/note.lua")),
    track_page: batch_script(include_str!("../../streams/scripts/track_page.lua")),
    delivered: batch_script(include_str!("../../streams/scripts/delivered.lua")),
});
