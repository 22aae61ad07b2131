//! The board's JSON API (`/api/...`), which its page reads. Documented in
//! docs/board.md. Every Redis read goes through typed methods of [`Store`].

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::auth::authorize;
use super::Board;
use crate::cli::status::{generations_json, queued_json};
use crate::events::{entry_millis, Event, Recorded};
use crate::keys::validate_batch_id;
use crate::projection::Projection;
use crate::seq_ranges::MISSING_RANGES_MAX;
use crate::store::batch::{BatchLog, BatchPolicy, Cancelling, Closing};
use crate::store::overview::Queued;
use crate::store::{Store, StoreError};

/// The most events in one page of a batch's timeline.
const PAGE_MAX: usize = 500;

/// An API failure: a status and a message, answered as `{"error": ...}`.
pub(crate) struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}"))
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

/// Where a batch is: `queued` (chunks wait unread), `in_flight`,
/// `scheduled` (every group sent, waiting for the provider to finish),
/// `stalled` (quiet past the stall threshold before its report) or
/// `reported`.
pub(crate) fn batch_state(
    p: &Projection,
    quiet_ms: Option<u64>,
    stall_after_ms: u64,
) -> &'static str {
    let gens = p.generations();
    if p.get("report").is_some() {
        "reported"
    } else if quiet_ms.is_some_and(|q| q >= stall_after_ms) {
        "stalled"
    } else if gens > 0 && (0..gens).all(|g| p.gen_field(g, "sent").is_some()) {
        "scheduled"
    } else {
        "in_flight"
    }
}

/// One batch's row of the overview.
fn row(board: &Board, batch: &str, shard: u32, p: &Projection, now: u64, queued: u64) -> Value {
    let hb = p.int("hb") as u64;
    let t0 = p.int("t0") as u64;
    let quiet = (hb > 0 && p.get("report").is_none()).then(|| now.saturating_sub(hb));
    json!({
        "batch": batch,
        "shard": shard,
        "state": batch_state(p, quiet, board.stall_after.as_millis() as u64),
        "outcome": p.get("report"),
        "chunks": p.int("seqs"),
        "lastSeq": p.last_seq(),
        "queuedChunks": queued,
        "recipients": p.int("recipients"),
        "registered": p.int("registered"),
        "failed": p.int("failed"),
        "rejected": p.int("rejected"),
        "stalls": p.int("stalls"),
        "cancelled": p.cancelled(),
        "providerRefusedCredentials": p.get(crate::projection::field::CREDS_REFUSED),
        "chunksAfterEnd": p.int(crate::projection::field::AFTER_END),
        "ageMs": (t0 > 0).then(|| now.saturating_sub(t0)),
        "quietMs": quiet,
        "generations": generations_json(p),
    })
}

/// Shard `shard`'s clock in `times` (from [`Store::shard_times_ms`]): ages
/// and quiet times are measured on the clock that stamped the heartbeats
/// and entry ids, the shard's server's, never this machine's.
///
/// [`Store::shard_times_ms`]: crate::store::Store::shard_times_ms
fn clock_of(times: &[u64], shard: u32) -> u64 {
    usize::try_from(shard)
        .ok()
        .and_then(|s| times.get(s))
        .copied()
        .unwrap_or_default()
}

fn queued_chunks(queued: &[Queued], batch: &str) -> u64 {
    queued
        .iter()
        .find_map(|q| q.of(batch))
        .map_or(0, |w| w.chunks)
}

/// `GET /api/overview`: every batch (queued, in flight, scheduled, stalled,
/// and the newest reported), the streams' health, the dead-letter count.
pub(crate) async fn overview(State(board): State<Arc<Board>>) -> ApiResult {
    let store = &board.store;
    let times = store.shard_times_ms().await?;
    let streams = store.stream_health().await?;
    let queued = store.queued_all().await?;
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    for shard in 0..store.keys.shards() {
        let mut names = store.active_batches(shard).await?;
        names.extend(
            store
                .reported_batches(shard, board.reported)
                .await?
                .into_iter()
                .map(|r| r.batch),
        );
        for b in names {
            if !seen.insert(b.clone()) {
                continue;
            }
            let p = store.batch(&b).state().await?;
            if p.fields.is_empty() {
                continue; // past its retention
            }
            let now = clock_of(&times, shard);
            rows.push(row(&board, &b, shard, &p, now, queued_chunks(&queued, &b)));
        }
    }
    for q in &queued {
        for w in q.batches.iter().filter(|w| !seen.contains(&w.batch)) {
            let mut v = queued_json(&w.batch, w, q);
            v["ageMs"] = json!(clock_of(&times, w.shard).saturating_sub(w.since_ms));
            v["recipients"] = json!(w.recipients);
            v["generations"] = json!([]);
            rows.push(v);
        }
    }
    let dead_letters: u64 = streams
        .iter()
        .filter(|s| s.what == "dead letters")
        .map(|s| s.length)
        .sum();
    Ok(Json(json!({
        "now": clock_of(&times, 0),
        "readOnly": board.token.is_none(),
        "stallAfterMs": board.stall_after.as_millis() as u64,
        "batches": rows,
        "streams": streams,
        "queued": queued,
        "deadLetters": dead_letters,
    })))
}

