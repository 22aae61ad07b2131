//! The server-side scripts, from `streams/scripts/`, and how the store calls
//! them.
//!
//! Each script's keys, arguments, reply tags, events and next steps are
//! declared once, in [`declarations`]; its Lua is loaded with those names
//! bound in front of it, and the store calls it through [`Call`], which
//! passes keys and arguments by their declared names. A call out of that
//! order is refused before it reaches Redis ([`StoreError::ScriptCall`]).
//!
//! Each runs with `EVALSHA`; `redis::Script` loads it on a `NOSCRIPT` answer
//! (a restarted server, a failed-over node, a cluster node seeing it first)
//! and tries again, so scripts are loaded on demand wherever their slot lives.

use std::ops::Deref;
use std::sync::LazyLock;

use redis::{FromRedisValue, Script, ToRedisArgs};

use super::{StoreError, StoreResult};

pub mod declarations;
#[cfg(test)]
mod tests;

use declarations::{Declaration, Layout};

/// The Lua source of a script or part, by its declared name.
pub fn source_of(name: &str) -> Option<&'static str> {
    Some(match name {
        "prelude" => include_str!("../../../streams/scripts/prelude.lua"),
        "settle" => include_str!("../../../streams/scripts/settle.lua"),
        "accept" => include_str!("../../../streams/scripts/accept.lua"),
        "park" => include_str!("../../../streams/scripts/park.lua"),
        "record_group" => include_str!("../../../streams/scripts/record_group.lua"),
        "loaded" => include_str!("../../../streams/scripts/loaded.lua"),
        "reject" => include_str!("../../../streams/scripts/reject.lua"),
        "close" => include_str!("../../../streams/scripts/close.lua"),
        "seal" => include_str!("../../../streams/scripts/seal.lua"),
        "cancel" => include_str!("../../../streams/scripts/cancel.lua"),
        "claim_send" => include_str!("../../../streams/scripts/claim_send.lua"),
        "sent" => include_str!("../../../streams/scripts/sent.lua"),
        "completed" => include_str!("../../../streams/scripts/completed.lua"),
        "append" => include_str!("../../../streams/scripts/append.lua"),
        "stalled" => include_str!("../../../streams/scripts/stalled.lua"),
        "dead_letter" => include_str!("../../../streams/scripts/dead_letter.lua"),
        "retry_later" => include_str!("../../../streams/scripts/retry_later.lua"),
        "promote" => include_str!("../../../streams/scripts/promote.lua"),
        "rate_limit" => include_str!("../../../streams/scripts/rate_limit.lua"),
        "learn_rate" => include_str!("../../../streams/scripts/learn_rate.lua"),
        "lease" => include_str!("../../../streams/scripts/lease.lua"),
        "release" => include_str!("../../../streams/scripts/release.lua"),
        "renew_lease" => include_str!("../../../streams/scripts/renew_lease.lua"),
        "restore" => include_str!("../../../streams/scripts/restore.lua"),
        "ack_recorded" => include_str!("../../../streams/scripts/ack_recorded.lua"),
        "fail_generation" => include_str!("../../../streams/scripts/fail_generation.lua"),
        "give_up_send" => include_str!("../../../streams/scripts/give_up_send.lua"),
        "note" => include_str!("../../../streams/scripts/note.lua"),
        "track_page" => include_str!("../../../streams/scripts/track_page.lua"),
        "delivered" => include_str!("../../../streams/scripts/delivered.lua"),
        _ => return None,
    })
}

/// The script's own Lua: its file, and for `stalled` the append it guards.
fn body_of(d: &Declaration) -> String {
    let own = source_of(d.name).unwrap_or_default();
    if d.name == declarations::STALLED.name {
        format!(
            "{own}\n{}",
            source_of(declarations::APPEND.name).unwrap_or_default()
        )
    } else {
        own.to_string()
    }
}

/// What Redis runs: the bindings of the declared names, the layout's parts,
/// then the script's own Lua.
pub fn full_source(d: &Declaration) -> String {
    let mut lua = d.bindings();
    if d.layout != Layout::Plain {
        lua.push_str(source_of(declarations::PRELUDE.name).unwrap_or_default());
        lua.push('\n');
    }
    if d.layout == Layout::Settling {
        lua.push_str(source_of(declarations::SETTLE.name).unwrap_or_default());
        lua.push('\n');
    }
    lua.push_str(&body_of(d));
    lua
}

