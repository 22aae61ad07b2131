//! The mock's HTTP routes: the provider API (guarded by faults and auth)
//! and the `/_mock/...` test hooks (no auth, no faults).

use std::borrow::Cow;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::config::Faults;
use super::faults::Verdict;
use super::ledger::{self, Code, ListPage, MockError};
use super::{lock, EndpointFault, MockState};
use groupcast::provider::auth::{self, AuthError};
use groupcast::provider::model::{CreateGroupRequest, ErrorBody};
use groupcast::provider::MAX_MESSAGES_PER_REQUEST;

/// Largest request body read: far above 10,000 messages, so that an
/// oversized add is answered `413 RecipientsTooMany` by the contract's rule
/// rather than cut off by the HTTP layer.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// Endpoint names, as counted in the totals and used in the client metrics.
/// `messages` is the message list (`GET /messages/v4/list`).
pub(crate) const ENDPOINTS: [&str; 7] = [
    "create", "add", "send", "get", "delete", "messages", "other",
];

/// Index of `other` in [`ENDPOINTS`].
const OTHER: usize = ENDPOINTS.len() - 1;

/// Most messages a list page holds; the default when `limit` is missing.
const MAX_LIST_LIMIT: usize = 500;
const DEFAULT_LIST_LIMIT: usize = 100;

pub(crate) fn router(state: Arc<MockState>) -> Router {
    let api = Router::new()
        .route("/messages/v4/groups", post(create_group).get(list_groups))
        .route(
            "/messages/v4/groups/{id}",
            get(get_group).delete(delete_group),
        )
        .route("/messages/v4/groups/{id}/messages", put(add_messages))
        .route("/messages/v4/groups/{id}/send", post(send_group))
        .route("/messages/v4/list", get(list_messages))
        .layer(middleware::from_fn_with_state(state.clone(), guard));
    let hooks = Router::new()
        .route("/_mock/faults", get(get_faults).post(set_faults))
        .route("/_mock/ledger", get(ledger_full))
        .route("/_mock/ledger/summary", get(ledger_summary))
        .route("/_mock/reset", post(reset));
    api.merge(hooks)
        .fallback(|| async { error(404, "ResourceNotFound", "no such resource") })
        .method_not_allowed_fallback(|| async {
            error(405, "MethodNotAllowed", "method not allowed here")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

fn error(status: u16, code: &str, message: impl Into<String>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        Json(ErrorBody {
            error_code: code.to_owned(),
            error_message: message.into(),
        }),
    )
        .into_response()
}

impl IntoResponse for MockError {
    fn into_response(self) -> Response {
        error(self.status, self.code, self.message)
    }
}

fn classify(method: &Method, path: &str) -> usize {
    let path = path.trim_end_matches('/');
    if path == "/messages/v4/list" && method == Method::GET {
        return 5;
    }
    let Some(rest) = path.strip_prefix("/messages/v4/groups") else {
        return OTHER;
    };
    let segments = rest.split('/').filter(|s| !s.is_empty()).count();
    match (method, segments, rest.rsplit('/').next()) {
        (&Method::POST, 0, _) => 0,
        (&Method::PUT, 2, Some("messages")) => 1,
        (&Method::POST, 2, Some("send")) => 2,
        (&Method::GET, 1, _) => 3,
        (&Method::DELETE, 1, _) => 4,
        _ => OTHER,
    }
}

/// Faults and authentication in front of every provider route.
async fn guard(State(s): State<Arc<MockState>>, req: Request, next: Next) -> Response {
    let ep = classify(req.method(), req.uri().path());
    s.requests[ep].fetch_add(1, Ordering::Relaxed);
    let plan = s.faults.plan();
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    let verdict = s.faults.verdict();
    let injected = lock(&s.endpoint_faults)[ep];
    let injected_error = |f: EndpointFault| {
        let code = match f.status {
            400 => "ValidationError",
            403 => "Forbidden",
            404 => "ResourceNotFound",
            _ => "InternalError",
        };
        error(
            f.status,
            code,
            format!("injected {} failure", ENDPOINTS[ep]),
        )
    };
    let refusal = match (verdict, injected) {
        (Verdict::Proceed { .. }, Some(f)) if !f.after_effect => Some(injected_error(f)),
        (verdict, _) => match verdict {
            Verdict::RateLimited { retry_after_secs } => {
                let mut r = error(429, "TooManyRequests", "request rate limit exceeded");
                r.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
                Some(r)
            }
            Verdict::Error => Some(error(500, "InternalError", "injected server error")),
            Verdict::RefuseCredentials => Some(error(
                403,
                "InvalidAPIKey",
                "injected: the API key is not valid (revoked)",
            )),
            Verdict::Proceed { .. } => match s.authenticate(req.headers()) {
                Ok(()) => None,
                Err(e) => Some(error(403, e.error_code(), e.to_string())),
            },
        },
    };
    if let Some(refusal) = refusal {
        // Read the unread request body before answering: a server that
        // answers and closes with request bytes still unread makes the
        // kernel reset the connection, and the client would see a transport
        // error instead of this status.
        let _ = axum::body::to_bytes(req.into_body(), MAX_BODY).await;
        return refusal;
    }
    let resp = next.run(req).await;
    if let Some(f) = injected {
        // It took effect; its answer is the error.
        return injected_error(f);
    }
    if verdict == (Verdict::Proceed { drop: true }) {
        s.faults.drops.fetch_add(1, Ordering::Relaxed);
        return dropped(resp);
    }
    resp
}

/// The same answer with a body that fails: hyper aborts the connection
/// (before or during the body), so the client gets a transport error after
/// the request took effect.
fn dropped(resp: Response) -> Response {
    let (mut parts, _) = resp.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    let body = Body::from_stream(futures_util::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("mock: answer dropped"))
    }));
    Response::from_parts(parts, body)
}

