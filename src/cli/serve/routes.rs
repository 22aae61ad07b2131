//! The `/v1` handlers: create a batch, add its chunks, close, cancel, and
//! read its status, report and results. Each takes its token's scope
//! first ([`Tokens::authorize`](super::tokens::Tokens::authorize)),
//! answers JSON, and refuses with a [`Problem`](super::problems::Problem)
//! (`application/problem+json`).
//! The request and answer types are the OpenAPI document's schemas
//! ([`super::openapi`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::problems::{
    ActionRefusals, ApiProblem, ChunkRefusals, CreateRefusals, Kind, ReadRefusals, Refusals,
    SealRefusals,
};
use super::tokens::{Scope, Token};
use super::Front;
use crate::cli::board::api::{
    cancel_batch, close_batch, log_for_action, on_disk, reports_json, results_download,
    set_missing_seqs, ApiError, ResultsQuery,
};
use crate::cli::status::{batch_json, queued_json};
use crate::cli::submit::body::{csv_recipients, json_recipients};
use crate::cli::submit::{
    ended_batches, options_from, refuse_a_far_send_at, OptionsGiven, TemplateFile,
};
use crate::cli::CliError;
use crate::events::chunk::MAX_CHUNK_BYTES;
use crate::events::options::BatchOptions;
use crate::events::{clip, Chunk, Recipient, Template, QUOTE_MAX};
use crate::keys::validate_batch_id;
use crate::producer::{Producer, Room};
use crate::store::batch::Sealing;
use crate::store::front::Recorded;

/// A batch id, as the document describes it (the handlers check it with
/// [`validate_batch_id`]).
#[derive(Debug, ToSchema)]
#[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
// Only its schema is used (the path parameter's, in the document): the
// handlers take the id as a `String` and check it themselves.
pub(crate) struct BatchId(#[allow(dead_code)] String);

/// What a handler answers: its JSON, or a problem.
type Answer<T> = Result<T, ApiProblem>;

/// `POST /v1/batches`: a batch's id, template and options.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateBatch {
    /// The batch id: 1 to 128 of `[A-Za-z0-9._-]`.
    #[schema(value_type = BatchId)]
    pub batch: String,
    /// The message, in the provider's shape (as `submit --template`).
    pub template: TemplateFile,
    /// No group is sent before this instant (RFC 3339 with an offset),
    /// at most 5 minutes past and 90 days ahead.
    #[schema(format = DateTime)]
    pub send_at: Option<String>,
    /// `urgent`, `normal` (the default) or `bulk`.
    #[schema(pattern = "^(urgent|normal|bulk)$")]
    pub priority: Option<String>,
    /// A daily window in which nothing is sent, `HH:MM-HH:MM` (start and
    /// end differ).
    #[schema(
        pattern = "^[0-2][0-9]:[0-5][0-9](:[0-5][0-9])?-[0-2][0-9]:[0-5][0-9](:[0-5][0-9])?$"
    )]
    pub quiet_hours: Option<String>,
    /// The IANA zone of `quietHours` (default: the server's
    /// `GROUPCAST_TIMEZONE`).
    pub timezone: Option<String>,
}

/// What a batch was created with: the template and options every chunk
/// given over HTTP carries (kept by the store, see
/// [`crate::store::front`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Definition {
    template: Template,
    options: BatchOptions,
}

/// The answer to `POST /v1/batches`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchCreated {
    /// The batch id.
    pub batch: String,
    /// `true`: created now (201); `false`: it existed with the same
    /// definition (200).
    pub created: bool,
    /// The options as the workers will read them (`describe`).
    pub options: String,
}

/// `PUT /v1/batches/{id}/chunks/{seq}` with `application/json`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChunkRecipients {
    /// 1 to 10,000 recipients.
    pub recipients: Vec<RecipientIn>,
    /// Whether this is the batch's last chunk (or `?last=true`).
    #[serde(default)]
    pub last: Option<bool>,
}

/// One recipient of a JSON chunk.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecipientIn {
    /// The phone number, as people write it (normalised as `submit` does).
    pub to: String,
    /// A value for each of the template's `#{name}` placeholders.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
}

