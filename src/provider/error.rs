//! Provider call failures, with the retry decision carried as data.
//!
//! Callers never match on HTTP codes themselves: they ask
//! [`ProviderError::retry_decision`] (the redis-rs `RetryMethod` pattern), so
//! the classification of every failure lives in one place. Errors carry no
//! credentials: neither the API key nor the secret nor the Authorization
//! header ever reaches an error or a log line.

use std::fmt;
use std::time::Duration;

/// Used when a `429` carries no (or an unreadable) `Retry-After`.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What went wrong, grouped by what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderErrorKind {
    /// 5xx, timeout, connect error, dropped connection, body cut short: the
    /// request may or may not have taken effect; retrying is safe because
    /// every call is idempotent at the provider (adds answer `1026`, sends
    /// answer `409`).
    Transient,
    /// `429`: wait for `Retry-After`, then retry.
    RateLimited,
    /// `409` on send: the group was already sent (`GroupInProcessing` /
    /// `AlreadySent`); the send happened, nothing to do.
    AlreadySent,
    /// 400/401/403/404/413 (and any other 4xx): retrying cannot help.
    Permanent,
    /// A 2xx whose body is not what the contract says, or an unexpected
    /// status class; retrying will not make the provider speak the contract.
    InvalidResponse,
}

/// What a caller should do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryDecision {
    /// Retry with exponential backoff and jitter.
    RetryWithBackoff,
    /// Retry after this delay (from `Retry-After`); not a spent attempt.
    RetryAfter(Duration),
    /// The effect already happened: treat as success.
    AlreadyDone,
    /// Give up: dead-letter with this error's context.
    Abort,
}

/// A failed provider call.
#[derive(Debug, thiserror::Error)]
pub struct ProviderError {
    kind: ProviderErrorKind,
    endpoint: &'static str,
    status: Option<u16>,
    error_code: Option<String>,
    message: String,
    retry_after: Option<Duration>,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ProviderError {
    /// A new error of `kind` on `endpoint` (`"create"`, `"add"`, `"send"`,
    /// `"get"`, `"delete"`).
    pub fn new(
        kind: ProviderErrorKind,
        endpoint: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ProviderError {
            kind,
            endpoint,
            status: None,
            error_code: None,
            message: message.into(),
            retry_after: None,
            source: None,
        }
    }

    /// Sets the HTTP status.
    pub(crate) fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the provider's `errorCode`.
    pub(crate) fn with_error_code(mut self, code: impl Into<String>) -> Self {
        self.error_code = Some(code.into());
        self
    }

    /// Sets the delay a `429` asked for.
    pub(crate) fn with_retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Attaches the underlying cause.
    pub(crate) fn with_source(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(e));
        self
    }

    /// The classification.
    pub fn kind(&self) -> ProviderErrorKind {
        self.kind
    }

    /// Which call failed: `"create"`, `"add"`, `"send"`, `"get"`, `"delete"`
    /// (or `"client"` when the HTTP client could not be built).
    pub fn endpoint(&self) -> &'static str {
        self.endpoint
    }

    /// HTTP status, when an answer arrived.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The provider's `errorCode`, when the body had one.
    pub fn error_code(&self) -> Option<&str> {
        self.error_code.as_deref()
    }

    /// The provider's `errorMessage`, or a description of the failure.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The `Retry-After` of a `429` (default [`DEFAULT_RETRY_AFTER`]).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// What to do about it.
    pub fn retry_decision(&self) -> RetryDecision {
        match self.kind {
            ProviderErrorKind::Transient => RetryDecision::RetryWithBackoff,
            ProviderErrorKind::RateLimited => {
                RetryDecision::RetryAfter(self.retry_after.unwrap_or(DEFAULT_RETRY_AFTER))
            }
            ProviderErrorKind::AlreadySent => RetryDecision::AlreadyDone,
            ProviderErrorKind::Permanent | ProviderErrorKind::InvalidResponse => {
                RetryDecision::Abort
            }
        }
    }

    /// Whether the provider refused the request's credentials: `401`, or
    /// `403` for anything but a replayed signature (`DuplicatedSignature`)
    /// or a skewed clock (`RequestTimeTooSkewed`), which a right key and
    /// secret do not fix. Every later request will be refused the same way
    /// until an operator fixes the key or the secret.
    pub(crate) fn refused_credentials(&self) -> bool {
        match self.status {
            Some(401) => true,
            Some(403) => !matches!(
                self.error_code.as_deref(),
                Some("DuplicatedSignature" | "RequestTimeTooSkewed")
            ),
            _ => false,
        }
    }

    /// Whether [`retry_decision`](Self::retry_decision) says to retry (now
    /// or later).
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(
            self.retry_decision(),
            RetryDecision::RetryWithBackoff | RetryDecision::RetryAfter(_)
        )
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provider {} failed ({:?}", self.endpoint, self.kind)?;
        if let Some(s) = self.status {
            write!(f, ", HTTP {s}")?;
        }
        if let Some(c) = &self.error_code {
            write!(f, ", {c}")?;
        }
        write!(f, "): {}", self.message)?;
        if let Some(src) = &self.source {
            // reqwest's Display of a transport error says "error sending
            // request", the cause chain says why; fold it in for logs.
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(src.as_ref());
            while let Some(c) = cause {
                write!(f, ": {c}")?;
                cause = c.source();
            }
        }
        Ok(())
    }
}

