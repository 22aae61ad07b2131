//! Who may call the API: the tokens file (`--tokens FILE`, one token a line
//! `NAME SCOPES SECRET`), the scopes, and the check of a request's
//! `Authorization: Bearer SECRET` (compared in constant time) and of where
//! it comes from (a browser's cross-site request is refused).

use std::path::Path;

use axum::http::{HeaderMap, Method};

use crate::cli::board::auth::{bearer, from_another_site, same};

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Scope {
    /// Create batches and add their chunks.
    Ingest,
    /// Close and cancel batches.
    Operate,
    /// Read a batch's status, report and results.
    Read,
}

impl Scope {
    /// Its name in the tokens file.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Operate => "operate",
            Scope::Read => "read",
        }
    }

    fn parse(s: &str) -> Option<Scope> {
        [Scope::Ingest, Scope::Operate, Scope::Read]
            .into_iter()
            .find(|k| k.name() == s)
    }
}

/// The shortest secret accepted: a secret a person could guess is no
/// secret (`openssl rand -hex 32` makes a good one).
pub(crate) const MIN_SECRET_BYTES: usize = 24;

/// One token of the file.
#[derive(Clone)]
pub(crate) struct Token {
    /// Its name, recorded with every action taken with it.
    pub name: String,
    /// What it allows.
    pub scopes: Vec<Scope>,
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("scopes", &self.scopes)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The tokens the server takes (several may share a name: a secret being
/// rotated and its successor).
#[derive(Debug, Clone, Default)]
pub struct Tokens(Vec<Token>);

/// Why a tokens file cannot be used (it names the line).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokensFileError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {why}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// A line is not `NAME SCOPES SECRET`.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: String,
        /// The line (from 1).
        line: usize,
        /// What is wrong (never the secret).
        why: String,
    },
}

impl Tokens {
    /// Reads a tokens file.
    pub fn read(path: &Path) -> Result<Tokens, TokensFileError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokensFileError::Unreadable {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
        Tokens::parse(&path.display().to_string(), &text)
    }

    /// Parses a tokens file's text: one token a line, `NAME SCOPES SECRET`
    /// (scopes comma-separated), blank lines and `#` comments skipped.
    pub fn parse(path: &str, text: &str) -> Result<Tokens, TokensFileError> {
        let mut tokens: Vec<Token> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let bad = |why: String| TokensFileError::Line {
                path: path.to_string(),
                line: i + 1,
                why,
            };
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let [name, scopes, secret] = words[..] else {
                return Err(bad(format!(
                    "expected `NAME SCOPES SECRET` (3 words), found {}",
                    words.len()
                )));
            };
            let named = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
            if name.len() > 64 || !name.chars().all(named) {
                return Err(bad(format!(
                    "token name {name:?}: at most 64 letters, digits, '.', '_', '-'"
                )));
            }
            let mut parsed = Vec::new();
            for s in scopes.split(',') {
                let scope = Scope::parse(s).ok_or_else(|| {
                    bad(format!(
                        "scope {s:?}: one of ingest, operate, read (comma-separated)"
                    ))
                })?;
                if !parsed.contains(&scope) {
                    parsed.push(scope);
                }
            }
            if secret.len() < MIN_SECRET_BYTES {
                return Err(bad(format!(
                    "the secret of token {name} is {} bytes; at least {MIN_SECRET_BYTES} are needed (e.g. `openssl rand -hex 32`)",
                    secret.len()
                )));
            }
            if tokens.iter().any(|t| t.secret == secret) {
                return Err(bad(format!(
                    "token {name} has the secret of an earlier line: each secret names one token"
                )));
            }
            tokens.push(Token {
                name: name.to_string(),
                scopes: parsed,
                secret: secret.to_string(),
            });
        }
        Ok(Tokens(tokens))
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (every call needing a token is refused).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token a request's `Authorization: Bearer` secret names. Every
    /// token is compared, each in constant time, so that the time taken
    /// tells nothing of which secret is nearest.
    fn find(&self, given: &str) -> Option<&Token> {
        self.0.iter().fold(None, |found, t| {
            let matches = same(given.as_bytes(), t.secret.as_bytes());
            found.or(matches.then_some(t))
        })
    }