/// A script, compiled, with its declaration.
pub struct Declared {
    /// What it and its callers agree on.
    pub declaration: &'static Declaration,
    /// Its key and argument names in call order, worked out once.
    keys: Vec<&'static str>,
    args: Vec<&'static str>,
    script: Script,
}

impl Declared {
    fn new(declaration: &'static Declaration) -> Self {
        Declared {
            declaration,
            keys: declaration.all_keys(),
            args: declaration.all_args(),
            script: Script::new(&full_source(declaration)),
        }
    }

    /// A call of the script, its keys and arguments to be given in order.
    pub fn call(&'static self) -> Call {
        Call {
            declaration: self.declaration,
            keys: &self.keys,
            args: &self.args,
            invocation: self.script.prepare_invoke(),
            keys_given: 0,
            args_given: 0,
            wrong: None,
        }
    }
}

/// The compiled script, for tests that call it as raw `EVALSHA`.
impl Deref for Declared {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// One call of a script, its keys and arguments passed by their declared
/// names: a name out of order, a missing one or one too many makes
/// [`invoke`](Call::invoke) fail without reaching Redis.
pub struct Call {
    declaration: &'static Declaration,
    keys: &'static [&'static str],
    args: &'static [&'static str],
    invocation: redis::ScriptInvocation<'static>,
    keys_given: usize,
    args_given: usize,
    wrong: Option<String>,
}

/// Whether `given` is the name declared at `at`.
fn named(declared: &[&str], at: usize, given: &str) -> Result<(), String> {
    match declared.get(at) {
        Some(d) if d.trim_end_matches('?') == given => Ok(()),
        Some(d) => Err(format!("`{given}` where `{d}` is declared")),
        None => Err(format!("`{given}` after the last declared one")),
    }
}

/// Whether a call may pass what follows the named ones: the declaration
/// says so, and every named one not given is optional.
fn more_allowed(declared: &[&str], given: usize, more: Option<&str>) -> Result<(), String> {
    if more.is_none() {
        return Err("more than the declared ones".to_string());
    }
    match declared.iter().skip(given).find(|d| !d.ends_with('?')) {
        Some(d) => Err(format!("more before `{d}`")),
        None => Ok(()),
    }
}

impl Call {
    fn note(&mut self, what: &str, r: Result<(), String>) {
        if let (Err(e), None) = (r, &self.wrong) {
            self.wrong = Some(format!("{what}: {e}"));
        }
    }

    /// Passes key `name`, the next one declared.
    pub fn key(&mut self, name: &str, value: impl ToRedisArgs) -> &mut Self {
        let r = named(self.keys, self.keys_given, name);
        self.note("key", r);
        self.keys_given += 1;
        self.invocation.key(value);
        self
    }

    /// Passes a key after the named ones (where the declaration has
    /// `more_keys`).
    pub fn more_key(&mut self, value: impl ToRedisArgs) -> &mut Self {
        let r = more_allowed(self.keys, self.keys_given, self.declaration.more_keys);
        self.note("key", r);
        self.keys_given = self.keys_given.max(self.keys.len());
        self.invocation.key(value);
        self
    }

    /// Passes argument `name`, the next one declared.
    pub fn arg(&mut self, name: &str, value: impl ToRedisArgs) -> &mut Self {
        let r = named(self.args, self.args_given, name);
        self.note("argument", r);
        self.args_given += 1;
        self.invocation.arg(value);
        self
    }

    /// Passes an argument after the named ones (where the declaration has
    /// `more_args`).
    pub fn more_arg(&mut self, value: impl ToRedisArgs) -> &mut Self {
        let r = more_allowed(self.args, self.args_given, self.declaration.more_args);
        self.note("argument", r);
        self.args_given = self.args_given.max(self.args.len());
        self.invocation.arg(value);
        self
    }

