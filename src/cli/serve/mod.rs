//! `groupcast serve`: the HTTP front door. One listener serves the
//! operator's board (`/`, `/api/...`: [`crate::cli::board`], with its own
//! token) and a versioned JSON API under `/v1` (docs/api.md), with which a
//! producer in any language creates a batch, adds its chunks, closes or
//! cancels it and reads its status, report and results, without speaking
//! the stream protocol. The API appends to the same ingest streams through
//! the same producer code, so the scripts decide its chunks as any other:
//! a batch may be fed partly by HTTP and partly by streams.
//!
//! - `routes`: the handlers and their request and answer types.
//! - `problems`: every error as `application/problem+json` (RFC 9457).
//! - `tokens`: the tokens file, scopes, and the bearer and cross-site checks.
//! - `openapi`: `GET /v1/openapi.json`, generated from the handlers.
//!
//! Limits: a request body over `--max-body` is refused (413) before it is
//! read; a request that takes longer than `--request-timeout`, reading its
//! body included, is answered 503 and dropped, so a slow client holds
//! nothing for long; a chunk is refused (429 with `Retry-After`) while its
//! ingest stream holds `--max-unread-chunks` unread (the bound `submit`
//! waits under), instead of growing Redis.

pub(crate) mod openapi;
pub(crate) mod problems;
pub(crate) mod routes;
pub mod tokens;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use clap::Args;

use crate::cli::board::{self, Board, BoardArgs};
use crate::cli::CliError;
use crate::events::chunk::MAX_CHUNK_BYTES;
use crate::producer::DEFAULT_MAX_UNREAD_CHUNKS;
use crate::store::batch::BatchPolicy;
use crate::store::Store;
use problems::{ApiProblem, Kind};
use tokens::Tokens;

/// Serve flags: the board's (the connection, `--listen`, ...) and the API's.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The board's flags: the connection, where to listen (loopback by
    /// default), and how the board shows batches.
    #[command(flatten)]
    pub board: BoardArgs,
    /// The API's tokens: one a line, `NAME SCOPES SECRET` (scopes
    /// `ingest`, `operate`, `read`, comma-separated), `#` comments.
    /// Without it every `/v1` call but the OpenAPI document is refused.
    #[arg(long, env = "GROUPCAST_API_TOKENS_FILE", value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Refuse a chunk (429, `Retry-After`) while its ingest stream holds
    /// this many chunks no worker has read (as `submit
    /// --max-unread-chunks`); 0: no bound.
    #[arg(long, default_value_t = DEFAULT_MAX_UNREAD_CHUNKS)]
    pub max_unread_chunks: u64,
    /// The largest request body, in bytes (larger: 413). Room for the
    /// largest MessagePack chunk by default.
    #[arg(long, default_value_t = MAX_CHUNK_BYTES + 64 * 1024)]
    pub max_body: usize,
    /// The longest a request may take, reading its body included (longer:
    /// 503, and the connection's work is dropped).
    #[arg(long, default_value = "30s", value_parser = crate::human::flag_duration)]
    pub request_timeout: crate::human::FlagDuration,
}

/// What every `/v1` handler shares.
pub struct Front {
    /// The store.
    pub store: Store,
    /// The tokens.
    pub tokens: Tokens,
    /// See [`ServeArgs::max_unread_chunks`].
    pub max_unread: u64,
    /// What a 429 tells the client to wait.
    pub retry_after: Duration,
    /// How long the front door keeps a batch's definition and seq digests
    /// after their last change (the workers' retention).
    pub keep: Duration,
    /// How a batch closed or cancelled through the API ends.
    pub policy: BatchPolicy,
}

/// What a 429 tells the client to wait: about the time a worker takes to
/// read a round of chunks.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The `/v1` routes, with the body limit and the timeout.
pub fn api_router(front: Arc<Front>, max_body: usize, timeout: Duration) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/v1/batches", post(routes::create_batch))
        .route("/v1/batches/{id}", get(routes::status))
        .route("/v1/batches/{id}/chunks/{seq}", put(routes::put_chunk))
        .route("/v1/batches/{id}/seal", post(routes::seal))
        .route("/v1/batches/{id}/close", post(routes::close))
        .route("/v1/batches/{id}/cancel", post(routes::cancel))
        .route("/v1/batches/{id}/report", get(routes::report))
        .route("/v1/batches/{id}/results", get(routes::results))
        .route("/v1/{*rest}", axum::routing::any(routes::not_found))
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(front)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(timeout, deadline))
}

/// Answers 503 for a request that takes longer than `limit` (its body's
/// reading included), dropping its work.
async fn deadline(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiProblem::new(
            Kind::Timeout,
            format!(
                "the request took more than {} (--request-timeout)",
                crate::human::millis(limit.as_millis() as u64)
            ),
        )
        .into_response(),
    }
}

/// The whole server: the board and the API on one listener.
pub fn router(board: Arc<Board>, front: Arc<Front>, max_body: usize, timeout: Duration) -> Router {
    board::router(board).merge(api_router(front, max_body, timeout))
}

/// Runs `groupcast serve`.
pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let tokens = match &args.tokens {
        Some(path) => Tokens::read(path).map_err(|e| CliError::Usage(e.to_string()))?,
        None => Tokens::default(),
    };
    let store = args.board.redis.connect().await?;
    let board = Board::from_args(&args.board, store.clone())?;
    let front = Front {
        store,
        tokens,
        max_unread: args.max_unread_chunks,
        retry_after: RETRY_AFTER,
        keep: args.board.retention.into(),
        policy: board.policy,
    };
    let (listener, local) = board::bind(args.board.listen).await?;
    tracing::info!(
        "serving the API at http://{local}/v1 ({} token(s)) and the board at http://{local}/",
        front.tokens.len()
    );
    if front.tokens.is_empty() {
        tracing::warn!("no --tokens file: every /v1 call but the OpenAPI document is refused");
    }
    let app = router(
        Arc::new(board),
        Arc::new(front),
        args.max_body,
        args.request_timeout.into(),
    );
    axum::serve(listener, app)
        .await
        .map_err(|e| CliError::Failed(format!("the server stopped: {e}")))
}
