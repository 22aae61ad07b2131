//! [`ProviderClient`]: one method per endpoint, every request freshly signed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

// `Bytes` via axum's re-export: the same `bytes` 1.x type reqwest returns,
// without one more direct dependency.
use axum::body::Bytes;
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use super::auth;
use super::error::{kind_for_status, ProviderError, ProviderErrorKind, DEFAULT_RETRY_AFTER};
use super::model::{
    AddMessagesRequest, AddMessagesResponse, AddSummary, CreateGroupRequest, ErrorBody, Group,
    Message, MessagePage, Registration,
};

/// The provider refuses requests with more messages than this
/// (`413 RecipientsTooMany`); [`ProviderClient::add_messages`] splits.
pub const MAX_MESSAGES_PER_REQUEST: usize = 10_000;

/// Counter: provider requests by `endpoint` and `status` (HTTP code, or
/// `"error"` when no complete answer arrived).
pub(crate) const METRIC_REQUESTS: &str = "groupcast_provider_requests_total";
/// Histogram: provider request duration in seconds by `endpoint`, until the
/// whole body was read.
pub(crate) const METRIC_DURATION: &str = "groupcast_provider_request_duration_seconds";

/// Where and how to reach the provider.
#[derive(Clone)]
pub struct ProviderConfig {
    /// Base URL, without the `/messages/v4` path. Default: the real service,
    /// `https://api.solapi.com`.
    pub base_url: String,
    /// API key (sent in every request's `Authorization` header). Default empty.
    pub api_key: String,
    /// API secret (signs requests, never sent). Default empty.
    pub api_secret: String,
    /// Whole-request deadline, connect to last body byte. Default 30 s: an
    /// add of 10,000 messages is a few MB, and the provider may be slow to
    /// answer; a longer hang is treated as a transient failure.
    pub request_timeout: Duration,
    /// TCP (and TLS) connect deadline. Default 5 s.
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per host. Default 32: enough for the
    /// workers' concurrent calls to reuse connections instead of paying a
    /// TLS handshake per request.
    pub pool_max_idle_per_host: usize,
}

impl ProviderConfig {
    /// Default of [`ProviderConfig::request_timeout`] (and of the worker's
    /// `--provider-timeout`).
    pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            base_url: "https://api.solapi.com".to_owned(),
            api_key: String::new(),
            api_secret: String::new(),
            request_timeout: Self::REQUEST_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            pool_max_idle_per_host: 32,
        }
    }
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Credentials are redacted: configs end up in logs.
        f.debug_struct("ProviderConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("api_secret", &"<redacted>")
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .finish()
    }
}

struct Inner {
    base_url: Url,
    api_key: String,
    api_secret: String,
}

/// A client for the provider's group API. Cloning is cheap and shares the
/// connection pool (keep-alive), so make one and clone it everywhere.
#[derive(Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    inner: Arc<Inner>,
    /// Told of every `429` ([`ProviderClient::on_rate_limited`]).
    on_rate_limited: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderClient")
            .field("base_url", &self.inner.base_url.as_str())
            .finish_non_exhaustive()
    }
}

impl ProviderClient {
    /// Builds a client. Fails (kind `Permanent`, endpoint `"client"`) on a
    /// base URL that is not an absolute http(s) URL or when the TLS backend
    /// cannot be initialised.
    pub fn new(config: ProviderConfig) -> Result<Self, ProviderError> {
        let base_url = Url::parse(&config.base_url).map_err(|e| {
            ProviderError::new(ProviderErrorKind::Permanent, "client", "invalid base_url")
                .with_source(e)
        })?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(ProviderError::new(
                ProviderErrorKind::Permanent,
                "client",
                "base_url must be an http(s) URL",
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.connect_timeout)
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| {
                ProviderError::new(
                    ProviderErrorKind::Permanent,
                    "client",
                    "cannot build HTTP client",
                )
                .with_source(e)
            })?;
        Ok(ProviderClient {
            http,
            inner: Arc::new(Inner {
                base_url,
                api_key: config.api_key,
                api_secret: config.api_secret,
            }),
            on_rate_limited: None,
        })
    }

    /// Calls `f` whenever the provider answers `429`, before the error is
    /// returned: the workers' rate limiter learns the provider's pace from
    /// it (`--rate-limit auto`).
    pub(crate) fn on_rate_limited(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_rate_limited = Some(Arc::new(f));
        self
    }

    /// The base URL requests go to.
    pub fn base_url(&self) -> &str {
        self.inner.base_url.as_str()
    }