fn check_batch(id: &str) -> Result<(), ApiError> {
    validate_batch_id(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("{id:?}: {e}")))
}

/// The seqs not accepted yet, up to the last one (or the highest seen when
/// the last has not arrived), as `missingSeqRanges` (the first
/// [`MISSING_RANGES_MAX`] ranges `[from, to]`), `missingSeqRangesTotal`
/// and `missingSeqCount`, set on `v`: the work is proportional to the seqs
/// that arrived, never to the highest seq.
pub(crate) fn set_missing_seqs(v: &mut Value, p: &Projection) {
    let m = p.missing_seqs(MISSING_RANGES_MAX);
    v["missingSeqRanges"] = json!(m.ranges);
    v["missingSeqRangesTotal"] = json!(m.ranges_total);
    v["missingSeqCount"] = json!(m.count);
}

/// `GET /api/batches/{id}`: generations and groups, missing seqs, rejected
/// inputs with reasons, the report, and what waits in the ingest stream.
pub(crate) async fn batch(State(board): State<Arc<Board>>, Path(id): Path<String>) -> ApiResult {
    check_batch(&id)?;
    let store = &board.store;
    let shard = store.keys.shard_of(&id);
    let queued = store.queued(shard).await?;
    let p = store.batch(&id).state().await?;
    if p.fields.is_empty() {
        return match queued.of(&id) {
            Some(w) => {
                let mut v = queued_json(&id, w, &queued);
                v["describe"] = json!(queued.describe(w));
                set_missing_seqs(&mut v, &Projection::default());
                v["rejected"] = json!([]);
                v["generations"] = json!([]);
                v["readOnly"] = json!(board.token.is_none());
                Ok(Json(v))
            }
            None => Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no batch {id} (unknown, or past its retention)"),
            )),
        };
    }
    let events = store.batch(&id).events().await?;
    // The clock that stamped the batch's heartbeat and entry ids.
    let now = store.batch(&id).server_time_ms().await?;
    let rejected: Vec<Value> = events
        .iter()
        .flatten()
        .filter_map(|r| match &r.event {
            Event::InputRejected(e) => Some(json!({
                "seq": e.seq, "reason": e.reason, "id": r.id, "timeMs": r.millis(),
            })),
            _ => None,
        })
        .collect();
    let (report, delivery) = reports_json(&events);
    let mut v = row(&board, &id, shard, &p, now, queued_chunks(&[queued], &id));
    set_missing_seqs(&mut v, &p);
    v["lastSeqKnown"] = json!(p.last_seq().is_some());
    v["rejected"] = json!(rejected);
    v["report"] = report;
    v["delivery_report"] = delivery;
    v["events"] = json!(events.len());
    v["readOnly"] = json!(board.token.is_none());
    Ok(Json(v))
}

/// A batch's report and delivery report (`Null` while not decided), with
/// the fields the reports stream and the webhook name them
/// (docs/reports.md) and when each was decided (`time_ms`).
pub(crate) fn reports_json(events: &[Result<Recorded, (String, String)>]) -> (Value, Value) {
    let mut report = Value::Null;
    let mut delivery = Value::Null;
    for r in events.iter().flatten() {
        let (slot, value) = match &r.event {
            Event::BatchReported(e) => (&mut report, serde_json::to_value(e)),
            Event::BatchDelivered(e) => (&mut delivery, serde_json::to_value(e)),
            _ => continue,
        };
        *slot = value.unwrap_or(Value::Null);
        slot["time_ms"] = json!(r.millis());
    }
    (report, delivery)
}

/// Paging of a batch's timeline.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Page {
    /// The first event (0-based).
    #[serde(default)]
    pub offset: usize,
    /// Events per page (at most 500).
    pub limit: Option<usize>,
}

/// `GET /api/batches/{id}/events?offset=&limit=`: the event timeline, one
/// page, with recipient numbers masked as `audit` masks them.
pub(crate) async fn events(
    State(board): State<Arc<Board>>,
    Path(id): Path<String>,
    Query(page): Query<Page>,
) -> ApiResult {
    check_batch(&id)?;
    let events = board.store.batch(&id).events().await?;
    let limit = page.limit.unwrap_or(100).clamp(1, PAGE_MAX);
    let tz = crate::cli::audit::batch_zone(&events);
    let items: Vec<Value> = events
        .iter()
        .skip(page.offset)
        .take(limit)
        .map(|r| match r {
            Ok(r) => {
                let mut v = crate::cli::audit::json_in(r, false, &tz);
                v["timeMs"] = json!(r.millis());
                v
            }
            Err((id, why)) => json!({"id": id, "type": "UNREADABLE", "summary": why}),
        })
        .collect();
    Ok(Json(json!({
        "batch": id,
        "total": events.len(),
        "offset": page.offset,
        "limit": limit,
        "events": items,
    })))
}