/// `?last=true` on a chunk.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ChunkQuery {
    /// Marks the batch's last chunk (CSV has no field for it; JSON may say
    /// `"last": true`; a MessagePack chunk carries its own flag).
    pub last: Option<bool>,
}

/// The answer to a chunk: appended (or found appended before).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChunkAccepted {
    /// The batch id.
    pub batch: String,
    /// The chunk's seq.
    pub seq: u32,
    /// Whether it is the last chunk.
    pub last: bool,
    /// Its recipients (after normalisation and dropping a repeated number).
    pub recipients: usize,
    /// Its digest (16 hex digits): the same content has the same digest.
    pub digest: String,
    /// `true`: this seq was given before with the same content (appended
    /// again: the workers take it once).
    pub repeat: bool,
}

/// Why a batch is closed or cancelled (or `?reason=`): recorded with the
/// token's name.
#[derive(Debug, Default, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReasonIn {
    /// Why; at most 256 bytes are recorded.
    pub reason: Option<String>,
}

/// The answer to a close.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Closed {
    /// The batch id.
    pub closed: String,
    /// The reason recorded (with the token's name).
    pub reason: String,
    /// Seqs that never arrived, given up on.
    pub missing: u64,
}

/// The answer to a cancel.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Cancelled {
    /// The batch id.
    pub cancelled: String,
    /// The reason recorded (with the token's name).
    pub reason: String,
    /// Generations stopped (never sent).
    pub stopped: u32,
    /// Recipients registered in them.
    pub unsent: u64,
    /// Whether any chunk of the batch had been recorded.
    pub seen: bool,
}

/// A batch's reports.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reports {
    /// The batch id.
    pub batch: String,
    /// The report (`batch_reported`, docs/reports.md), once decided.
    pub report: Option<Value>,
    /// The delivery report (`batch_delivered`), once decided.
    pub delivery_report: Option<Value>,
}

/// The batch id of a path, checked.
fn batch_of(path: Result<Path<String>, PathRejection>) -> Answer<String> {
    let Path(id) = path.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
    checked_id(id)
}

fn checked_id(id: String) -> Answer<String> {
    validate_batch_id(&id)
        .map_err(|e| ApiProblem::one(Kind::BadRequest, "batch id", Some("batch"), e.to_string()))?;
    Ok(id)
}

/// A request's body, or the problem of reading it (over the limit: 413).
fn body_of(body: Result<Bytes, BytesRejection>) -> Answer<Bytes> {
    body.map_err(|e| {
        let kind = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Kind::BodyTooLarge
        } else {
            Kind::BadRequest
        };
        ApiProblem::new(kind, e.body_text())
    })
}

/// JSON of type `T`, or the problem saying where it is wrong.
fn json_of<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Answer<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiProblem::new(
            Kind::BadRequest,
            format!("{what}: not the expected JSON: {e}"),
        )
    })
}

/// The media type of a request, lowercase, without its parameters.
fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A usage error of the options or the template, as `invalid-batch`.
fn invalid_batch(field: &str, e: impl std::fmt::Display) -> ApiProblem {
    ApiProblem::one(Kind::InvalidBatch, "batch", Some(field), e.to_string())
}

/// Refuses an action on a batch that takes no more chunks.
async fn refuse_ended(front: &Front, batch: &str) -> Answer<()> {
    match ended_batches(&front.store, &[batch.to_string()])
        .await
        .map_err(cli_problem)?
        .pop()
    {
        Some((_, why)) => Err(ApiProblem::new(Kind::BatchEnded, why)),
        None => Ok(()),
    }
}

fn cli_problem(e: CliError) -> ApiProblem {
    match e {
        CliError::Usage(m) => ApiProblem::new(Kind::BadRequest, m),
        CliError::Redis(m) | CliError::Failed(m) => ApiProblem::new(Kind::Unavailable, m),
    }
}

/// The board's shared actions' errors as problems.
fn board_problem(e: ApiError) -> ApiProblem {
    let kind = match e.0 {
        StatusCode::CONFLICT => Kind::BatchEnded,
        StatusCode::NOT_FOUND => Kind::NotFound,
        StatusCode::BAD_REQUEST => Kind::BadRequest,
        _ => Kind::Unavailable,
    };
    ApiProblem::new(kind, e.1)
}

