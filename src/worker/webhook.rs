//! How a report reaches the webhook: signed as Standard Webhooks specifies
//! (<https://www.standardwebhooks.com/>), with its fields named in one
//! vocabulary (`docs/reports.md`).
//!
//! Every delivery carries `webhook-id` (the report's idempotency key, the
//! same on every retry, so a receiver can drop a second copy),
//! `webhook-timestamp` (the attempt's Unix time in seconds) and
//! `webhook-signature`: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`,
//! once per secret, space-separated, so a receiver that knows any one of the
//! secrets accepts it while they are rotated.

use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix the specification gives a secret's text.
const SECRET_PREFIX: &str = "whsec_";

/// Base64 with or without its `=` padding, as the specification's own
/// libraries read a secret.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The shortest secret accepted: the specification asks for 24 to 64 bytes.
const SECRET_MIN_BYTES: usize = 24;

/// A secret from `GROUPCAST_WEBHOOK_SECRET` that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookSecretError {
    /// The variable is set but holds no secret.
    #[error("GROUPCAST_WEBHOOK_SECRET is empty: set one or more secrets `whsec_<base64>` separated by spaces, or unset it")]
    Empty,
    /// A secret does not start with `whsec_`.
    #[error("webhook secret {0} of GROUPCAST_WEBHOOK_SECRET does not start with `whsec_`: write each secret as `whsec_` followed by base64 (e.g. `whsec_$(openssl rand -base64 32)`)")]
    NoPrefix(usize),
    /// A secret's text after `whsec_` is not base64.
    #[error("webhook secret {0} of GROUPCAST_WEBHOOK_SECRET is not base64 after `whsec_`: write e.g. `whsec_$(openssl rand -base64 32)`")]
    NotBase64(usize),
    /// A secret is too short to be safe.
    #[error("webhook secret {0} of GROUPCAST_WEBHOOK_SECRET has {1} bytes; use at least {SECRET_MIN_BYTES} (e.g. `whsec_$(openssl rand -base64 32)`)")]
    TooShort(usize, usize),
}

/// The secrets every report delivery is signed with (the first is the
/// current one; the others are kept while receivers move to it), each as
/// an HMAC-SHA256 keyed with it.
#[derive(Clone)]
pub struct WebhookSecrets(Vec<Hmac<Sha256>>);

impl fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Configs end up in logs: never the keys themselves.
        write!(f, "WebhookSecrets(<{} redacted>)", self.0.len())
    }
}

impl WebhookSecrets {
    /// Parses `whsec_<base64>` secrets separated by white space. Secrets are
    /// numbered from 1 in errors, which never quote them.
    pub fn parse(text: &str) -> Result<WebhookSecrets, WebhookSecretError> {
        let keys = text
            .split_whitespace()
            .enumerate()
            .map(|(i, s)| {
                let n = i + 1;
                let b64 = s
                    .strip_prefix(SECRET_PREFIX)
                    .ok_or(WebhookSecretError::NoPrefix(n))?;
                let key = SECRET_BASE64
                    .decode(b64)
                    .map_err(|_| WebhookSecretError::NotBase64(n))?;
                if key.len() < SECRET_MIN_BYTES {
                    return Err(WebhookSecretError::TooShort(n, key.len()));
                }
                // HMAC takes a key of any length.
                <Hmac<Sha256> as Mac>::new_from_slice(&key)
                    .map_err(|_| WebhookSecretError::TooShort(n, key.len()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(WebhookSecretError::Empty);
        }
        Ok(WebhookSecrets(keys))
    }

    /// The `webhook-signature` header for one delivery: `v1,<base64>` per
    /// secret, space-separated.
    pub fn signature(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        self.0
            .iter()
            .map(|keyed| {
                let mut mac = keyed.clone();
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp.to_string().as_bytes());
                mac.update(b".");
                mac.update(body);
                format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// How the report's fields are named in the webhook's body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FieldNames {
    /// snake_case, as in the reports stream and the board's API.
    #[default]
    Snake,
    /// the camelCase names of earlier releases (kept for one release).
    Camel,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the specification's reference libraries: secret
    /// `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id `msg_p5jXN8AQM9LWM0D4loKWxJek`,
    /// timestamp 1614265330, body `{"test": 2432232314}`.
    #[test]
    fn signs_as_the_specifications_example() {
        // The example's key is 24 bytes.
        let s = WebhookSecrets::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        assert_eq!(
            s.signature(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_secret_signs_for_rotation() {
        let a = format!("whsec_{}", STANDARD.encode([1u8; 32]));
        let b = format!("whsec_{}", STANDARD.encode([2u8; 32]));
        let both = WebhookSecrets::parse(&format!(" {a}  {b}\n")).expect("secrets");
        let one = |s: &str| {
            WebhookSecrets::parse(s)
                .expect("secret")
                .signature("i", 1, b"{}")
        };
        assert_eq!(
            both.signature("i", 1, b"{}"),
            format!("{} {}", one(&a), one(&b))
        );
        assert_ne!(one(&a), one(&b));
    }

    #[test]
    fn a_secret_not_in_the_specifications_form_is_refused_without_quoting_it() {
        let ok = format!("whsec_{}", STANDARD.encode([7u8; 32]));
        let refused = |s: &str| WebhookSecrets::parse(s).err();
        assert_eq!(refused("  "), Some(WebhookSecretError::Empty));
        assert_eq!(
            refused(&format!("{ok} hunter2")),
            Some(WebhookSecretError::NoPrefix(2))
        );
        assert_eq!(
            refused("whsec_not*base64!"),
            Some(WebhookSecretError::NotBase64(1))
        );
        assert_eq!(
            refused("whsec_c2hvcnQ="),
            Some(WebhookSecretError::TooShort(1, 5))
        );
        assert_eq!(refused(&ok), None);
        // Without its padding, as the reference libraries accept it.
        assert_eq!(refused(ok.trim_end_matches('=')), None);
        let shown = WebhookSecretError::NoPrefix(2).to_string();
        assert!(
            !shown.contains("hunter2") && shown.contains("whsec_"),
            "{shown}"
        );
        assert!(!format!("{:?}", WebhookSecrets::parse(&ok)).contains(&ok[6..]));
    }
}
