//! Durability, the worker's half: which mode a deployment runs in, chosen
//! at start from the server's persistence ([`Durability`], [`choose_wait`]),
//! what adds and sends wait for before they go out ([`DurableWait`]; the
//! wait itself is `ops::on_disk`, with the consumer slot given back), and
//! the read-back of acknowledged events that reports writes Redis lost
//! ([`lost_writes`]). The Redis half, and the account of what each mode
//! relies on, is [`crate::store::durability`]; `docs/durability.md` is the
//! operator's account.

use std::time::Duration;

use clap::ValueEnum;

use crate::store::{Store, StoreError};

pub(crate) mod lost_writes;

/// The durability the deployment expects from Redis, and so what adds and
/// sends wait for (see `docs/durability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    /// Read the server's persistence at start and behave accordingly: no AOF
    /// → no wait (warned: a Redis crash loses the batches' state);
    /// `appendfsync always` → no wait; `everysec` → `WAITAOF` where the
    /// server has it (7.2+), else the fixed window.
    Auto,
    /// AOF with `appendfsync always`: no acknowledged write is lost in a
    /// crash; adds and sends do not wait.
    Always,
    /// AOF with `appendfsync everysec`, without `WAITAOF`: adds and sends wait
    /// a fixed window (4 s) after the events they rely on.
    Everysec,
    /// AOF with `WAITAOF` (Redis/Valkey 7.2+, single server): adds and sends
    /// wait until `WAITAOF 1 <--replicas-ack>` confirms the events they rely
    /// on, one call per round for the whole process.
    Waitaof,
    /// No persistence expected (tests, throwaway demos): no wait.
    None,
}

/// What an add or a send waits for before it goes out (see
/// [`WorkerConfig::durable`] and `docs/durability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableWait {
    /// Nothing: Redis keeps every acknowledged write (`appendfsync always`),
    /// or nothing is expected to survive a crash (no AOF).
    None,
    /// Until the events relied on have been in Redis this long (the entry
    /// ids' clock): a timing argument for servers without `WAITAOF`.
    Window(Duration),
    /// Until `WAITAOF 1 <replicas>` confirms that they are fsynced to the
    /// AOF (and acknowledged by that many replicas): exact, Redis/Valkey
    /// 7.2 or newer, one call per round for every waiter of the process.
    WaitAof {
        /// Replicas that must have them too (`--replicas-ack`).
        replicas: u32,
    },
}

impl DurableWait {
    /// Whether adds and sends wait at all.
    pub fn waits(self) -> bool {
        self != DurableWait::None
    }
}