    /// Decides whether a request may do what needs `scope`: a browser's
    /// cross-site request that changes state is refused first, then the
    /// token is looked up and its scopes checked.
    pub(crate) fn authorize(
        &self,
        method: &Method,
        headers: &HeaderMap,
        scope: Scope,
    ) -> Result<&Token, Denied> {
        if !matches!(*method, Method::GET | Method::HEAD) {
            if let Some(why) = from_another_site(headers) {
                return Err(Denied::CrossSite(why));
            }
        }
        let given = bearer(headers).ok_or(Denied::NoToken)?;
        let token = self.find(given).ok_or(Denied::UnknownToken)?;
        if !token.scopes.contains(&scope) {
            return Err(Denied::Scope {
                token: token.name.clone(),
                scope,
            });
        }
        Ok(token)
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denied {
    /// No `Authorization: Bearer` header.
    #[error("this call needs `Authorization: Bearer <secret>` with a token from the server's tokens file")]
    NoToken,
    /// A secret no token has.
    #[error("the bearer secret is not one of the server's tokens")]
    UnknownToken,
    /// The token lacks the scope.
    #[error("token {token} lacks the scope `{}` this call needs", .scope.name())]
    Scope {
        /// The token's name.
        token: String,
        /// The scope needed.
        scope: Scope,
    },
    /// A browser's cross-site request that would change state.
    #[error("cross-site request refused: {0}")]
    CrossSite(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: &str = "0123456789abcdef0123456789abcdef";
    const FEED: &str = "feedfeedfeedfeedfeedfeedfeedfeed";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn a_tokens_file_has_names_scopes_and_secrets_and_says_which_line_is_wrong() {
        let text = format!(
            "# rotated on 2026-12-01\n\nops-oncall ingest,operate,read {OPS}\n  feeder ingest {FEED}  \n"
        );
        let tokens = Tokens::parse("t", &text).expect("parse");
        assert_eq!(tokens.len(), 2);
        let line = |text: &str| Tokens::parse("t", text).expect_err("bad").to_string();
        assert!(line("a b\n").starts_with("t:1: expected"));
        assert!(line(&format!("\nx write {OPS}\n")).starts_with("t:2: scope \"write\""));
        assert!(line("x read short\n").contains("at least 24"));
        assert!(line(&format!("a read {OPS}\nb read {OPS}\n")).starts_with("t:2:"));
        assert!(line(&format!("a:b read {OPS}\n")).contains("token name"));
        let secretless = line("x read short\n");
        assert!(!secretless.contains("short"), "no secret in {secretless}");
    }

    #[test]
    fn a_request_needs_a_known_secret_with_the_scope_from_its_own_site() {
        let text = format!("ops-oncall operate,read {OPS}\nfeeder ingest {FEED}\n");
        let tokens = Tokens::parse("t", &text).expect("parse");
        let bearer = |s: &str| format!("Bearer {s}");
        let post = Method::POST;
        let ok = tokens
            .authorize(
                &post,
                &headers(&[("authorization", &bearer(OPS))]),
                Scope::Operate,
            )
            .expect("ops may operate");
        assert_eq!(ok.name, "ops-oncall");
        assert_eq!(
            tokens
                .authorize(&post, &headers(&[]), Scope::Read)
                .map(|t| t.name.clone()),
            Err(Denied::NoToken)
        );
        let wrong = headers(&[("authorization", "Bearer 0123456789abcdef0123456789abcdeF")]);
        assert_eq!(
            tokens
                .authorize(&post, &wrong, Scope::Read)
                .map(|t| t.name.clone()),
            Err(Denied::UnknownToken)
        );
        assert!(matches!(
            tokens.authorize(
                &post,
                &headers(&[("authorization", &bearer(FEED))]),
                Scope::Operate
            ),
            Err(Denied::Scope { .. })
        ));
        let cross = headers(&[
            ("authorization", &bearer(OPS)),
            ("host", "127.0.0.1:9465"),
            ("origin", "https://evil.example"),
        ]);
        assert!(matches!(
            tokens.authorize(&post, &cross, Scope::Operate),
            Err(Denied::CrossSite(_))
        ));
        assert!(tokens.authorize(&Method::GET, &cross, Scope::Read).is_ok());
        let fetch = headers(&[
            ("authorization", &bearer(OPS)),
            ("sec-fetch-site", "cross-site"),
        ]);
        assert!(matches!(
            tokens.authorize(&Method::PUT, &fetch, Scope::Read),
            Err(Denied::CrossSite(_))
        ));
    }
}