#[utoipa::path(
    post, path = "/v1/batches", tag = "batches",
    request_body = CreateBatch,
    security(("bearer" = ["ingest"])),
    responses(
        (status = 201, body = BatchCreated, description = "Created"),
        (status = 200, body = BatchCreated, description = "It existed with the same definition"),
        Refusals, CreateRefusals,
    )
)]
/// Creates a batch: its template and options, which every chunk given
/// over HTTP carries.
pub(crate) async fn create_batch(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Response> {
    let token = front.tokens.authorize(&method, &headers, Scope::Ingest)?;
    let body = body_of(body)?;
    let given: CreateBatch = json_of(&body, "the batch")?;
    let batch = checked_id(given.batch)?;
    let template = given
        .template
        .checked()
        .map_err(|e| invalid_batch("template", e))?;
    let options = options_from(&OptionsGiven {
        send_at: given.send_at.as_deref(),
        priority: given.priority.as_deref(),
        quiet_hours: given.quiet_hours.as_deref(),
        timezone: given.timezone.as_deref(),
        ad: false,
    })
    .map_err(|e| invalid_batch("options", e))?;
    let shard = front.store.keys.shard_of(&batch);
    refuse_a_far_send_at(&front.store, shard, &options)
        .await
        .map_err(|e| match e {
            CliError::Usage(m) => invalid_batch("sendAt", m),
            other => cli_problem(other),
        })?;
    refuse_ended(&front, &batch).await?;
    let definition = Definition { template, options };
    let text = serde_json::to_string(&definition).unwrap_or_default();
    let described = definition
        .options
        .resolve()
        .map(|w| w.describe())
        .unwrap_or_default();
    let created = match front.store.define_batch(&batch, &text, front.keep).await? {
        Recorded::New => true,
        Recorded::Same => false,
        Recorded::Other(_) => {
            return Err(ApiProblem::new(
                Kind::BatchConflict,
                format!(
                "batch {batch} was created with another template or options: use a new batch id"
            ),
            ))
        }
    };
    tracing::info!(batch = %batch, token = %token.name, created, "batch created over HTTP");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let location = format!("/v1/batches/{batch}");
    Ok((
        status,
        [(header::LOCATION, location)],
        Json(BatchCreated {
            batch,
            created,
            options: described,
        }),
    )
        .into_response())
}

/// The batch's definition, if it was created over HTTP.
async fn definition_of(front: &Front, batch: &str) -> Answer<Option<Definition>> {
    let Some(text) = front.store.batch_definition(batch).await? else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        ApiProblem::new(
            Kind::Unavailable,
            format!("batch {batch}: its stored definition is unreadable: {e}"),
        )
    })
}

/// A chunk built from a request's body: the chunk, and its encoded bytes.
struct Built {
    chunk: Chunk,
    payload: Vec<u8>,
}

/// Builds the chunk of a JSON or CSV body with the batch's definition.
fn with_definition(
    (batch, seq, last): (&str, u32, bool),
    definition: Definition,
    recipients: Vec<Recipient>,
) -> Built {
    let chunk = Chunk {
        batch: batch.to_string(),
        seq,
        last,
        template: definition.template,
        options: definition.options,
        recipients,
    };
    let payload = chunk.encode();
    Built { chunk, payload }
}

/// Reads a MessagePack chunk (the bytes a stream producer appends),
/// checked against the path and, when the batch was created over HTTP,
/// its definition.
fn msgpack_chunk(
    (batch, seq, last): (&str, u32, Option<bool>),
    definition: Option<&Definition>,
    body: Bytes,
) -> Answer<Built> {
    let what = format!("chunk {seq}");
    let chunk = Chunk::decode(&body).map_err(|e| {
        ApiProblem::one(
            Kind::InvalidChunk,
            &what,
            None,
            format!("undecodable chunk: {e}"),
        )
    })?;
    let mismatch =
        |field: &str, why: String| ApiProblem::one(Kind::InvalidChunk, &what, Some(field), why);
    if chunk.batch != batch {
        return Err(mismatch(
            "batch",
            format!(
                "the chunk is of batch {:?}, the path names {batch}",
                clip(&chunk.batch, QUOTE_MAX)
            ),
        ));
    }
    if chunk.seq != seq {
        return Err(mismatch(
            "seq",
            format!("the chunk has seq {}, the path names {seq}", chunk.seq),
        ));
    }
    if last.is_some_and(|l| l != chunk.last) {
        return Err(mismatch(
            "last",
            format!("the chunk says last: {}, the query the other", chunk.last),
        ));
    }
    if let Some(d) = definition {
        let same_options = chunk.options.canonical().ok() == d.options.canonical().ok();
        if chunk.template != d.template || !same_options {
            return Err(ApiProblem::new(
                Kind::BatchConflict,
                format!("{what}: its template or options differ from the batch's (as created): the workers would refuse it"),
            ));
        }
    }
    Ok(Built {
        chunk,
        payload: body.to_vec(),
    })
}