impl MockState {
    fn authenticate(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        let value = headers
            .get(AUTHORIZATION)
            .ok_or(AuthError::Malformed("missing Authorization header"))?
            .to_str()
            .map_err(|_| AuthError::Malformed("non-ASCII Authorization header"))?;
        let h = auth::parse_authorization(value)?;
        let sig = h.verify(&self.api_key, &self.api_secret)?;
        auth::check_date(h.date, SystemTime::now())?;
        // Remembered only once everything else passed, so that forged or
        // stale requests cannot fill the memory.
        if !lock(&self.replay).first_use(sig, Instant::now()) {
            return Err(AuthError::DuplicatedSignature);
        }
        Ok(())
    }
}

async fn create_group(State(s): State<Arc<MockState>>, body: Bytes) -> Response {
    let req = if body.iter().all(u8::is_ascii_whitespace) {
        CreateGroupRequest::default()
    } else {
        match serde_json::from_slice::<CreateGroupRequest>(&body) {
            Ok(r) => r,
            Err(e) => return error(400, "ValidationError", format!("invalid body: {e}")),
        }
    };
    let g = lock(&s.ledger).create(req.custom_fields, req.allow_duplicates);
    Json(g).into_response()
}

#[derive(Deserialize)]
struct AddBody<'a> {
    #[serde(borrow)]
    messages: Vec<InMessage<'a>>,
}

/// Only `to` matters to the mock; the other fields are skipped unparsed.
#[derive(Deserialize)]
struct InMessage<'a> {
    #[serde(borrow)]
    to: Cow<'a, str>,
}

