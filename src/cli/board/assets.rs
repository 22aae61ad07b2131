//! The page and its script and style, embedded in the binary (no CDN: the
//! board works offline). One page: its script reads the path (`/`,
//! `/batches/{id}`, `/dlq`) and renders from the JSON API.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// Only this board's own script and style may run or load, and no other
/// site may frame it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The page (for every page path).
pub(crate) async fn page() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-store"),
            (axum::http::header::CONTENT_SECURITY_POLICY, CSP),
            (axum::http::header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE,
    )
}

/// The page's script.
pub(crate) async fn script() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
}

/// The page's style.
pub(crate) async fn style() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        STYLE,
    )
}