/// What `--durability` and `--replicas-ack` make adds and sends wait for on a
/// server whose settings are these (`None`: unreadable), and why, for the
/// start-up log. Pure: the start-up reads the server and calls it.
///
/// `everysec` and `waitaof` are what the flag says (`waitaof` without
/// `WAITAOF` or on a cluster is refused: an error). `auto`: no AOF → no wait
/// (a Redis crash loses the batches' state anyway: the reason says so as a
/// warning); `always` → no wait (unless replicas must acknowledge);
/// `everysec` (or unreadable settings) → `WAITAOF` where possible, else the
/// window.
pub fn choose_wait(
    durability: Durability,
    replicas_ack: u32,
    server: &ServerPersistence,
) -> Result<(DurableWait, String), String> {
    let window = DurableWait::Window(crate::store::durability::witness::WINDOW);
    let waitaof = DurableWait::WaitAof {
        replicas: replicas_ack,
    };
    let exact = server.waitaof && !server.cluster && server.confirms_early.is_none();
    let settings = format!(
        "redis has appendonly={} appendfsync={}{}{}",
        server.appendonly.as_deref().unwrap_or("?"),
        server.appendfsync.as_deref().unwrap_or("?"),
        match (server.waitaof, server.confirms_early) {
            (true, None) => " and WAITAOF".to_string(),
            (true, Some(d)) => format!(
                " and a WAITAOF that confirms before the fsync (a write made right after an fsync confirmed in {} ms, \
                 while fsyncs are a second apart; redis/redis#13793)",
                d.as_millis()
            ),
            (false, _) => ", no WAITAOF (before 7.2, or refused)".to_string(),
        },
        if server.cluster { " (a cluster)" } else { "" },
    );
    let wait_line = |w: DurableWait| {
        match w {
        DurableWait::None => "adds and sends do not wait".to_string(),
        DurableWait::Window(d) => format!(
            "adds and sends wait until the events they rely on are {d:?} old (the fsync window)"
        ),
        DurableWait::WaitAof { replicas } => format!(
            "adds and sends wait for WAITAOF 1 {replicas} on the events they rely on (one call per round for the process)"
        ),
    }
    };
    let (wait, why) = match durability {
        Durability::None => (DurableWait::None, "--durability none".to_string()),
        Durability::Always => (DurableWait::None, "--durability always".to_string()),
        Durability::Everysec => (window, "--durability everysec".to_string()),
        Durability::Waitaof if exact => (waitaof, format!("--durability waitaof; {settings}")),
        // The operator's word against the measurement: allowed, loudly.
        Durability::Waitaof if server.waitaof && !server.cluster => (
            waitaof,
            format!(
                "--durability waitaof; {settings}: WARNING: the waits end when the server says, \
                 which may be before the events are on disk"
            ),
        ),
        Durability::Waitaof => {
            return Err(format!(
                "--durability waitaof needs a single server with WAITAOF (Redis or Valkey 7.2+): {settings}"
            ))
        }
        Durability::Auto => match (server.appendonly.as_deref(), server.appendfsync.as_deref()) {
            (Some("yes"), Some("always")) if replicas_ack == 0 => (
                DurableWait::None,
                format!("--durability auto: {settings}: every acknowledged write is on disk"),
            ),
            (Some(aof), _) if aof != "yes" => (
                DurableWait::None,
                format!(
                    "--durability auto: {settings}: WARNING: without an AOF a Redis crash or restart loses \
                     the batches' state (events, groups, sends) since the last snapshot; nothing to wait for"
                ),
            ),
            (_, Some("no")) => (
                window,
                format!(
                    "--durability auto: {settings}: WARNING: with appendfsync no the OS decides when \
                     the AOF reaches the disk (WAITAOF would never confirm); an OS crash can lose more than the window"
                ),
            ),
            _ if exact => (waitaof, format!("--durability auto: {settings}")),
            _ => (window, format!("--durability auto: {settings}")),
        },
    };
    Ok((wait, format!("{why}: {}", wait_line(wait))))
}

/// What `--durability auto` reads from the server at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerPersistence {
    /// `CONFIG GET appendonly` (of every master: the weakest), if readable.
    pub appendonly: Option<String>,
    /// `CONFIG GET appendfsync` (the weakest), if readable.
    pub appendfsync: Option<String>,
    /// Whether `WAITAOF` works (the server has it, the ACL allows it).
    pub waitaof: bool,
    /// Whether it is a cluster.
    pub cluster: bool,
    /// Under `everysec`, when `WAITAOF` confirmed a write sooner than an
    /// fsync can come (fsyncs are a second apart): how soon. Such a server's
    /// `WAITAOF` says nothing about the disk (redis/redis#13793).
    pub confirms_early: Option<Duration>,
}

/// A `WAITAOF` under `everysec` that confirms a write made right after an
/// fsync sooner than this confirms writes that are not on disk.
pub const EARLY_CONFIRMATION: Duration = Duration::from_millis(500);

