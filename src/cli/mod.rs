//! The command line: one file per command, and this thin dispatcher.

pub(crate) mod audit;
pub mod board;
pub(crate) mod cancel;
pub(crate) mod close;
pub mod dlq;
pub mod replay;
pub(crate) mod results;
pub(crate) mod seal;
pub mod serve;
pub(crate) mod status;
pub mod submit;
pub(crate) mod verify;
pub mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::keys::{Keyspace, ShardCount};
use crate::store::shards::ShardSource;
use crate::store::{ClientTlsConfig, Store, StoreError, TlsCertificates};

/// Bulk notifications through a provider's group API, event-sourced on Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "groupcast", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human, env = "GROUPCAST_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// How logs are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The product's commands. (The binary, in the rigs' package, adds
/// `demo`, `mock-provider` and `bench`.)
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a worker: loaders, provider operations, retries, watchdog.
    /// (Boxed: its many settings would make every command as large.)
    Worker(Box<worker::WorkerArgs>),
    /// Cut a recipients file into chunks and append them.
    Submit(submit::SubmitArgs),
    /// A batch's full event history as a timeline.
    Audit(audit::AuditArgs),
    /// Rebuild batch states from their events; --verify compares with the live copy.
    Replay(replay::ReplayArgs),
    /// A batch's state, or an overview of the streams.
    Status(status::StatusArgs),
    /// Inspect and redrive dead letters.
    Dlq(dlq::DlqArgs),
    /// Export the recipients' outcomes (failed, unknown, not sent, ...).
    Results(results::ResultsArgs),
    /// Stop waiting for a batch's missing seqs: send what was loaded, report.
    Close(close::CloseArgs),
    /// Declare a batch's last seq after its chunks (a streaming producer).
    Seal(seal::SealArgs),
    /// Cancel a batch: stop every generation not yet claimed for sending.
    Cancel(cancel::CancelArgs),
    /// Check the invariants for a batch.
    Verify(verify::VerifyArgs),
    /// Serve the operator board: every batch, stream health, dead letters.
    Board(board::BoardArgs),
    /// Serve the HTTP API under /v1 (and the board) on one listener.
    Serve(serve::ServeArgs),
}

impl Command {
    /// The command's connection flags: every product command uses the
    /// deployment's Redis (the tests check that each takes them).
    #[cfg(test)]
    fn redis_args(&self) -> &RedisArgs {
        match self {
            Command::Worker(a) => &a.redis,
            Command::Submit(a) => &a.redis,
            Command::Audit(a) => &a.redis,
            Command::Replay(a) => &a.redis,
            Command::Status(a) => &a.redis,
            Command::Dlq(a) => &a.redis,
            Command::Results(a) => &a.redis,
            Command::Close(a) => &a.redis,
            Command::Seal(a) => &a.redis,
            Command::Cancel(a) => &a.redis,
            Command::Verify(a) => &a.redis,
            Command::Board(a) => &a.redis,
            Command::Serve(a) => &a.board.redis,
        }
    }
}

/// Where Redis is and how keys are named: the connection flags, the same
/// for every command that uses Redis. Each is `global`, so that a command
/// with subcommands (`dlq list`) takes them after its subcommand too, in the
/// same position as every other command (`status --redis URL`).
#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    /// Redis URL: redis://, rediss:// (TLS), or redis+cluster://host:port,host:port.
    /// Put no password here (a command line is visible to `ps`): use
    /// GROUPCAST_REDIS_PASSWORD or GROUPCAST_REDIS_PASSWORD_FILE (and
    /// GROUPCAST_REDIS_USERNAME for an ACL user).
    #[arg(
        long = "redis",
        global = true,
        env = "GROUPCAST_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub url: String,
    /// Key prefix, so that deployments can share a server.
    #[arg(long, global = true, env = "GROUPCAST_PREFIX", default_value = "gc")]
    pub prefix: String,
    /// Number of shards (hash tags) batches are spread over: `auto` (the
    /// count the deployment recorded in `<prefix>:shards`; the first process
    /// records one per cluster master, or 1 on a single server) or 1 to
    /// 1024 (recorded if none is; refused if the deployment recorded
    /// another: changing it moves batches, see docs/cluster.md).
    #[arg(long, global = true, env = "GROUPCAST_SHARDS", default_value = "auto")]
    pub shards: ShardCount,
    /// PEM file of the CA that signed the Redis server's certificate
    /// (rediss:// only). Without it the system's trust store is used.
    #[arg(long = "redis-ca-file", global = true, env = "GROUPCAST_REDIS_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a server with `tls-auth-clients yes`.
    #[arg(
        long = "redis-client-cert-file",
        global = true,
        env = "GROUPCAST_REDIS_CLIENT_CERT_FILE",
        requires = "client_key_file"
    )]
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PKCS#8 PEM).
    #[arg(
        long = "redis-client-key-file",
        global = true,
        env = "GROUPCAST_REDIS_CLIENT_KEY_FILE",
        requires = "client_cert_file"
    )]
    pub client_key_file: Option<PathBuf>,
}