#[utoipa::path(
    put, path = "/v1/batches/{id}/chunks/{seq}", tag = "batches",
    params(
        ("id" = BatchId, Path, description = "The batch id"),
        ("seq" = u32, Path, description = "The chunk's seq: 0, 1, 2, ... with no gaps"),
        ChunkQuery,
    ),
    request_body(
        description = "The chunk's recipients: JSON; CSV with a header (a `to` column, one column per variable, as `submit` reads); or the MessagePack chunk of schemas/chunk.schema.json",
        content(
            (ChunkRecipients = "application/json"),
            (String = "text/csv"),
            (Vec<u8> = "application/msgpack"),
        )
    ),
    security(("bearer" = ["ingest"])),
    responses(
        (status = 202, body = ChunkAccepted, description = "Appended to the ingest stream (or appended before with the same content)"),
        Refusals, ChunkRefusals,
    )
)]
/// Adds a chunk to a batch: checked at once (every problem answered),
/// then appended to the batch's ingest stream as a stream producer does.
/// Idempotent on (batch, seq, content); another content for a seq already
/// given is refused.
pub(crate) async fn put_chunk(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<(String, u32)>, PathRejection>,
    query: Result<Query<ChunkQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Response> {
    let token = front.tokens.authorize(&method, &headers, Scope::Ingest)?;
    let Path((id, seq)) = path.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
    let batch = checked_id(id)?;
    let Query(query) = query.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
    let body = body_of(body)?;
    let definition = definition_of(&front, &batch).await?;
    let kind = media_type(&headers);
    let not_created = || {
        ApiProblem::new(
            Kind::BatchNotCreated,
            format!("batch {batch} was not created: POST /v1/batches first (a JSON or CSV chunk takes the batch's template and options)"),
        )
    };
    let what = format!("chunk {seq}");
    let built = match kind.as_str() {
        "application/msgpack" | "application/x-msgpack" | "application/vnd.msgpack" => {
            msgpack_chunk((&batch, seq, query.last), definition.as_ref(), body)?
        }
        "application/json" => {
            let definition = definition.ok_or_else(not_created)?;
            let given: ChunkRecipients = json_of(&body, &what)?;
            let last = given.last.or(query.last).unwrap_or(false);
            let recipients = given
                .recipients
                .into_iter()
                .map(|r| Recipient { to: r.to, vars: r.vars })
                .collect();
            let checked = json_recipients(recipients, &definition.template)
                .map_err(|r| ApiProblem::invalid_chunk(&what, r))?;
            with_definition((&batch, seq, last), definition, checked)
        }
        "text/csv" => {
            let definition = definition.ok_or_else(not_created)?;
            let template = definition.template.clone();
            let name = what.clone();
            let checked = tokio::task::spawn_blocking(move || csv_recipients(&name, &body, &template))
                .await
                .map_err(|e| ApiProblem::new(Kind::Unavailable, format!("the CSV reader stopped: {e}")))?
                .map_err(|r| ApiProblem::invalid_chunk(&what, r))?;
            with_definition((&batch, seq, query.last.unwrap_or(false)), definition, checked)
        }
        other => {
            return Err(ApiProblem::new(
                Kind::UnsupportedMediaType,
                format!("Content-Type {other:?}: a chunk is application/json, text/csv or application/msgpack"),
            ))
        }
    };
    if let Err(e) = built.chunk.validate() {
        return Err(ApiProblem::one(
            Kind::InvalidChunk,
            &what,
            None,
            e.to_string(),
        ));
    }
    if built.payload.len() > MAX_CHUNK_BYTES {
        return Err(ApiProblem::one(
            Kind::InvalidChunk,
            &what,
            None,
            format!("the chunk is {} bytes encoded; at most {MAX_CHUNK_BYTES}: send fewer recipients a chunk", built.payload.len()),
        ));
    }
    refuse_ended(&front, &batch).await?;
    append_chunk(&front, token, built).await
}

/// Appends a checked chunk, unless the workers are behind (429) or its seq
/// was given with other content (409).
async fn append_chunk(front: &Front, token: &Token, built: Built) -> Answer<Response> {
    let Built { chunk, payload } = built;
    let (batch, seq) = (chunk.batch.as_str(), chunk.seq);
    let shard = front.store.keys.shard_of(batch);
    let lane = chunk.options.priority();
    let mut producer = Producer::new(front.store.clone()).max_unread(front.max_unread);
    if let Room::Full { unread } = producer.room(shard, lane).await? {
        return Err(ApiProblem::new(
            Kind::Backpressure,
            format!(
                "{unread} chunks wait unread in the ingest stream (the bound is {}): the workers are behind, or none runs; try again after Retry-After",
                front.max_unread
            ),
        )
        .retry_after(front.retry_after));
    }
    let digest = chunk.digest();
    let repeat = match front.store.claim_seq(batch, seq, &digest, front.keep).await? {
        Recorded::New => false,
        Recorded::Same => true,
        Recorded::Other(earlier) => {
            return Err(ApiProblem::new(
                Kind::SeqConflict,
                format!("seq {seq} of batch {batch} was given before with other content (digest {earlier}, this one {digest}): a seq's content cannot change"),
            ))
        }
    };
    // A repeat is appended again: its first append may have failed after
    // the claim, and the workers take the same content once.
    if let Err(e) = producer.append_encoded(shard, lane, vec![payload]).await {
        if !repeat {
            // Let the seq come again, with any content.
            let _ = front.store.forget_seq(batch, seq).await;
        }
        return Err(e.into());
    }
    tracing::info!(batch = %batch, seq, last = chunk.last, recipients = chunk.recipients.len(), repeat, token = %token.name, "chunk appended over HTTP");
    Ok((
        StatusCode::ACCEPTED,
        Json(ChunkAccepted {
            batch: batch.to_string(),
            seq,
            last: chunk.last,
            recipients: chunk.recipients.len(),
            digest,
            repeat,
        }),
    )
        .into_response())
}

/// The reason an action records: who did it (the token's name), and why.
fn reason_of(
    token: &Token,
    done: &str,
    query: Result<Query<ReasonIn>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer<String> {
    let body = body_of(body)?;
    let given = if body.iter().all(u8::is_ascii_whitespace) {
        let Query(q) = query.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
        q
    } else {
        json_of::<Option<ReasonIn>>(&body, "the reason")?.unwrap_or_default()
    };
    let by = format!("{done} by token {}", token.name);
    Ok(
        match given
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
        {
            Some(r) => crate::events::clip(&format!("{by}: {r}"), 4 * QUOTE_MAX),
            None => by,
        },
    )
}

/// `POST /v1/batches/{id}/seal`: the batch's last seq.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SealIn {
    /// The batch's last seq: it takes seqs 0 to this one.
    pub last: u32,
}

/// The answer to a seal.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Sealed {
    /// The batch id.
    pub sealed: String,
    /// Its last seq.
    pub last: u32,
}