impl ServerPersistence {
    /// Reads them. On a cluster the weakest master counts: `no` over `yes`,
    /// `no` over `everysec` over `always`; unreadable over everything. An
    /// error is Redis going away while it asks (the caller waits and asks
    /// again): a worker started while Redis restarts must not conclude that
    /// the server has no `WAITAOF`.
    pub async fn read(store: &Store) -> Result<ServerPersistence, StoreError> {
        fn weakest(values: Vec<(String, Option<String>)>, order: &[&str]) -> Option<String> {
            let mut worst: Option<(usize, String)> = None;
            for (_, v) in values {
                let v = v?;
                let rank = order.iter().position(|o| *o == v).unwrap_or(0);
                if worst.as_ref().is_none_or(|(r, _)| rank < *r) {
                    worst = Some((rank, v));
                }
            }
            worst.map(|(_, v)| v)
        }
        let mut p = ServerPersistence {
            appendonly: weakest(store.config_everywhere("appendonly").await, &["no", "yes"]),
            appendfsync: weakest(
                store.config_everywhere("appendfsync").await,
                &["no", "everysec", "always"],
            ),
            waitaof: store.waitaof_works().await?,
            cluster: store.target.is_cluster(),
            confirms_early: None,
        };
        // Whether WAITAOF really waits for the fsync (about 2 s at start).
        if p.waitaof
            && !p.cluster
            && p.appendonly.as_deref() == Some("yes")
            && p.appendfsync.as_deref() == Some("everysec")
        {
            match store.waitaof_confirmation_delay().await {
                Ok(d) if d < EARLY_CONFIRMATION => p.confirms_early = Some(d),
                Ok(_) => {}
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot measure how WAITAOF confirms: not using it");
                    p.waitaof = false;
                }
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(aof: Option<&str>, fsync: Option<&str>, waitaof: bool) -> ServerPersistence {
        ServerPersistence {
            appendonly: aof.map(str::to_string),
            appendfsync: fsync.map(str::to_string),
            waitaof,
            cluster: false,
            confirms_early: None,
        }
    }

    #[test]
    fn auto_waits_whenever_the_server_may_lose_acknowledged_writes() {
        let window = DurableWait::Window(crate::store::durability::witness::WINDOW);
        let exact = DurableWait::WaitAof { replicas: 0 };
        let auto = |s: &ServerPersistence| choose_wait(Durability::Auto, 0, s).expect("auto").0;
        // Unreadable settings (CONFIG GET refused): assume a crash may lose
        // the last second.
        assert_eq!(auto(&server(None, None, false)), window);
        assert_eq!(auto(&server(None, None, true)), exact);
        // appendfsync no: WAITAOF never confirms; the window, warned.
        assert_eq!(auto(&server(Some("yes"), Some("no"), true)), window);
        assert_eq!(
            auto(&server(Some("yes"), Some("always"), true)),
            DurableWait::None
        );
        assert_eq!(
            auto(&server(Some("no"), Some("everysec"), true)),
            DurableWait::None
        );
        // On a cluster WAITAOF answers for one node: the window.
        let cluster = ServerPersistence {
            cluster: true,
            ..server(Some("yes"), Some("everysec"), true)
        };
        assert_eq!(auto(&cluster), window);
        assert!(choose_wait(Durability::Waitaof, 0, &cluster).is_err());
        // A WAITAOF that confirms before the fsync proves nothing: the
        // window, unless the operator insists (warned).
        let early = ServerPersistence {
            confirms_early: Some(Duration::from_millis(100)),
            ..server(Some("yes"), Some("everysec"), true)
        };
        assert_eq!(auto(&early), window);
        let (w, why) = choose_wait(Durability::Waitaof, 0, &early).expect("ok");
        assert_eq!(w, exact);
        assert!(why.contains("WARNING"), "{why}");
        // Explicit modes are what they say.
        let s = server(Some("yes"), Some("everysec"), true);
        assert_eq!(
            choose_wait(Durability::None, 0, &s).expect("ok").0,
            DurableWait::None
        );
        assert_eq!(
            choose_wait(Durability::Always, 0, &s).expect("ok").0,
            DurableWait::None
        );
        assert_eq!(
            choose_wait(Durability::Everysec, 0, &s).expect("ok").0,
            window
        );
        assert_eq!(
            choose_wait(Durability::Waitaof, 2, &s).expect("ok").0,
            DurableWait::WaitAof { replicas: 2 }
        );
    }
}
