//! Errors as data: every refusal of the API is `application/problem+json`
//! (RFC 9457) with a stable `type` (`urn:groupcast:problem:<slug>`), a
//! `title` per type, the HTTP `status`, a `detail` for this occurrence and,
//! for a chunk refused by its checks, `errors`: each problem with its row
//! and field.

use std::time::Duration;

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::tokens::Denied;
use crate::cli::submit::body::{BodyRefused, RowProblem};
use crate::store::StoreError;

/// The media type of every error.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// The kinds of problem, each with a stable slug (the end of its `type`),
/// a title and a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// No token, or a secret no token has (401).
    Unauthorized,
    /// The token lacks the scope the call needs (403).
    Forbidden,
    /// A browser's cross-site request that would change state (403).
    CrossSite,
    /// No such route, batch, report or results (404).
    NotFound,
    /// A chunk of a batch that was never created (404).
    BatchNotCreated,
    /// The method is not one the route takes (405).
    MethodNotAllowed,
    /// The request is malformed: its JSON, its path or its query (400).
    BadRequest,
    /// The body's media type is not one the route takes (415).
    UnsupportedMediaType,
    /// The body is over the server's limit (413).
    BodyTooLarge,
    /// The batch's definition (template, options) is not usable (422).
    InvalidBatch,
    /// The chunk does not pass the checks: every problem in `errors` (422).
    InvalidChunk,
    /// The batch exists with another definition (409).
    BatchConflict,
    /// This seq was given before with other content (409).
    SeqConflict,
    /// A seal at another last seq than the batch knows, or below a seq it
    /// received (409).
    LastConflict,
    /// The batch takes no more chunks or actions: it reported, or was
    /// cancelled (409).
    BatchEnded,
    /// The workers are behind: try again after `Retry-After` (429).
    Backpressure,
    /// Redis could not be used, or lost a command: try again (503).
    Unavailable,
    /// The request took longer than the server allows (503).
    Timeout,
}

impl Kind {
    /// Every kind: the tests check each has its own slug and status.
    #[cfg(test)]
    const ALL: [Kind; 18] = [
        Kind::Unauthorized,
        Kind::Forbidden,
        Kind::CrossSite,
        Kind::NotFound,
        Kind::BatchNotCreated,
        Kind::MethodNotAllowed,
        Kind::BadRequest,
        Kind::UnsupportedMediaType,
        Kind::BodyTooLarge,
        Kind::InvalidBatch,
        Kind::InvalidChunk,
        Kind::BatchConflict,
        Kind::SeqConflict,
        Kind::LastConflict,
        Kind::BatchEnded,
        Kind::Backpressure,
        Kind::Unavailable,
        Kind::Timeout,
    ];

    /// The stable slug: the end of `type`.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Kind::Unauthorized => "unauthorized",
            Kind::Forbidden => "forbidden",
            Kind::CrossSite => "cross-site",
            Kind::NotFound => "not-found",
            Kind::BatchNotCreated => "batch-not-created",
            Kind::MethodNotAllowed => "method-not-allowed",
            Kind::BadRequest => "bad-request",
            Kind::UnsupportedMediaType => "unsupported-media-type",
            Kind::BodyTooLarge => "body-too-large",
            Kind::InvalidBatch => "invalid-batch",
            Kind::InvalidChunk => "invalid-chunk",
            Kind::BatchConflict => "batch-conflict",
            Kind::SeqConflict => "seq-conflict",
            Kind::LastConflict => "last-conflict",
            Kind::BatchEnded => "batch-ended",
            Kind::Backpressure => "backpressure",
            Kind::Unavailable => "unavailable",
            Kind::Timeout => "timeout",
        }
    }

    /// The title: the same for every occurrence of the kind.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Kind::Unauthorized => "A valid bearer token is needed",
            Kind::Forbidden => "The token lacks the scope this call needs",
            Kind::CrossSite => "Cross-site request refused",
            Kind::NotFound => "Not found",
            Kind::BatchNotCreated => "The batch was not created",
            Kind::MethodNotAllowed => "Method not allowed",
            Kind::BadRequest => "Malformed request",
            Kind::UnsupportedMediaType => "Unsupported media type",
            Kind::BodyTooLarge => "Request body too large",
            Kind::InvalidBatch => "The batch's definition is not usable",
            Kind::InvalidChunk => "The chunk does not pass the checks",
            Kind::BatchConflict => "The batch exists with another definition",
            Kind::SeqConflict => "This seq was given with other content",
            Kind::LastConflict => "The batch knows another last seq",
            Kind::BatchEnded => "The batch has ended",
            Kind::Backpressure => "The workers are behind: try again later",
            Kind::Unavailable => "Redis is unavailable: try again",
            Kind::Timeout => "The request took too long",
        }
    }

    /// The HTTP status.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::Forbidden | Kind::CrossSite => StatusCode::FORBIDDEN,
            Kind::NotFound | Kind::BatchNotCreated => StatusCode::NOT_FOUND,
            Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::InvalidBatch | Kind::InvalidChunk => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::BatchConflict | Kind::SeqConflict | Kind::LastConflict | Kind::BatchEnded => {
                StatusCode::CONFLICT
            }
            Kind::Backpressure => StatusCode::TOO_MANY_REQUESTS,
            Kind::Unavailable | Kind::Timeout => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `type` URI.
    pub(crate) fn type_uri(self) -> String {
        format!("urn:groupcast:problem:{}", self.slug())
    }
}

