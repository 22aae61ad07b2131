//! The provider's request signing: `HMAC-SHA256` over `date + salt`.
//!
//! ```text
//! Authorization: HMAC-SHA256 apiKey=<key>, date=<ISO-8601>, salt=<12-64 bytes>, signature=<hex>
//! signature = hex(HMAC_SHA256(key = api_secret, message = date + salt))
//! ```
//!
//! The client side is [`authorization`]; the verifying side (used by the mock)
//! is [`parse_authorization`] followed by [`AuthHeader::verify`] and
//! [`check_date`]. Replay detection needs state and lives in the mock.

use std::time::{Duration, SystemTime};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The scheme word that starts the header.
pub(crate) const SCHEME: &str = "HMAC-SHA256";
/// How far a request's date may be from the server's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
/// Shortest salt the provider accepts, in bytes.
pub(crate) const SALT_MIN_LEN: usize = 12;
/// Longest salt the provider accepts, in bytes.
pub(crate) const SALT_MAX_LEN: usize = 64;

/// Hex signature of `date + salt` under `api_secret`.
pub fn signature(api_secret: &str, date: &str, salt: &str) -> String {
    hex::encode(raw_signature(api_secret, date, salt))
}

fn mac(api_secret: &str, date: &str, salt: &str) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail; the fallback
    // keeps the function total without an unwrap.
    let mut mac = match HmacSha256::new_from_slice(api_secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => HmacSha256::new(&Default::default()),
    };
    mac.update(date.as_bytes());
    mac.update(salt.as_bytes());
    mac
}

fn raw_signature(api_secret: &str, date: &str, salt: &str) -> [u8; 32] {
    mac(api_secret, date, salt).finalize().into_bytes().into()
}

/// The full `Authorization` header value for one request.
///
/// `date` must be the request time in ISO-8601 (see [`now_date`]) and `salt`
/// a fresh random string for every request (see [`new_salt`]): the provider
/// refuses a signature it has seen before.
pub fn authorization(api_key: &str, api_secret: &str, date: &str, salt: &str) -> String {
    format!(
        "{SCHEME} apiKey={api_key}, date={date}, salt={salt}, signature={}",
        signature(api_secret, date, salt)
    )
}

/// A fresh salt: 16 random bytes as 32 hex characters (within 12-64 bytes
/// whether the provider counts the hex text or the raw bytes).
pub fn new_salt() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The current time as the provider wants it: RFC 3339 in UTC with
/// milliseconds, e.g. `2024-05-01T12:34:56.789Z`.
pub fn now_date() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Why a request's authentication was refused. Every variant is answered
/// `403` with [`AuthError::error_code`] as `errorCode`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The header is missing or not of the documented form; the string says
    /// what is wrong.
    #[error("malformed Authorization header: {0}")]
    Malformed(&'static str),
    /// The API key is not the provider's.
    #[error("invalid API key")]
    InvalidApiKey,
    /// The signature does not match `HMAC(secret, date + salt)`.
    #[error("signature does not match")]
    SignatureDoesNotMatch,
    /// The date is more than [`MAX_SKEW`] away from the server's clock.
    #[error("request time too skewed")]
    RequestTimeTooSkewed,
    /// This exact signature was already used.
    #[error("duplicated signature")]
    DuplicatedSignature,
}

impl AuthError {
    /// The provider's `errorCode` for this failure.
    ///
    /// The contract names no code for a malformed header; the mock answers
    /// `InvalidAuthorizationHeader`.
    pub fn error_code(&self) -> &'static str {
        match self {
            AuthError::Malformed(_) => "InvalidAuthorizationHeader",
            AuthError::InvalidApiKey => "InvalidAPIKey",
            AuthError::SignatureDoesNotMatch => "SignatureDoesNotMatch",
            AuthError::RequestTimeTooSkewed => "RequestTimeTooSkewed",
            AuthError::DuplicatedSignature => "DuplicatedSignature",
        }
    }
}