#[utoipa::path(
    post, path = "/v1/batches/{id}/seal", tag = "batches",
    params(("id" = BatchId, Path, description = "The batch id")),
    request_body(content = SealIn, description = "The batch's last seq"),
    security(("bearer" = ["ingest"])),
    responses(
        (status = 200, body = Sealed, description = "Sealed, now or before at the same seq: the batch takes seqs 0 to `last` and ends when each has arrived"),
        Refusals, SealRefusals,
    )
)]
/// Declares a batch's last seq after its chunks, for a producer that
/// learns where its batch ends only after its last chunk (as `groupcast
/// seal` and the stream protocol's `seal` entry do). A seal that
/// contradicts what the batch knows changes nothing.
pub(crate) async fn seal(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Json<Sealed>> {
    front.tokens.authorize(&method, &headers, Scope::Ingest)?;
    let batch = batch_of(path)?;
    let body = body.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
    let given: SealIn = serde_json::from_slice(&body)
        .map_err(|e| ApiProblem::one(Kind::BadRequest, "body", Some("last"), e.to_string()))?;
    let log = log_for_action(&front.store, front.policy, &batch)
        .await
        .map_err(board_problem)?;
    match log.seal(given.last).await? {
        Sealing::Sealed(last) => {
            on_disk(&front.store, &log, "seal", "seal")
                .await
                .map_err(board_problem)?;
            tracing::info!(%batch, last, "sealed");
            Ok(Json(Sealed {
                sealed: batch,
                last,
            }))
        }
        Sealing::Conflict(why) => Err(ApiProblem::new(Kind::LastConflict, why)),
        Sealing::Ended(why) => Err(ApiProblem::new(Kind::BatchEnded, why)),
    }
}

#[utoipa::path(
    post, path = "/v1/batches/{id}/close", tag = "operations",
    params(("id" = BatchId, Path, description = "The batch id"), ReasonIn),
    request_body(content = Option<ReasonIn>, description = "Why (or `?reason=`); optional"),
    security(("bearer" = ["operate"])),
    responses(
        (status = 200, body = Closed, description = "Closed: the seqs that never came are given up on"),
        Refusals, ActionRefusals,
    )
)]
/// Closes a batch as `groupcast close` does: it stops waiting for the
/// seqs that never came, sends what was loaded and reports.
pub(crate) async fn close(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ReasonIn>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Json<Closed>> {
    act(
        &front,
        Action::Close,
        (method, headers),
        (path, query, body),
    )
    .await
}

#[utoipa::path(
    post, path = "/v1/batches/{id}/cancel", tag = "operations",
    params(("id" = BatchId, Path, description = "The batch id"), ReasonIn),
    request_body(content = Option<ReasonIn>, description = "Why (or `?reason=`); optional"),
    security(("bearer" = ["operate"])),
    responses(
        (status = 200, body = Cancelled, description = "Cancelled: every generation not yet claimed for sending is stopped"),
        Refusals, ActionRefusals,
    )
)]
/// Cancels a batch as `groupcast cancel` does.
pub(crate) async fn cancel(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ReasonIn>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Json<Cancelled>> {
    act(
        &front,
        Action::Cancel,
        (method, headers),
        (path, query, body),
    )
    .await
}

/// What a close or cancel request gives: the batch's path, `?reason=`,
/// and a body that may hold the reason.
type ActionRequest = (
    Result<Path<String>, PathRejection>,
    Result<Query<ReasonIn>, QueryRejection>,
    Result<Bytes, BytesRejection>,
);

/// An operator's action on a batch.
#[derive(Debug, Clone, Copy)]
enum Action {
    Close,
    Cancel,
}

/// Takes `action` on the path's batch as the board and the command do,
/// recording the token's name with the reason, and answers the shared
/// action's JSON as this API's typed answer (so that the document cannot
/// drift from what is answered unnoticed).
async fn act<T: serde::de::DeserializeOwned>(
    front: &Front,
    action: Action,
    (method, headers): (Method, HeaderMap),
    (path, query, body): ActionRequest,
) -> Answer<Json<T>> {
    let token = front.tokens.authorize(&method, &headers, Scope::Operate)?;
    let batch = batch_of(path)?;
    let (store, policy) = (&front.store, front.policy);
    let done = match action {
        Action::Close => {
            let reason = reason_of(token, "closed", query, body)?;
            close_batch(store, policy, &batch, &reason).await
        }
        Action::Cancel => {
            let reason = reason_of(token, "cancelled", query, body)?;
            cancel_batch(store, policy, &batch, &reason).await
        }
    }
    .map_err(board_problem)?;
    serde_json::from_value(done)
        .map(Json)
        .map_err(|e| ApiProblem::new(Kind::Unavailable, format!("unexpected answer shape: {e}")))
}

#[utoipa::path(
    get, path = "/v1/batches/{id}", tag = "batches",
    params(("id" = BatchId, Path, description = "The batch id")),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, body = Object, description = "The batch's state as `groupcast status --json` prints it (chunks, lastSeq, recipients, registered, failed, rejected, report, cancelled, options, generations), with its missing seqs"),
        Refusals, ReadRefusals,
    )
)]
/// A batch's state: the same truths as `groupcast status BATCH --json`.
pub(crate) async fn status(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer<Json<Value>> {
    front.tokens.authorize(&method, &headers, Scope::Read)?;
    let batch = batch_of(path)?;
    let store = &front.store;
    let p = store.batch(&batch).state().await?;
    if p.fields.is_empty() {
        let queued = store.queued(store.keys.shard_of(&batch)).await?;
        return match queued.of(&batch) {
            Some(w) => Ok(Json(queued_json(&batch, w, &queued))),
            None => Err(ApiProblem::new(
                Kind::NotFound,
                format!("no batch {batch}: no state (unknown, or past its retention) and no chunk of it waits in the ingest stream"),
            )),
        };
    }
    let mut v = batch_json(&batch, &p);
    set_missing_seqs(&mut v, &p);
    Ok(Json(v))
}

#[utoipa::path(
    get, path = "/v1/batches/{id}/report", tag = "batches",
    params(("id" = BatchId, Path, description = "The batch id")),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, body = Reports, description = "The report and the delivery report; each `null` until decided"),
        Refusals, ReadRefusals,
    )
)]
/// A batch's report and delivery report, as the webhook posts them.
pub(crate) async fn report(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer<Json<Reports>> {
    front.tokens.authorize(&method, &headers, Scope::Read)?;
    let batch = batch_of(path)?;
    let events = front.store.batch(&batch).events().await?;
    if events.is_empty() {
        return Err(ApiProblem::new(
            Kind::NotFound,
            format!("no events of batch {batch} (unknown, not read by a worker yet, or past its retention)"),
        ));
    }
    let (report, delivery) = reports_json(&events);
    Ok(Json(Reports {
        batch,
        report: (!report.is_null()).then_some(report),
        delivery_report: (!delivery.is_null()).then_some(delivery),
    }))
}

#[utoipa::path(
    get, path = "/v1/batches/{id}/results", tag = "batches",
    params(
        ("id" = BatchId, Path, description = "The batch id"),
        ("status" = Option<String>, Query, description = "As `groupcast results --status` (default `failed`): `all`, or outcomes comma-separated",
            pattern = "^(all|(failed|unknown|not_sent|delivered|duplicate)(,(failed|unknown|not_sent|delivered|duplicate))*)$"),
        ("code" = Option<String>, Query, description = "Provider codes, comma-separated"),
        ("format" = Option<String>, Query, description = "`csv` (default) or `jsonl`", pattern = "^(csv|jsonl)$"),
        ("show_numbers" = Option<bool>, Query, description = "`true`: numbers in full (masked otherwise)"),
    ),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The recipients' outcomes, as `groupcast results` exports them",
            content((String = "text/csv"), (String = "application/x-ndjson"))),
        Refusals,
    )
)]
/// The recipients' outcomes (failed, unknown, not sent, ...), as
/// `groupcast results` exports them.
pub(crate) async fn results(
    State(front): State<Arc<Front>>,
    method: Method,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ResultsQuery>, QueryRejection>,
) -> Answer<Response> {
    front.tokens.authorize(&method, &headers, Scope::Read)?;
    let batch = batch_of(path)?;
    let Query(q) = query.map_err(|e| ApiProblem::new(Kind::BadRequest, e.body_text()))?;
    results_download(&front.store, &batch, q)
        .await
        .map_err(board_problem)
}

/// Any other path under `/v1`.
pub(crate) async fn not_found() -> ApiProblem {
    ApiProblem::new(
        Kind::NotFound,
        "no such route: GET /v1/openapi.json lists them",
    )
}

/// A method a route does not take.
pub(crate) async fn method_not_allowed() -> ApiProblem {
    ApiProblem::new(
        Kind::MethodNotAllowed,
        "this route does not take that method: GET /v1/openapi.json lists them",
    )
}