    /// `POST /messages/v4/groups`: creates a `PENDING` group with these
    /// custom fields (duplicates not allowed, so retried adds answer `1026`).
    pub async fn create_group(
        &self,
        custom_fields: &BTreeMap<String, String>,
    ) -> Result<Group, ProviderError> {
        self.create_group_with(&CreateGroupRequest {
            allow_duplicates: false,
            custom_fields: custom_fields.clone(),
        })
        .await
    }

    /// `POST /messages/v4/groups` with every option of the request body.
    pub async fn create_group_with(
        &self,
        req: &CreateGroupRequest,
    ) -> Result<Group, ProviderError> {
        const EP: &str = "create";
        let body = to_json(EP, req)?;
        let url = self.url(&[]);
        let group: Group = self.call(EP, Method::POST, url, Some(body)).await?;
        tracing::debug!(endpoint = EP, group_id = %group.group_id, "provider group created");
        Ok(group)
    }

    /// `PUT /messages/v4/groups/{groupId}/messages`, split into requests of
    /// at most [`MAX_MESSAGES_PER_REQUEST`] sent one after the other. Returns
    /// one [`Registration`] per message, in input order.
    ///
    /// If a later request fails, the earlier ones were registered: retry the
    /// whole call (into the same group), the provider answers
    /// [`Registration::Duplicate`] for those, so nothing is sent twice.
    pub async fn add_messages(
        &self,
        group_id: &str,
        messages: &[Message],
    ) -> Result<Vec<Registration>, ProviderError> {
        let mut out = Vec::with_capacity(messages.len());
        for chunk in messages.chunks(MAX_MESSAGES_PER_REQUEST) {
            let resp = self.add_messages_once(group_id, chunk).await?;
            out.extend(resp.result_list.iter().map(Registration::from_result));
        }
        Ok(out)
    }

