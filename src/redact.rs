//! Secrets out of what groupcast prints: the userinfo and the query string
//! of a URL are replaced by `***` before the URL reaches a log line, a
//! dead-letter reason, the board or its API.
//!
//! People put tokens in webhook URLs (`https://hooks.example/r?token=...`,
//! `https://user:pw@host/`) and reqwest puts the whole URL in its errors
//! (`error sending request for url (...)`). Redis URLs keep their own,
//! user-preserving redaction ([`crate::store::redact_url`]).

/// What replaces a redacted part.
const MASK: &str = "***";

/// `url` with its userinfo and its query string (and fragment) replaced by
/// `***`: `https://u:p@host/hook?token=x` → `https://***@host/hook?***`.
/// Text that is no URL comes back unchanged.
pub(crate) fn url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    // The authority ends at the path, the query or the fragment.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let host = match authority.rsplit_once('@') {
        Some((_, host)) => format!("{MASK}@{host}"),
        None => authority.to_string(),
    };
    let tail = match tail.find(['?', '#']) {
        Some(at) => format!("{}{}{MASK}", &tail[..at], &tail[at..=at]),
        None => tail.to_string(),
    };
    format!("{scheme}{host}{tail}")
}

/// `text` with every `http://` or `https://` URL in it redacted as [`url`]
/// does. A URL ends at white space or at a quote, bracket or parenthesis.
pub(crate) fn text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find_url(rest) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || "\"'`()<>[]{}".contains(c))
            .unwrap_or(tail.len());
        out.push_str(&url(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Where the first `http://` or `https://` in `text` starts.
fn find_url(text: &str) -> Option<usize> {
    [text.find("http://"), text.find("https://")]
        .into_iter()
        .flatten()
        .min()
}

/// A reqwest error with the URL it carries redacted as [`url`] does: its
/// message still names the host and path, never a token.
pub(crate) fn reqwest_error(mut e: reqwest::Error) -> reqwest::Error {
    if let Some(u) = e.url_mut() {
        if !u.username().is_empty() || u.password().is_some() {
            let _ = u.set_password(None);
            let _ = u.set_username(MASK);
        }
        if u.query().is_some() {
            u.set_query(Some(MASK));
        }
        if u.fragment().is_some() {
            u.set_fragment(Some(MASK));
        }
    }
    e
}

/// An error and its sources, one `: ` apart, redacted as [`text`] does:
/// reqwest's own message leaves out the cause (`connection refused`).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    text(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_userinfo_and_query_are_masked() {
        assert_eq!(
            url("https://user:pw@hooks.example:8443/r/1?token=SEKRET&x=1#frag"),
            "https://***@hooks.example:8443/r/1?***"
        );
        assert_eq!(url("http://h/hook?token=a"), "http://h/hook?***");
        assert_eq!(url("http://TOKEN@h"), "http://***@h");
        assert_eq!(url("http://h/p#t"), "http://h/p#***");
        // Nothing secret: unchanged.
        assert_eq!(
            url("http://127.0.0.1:9/reports"),
            "http://127.0.0.1:9/reports"
        );
    }

    #[test]
    fn every_url_in_a_text_is_masked_and_the_rest_kept() {
        let t = "report webhook unreachable: error sending request for url \
                 (http://127.0.0.1:9/hook?token=SEKRET123): connection refused; \
                 retried https://a:b@x/y?k=v too";
        assert_eq!(
            text(t),
            "report webhook unreachable: error sending request for url \
             (http://127.0.0.1:9/hook?***): connection refused; \
             retried https://***@x/y?*** too"
        );
        assert_eq!(text("no url here"), "no url here");
    }

    #[tokio::test]
    async fn a_reqwest_error_names_the_host_but_not_the_token() {
        // A port the system just handed out and that was closed again:
        // nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let e = reqwest::Client::new()
            .post(format!(
                "http://me:pw@127.0.0.1:{port}/hook?token=SEKRET123"
            ))
            .send()
            .await
            .expect_err("nothing listens");
        let shown = error_chain(&reqwest_error(e));
        assert!(!shown.contains("SEKRET123"), "{shown}");
        assert!(!shown.contains("me:pw"), "{shown}");
        // reqwest moves the userinfo into an Authorization header.
        assert!(
            shown.contains(&format!("//127.0.0.1:{port}/hook?***")),
            "{shown}"
        );
    }
}