/// The Redis credentials, from the environment or a file (never the command line).
#[derive(Clone, Default)]
pub struct RedisCredentials {
    /// GROUPCAST_REDIS_USERNAME (an ACL user; none means `default`).
    pub username: Option<String>,
    /// GROUPCAST_REDIS_PASSWORD or the file GROUPCAST_REDIS_PASSWORD_FILE names.
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCredentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl RedisCredentials {
    /// Reads them from the environment.
    pub(crate) fn from_env() -> Result<RedisCredentials, CliError> {
        Ok(RedisCredentials {
            password: secret_from_env("GROUPCAST_REDIS_PASSWORD")?,
            username: std::env::var("GROUPCAST_REDIS_USERNAME").ok(),
        })
    }
}

impl RedisArgs {
    fn url_with(&self, creds: &RedisCredentials) -> String {
        match (&creds.password, &creds.username) {
            (None, None) => self.url.clone(),
            (password, username) => {
                with_credentials(&self.url, username.as_deref(), password.as_deref())
            }
        }
    }

    /// The TLS files named by `--redis-ca-file` / GROUPCAST_REDIS_CA_FILE and
    /// the client certificate options, read; `None` when none is given.
    pub(crate) fn tls_certificates(&self) -> Result<Option<TlsCertificates>, CliError> {
        let read = |path: &PathBuf, var: &str| {
            std::fs::read(path)
                .map_err(|e| CliError::Usage(format!("{var}={}: cannot read: {e}", path.display())))
        };
        let root_cert = match &self.ca_file {
            Some(p) => Some(read(p, "GROUPCAST_REDIS_CA_FILE")?),
            None => None,
        };
        let client_tls = match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert, "GROUPCAST_REDIS_CLIENT_CERT_FILE")?,
                client_key: read(key, "GROUPCAST_REDIS_CLIENT_KEY_FILE")?,
            }),
            _ => None,
        };
        if root_cert.is_none() && client_tls.is_none() {
            return Ok(None);
        }
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// Connects, and checks that the server takes our credentials (a server
    /// that wants a password accepts a connection without one and refuses
    /// its first command): every failure is explained in one message, with
    /// the URL redacted and no secret in it.
    pub async fn connect(&self) -> Result<Store, CliError> {
        let creds = RedisCredentials::from_env()?;
        let tls = self.tls_certificates()?;
        self.connect_with(&creds, tls)
            .await
            .map_err(|e| self.failure(&e, &creds))
    }

    /// Connects and checks the server answers `PING`, returning the raw
    /// error (for callers that wait while Redis is away).
    pub(crate) async fn connect_with(
        &self,
        creds: &RedisCredentials,
        tls: Option<TlsCertificates>,
    ) -> Result<Store, StoreError> {
        let url = self.url_with(creds);
        // One shard until the deployment's count is settled: the count is
        // read from (or recorded in) Redis, outside every shard.
        let keys = Keyspace::new(self.prefix.clone(), 1);
        let store = Store::connect_with_tls(&url, keys, tls).await?;
        store.ping().await?;
        let (shards, source) = store.settle_shards(self.shards).await?;
        let key = store.keys.shard_count();
        match source {
            ShardSource::RecordedNow(why) => {
                tracing::info!("shards: {shards} ({why}), recorded for the deployment in {key}")
            }
            ShardSource::Recorded => {
                tracing::debug!("shards: {shards}, as the deployment recorded in {key}")
            }
        }
        Ok(store.with_shards(shards))
    }

    /// A connection failure as the command's error: a refused shard count
    /// is a usage error with its own advice; the rest is explained by
    /// [`explain`](Self::explain).
    pub fn failure(&self, e: &StoreError, creds: &RedisCredentials) -> CliError {
        match e {
            StoreError::ShardCount(why) => CliError::Usage(why.clone()),
            _ => CliError::Redis(self.explain(e, creds)),
        }
    }

    /// What a connection error means and what to do, without secrets.
    pub(crate) fn explain(&self, e: &StoreError, creds: &RedisCredentials) -> String {
        match e {
            StoreError::Redis(r) => {
                explain_connect(&self.url, Some(r), &format!("redis: {r}"), creds)
            }
            StoreError::ShardCount(why) => why.clone(),
            other => explain_connect(&self.url, None, &other.to_string(), creds),
        }
    }
}