    /// One add request, as the provider answers it (with `errorCount` and
    /// the raw per-message results). At most [`MAX_MESSAGES_PER_REQUEST`]
    /// messages, else the provider answers `413`. Fails with
    /// `InvalidResponse` unless there is exactly one result per message.
    pub async fn add_messages_once(
        &self,
        group_id: &str,
        messages: &[Message],
    ) -> Result<AddMessagesResponse, ProviderError> {
        const EP: &str = "add";
        let body = to_json(EP, &AddMessagesRequest { messages })?;
        let url = self.url(&[group_id, "messages"]);
        let resp: AddMessagesResponse = self.call(EP, Method::PUT, url, Some(body)).await?;
        if resp.result_list.len() != messages.len() {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                EP,
                format!(
                    "{} results for {} messages",
                    resp.result_list.len(),
                    messages.len()
                ),
            )
            .with_status(200));
        }
        tracing::debug!(
            endpoint = EP,
            group_id,
            messages = messages.len(),
            error_count = resp.error_count,
            "provider messages added"
        );
        Ok(resp)
    }

    /// One add request with a body the caller encoded (`{"messages":[...]}`
    /// with `messages` messages, at most [`MAX_MESSAGES_PER_REQUEST`]),
    /// answered as an [`AddSummary`]: the lean twin of
    /// [`add_messages_once`](Self::add_messages_once) for callers that only
    /// need each message's status, not its id. Fails with `InvalidResponse`
    /// unless there is exactly one result per message.
    pub(crate) async fn add_messages_json(
        &self,
        group_id: &str,
        body: Vec<u8>,
        messages: usize,
    ) -> Result<AddSummary, ProviderError> {
        const EP: &str = "add";
        let url = self.url(&[group_id, "messages"]);
        let bytes = self.execute(EP, Method::PUT, url, Some(body)).await?;
        let summary = AddSummary::from_json(&bytes).map_err(|e| {
            ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                EP,
                "answer does not match the contract",
            )
            .with_source(e)
        })?;
        if summary.results != messages {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                EP,
                format!("{} results for {} messages", summary.results, messages),
            )
            .with_status(200));
        }
        tracing::debug!(
            endpoint = EP,
            group_id,
            messages,
            error_count = summary.error_count,
            "provider messages added"
        );
        Ok(summary)
    }

    /// `POST /messages/v4/groups/{groupId}/send`: triggers the send. A group
    /// already sent fails with kind [`ProviderErrorKind::AlreadySent`]
    /// (decision [`AlreadyDone`](super::RetryDecision::AlreadyDone)).
    pub async fn send_group(&self, group_id: &str) -> Result<Group, ProviderError> {
        const EP: &str = "send";
        let url = self.url(&[group_id, "send"]);
        let group: Group = self.call(EP, Method::POST, url, None).await?;
        tracing::debug!(endpoint = EP, group_id, status = ?group.status, "provider group sent");
        Ok(group)
    }

    /// `GET /messages/v4/groups/{groupId}`.
    pub async fn get_group(&self, group_id: &str) -> Result<Group, ProviderError> {
        let url = self.url(&[group_id]);
        self.call("get", Method::GET, url, None).await
    }

    /// `GET /messages/v4/list?groupId=..&limit=..[&startKey=..]`: one page
    /// of a group's messages with their status (delivery results once
    /// sent). `limit` is 1 to 500 (else `400`, kind `Permanent`); pass a
    /// page's [`next_key`](MessagePage::next_key) as the next call's
    /// `start_key` until it is `None`. An unknown group is an empty page.
    /// Errors and retry classification as [`get_group`](Self::get_group).
    pub async fn list_messages(
        &self,
        group_id: &str,
        start_key: Option<&str>,
        limit: u32,
    ) -> Result<MessagePage, ProviderError> {
        let mut url = self.url_at(&["messages", "v4", "list"]);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("groupId", group_id)
                .append_pair("limit", &limit.to_string());
            if let Some(k) = start_key {
                q.append_pair("startKey", k);
            }
        }
        self.call("messages", Method::GET, url, None).await
    }

    /// `DELETE /messages/v4/groups/{groupId}`: only a `PENDING` group
    /// (else `400 NotOperationalStatus`, kind `Permanent`). The answer's
    /// body is not needed and not parsed.
    pub async fn delete_group(&self, group_id: &str) -> Result<(), ProviderError> {
        const EP: &str = "delete";
        let url = self.url(&[group_id]);
        self.execute(EP, Method::DELETE, url, None).await?;
        tracing::debug!(endpoint = EP, group_id, "provider group deleted");
        Ok(())
    }

    /// `GET /messages/v4/groups?limit=1`: lists at most one of the
    /// account's groups and changes nothing. The worker calls it at start:
    /// an authenticated request that cannot harm, to learn whether the
    /// provider accepts the credentials before any batch depends on them.
    /// The answer's body is not needed and not parsed.
    pub(crate) async fn check_credentials(&self) -> Result<(), ProviderError> {
        let mut url = self.url(&[]);
        url.query_pairs_mut().append_pair("limit", "1");
        self.execute("list", Method::GET, url, None).await?;
        Ok(())
    }

    /// `<base>/messages/v4/groups/<segments...>`, each segment escaped.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.url_at(&["messages", "v4", "groups"]);
        // `new` checked that the base URL can have path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.extend(segments);
        }
        url
    }

    /// `<base>/<segments...>`, each segment escaped.
    fn url_at(&self, segments: &[&str]) -> Url {
        let mut url = self.inner.base_url.clone();
        // `new` checked that the base URL can have path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    async fn call<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<T, ProviderError> {
        let bytes = self.execute(endpoint, method, url, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                endpoint,
                "answer does not match the contract",
            )
            .with_source(e)
        })
    }

    /// Sends one signed request and returns the body of a 2xx answer; any
    /// other outcome becomes a classified [`ProviderError`]. Records the
    /// request metrics.
    async fn execute(
        &self,
        endpoint: &'static str,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ProviderError> {
        // A fresh date and salt per request: the provider refuses a
        // signature it has already seen, and that includes our own retries.
        let authz = auth::authorization(
            &self.inner.api_key,
            &self.inner.api_secret,
            &auth::now_date(),
            &auth::new_salt(),
        );
        let mut req = self
            .http
            .request(method.clone(), url)
            .header(AUTHORIZATION, authz);
        if let Some(body) = body {
            req = req.header(CONTENT_TYPE, "application/json").body(body);
        }
        let started = Instant::now();
        let result = async {
            let resp = req.send().await.map_err(|e| transport(endpoint, e))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            // Reading the body is part of the call: a connection dropped
            // mid-body is a transport failure, whatever the status said.
            let bytes = resp.bytes().await.map_err(|e| transport(endpoint, e))?;
            Ok::<_, ProviderError>((status, headers, bytes))
        }
        .await;
        let elapsed = started.elapsed();
        metrics::histogram!(METRIC_DURATION, "endpoint" => endpoint).record(elapsed.as_secs_f64());
        let (status, headers, bytes) = match result {
            Ok(r) => r,
            Err(e) => {
                metrics::counter!(METRIC_REQUESTS, "endpoint" => endpoint, "status" => "error")
                    .increment(1);
                tracing::debug!(
                    endpoint,
                    %method,
                    elapsed_ms = elapsed.as_millis() as u64,
                    error = %e,
                    "provider request failed"
                );
                return Err(e);
            }
        };
        metrics::counter!(METRIC_REQUESTS, "endpoint" => endpoint, "status" => status.to_string())
            .increment(1);
        tracing::debug!(
            endpoint,
            %method,
            status,
            elapsed_ms = elapsed.as_millis() as u64,
            "provider request"
        );
        if (200..300).contains(&status) {
            return Ok(bytes);
        }
        let err = status_error(endpoint, status, &headers, &bytes);
        if err.kind() == ProviderErrorKind::RateLimited {
            if let Some(f) = &self.on_rate_limited {
                f();
            }
        }
        Err(err)
    }
}