/// `GET /api/dlq`: every dead letter with its reason, source and age.
pub(crate) async fn dead_letters(State(board): State<Arc<Board>>) -> ApiResult {
    let times = board.store.shard_times_ms().await?;
    let letters: Vec<Value> = board
        .store
        .dead_letter_entries()
        .await?
        .iter()
        .map(|(shard, e)| {
            let mut v = crate::cli::dlq::describe(e);
            v["shard"] = json!(shard);
            v["kind"] = json!(e.text("f:op").unwrap_or_else(|| "chunk".into()));
            v["ageMs"] = json!(clock_of(&times, *shard).saturating_sub(entry_millis(&e.id)));
            v
        })
        .collect();
    Ok(Json(json!({
        "readOnly": board.token.is_none(),
        "deadLetters": letters,
    })))
}

/// `POST /api/dlq/{id}/redrive` (token needed): puts a dead letter back on
/// the stream it came from.
pub(crate) async fn redrive(
    State(board): State<Arc<Board>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(board.token.as_deref(), &headers)
        .map_err(|refused| ApiError(refused.status(), refused.to_string()))?;
    let letters = board.store.dead_letter_entries().await?;
    let Some((shard, letter)) = letters.iter().find(|(_, e)| e.id == id) else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no dead letter {id}"),
        ));
    };
    match board.store.redrive_letter(*shard, letter).await? {
        Some(source) => {
            tracing::info!(dead_letter = %id, %source, "redriven from the board");
            Ok(Json(json!({ "redriven": id, "to": source })))
        }
        None => Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("dead letter {id} names no source stream"),
        )),
    }
}

/// The reason an action on a batch records (`?reason=`).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Reason {
    /// Why; a default names the board when absent or blank.
    pub reason: Option<String>,
}

impl Reason {
    /// The reason to record (at most 256 bytes of what was given).
    fn text(self, default: &str) -> String {
        match self.reason.filter(|r| !r.trim().is_empty()) {
            Some(r) => crate::events::clip(r.trim(), 4 * crate::events::QUOTE_MAX),
            None => default.to_string(),
        }
    }
}

/// The log of batch `id` for an action that can end it: its report is
/// queued for delivery (as `groupcast close` and `cancel` do), its work
/// (sends a close makes ready, deletes a cancel queues) goes to its lane.
pub(crate) async fn log_for_action(
    store: &Store,
    policy: BatchPolicy,
    id: &str,
) -> Result<BatchLog, ApiError> {
    check_batch(id)?;
    let store = store.clone().with_policy(policy);
    Ok(store.batch_in_its_lane(id).await?)
}

/// Answers once an operator's command (event key `key`) is on disk
/// ([`crate::store::Store::command_on_disk`]); `503` when Redis lost it
/// meanwhile: the operator gives it again.
pub(crate) async fn on_disk(
    store: &Store,
    log: &BatchLog,
    key: &str,
    command: &str,
) -> Result<(), ApiError> {
    use crate::store::durability::witness::CommandOnDisk;
    match store.command_on_disk(log, key).await? {
        CommandOnDisk::NoWait | CommandOnDisk::OnDisk => Ok(()),
        CommandOnDisk::Lost => Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("batch {}: Redis restarted and lost the {command} before it reached its disk: {command} it again", log.batch),
        )),
    }
}

/// Cancels batch `id` as `groupcast cancel` does, recording `reason`:
/// `{cancelled, reason, stopped, unsent, seen}`; `409` when it had already
/// reported otherwise. Shared by the board and `groupcast serve`.
pub(crate) async fn cancel_batch(
    store: &Store,
    policy: BatchPolicy,
    id: &str,
    reason: &str,
) -> Result<Value, ApiError> {
    let log = log_for_action(store, policy, id).await?;
    match log.cancel(reason).await? {
        Cancelling::Cancelled {
            stopped,
            unsent,
            seen,
        } => {
            on_disk(store, &log, "cancelled", "cancel").await?;
            tracing::info!(batch = %id, %reason, stopped, "cancelled");
            Ok(json!({
                "cancelled": id, "reason": reason, "stopped": stopped, "unsent": unsent, "seen": seen,
            }))
        }
        Cancelling::AlreadyReported(outcome) => Err(ApiError(
            StatusCode::CONFLICT,
            format!("batch {id} already reported ({outcome}): nothing to cancel"),
        )),
        Cancelling::Forgotten => Err(ApiError(
            StatusCode::CONFLICT,
            format!("batch {id} already reported, its events expired: nothing to cancel"),
        )),
    }
}