/// The four fields of a parsed `Authorization` header, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthHeader<'a> {
    /// `apiKey=`
    pub api_key: &'a str,
    /// `date=` (ISO-8601, not yet checked against the clock)
    pub date: &'a str,
    /// `salt=`
    pub salt: &'a str,
    /// `signature=` (64 hex characters)
    pub signature: &'a str,
}

/// Parses the header's form: scheme `HMAC-SHA256`, then exactly the four
/// fields `apiKey`, `date`, `salt`, `signature` (any order, comma-separated,
/// spaces allowed around commas), each once and non-empty; a salt of 12-64
/// bytes; a signature of 64 hex digits; a date that parses as ISO-8601.
pub fn parse_authorization(header: &str) -> Result<AuthHeader<'_>, AuthError> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once(|c: char| c.is_ascii_whitespace())
        .ok_or(AuthError::Malformed("expected `HMAC-SHA256 <fields>`"))?;
    if scheme != SCHEME {
        return Err(AuthError::Malformed("scheme is not HMAC-SHA256"));
    }
    let (mut api_key, mut date, mut salt, mut signature) = (None, None, None, None);
    for part in rest.split(',') {
        let (name, value) = part
            .trim()
            .split_once('=')
            .ok_or(AuthError::Malformed("field without `=`"))?;
        let slot = match name.trim() {
            "apiKey" => &mut api_key,
            "date" => &mut date,
            "salt" => &mut salt,
            "signature" => &mut signature,
            _ => return Err(AuthError::Malformed("unknown field")),
        };
        if slot.is_some() {
            return Err(AuthError::Malformed("repeated field"));
        }
        let value = value.trim();
        if value.is_empty() || value.contains(char::is_whitespace) {
            return Err(AuthError::Malformed("empty or spaced value"));
        }
        *slot = Some(value);
    }
    let h = AuthHeader {
        api_key: api_key.ok_or(AuthError::Malformed("missing apiKey"))?,
        date: date.ok_or(AuthError::Malformed("missing date"))?,
        salt: salt.ok_or(AuthError::Malformed("missing salt"))?,
        signature: signature.ok_or(AuthError::Malformed("missing signature"))?,
    };
    if !(SALT_MIN_LEN..=SALT_MAX_LEN).contains(&h.salt.len()) {
        return Err(AuthError::Malformed("salt must be 12-64 bytes"));
    }
    if h.signature.len() != 64 || !h.signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AuthError::Malformed("signature must be 64 hex digits"));
    }
    parse_date(h.date).ok_or(AuthError::Malformed("date is not ISO-8601"))?;
    Ok(h)
}

impl AuthHeader<'_> {
    /// Checks the key and the signature (in constant time). On success
    /// returns the raw signature bytes, which the verifier remembers to
    /// refuse replays.
    pub fn verify(&self, api_key: &str, api_secret: &str) -> Result<[u8; 32], AuthError> {
        if self.api_key != api_key {
            return Err(AuthError::InvalidApiKey);
        }
        let mut raw = [0u8; 32];
        hex::decode_to_slice(self.signature, &mut raw)
            .map_err(|_| AuthError::Malformed("signature must be 64 hex digits"))?;
        mac(api_secret, self.date, self.salt)
            .verify_slice(&raw)
            .map_err(|_| AuthError::SignatureDoesNotMatch)?;
        Ok(raw)
    }
}

/// Checks that `date` is within [`MAX_SKEW`] of `now`, either way.
pub fn check_date(date: &str, now: SystemTime) -> Result<(), AuthError> {
    let t = parse_date(date).ok_or(AuthError::Malformed("date is not ISO-8601"))?;
    let skew = match now.duration_since(t) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    if skew > MAX_SKEW {
        Err(AuthError::RequestTimeTooSkewed)
    } else {
        Ok(())
    }
}

