//! Who may act on the board: the bearer token, and the checks that refuse
//! cross-site forgeries.

use axum::http::{header, HeaderMap, StatusCode};

/// The header the board's own page sends with every action. A browser adds
/// a custom header to a cross-site request only after a CORS preflight,
/// which the board does not answer: a forged form or image cannot carry it.
pub(crate) const BOARD_HEADER: &str = "x-groupcast-board";

/// Why an action was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// No token is configured: the board is read-only (403).
    #[error("the board is read-only: start it with GROUPCAST_BOARD_TOKEN (or GROUPCAST_BOARD_TOKEN_FILE) to allow actions")]
    ReadOnly,
    /// The request lacks the board's header, or comes from another site (403).
    #[error("cross-site request refused: {0}")]
    CrossSite(&'static str),
    /// No `Authorization: Bearer` token, or the wrong one (401).
    #[error(
        "a valid `Authorization: Bearer <token>` is needed (the token is GROUPCAST_BOARD_TOKEN)"
    )]
    Unauthorized,
}

impl Refused {
    /// The HTTP status it answers with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refused::Unauthorized => StatusCode::UNAUTHORIZED,
            Refused::ReadOnly | Refused::CrossSite(_) => StatusCode::FORBIDDEN,
        }
    }
}

/// Compares in time independent of where the first difference is, so that
/// the token cannot be guessed byte by byte from response times.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Decides whether a request may act: `token` is the configured one.
pub(crate) fn authorize(token: Option<&str>, headers: &HeaderMap) -> Result<(), Refused> {
    let Some(token) = token else {
        return Err(Refused::ReadOnly);
    };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text(BOARD_HEADER).is_none() {
        return Err(Refused::CrossSite(
            "the X-Groupcast-Board header is missing",
        ));
    }
    if let Some(why) = from_another_site(headers) {
        return Err(Refused::CrossSite(why));
    }
    match bearer(headers) {
        Some(g) if same(g.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(Refused::Unauthorized),
    }
}

/// Why a request comes from another site, if a browser says it does: its
/// `Sec-Fetch-Site` names another site, or its `Origin` is not the host it
/// was sent to. (A request without either, from a program, is not a
/// browser's forgery.)
pub(crate) fn from_another_site(headers: &HeaderMap) -> Option<&'static str> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text("sec-fetch-site").is_some_and(|s| s == "cross-site" || s == "same-site") {
        return Some("Sec-Fetch-Site says another site");
    }
    let origin = text(header::ORIGIN.as_str())?;
    let host = text(header::HOST.as_str()).unwrap_or("");
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    (bare != Some(host)).then_some("Origin is not this server")
}

/// The token of an `Authorization: Bearer <token>` header, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn only_the_token_with_the_boards_header_from_the_board_itself_may_act() {
        let good = [
            ("host", "127.0.0.1:9465"),
            ("x-groupcast-board", "1"),
            ("authorization", "Bearer s3cret"),
        ];
        assert_eq!(authorize(Some("s3cret"), &headers(&good)), Ok(()));
        let mut same_origin = good.to_vec();
        same_origin.push(("origin", "http://127.0.0.1:9465"));
        same_origin.push(("sec-fetch-site", "same-origin"));
        assert_eq!(authorize(Some("s3cret"), &headers(&same_origin)), Ok(()));
        assert_eq!(authorize(None, &headers(&good)), Err(Refused::ReadOnly));
        let wrong = [
            ("host", "127.0.0.1:9465"),
            ("x-groupcast-board", "1"),
            ("authorization", "Bearer s3creT"),
        ];
        assert_eq!(
            authorize(Some("s3cret"), &headers(&wrong)),
            Err(Refused::Unauthorized)
        );
        assert_eq!(
            authorize(Some("s3cret"), &headers(&good[..2])),
            Err(Refused::Unauthorized)
        );
        assert!(matches!(
            authorize(Some("s3cret"), &headers(&[good[0], good[2]])),
            Err(Refused::CrossSite(_))
        ));
        let mut forged = good.to_vec();
        forged.push(("origin", "https://evil.example"));
        assert!(matches!(
            authorize(Some("s3cret"), &headers(&forged)),
            Err(Refused::CrossSite(_))
        ));
        let mut cross = good.to_vec();
        cross.push(("sec-fetch-site", "cross-site"));
        assert!(matches!(
            authorize(Some("s3cret"), &headers(&cross)),
            Err(Refused::CrossSite(_))
        ));
        assert_eq!(Refused::Unauthorized.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Refused::ReadOnly.status(), StatusCode::FORBIDDEN);
    }
}