/// Closes batch `id` as `groupcast close` does, recording `reason`:
/// `{closed, reason, missing}`; `409` when it had already reported, `404`
/// for a batch never seen. Shared by the board and `groupcast serve`.
pub(crate) async fn close_batch(
    store: &Store,
    policy: BatchPolicy,
    id: &str,
    reason: &str,
) -> Result<Value, ApiError> {
    let log = log_for_action(store, policy, id).await?;
    match log.close(reason).await? {
        Closing::Closed { missing } => {
            on_disk(store, &log, "closed", "close").await?;
            tracing::info!(batch = %id, %reason, missing, "closed");
            Ok(json!({ "closed": id, "reason": reason, "missing": missing }))
        }
        Closing::AlreadyReported(outcome) => Err(ApiError(
            StatusCode::CONFLICT,
            format!("batch {id} already reported ({outcome}): nothing to close"),
        )),
        Closing::Unknown => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no chunk of batch {id} was ever recorded (or its events expired)"),
        )),
    }
}

fn may_act(board: &Board, headers: &HeaderMap) -> Result<(), ApiError> {
    authorize(board.token.as_deref(), headers)
        .map_err(|refused| ApiError(refused.status(), refused.to_string()))
}

/// `POST /api/batches/{id}/cancel?reason=` (token needed): cancels the
/// batch as `groupcast cancel` does ([`cancel_batch`]).
pub(crate) async fn cancel(
    State(board): State<Arc<Board>>,
    Path(id): Path<String>,
    Query(reason): Query<Reason>,
    headers: HeaderMap,
) -> ApiResult {
    may_act(&board, &headers)?;
    let reason = reason.text("cancelled from the board");
    Ok(Json(
        cancel_batch(&board.store, board.policy, &id, &reason).await?,
    ))
}

/// `POST /api/batches/{id}/close?reason=` (token needed): closes the batch
/// as `groupcast close` does ([`close_batch`]).
pub(crate) async fn close(
    State(board): State<Arc<Board>>,
    Path(id): Path<String>,
    Query(reason): Query<Reason>,
    headers: HeaderMap,
) -> ApiResult {
    may_act(&board, &headers)?;
    let reason = reason.text("closed from the board");
    Ok(Json(
        close_batch(&board.store, board.policy, &id, &reason).await?,
    ))
}

/// What `GET /api/batches/{id}/results` exports.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ResultsQuery {
    /// As `groupcast results --status` (default `failed`).
    pub status: Option<String>,
    /// As `--code`, comma-separated.
    pub code: Option<String>,
    /// `csv` (default) or `jsonl`.
    pub format: Option<String>,
    /// `1`/`true`: numbers in full (masked otherwise).
    pub show_numbers: Option<String>,
}

/// `GET /api/batches/{id}/results?status=&code=&format=&show_numbers=`
/// (token needed: recipient numbers): the stored outcomes, as
/// `groupcast results` exports them, as a download ([`results_download`]).
pub(crate) async fn results(
    State(board): State<Arc<Board>>,
    Path(id): Path<String>,
    Query(q): Query<ResultsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    may_act(&board, &headers)?;
    results_download(&board.store, &id, q).await
}

/// Batch `id`'s stored outcomes, as `groupcast results` exports them, as a
/// download: shared by the board and `groupcast serve`.
pub(crate) async fn results_download(
    store: &Store,
    id: &str,
    q: ResultsQuery,
) -> Result<Response, ApiError> {
    use crate::cli::results::{export_stored, parse_filter, Format};
    check_batch(id)?;
    let bad = |m: String| ApiError(StatusCode::BAD_REQUEST, m);
    let status = parse_filter(q.status.as_deref().unwrap_or("failed")).map_err(bad)?;
    let format = match q.format.as_deref().unwrap_or("csv") {
        "csv" => Format::Csv,
        "jsonl" => Format::Jsonl,
        other => return Err(bad(format!("format {other:?}: csv or jsonl"))),
    };
    let codes: Vec<String> = q
        .code
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    let show = match q.show_numbers.as_deref() {
        None | Some("0" | "false") => false,
        Some("1" | "true") => true,
        Some(other) => return Err(bad(format!("show_numbers {other:?}: true or false"))),
    };
    let mut body = Vec::new();
    let log = store.batch(id);
    export_stored(&log, &status, &codes, show, format, &mut body)
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let (kind, ext) = match format {
        Format::Csv => ("text/csv; charset=utf-8", "csv"),
        Format::Jsonl => ("application/x-ndjson", "jsonl"),
    };
    let disposition = format!("attachment; filename=\"{id}-results.{ext}\"");
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, kind.to_string()),
            (axum::http::header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}