/// One problem of a chunk's rows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct FieldError {
    /// For a CSV body, its line (the header is line 1); for JSON, the
    /// recipient's index in `recipients` (from 0); absent for a problem of
    /// the chunk as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<usize>,
    /// The field (`to`, a variable's name, `template`, ...), when the
    /// problem is one field's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong and what to do.
    pub reason: String,
}

impl From<&RowProblem> for FieldError {
    fn from(p: &RowProblem) -> Self {
        FieldError {
            row: Some(p.row),
            field: p.field.clone(),
            reason: p.reason.clone(),
        }
    }
}

/// An error, as RFC 9457 has it (`application/problem+json`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Problem {
    /// `urn:groupcast:problem:<slug>`: stable, the same for every
    /// occurrence of the kind (docs/api.md lists them).
    #[serde(rename = "type")]
    pub kind: String,
    /// The kind's title.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong this time, and what to do.
    pub detail: String,
    /// For `invalid-chunk` and `invalid-batch`: every problem found (the
    /// first 100), each with its row and field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// How many problems in all, when more were found than listed.
    #[serde(rename = "errorsTotal", skip_serializing_if = "Option::is_none")]
    pub errors_total: Option<usize>,
    /// For `backpressure`: the seconds to wait (as `Retry-After`).
    #[serde(rename = "retryAfter", skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

/// A refusal of the API, answered as [`Problem`] (the `Retry-After` header
/// too, when it says when to come back).
#[derive(Debug, Clone)]
pub(crate) struct ApiProblem(pub Box<Problem>);

impl ApiProblem {
    /// A problem of `kind` with `detail`.
    pub(crate) fn new(kind: Kind, detail: impl Into<String>) -> ApiProblem {
        ApiProblem(Box::new(Problem {
            kind: kind.type_uri(),
            title: kind.title().into(),
            status: kind.status().as_u16(),
            detail: detail.into(),
            errors: Vec::new(),
            errors_total: None,
            retry_after: None,
        }))
    }

    /// With the problems of a chunk or a batch's definition listed.
    pub(crate) fn with_errors(mut self, errors: Vec<FieldError>, total: usize) -> ApiProblem {
        self.0.errors_total = (total > errors.len()).then_some(total);
        self.0.errors = errors;
        self
    }

    /// With when to come back.
    pub(crate) fn retry_after(mut self, wait: Duration) -> ApiProblem {
        self.0.retry_after = Some(wait.as_secs().max(1));
        self
    }

    /// A chunk refused by its checks.
    pub(crate) fn invalid_chunk(what: &str, refused: BodyRefused) -> ApiProblem {
        match refused {
            BodyRefused::Rows {
                problems,
                total,
                rows,
            } => ApiProblem::new(
                Kind::InvalidChunk,
                format!("{what}: {rows} row(s), {total} problem(s); nothing was appended: fix them and send the chunk again"),
            )
            .with_errors(problems.iter().map(FieldError::from).collect(), total),
            BodyRefused::Whole(why) => ApiProblem::one(Kind::InvalidChunk, what, None, why),
        }
    }