/// Parses an ISO-8601 / RFC 3339 time: `2024-05-01T12:34:56Z`, with optional
/// fractional seconds, and a `Z` or a `±HH:MM` / `±HHMM` offset (SDKs of the
/// real service send both).
pub fn parse_date(s: &str) -> Option<SystemTime> {
    // The offset, if any, follows the seconds: past "YYYY-MM-DDTHH:MM:SS".
    const TIME_END: usize = 19;
    if s.len() > TIME_END && s.is_char_boundary(TIME_END) {
        let tail = &s[TIME_END..];
        if let Some(pos) = tail.rfind(['+', '-']) {
            let idx = TIME_END + pos;
            let (base, off) = s.split_at(idx);
            let sign = if off.starts_with('-') { -1i64 } else { 1 };
            let digits: String = off[1..].chars().filter(|c| *c != ':').collect();
            if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let hours: u64 = digits[..2].parse().ok()?;
            let mins: u64 = digits[2..].parse().ok()?;
            if hours > 23 || mins > 59 {
                return None;
            }
            let off = Duration::from_secs(hours * 3600 + mins * 60);
            let local = humantime::parse_rfc3339_weak(base).ok()?;
            // local time = UTC + offset, so UTC = local - offset.
            return if sign > 0 {
                local.checked_sub(off)
            } else {
                local.checked_add(off)
            };
        }
    }
    humantime::parse_rfc3339_weak(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let date = now_date();
        let salt = new_salt();
        let h = authorization("key", "secret", &date, &salt);
        let p = parse_authorization(&h).unwrap();
        assert_eq!(p.api_key, "key");
        assert_eq!(p.salt, salt);
        p.verify("key", "secret").unwrap();
        assert_eq!(p.verify("other", "secret"), Err(AuthError::InvalidApiKey));
        assert_eq!(
            p.verify("key", "other"),
            Err(AuthError::SignatureDoesNotMatch)
        );
        check_date(p.date, SystemTime::now()).unwrap();
    }

    #[test]
    fn malformed() {
        let sig = "a".repeat(64);
        for bad in [
            String::new(),
            "HMAC-SHA256".to_owned(),
            format!("Bearer apiKey=k, date=2024-01-01T00:00:00Z, salt=0123456789ab, signature={sig}"),
            format!("HMAC-SHA256 apiKey=k, date=2024-01-01T00:00:00Z, signature={sig}"),
            format!("HMAC-SHA256 apiKey=k, date=2024-01-01T00:00:00Z, salt=short, signature={sig}"),
            format!("HMAC-SHA256 apiKey=k, date=yesterday, salt=0123456789ab, signature={sig}"),
            "HMAC-SHA256 apiKey=k, date=2024-01-01T00:00:00Z, salt=0123456789ab, signature=zz".to_owned(),
            format!("HMAC-SHA256 apiKey=k, apiKey=k, date=2024-01-01T00:00:00Z, salt=0123456789ab, signature={sig}"),
        ] {
            assert!(
                matches!(parse_authorization(&bad), Err(AuthError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dates_with_offsets() {
        let z = parse_date("2024-01-01T09:00:00Z").unwrap();
        assert_eq!(parse_date("2024-01-01T18:00:00+09:00"), Some(z));
        assert_eq!(parse_date("2024-01-01T18:00:00.000+0900"), Some(z));
        assert_eq!(parse_date("2024-01-01T08:30:00-00:30"), Some(z));
        assert_eq!(
            parse_date("2024-01-01T09:00:00.123Z").map(|t| t > z),
            Some(true)
        );
        assert_eq!(parse_date("2024-01-01T09:00:00+9"), None);
    }

    #[test]
    fn skew() {
        let now = parse_date("2024-01-01T09:00:00Z").unwrap();
        check_date("2024-01-01T09:14:59Z", now).unwrap();
        check_date("2024-01-01T08:45:01Z", now).unwrap();
        assert_eq!(
            check_date("2024-01-01T09:15:01Z", now),
            Err(AuthError::RequestTimeTooSkewed)
        );
        assert_eq!(
            check_date("2024-01-01T08:44:59Z", now),
            Err(AuthError::RequestTimeTooSkewed)
        );
    }
}