/// Puts a username and password into a URL (`scheme://user:pass@host...`).
pub(crate) fn with_credentials(
    url: &str,
    username: Option<&str>,
    password: Option<&str>,
) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let host = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    let user = username.unwrap_or("");
    match password {
        Some(p) => format!("{scheme}://{user}:{}@{host}", percent(p)),
        None => format!("{scheme}://{user}@{host}"),
    }
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Reads a secret from `NAME` or from the file named by `NAME_FILE`.
pub fn secret_from_env(name: &str) -> Result<Option<String>, CliError> {
    if let Ok(v) = std::env::var(name) {
        return Ok(Some(v));
    }
    let file_var = format!("{name}_FILE");
    if let Ok(path) = std::env::var(&file_var) {
        return std::fs::read_to_string(&path)
            .map(|s| Some(s.trim_end_matches(['\n', '\r']).to_string()))
            .map_err(|e| {
                CliError::Usage(format!(
                    "{file_var}={path}: cannot read the secret file: {e}"
                ))
            });
    }
    Ok(None)
}

fn explain_connect(
    url: &str,
    error: Option<&redis::RedisError>,
    text: &str,
    creds: &RedisCredentials,
) -> String {
    let redacted = crate::store::redact_url(url);
    let code = error.and_then(|e| e.code());
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let tls = url.starts_with("rediss");
    let hint = if error.is_some_and(|e| e.kind() == redis::ErrorKind::AuthenticationFailed)
        || matches!(code, Some("NOAUTH" | "WRONGPASS"))
        || has(&["WRONGPASS", "NOAUTH", "invalid username-password"])
    {
        "the credentials were refused: check GROUPCAST_REDIS_USERNAME and \
         GROUPCAST_REDIS_PASSWORD (or GROUPCAST_REDIS_PASSWORD_FILE)"
    } else if code == Some("NOPERM") || has(&["NOPERM"]) {
        "the ACL user lacks permissions: groupcast needs streams, hashes, sets, sorted sets, \
         strings and EVALSHA on its prefix (see docs/security.md)"
    } else if has(&["certificate", "SSL", "TLS", "handshake"])
        // A server that wants a client certificate and got none closes the
        // connection right after the handshake.
        || (tls && (error.is_some_and(|e| e.is_io_error() || e.is_connection_dropped())
            || has(&["reset by peer", "Broken pipe", "closed"])))
    {
        "the TLS handshake failed: for a server certificate signed by a private CA set \
         GROUPCAST_REDIS_CA_FILE to that CA's PEM file; for a server that wants client \
         certificates set GROUPCAST_REDIS_CLIENT_CERT_FILE and GROUPCAST_REDIS_CLIENT_KEY_FILE"
    } else if error.is_some_and(|e| e.is_connection_refusal()) || has(&["refused"]) {
        "nothing listens there: is redis-server running? (Debian: sudo apt-get install redis-server)"
    } else {
        "check the URL (rediss:// for TLS), the network and the server's log"
    };
    let text = scrub(text, creds.password.as_deref());
    format!("cannot use redis at {redacted}: {text} ({hint})")
}

/// `text` with every occurrence of `secret` (as given and percent-encoded)
/// replaced by `***`: a last guard for error texts that might echo a URL.
pub(crate) fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => text.replace(s, "***").replace(&percent(s), "***"),
        _ => text.to_string(),
    }
}