async fn add_messages(
    State(s): State<Arc<MockState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    // Parsing and packing happen before the lock is taken.
    let parsed: AddBody<'_> = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return error(400, "ValidationError", format!("invalid body: {e}")),
    };
    let n = parsed.messages.len();
    if n > MAX_MESSAGES_PER_REQUEST {
        return error(
            413,
            "RecipientsTooMany",
            format!("{n} messages, at most {MAX_MESSAGES_PER_REQUEST} per request"),
        );
    }
    if let Some(to) = lock(&s.refused_number).as_deref() {
        if parsed.messages.iter().any(|m| m.to == to) {
            return error(
                400,
                "ValidationError",
                format!("messages to {to} are refused (test hook)"),
            );
        }
    }
    let keys: Vec<Option<u64>> = parsed
        .messages
        .iter()
        .map(|m| ledger::pack(&m.to))
        .collect();
    let outcome = {
        let mut l = lock(&s.ledger);
        l.add(
            &id,
            keys.iter()
                .zip(&parsed.messages)
                .map(|(k, m)| (*k, m.to.as_ref())),
            s.cap,
            s.complete_after,
            &s.faults.get(),
        )
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    // The answer is written by hand: one buffer, no per-message allocation.
    let errors = outcome
        .codes
        .iter()
        .filter(|c| **c != Code::Registered as u8)
        .count();
    let mut out = Vec::with_capacity(64 + n * 128);
    out.extend_from_slice(b"{\"groupId\":");
    json_str(&mut out, &id);
    if s.error_count_as_string {
        let _ = write!(out, ",\"errorCount\":\"{errors}\",\"resultList\":[");
    } else {
        let _ = write!(out, ",\"errorCount\":{errors},\"resultList\":[");
    }
    for (i, (m, code)) in parsed.messages.iter().zip(&outcome.codes).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"to\":");
        json_str(&mut out, &m.to);
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            ",\"messageId\":\"M4V{}{:06}{:09}\",\"statusCode\":\"{}\",\"statusMessage\":\"{}\"}}",
            s.nonce,
            outcome.group_seq,
            outcome.base_index + i as u64,
            ledger::code_str(*code, &outcome.table),
            ledger::code_message(*code, &outcome.table)
        );
    }
    out.extend_from_slice(b"]}");
    ([(CONTENT_TYPE, "application/json")], out).into_response()
}

/// Appends `s` as a JSON string.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

