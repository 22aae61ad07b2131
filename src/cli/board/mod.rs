//! `groupcast board`: an operator's web page served by the binary, with the
//! JSON API it reads (`/api/...`, see [`api`]).
//!
//! - Every asset is embedded ([`assets`]): the board works offline, with no
//!   CDN.
//! - Reading needs nothing; acting (redrive a dead letter, close or cancel
//!   a batch) needs
//!   `Authorization: Bearer <token>` with the token from
//!   `GROUPCAST_BOARD_TOKEN` (or the file `GROUPCAST_BOARD_TOKEN_FILE`
//!   names). Without a token configured the board is read-only.
//! - Cross-site forgeries are refused ([`auth`]): an action must carry the
//!   `X-Groupcast-Board` header (a browser sends a custom header cross-site
//!   only after a CORS preflight, which the board never answers), and an
//!   `Origin` or `Sec-Fetch-Site` that says another site is refused.

pub(crate) mod api;
pub(crate) mod assets;
pub(crate) mod auth;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use clap::Args;

use crate::cli::{secret_from_env, CliError, RedisArgs};
use crate::store::batch::BatchPolicy;
use crate::store::Store;

/// Where the board listens unless told otherwise (workers looking for a
/// free metrics port pass over it, so that a board started later finds it
/// free).
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:9465";

/// Board flags.
#[derive(Debug, Args)]
pub struct BoardArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Where to serve the board. Loopback unless told otherwise: anyone who
    /// reaches it reads every batch's state.
    #[arg(long, env = "GROUPCAST_BOARD_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// A batch in flight quiet this long is shown as stalled (as the
    /// workers' --stall-after).
    #[arg(long, env = "GROUPCAST_STALL_AFTER", default_value = "5m", value_parser = duration)]
    pub stall_after: Duration,
    /// Reported batches listed per shard (the newest).
    #[arg(long, default_value_t = 200)]
    pub reported: usize,
    /// How long a batch closed or cancelled from the board keeps its events
    /// once it reports (use the workers' `--retention`).
    #[arg(long, default_value_t = crate::worker::WorkerConfig::RETENTION.into(), value_parser = crate::human::flag_duration)]
    pub retention: crate::human::FlagDuration,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 30s, 5m)"))
}

/// What every handler shares.
pub struct Board {
    /// The store.
    pub store: Store,
    /// The token actions need; `None`: read-only.
    pub token: Option<String>,
    /// See [`BoardArgs::stall_after`].
    pub stall_after: Duration,
    /// See [`BoardArgs::reported`].
    pub reported: usize,
    /// How a batch closed or cancelled from the board ends (its report is
    /// queued for delivery; see [`BoardArgs::retention`]).
    pub policy: BatchPolicy,
}

/// The board's routes.
pub fn router(board: Arc<Board>) -> Router {
    Router::new()
        .route("/", get(assets::page))
        .route("/batches/{id}", get(assets::page))
        .route("/dlq", get(assets::page))
        .route("/assets/app.js", get(assets::script))
        .route("/assets/app.css", get(assets::style))
        .route("/api/overview", get(api::overview))
        .route("/api/batches/{id}", get(api::batch))
        .route("/api/batches/{id}/events", get(api::events))
        .route("/api/batches/{id}/results", get(api::results))
        .route("/api/dlq", get(api::dead_letters))
        .route("/api/dlq/{id}/redrive", post(api::redrive))
        .route("/api/batches/{id}/close", post(api::close))
        .route("/api/batches/{id}/cancel", post(api::cancel))
        .with_state(board)
}

/// Serves the board on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, board: Arc<Board>) -> std::io::Result<()> {
    axum::serve(listener, router(board)).await
}

impl Board {
    /// The board of `args` on `store`, its token from
    /// `GROUPCAST_BOARD_TOKEN` (or the file `GROUPCAST_BOARD_TOKEN_FILE`
    /// names); `groupcast serve` builds its board the same way.
    pub(crate) fn from_args(args: &BoardArgs, store: Store) -> Result<Board, CliError> {
        let token = secret_from_env("GROUPCAST_BOARD_TOKEN")?;
        if token.as_deref().is_some_and(str::is_empty) {
            return Err(CliError::Usage(
                "GROUPCAST_BOARD_TOKEN is empty: set a long random token, or unset it for a read-only board"
                    .into(),
            ));
        }
        Ok(Board {
            store,
            token,
            stall_after: args.stall_after,
            reported: args.reported,
            policy: BatchPolicy::for_operator(args.retention.into()),
        })
    }
}

/// Binds `--listen`, saying which address in a usage error.
pub async fn bind(listen: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), CliError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| CliError::Usage(format!("--listen {listen}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Usage(format!("--listen {listen}: {e}")))?;
    Ok((listener, local))
}

/// Runs `groupcast board`.
pub async fn run(args: BoardArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    let board = Board::from_args(&args, store)?;
    let (listener, local) = bind(args.listen).await?;
    tracing::info!(
        "board at http://{local}/ ({})",
        if board.token.is_some() {
            "actions need the token"
        } else {
            "read-only: no GROUPCAST_BOARD_TOKEN"
        }
    );
    serve(listener, Arc::new(board))
        .await
        .map_err(|e| CliError::Failed(format!("the board stopped: {e}")))
}