    /// What is wrong with the call as given, if anything.
    fn check(&self) -> Result<(), String> {
        if let Some(wrong) = &self.wrong {
            return Err(wrong.clone());
        }
        for (what, declared, given) in [
            ("key", self.keys, self.keys_given),
            ("argument", self.args, self.args_given),
        ] {
            if let Some(d) = declared.iter().skip(given).find(|d| !d.ends_with('?')) {
                return Err(format!("{what} `{d}` not given"));
            }
        }
        Ok(())
    }

    /// Runs the script.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> StoreResult<T> {
        self.check().map_err(|detail| StoreError::ScriptCall {
            script: self.declaration.name,
            detail,
        })?;
        Ok(self.invocation.invoke_async(conn).await?)
    }
}

/// Every script, compiled once.
pub struct Scripts {
    /// `accept.lua`.
    pub accept: Declared,
    /// `park.lua`.
    pub park: Declared,
    /// `record_group.lua`.
    pub record_group: Declared,
    /// `loaded.lua`.
    pub loaded: Declared,
    /// `reject.lua`.
    pub reject: Declared,
    /// `close.lua`.
    pub close: Declared,
    /// `seal.lua`.
    pub seal: Declared,
    /// `cancel.lua`.
    pub cancel: Declared,
    /// `claim_send.lua`.
    pub claim_send: Declared,
    /// `sent.lua`.
    pub sent: Declared,
    /// `completed.lua`.
    pub completed: Declared,
    /// `append.lua`.
    pub append: Declared,
    /// `dead_letter.lua`.
    pub dead_letter: Declared,
    /// `retry_later.lua`.
    pub retry_later: Declared,
    /// `promote.lua`.
    pub promote: Declared,
    /// `rate_limit.lua`.
    pub rate_limit: Declared,
    /// `learn_rate.lua`.
    pub learn_rate: Declared,
    /// `stalled.lua`, the guard, then `append.lua`: the watchdog's
    /// `batch_stalled` append.
    pub stalled: Declared,
    /// `lease.lua`.
    pub lease: Declared,
    /// `release.lua`.
    pub release: Declared,
    /// `renew_lease.lua`.
    pub renew_lease: Declared,
    /// `restore.lua`.
    pub restore: Declared,
    /// `ack_recorded.lua`.
    pub ack_recorded: Declared,
    /// `fail_generation.lua`.
    pub fail_generation: Declared,
    /// `give_up_send.lua`.
    pub give_up_send: Declared,
    /// `note.lua`.
    pub note: Declared,
    /// `track_page.lua`.
    pub track_page: Declared,
    /// `delivered.lua`.
    pub delivered: Declared,
}

/// The scripts.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    use declarations as d;
    Scripts {
        accept: Declared::new(&d::ACCEPT),
        park: Declared::new(&d::PARK),
        record_group: Declared::new(&d::RECORD_GROUP),
        loaded: Declared::new(&d::LOADED),
        reject: Declared::new(&d::REJECT),
        close: Declared::new(&d::CLOSE),
        seal: Declared::new(&d::SEAL),
        cancel: Declared::new(&d::CANCEL),
        claim_send: Declared::new(&d::CLAIM_SEND),
        sent: Declared::new(&d::SENT),
        completed: Declared::new(&d::COMPLETED),
        append: Declared::new(&d::APPEND),
        dead_letter: Declared::new(&d::DEAD_LETTER),
        retry_later: Declared::new(&d::RETRY_LATER),
        promote: Declared::new(&d::PROMOTE),
        rate_limit: Declared::new(&d::RATE_LIMIT),
        learn_rate: Declared::new(&d::LEARN_RATE),
        stalled: Declared::new(&d::STALLED),
        lease: Declared::new(&d::LEASE),
        release: Declared::new(&d::RELEASE),
        renew_lease: Declared::new(&d::RENEW_LEASE),
        restore: Declared::new(&d::RESTORE),
        ack_recorded: Declared::new(&d::ACK_RECORDED),
        fail_generation: Declared::new(&d::FAIL_GENERATION),
        give_up_send: Declared::new(&d::GIVE_UP_SEND),
        note: Declared::new(&d::NOTE),
        track_page: Declared::new(&d::TRACK_PAGE),
        delivered: Declared::new(&d::DELIVERED),
    }
});