async fn send_group(State(s): State<Arc<MockState>>, Path(id): Path<String>) -> Response {
    let faults = s.faults.get();
    let r = lock(&s.ledger).send(&id, s.complete_after, &faults);
    match r {
        Ok(g) => Json(g).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /messages/v4/groups`: the real service lists the account's groups,
/// a page at a time; the mock answers an empty first page. Callers use it
/// to check their credentials (the guard in front of every route has
/// authenticated the request by then).
async fn list_groups() -> Response {
    Json(serde_json::json!({
        "limit": 1,
        "startKey": null,
        "nextKey": null,
        "groupList": {},
    }))
    .into_response()
}

/// The query of `GET /messages/v4/list` (other parameters are ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    group_id: Option<String>,
    limit: Option<String>,
    start_key: Option<String>,
    status_code: Option<String>,
}

/// `GET /messages/v4/list?groupId=G&limit=N[&startKey=K][&statusCode=C]`.
async fn list_messages(
    State(s): State<Arc<MockState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(400, "ValidationError", format!("invalid query: {e}")),
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIST_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => n,
            _ => {
                return error(
                    400,
                    "ValidationError",
                    format!("limit must be 1 to {MAX_LIST_LIMIT}, got {l:?}"),
                )
            }
        },
    };
    let Some(group_id) = q.group_id.filter(|g| !g.is_empty()) else {
        return error(400, "ValidationError", "groupId is required");
    };
    let page = lock(&s.ledger).list(
        &group_id,
        q.start_key.as_deref(),
        limit,
        q.status_code.as_deref(),
        s.complete_after,
    );
    match page {
        Ok(page) => list_answer(q.start_key.as_deref(), limit, page),
        Err(e) => e.into_response(),
    }
}

/// Writes a list page by hand into one buffer, in index order.
fn list_answer(start_key: Option<&str>, limit: usize, page: Option<ListPage>) -> Response {
    let mut out = Vec::with_capacity(128 + limit * 400);
    out.extend_from_slice(b"{\"startKey\":");
    match start_key {
        Some(k) => json_str(&mut out, k),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"nextKey\":");
    match page.as_ref().and_then(|p| p.next_key.as_deref()) {
        Some(k) => json_str(&mut out, k),
        None => out.extend_from_slice(b"null"),
    }
    // Writing to a Vec cannot fail.
    let _ = write!(out, ",\"limit\":{limit},\"messageList\":{{");
    if let Some(p) = &page {
        for (i, m) in p.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, &m.message_id);
            out.extend_from_slice(b":{\"messageId\":");
            json_str(&mut out, &m.message_id);
            out.extend_from_slice(b",\"groupId\":");
            json_str(&mut out, &p.group_id);
            out.extend_from_slice(b",\"to\":");
            json_str(&mut out, &m.to);
            out.extend_from_slice(b",\"type\":\"ATA\",\"statusCode\":");
            json_str(&mut out, &m.status_code);
            out.extend_from_slice(b",\"reason\":");
            json_str(&mut out, m.reason);
            out.extend_from_slice(b",\"replacement\":false,\"dateCreated\":");
            json_str(&mut out, &p.date_created);
            out.extend_from_slice(b",\"dateProcessed\":");
            match (&p.date_sent, m.processed) {
                (Some(d), true) => json_str(&mut out, d),
                _ => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"dateReported\":");
            match m.reported {
                Some(t) => json_str(&mut out, &ledger::fmt_date(t)),
                None => out.extend_from_slice(b"null"),
            }
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"}}");
    ([(CONTENT_TYPE, "application/json")], out).into_response()
}

async fn get_group(State(s): State<Arc<MockState>>, Path(id): Path<String>) -> Response {
    let r = lock(&s.ledger).get(&id, s.complete_after);
    match r {
        Ok(g) => Json(g).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn delete_group(State(s): State<Arc<MockState>>, Path(id): Path<String>) -> Response {
    let r = lock(&s.ledger).delete(&id, s.complete_after);
    match r {
        Ok(g) => Json(g).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_faults(State(s): State<Arc<MockState>>) -> Json<Faults> {
    Json(s.faults.get())
}

async fn set_faults(State(s): State<Arc<MockState>>, body: Bytes) -> Response {
    match serde_json::from_slice::<Faults>(&body) {
        Ok(f) => {
            if let Err(e) = f.validate() {
                return error(400, "ValidationError", format!("invalid faults: {e}"));
            }
            s.faults.set(f.clone());
            Json(f).into_response()
        }
        Err(e) => error(400, "ValidationError", format!("invalid faults: {e}")),
    }
}

async fn ledger_full(State(s): State<Arc<MockState>>) -> Response {
    Json(s.ledger_snapshot()).into_response()
}

async fn ledger_summary(State(s): State<Arc<MockState>>) -> Response {
    Json(s.ledger_summary()).into_response()
}

async fn reset(State(s): State<Arc<MockState>>) -> StatusCode {
    s.reset();
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_classification() {
        assert_eq!(classify(&Method::POST, "/messages/v4/groups"), 0);
        assert_eq!(classify(&Method::PUT, "/messages/v4/groups/G1/messages"), 1);
        assert_eq!(classify(&Method::POST, "/messages/v4/groups/G1/send"), 2);
        assert_eq!(classify(&Method::GET, "/messages/v4/groups/G1"), 3);
        assert_eq!(classify(&Method::DELETE, "/messages/v4/groups/G1"), 4);
        assert_eq!(classify(&Method::GET, "/messages/v4/list"), 5);
        assert_eq!(classify(&Method::POST, "/messages/v4/list"), OTHER);
        assert_eq!(classify(&Method::GET, "/elsewhere"), OTHER);
        assert_eq!(ENDPOINTS[OTHER], "other");
    }

    #[test]
    fn json_strings() {
        let mut v = Vec::new();
        json_str(&mut v, "010");
        json_str(&mut v, "a\"b");
        json_str(&mut v, "가");
        assert_eq!(String::from_utf8(v).unwrap(), r#""010""a\"b""가""#);
    }
}