/// Classifies a non-2xx HTTP status on `endpoint`.
pub(crate) fn kind_for_status(endpoint: &str, status: u16) -> ProviderErrorKind {
    match status {
        409 if endpoint == "send" => ProviderErrorKind::AlreadySent,
        429 => ProviderErrorKind::RateLimited,
        // 408 Request Timeout: the server gave up waiting, like a timeout here.
        408 | 500..=599 => ProviderErrorKind::Transient,
        400..=499 => ProviderErrorKind::Permanent,
        _ => ProviderErrorKind::InvalidResponse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        use ProviderErrorKind::*;
        assert_eq!(kind_for_status("add", 500), Transient);
        assert_eq!(kind_for_status("add", 503), Transient);
        assert_eq!(kind_for_status("add", 429), RateLimited);
        assert_eq!(kind_for_status("send", 409), AlreadySent);
        assert_eq!(kind_for_status("add", 409), Permanent);
        for s in [400, 401, 403, 404, 413] {
            assert_eq!(kind_for_status("add", s), Permanent);
        }
        assert_eq!(kind_for_status("add", 302), InvalidResponse);
    }

    #[test]
    fn only_401_and_403_for_the_key_or_secret_are_refused_credentials() {
        let e = |status: u16, code: &str| {
            ProviderError::new(kind_for_status("create", status), "create", "x")
                .with_status(status)
                .with_error_code(code)
        };
        assert!(e(403, "SignatureDoesNotMatch").refused_credentials());
        assert!(e(403, "InvalidAPIKey").refused_credentials());
        assert!(e(401, "Unauthorized").refused_credentials());
        assert!(!e(403, "DuplicatedSignature").refused_credentials());
        assert!(!e(403, "RequestTimeTooSkewed").refused_credentials());
        assert!(!e(400, "ValidationError").refused_credentials());
        assert!(!e(500, "InternalError").refused_credentials());
    }

    #[test]
    fn decisions() {
        let e = ProviderError::new(ProviderErrorKind::RateLimited, "add", "slow down");
        assert_eq!(
            e.retry_decision(),
            RetryDecision::RetryAfter(DEFAULT_RETRY_AFTER)
        );
        let e = e.with_retry_after(Duration::from_secs(7));
        assert_eq!(
            e.retry_decision(),
            RetryDecision::RetryAfter(Duration::from_secs(7))
        );
        let e = ProviderError::new(ProviderErrorKind::AlreadySent, "send", "x").with_status(409);
        assert_eq!(e.retry_decision(), RetryDecision::AlreadyDone);
        assert!(!e.is_retryable());
        let e = ProviderError::new(ProviderErrorKind::Permanent, "add", "x")
            .with_status(400)
            .with_error_code("InvalidGroupStatus");
        assert_eq!(e.retry_decision(), RetryDecision::Abort);
        assert_eq!(
            e.to_string(),
            "provider add failed (Permanent, HTTP 400, InvalidGroupStatus): x"
        );
    }
}