fn to_json<T: serde::Serialize>(endpoint: &'static str, v: &T) -> Result<Vec<u8>, ProviderError> {
    serde_json::to_vec(v).map_err(|e| {
        ProviderError::new(
            ProviderErrorKind::Permanent,
            endpoint,
            "cannot encode request",
        )
        .with_source(e)
    })
}

/// A request that got no complete answer: transient, except for our own bugs
/// (a request that could not even be built).
fn transport(endpoint: &'static str, e: reqwest::Error) -> ProviderError {
    let (kind, what) = if e.is_builder() {
        (ProviderErrorKind::Permanent, "cannot build request")
    } else if e.is_timeout() {
        (ProviderErrorKind::Transient, "timed out")
    } else if e.is_connect() {
        (ProviderErrorKind::Transient, "cannot connect")
    } else if e.is_body() || e.is_decode() {
        (ProviderErrorKind::Transient, "answer cut short")
    } else {
        (ProviderErrorKind::Transient, "connection failed")
    };
    // reqwest errors carry the URL (base URL and group id), never headers;
    // a token in the base URL's userinfo or query is masked.
    ProviderError::new(kind, endpoint, what).with_source(crate::redact::reqwest_error(e))
}

fn status_error(
    endpoint: &'static str,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
) -> ProviderError {
    let kind = kind_for_status(endpoint, status);
    let mut err = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => ProviderError::new(kind, endpoint, b.error_message).with_error_code(b.error_code),
        // A proxy's HTML error page, for instance: keep a short excerpt.
        Err(_) => ProviderError::new(
            kind,
            endpoint,
            String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        ),
    }
    .with_status(status);
    if kind == ProviderErrorKind::RateLimited {
        err = err.with_retry_after(parse_retry_after(headers));
    }
    err
}

/// `Retry-After` in seconds (integer or decimal); missing, negative or
/// unreadable (including the HTTP-date form, which no provider here uses)
/// gives [`DEFAULT_RETRY_AFTER`].
fn parse_retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_retry_after(&h), DEFAULT_RETRY_AFTER);
        h.insert(RETRY_AFTER, HeaderValue::from_static("5"));
        assert_eq!(parse_retry_after(&h), Duration::from_secs(5));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.5"));
        assert_eq!(parse_retry_after(&h), Duration::from_millis(500));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(parse_retry_after(&h), DEFAULT_RETRY_AFTER);
        h.insert(RETRY_AFTER, HeaderValue::from_static("-3"));
        assert_eq!(parse_retry_after(&h), DEFAULT_RETRY_AFTER);
    }

    #[test]
    fn urls_and_debug() {
        let c = ProviderClient::new(ProviderConfig {
            base_url: "http://127.0.0.1:1/prefix/".into(),
            api_key: "KEY123".into(),
            api_secret: "SECRET456".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            c.url(&["G4V/x", "send"]).as_str(),
            "http://127.0.0.1:1/prefix/messages/v4/groups/G4V%2Fx/send"
        );
        assert_eq!(
            c.url_at(&["messages", "v4", "list"]).as_str(),
            "http://127.0.0.1:1/prefix/messages/v4/list"
        );
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("KEY123") && !dbg.contains("SECRET456"));
        let cfg = ProviderConfig {
            api_key: "KEY123".into(),
            api_secret: "SECRET456".into(),
            ..Default::default()
        };
        let dbg = format!("{cfg:?}");
        assert!(
            !dbg.contains("KEY123") && !dbg.contains("SECRET456"),
            "{dbg}"
        );
        assert!(ProviderClient::new(ProviderConfig {
            base_url: "mailto:x@y".into(),
            ..Default::default()
        })
        .is_err());
    }
}