/// What a command failed with, and its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input or usage: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Redis could not be used: exit 1.
    #[error("{0}")]
    Redis(String),
    /// The command ran and found a failure (verification, differences): exit 1.
    #[error("{0}")]
    Failed(String),
}

impl From<crate::producer::InputError> for CliError {
    fn from(e: crate::producer::InputError) -> Self {
        match e {
            crate::producer::InputError::Usage(m) => CliError::Usage(m),
            crate::producer::InputError::Failed(m) => CliError::Failed(m),
        }
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::ShardCount(why) => CliError::Usage(why.clone()),
            StoreError::Redis(r) if r.code() == Some("NOPERM") => CliError::Redis(format!(
                "{e} (the ACL user lacks a command groupcast needs: see docs/security.md for the rule)"
            )),
            _ => CliError::Redis(e.to_string()),
        }
    }
}

impl From<redis::RedisError> for CliError {
    fn from(e: redis::RedisError) -> Self {
        CliError::Redis(e.to_string())
    }
}

impl CliError {
    fn code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Redis(_) | CliError::Failed(_) => 1,
        }
    }
}

/// Whether human logs get ANSI colors: only when stderr is a terminal (a
/// file or a pipe gets plain text) and `NO_COLOR` is not set to anything
/// non-empty (<https://no-color.org>).
pub(crate) fn log_colors(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Sets up logging; a `quiet` command (one that prints its own progress)
/// logs only when GROUPCAST_LOG asks.
pub fn start_logging(format: LogFormat, quiet: bool) {
    if quiet && std::env::var_os("GROUPCAST_LOG").is_none() {
        return;
    }
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GROUPCAST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colors = log_colors(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colors)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Human => builder.try_init(),
    };
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> ExitCode {
    start_logging(cli.log_format, matches!(cli.command, Command::Submit(_)));
    let result = match cli.command {
        Command::Worker(a) => worker::run(*a).await,
        Command::Submit(a) => submit::run(a).await,
        Command::Audit(a) => audit::run(a).await,
        Command::Results(a) => results::run(a).await,
        Command::Replay(a) => replay::run(a).await,
        Command::Status(a) => status::run(a).await,
        Command::Dlq(a) => dlq::run(a).await,
        Command::Close(a) => close::run(a).await,
        Command::Seal(a) => seal::run(a).await,
        Command::Cancel(a) => cancel::run(a).await,
        Command::Verify(a) => verify::run(a).await,
        Command::Board(a) => board::run(a).await,
        Command::Serve(a) => serve::run(a).await,
    };
    exit_code(result)
}

/// A command's result as the process's exit status, its error printed.
pub fn exit_code(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("groupcast: {e}");
            ExitCode::from(e.code())
        }
    }
}

/// Formats a duration for people ([`crate::human::duration`]): `850 ms`,
/// `12.3 s`, `4m 5s`, `2h 3m`, `7 days`.
pub(crate) fn human_duration(ms: u64) -> String {
    crate::human::millis(ms)
}

