//! `GET /v1/openapi.json`: the OpenAPI 3.1 document, generated from the
//! handlers' annotations and the request, answer and problem types
//! ([`super::routes`], [`super::problems`]), so that it says what the code
//! does.

use axum::response::IntoResponse;
use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::problems::{FieldError, Problem};
use super::routes::{
    BatchCreated, BatchId, Cancelled, ChunkAccepted, ChunkRecipients, Closed, CreateBatch,
    ReasonIn, RecipientIn, Reports, SealIn, Sealed,
};
use crate::cli::submit::{KakaoFile, TemplateFile};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "groupcast",
        version = "1",
        description = "Bulk notifications through a provider's group API: create a batch, add its chunks, \
                       seal it (its last seq, after the fact), close or cancel it, read its status, report and results. Every error is \
                       application/problem+json (RFC 9457); docs/api.md has a session and the problem types."
    ),
    paths(
        super::routes::create_batch,
        super::routes::put_chunk,
        super::routes::seal,
        super::routes::close,
        super::routes::cancel,
        super::routes::status,
        super::routes::report,
        super::routes::results,
        openapi_json,
    ),
    components(schemas(
        BatchId, CreateBatch, TemplateFile, KakaoFile, BatchCreated, ChunkRecipients, RecipientIn,
        ChunkAccepted, SealIn, Sealed, ReasonIn, Closed, Cancelled, Reports, Problem, FieldError
    )),
    modifiers(&BearerTokens),
    tags(
        (name = "batches", description = "Create batches, add chunks, read what happened"),
        (name = "operations", description = "Close and cancel (scope `operate`)"),
    )
)]
pub(crate) struct ApiDoc;

/// Declares the bearer tokens (`--tokens FILE`) the operations name.
struct BearerTokens;

impl Modify for BearerTokens {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A secret of the server's tokens file; the scopes an operation needs are listed with it",
                    ))
                    .build(),
            ),
        );
    }
}

#[utoipa::path(
    get, path = "/v1/openapi.json", tag = "batches",
    responses((status = 200, description = "This document", content_type = "application/json", body = Object))
)]
/// This document (no token needed).
pub(crate) async fn openapi_json() -> impl IntoResponse {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route_and_its_problems() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("json");
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        for (path, method) in [
            ("/v1/batches", "post"),
            ("/v1/batches/{id}/chunks/{seq}", "put"),
            ("/v1/batches/{id}/seal", "post"),
            ("/v1/batches/{id}/close", "post"),
            ("/v1/batches/{id}/cancel", "post"),
            ("/v1/batches/{id}", "get"),
            ("/v1/batches/{id}/report", "get"),
            ("/v1/batches/{id}/results", "get"),
            ("/v1/openapi.json", "get"),
        ] {
            let op = &paths[path][method];
            assert!(op.is_object(), "{method} {path} is documented");
            if path != "/v1/openapi.json" {
                let bad = &op["responses"]["401"]["content"]["application/problem+json"];
                assert!(bad.is_object(), "{method} {path}: 401 is a problem");
            }
        }
        let chunk = &paths["/v1/batches/{id}/chunks/{seq}"]["put"];
        for media in ["application/json", "text/csv", "application/msgpack"] {
            assert!(
                chunk["requestBody"]["content"][media].is_object(),
                "{media}"
            );
        }
        assert!(chunk["responses"]["429"]["headers"]["Retry-After"].is_object());
        assert!(doc["components"]["schemas"]["Problem"].is_object());
        assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    }
}