    /// A problem with one error, of `field` if it is one field's.
    pub(crate) fn one(kind: Kind, what: &str, field: Option<&str>, reason: String) -> ApiProblem {
        ApiProblem::new(kind, format!("{what}: {reason}")).with_errors(
            vec![FieldError {
                row: None,
                field: field.map(str::to_string),
                reason,
            }],
            1,
        )
    }
}

impl From<StoreError> for ApiProblem {
    fn from(e: StoreError) -> Self {
        tracing::warn!(error = %e, "redis");
        ApiProblem::new(Kind::Unavailable, format!("redis: {e}"))
            .retry_after(Duration::from_secs(1))
    }
}

impl From<Denied> for ApiProblem {
    fn from(d: Denied) -> Self {
        let kind = match d {
            Denied::NoToken | Denied::UnknownToken => Kind::Unauthorized,
            Denied::Scope { .. } => Kind::Forbidden,
            Denied::CrossSite(_) => Kind::CrossSite,
        };
        ApiProblem::new(kind, d.to_string())
    }
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        let p = self.0;
        let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&*p).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = p.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The OpenAPI responses of `kinds`: one a status, its description the
/// kinds' slugs and titles, its body a [`Problem`] (and `Retry-After` for
/// `backpressure`).
fn responses_for(
    kinds: &[Kind],
) -> BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::response::Response>> {
    use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, ResponseBuilder};
    let mut by_status: BTreeMap<u16, Vec<Kind>> = BTreeMap::new();
    for k in kinds {
        by_status.entry(k.status().as_u16()).or_default().push(*k);
    }
    by_status
        .into_iter()
        .map(|(status, kinds)| {
            let description: Vec<String> = kinds
                .iter()
                .map(|k| format!("`{}`: {}", k.slug(), k.title()))
                .collect();
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build();
            let mut response = ResponseBuilder::new()
                .description(description.join("; "))
                .content(PROBLEM_JSON, content);
            if kinds.contains(&Kind::Backpressure) {
                response = response.header(
                    "Retry-After",
                    HeaderBuilder::new()
                        .schema(
                            utoipa::openapi::ObjectBuilder::new()
                                .schema_type(utoipa::openapi::schema::Type::Integer),
                        )
                        .description(Some("Seconds to wait before trying again"))
                        .build(),
                );
            }
            (status.to_string(), response.build().into())
        })
        .collect()
}

/// A set of problems an operation may answer, as OpenAPI responses.
macro_rules! refusals {
    ($(#[$doc:meta])* $name:ident: $($kind:ident),+) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses(
            ) -> BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::response::Response>> {
                responses_for(&[$(Kind::$kind),+])
            }
        }
    };
}

refusals!(
    /// What every call with a token may answer: malformed, no token, no
    /// scope, cross-site, Redis away, too slow.
    Refusals: BadRequest, Unauthorized, Forbidden, CrossSite, Unavailable, Timeout
);
refusals!(
    /// What creating a batch may answer besides [`Refusals`].
    CreateRefusals: BodyTooLarge, InvalidBatch, BatchConflict, BatchEnded
);
refusals!(
    /// What adding a chunk may answer besides [`Refusals`].
    ChunkRefusals: BatchNotCreated, BodyTooLarge, UnsupportedMediaType, InvalidChunk,
        SeqConflict, BatchConflict, BatchEnded, Backpressure
);
refusals!(
    /// What sealing may answer besides [`Refusals`].
    SealRefusals: BodyTooLarge, LastConflict, BatchEnded
);
refusals!(
    /// What closing or cancelling may answer besides [`Refusals`].
    ActionRefusals: NotFound, BatchEnded
);
refusals!(
    /// What reading a batch may answer besides [`Refusals`].
    ReadRefusals: NotFound
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_slug_and_a_status_of_an_error() {
        let mut slugs: Vec<&str> = Kind::ALL.iter().map(|k| k.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), Kind::ALL.len());
        for k in Kind::ALL {
            assert!(
                k.status().is_client_error() || k.status().is_server_error(),
                "{k:?}"
            );
        }
    }
}