/// Formats epoch milliseconds as an RFC 3339 UTC time (to the millisecond).
pub(crate) fn human_time(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Writes one line to stdout. A closed pipe (`groupcast audit B | head`)
/// ends the process quietly with success instead of a panic; any other
/// write error ends it with status 1.
pub fn out(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("groupcast: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`out`].
macro_rules! outln {
    () => {
        $crate::cli::out("")
    };
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Whether a table cell reads as a number (right-aligned): `12`, `-3`,
/// `4.5`, `3/5`.
fn numeric(cell: &str) -> bool {
    !cell.is_empty()
        && cell.chars().any(|c| c.is_ascii_digit())
        && cell
            .chars()
            .enumerate()
            .all(|(i, c)| c.is_ascii_digit() || c == '.' || c == '/' || (i == 0 && c == '-'))
}

/// Prints rows as an aligned table: numeric columns (every cell a number or
/// `-`, at least one a number) are right-aligned, the last column is not
/// padded.
pub(crate) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let mut right = vec![true; headers.len()];
    let mut any_number = vec![false; headers.len()];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
                right[i] &= c == "-" || numeric(c);
                any_number[i] |= numeric(c);
            }
        }
    }
    for (r, n) in right.iter_mut().zip(&any_number) {
        *r &= *n;
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let last = i + 1 == cells.len();
            if right.get(i).copied().unwrap_or(false) {
                s.push_str(&format!("{c:>w$}"));
            } else if last {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}"));
            }
            if !last {
                s.push_str("  ");
            }
        }
        s.trim_end().to_string()
    };
    out(line(headers.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        out(line(r.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every leaf command line (`["dlq", "list"]`, `["status"]`, ...).
    fn leaves(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Command)>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|c| c.get_name() != "help")
            .collect();
        if subs.is_empty() {
            out.push((path.clone(), cmd.clone()));
        }
        for s in subs {
            let mut p = path.clone();
            p.push(s.get_name().to_string());
            leaves(s, p, out);
        }
    }

    #[test]
    fn every_command_using_redis_takes_the_connection_flags_after_its_name() {
        let dir = std::env::temp_dir();
        let ca = dir.join("ca.pem").display().to_string();
        let cert = dir.join("client.pem").display().to_string();
        let key = dir.join("client.key").display().to_string();
        let mut all = Vec::new();
        leaves(&Cli::command(), Vec::new(), &mut all);
        assert!(all.len() >= 10, "{} commands", all.len());
        for (path, cmd) in &all {
            let mut argv = vec!["groupcast".to_string()];
            argv.extend(path.iter().cloned());
            // Required positionals and options get a placeholder (a
            // number: some options are numbers, every string takes one).
            for a in cmd.get_arguments().filter(|a| a.is_required_set()) {
                match a.get_long() {
                    Some(l) => argv.extend([format!("--{l}"), "1".into()]),
                    None => argv.push("b1".into()),
                }
            }
            argv.extend(
                [
                    "--redis",
                    "redis://10.0.0.9:7000",
                    "--prefix",
                    "px",
                    "--shards",
                    "3",
                    "--redis-ca-file",
                    &ca,
                    "--redis-client-cert-file",
                    &cert,
                    "--redis-client-key-file",
                    &key,
                ]
                .map(String::from),
            );
            let line = argv.join(" ");
            let cli = Cli::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("`{line}` refused the connection flags: {e}"));
            let r = cli.command.redis_args();
            assert_eq!(r.url, "redis://10.0.0.9:7000", "{line}");
            assert_eq!(r.prefix, "px", "{line}");
            assert_eq!(r.shards, ShardCount::Fixed(3), "{line}");
            assert_eq!(
                r.ca_file.as_ref().map(|p| p.display().to_string()),
                Some(ca.clone()),
                "{line}"
            );
            assert_eq!(
                r.client_cert_file.as_ref().map(|p| p.display().to_string()),
                Some(cert.clone()),
                "{line}"
            );
            assert_eq!(
                r.client_key_file.as_ref().map(|p| p.display().to_string()),
                Some(key.clone()),
                "{line}"
            );
        }
    }

    #[test]
    fn colors_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colors(true, None));
        assert!(log_colors(true, Some(OsStr::new(""))));
        assert!(!log_colors(true, Some(OsStr::new("1"))));
        assert!(!log_colors(false, None));
        assert!(!log_colors(false, Some(OsStr::new("1"))));
    }

    #[test]
    fn the_claim_lifetime_is_a_flag_of_at_least_a_second() {
        let config = |lifetime: &str| {
            let cli = Cli::try_parse_from(["groupcast", "worker", "--claim-lifetime", lifetime])
                .expect("parse");
            let Command::Worker(a) = cli.command else {
                panic!("not the worker")
            };
            a.worker.config()
        };
        let c = config("3s").expect("3s is fine");
        assert_eq!(c.claim_lifetime, std::time::Duration::from_secs(3));
        let e = config("400ms").expect_err("too short").to_string();
        assert!(e.contains("--claim-lifetime 400 ms is too short"), "{e}");
    }

    #[test]
    fn the_connection_flags_also_go_before_a_subcommand() {
        let cli = Cli::try_parse_from([
            "groupcast",
            "dlq",
            "--redis",
            "redis://h:1",
            "list",
            "--prefix",
            "p2",
        ])
        .expect("parse");
        let r = cli.command.redis_args();
        assert_eq!((r.url.as_str(), r.prefix.as_str()), ("redis://h:1", "p2"));
    }
}
