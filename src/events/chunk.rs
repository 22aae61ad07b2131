//! The ingest format: one chunk of a batch, as an upstream producer writes it.
//!
//! An ingest stream entry has the fields `v` (`1`), `t` (`chunk`) and `d` (a
//! MessagePack map of [`Chunk`]). See `schemas/chunk.schema.json`.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::{clip, QUOTE_MAX};
use crate::keys::{validate_batch_id, BatchIdError};

/// The most recipients one chunk may carry (one provider add request).
pub const MAX_CHUNK_RECIPIENTS: usize = 10_000;
/// The largest encoded chunk accepted, in bytes.
pub const MAX_CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// The longest template text, in characters.
pub const MAX_TEXT_CHARS: usize = 4_000;
/// The longest template variable value, in characters.
pub const MAX_VAR_CHARS: usize = 1_000;
/// The longest sender number (`from`), in characters.
pub const MAX_SENDER_CHARS: usize = 32;
/// The longest Kakao channel or template id, in characters.
pub const MAX_KAKAO_ID_CHARS: usize = 128;

/// One chunk of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The batch (campaign) id: `[A-Za-z0-9._-]{1,128}`.
    pub batch: String,
    /// Sequence number, 0-based.
    pub seq: u32,
    /// Whether this is the last chunk of the batch.
    pub last: bool,
    /// The message template shared by the batch.
    pub template: Template,
    /// The recipients.
    pub recipients: Vec<Recipient>,
}

/// A message template in the provider's shape, with `#{name}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// `SMS`, `LMS`, `ATA` (AlimTalk) or `CTA`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The sender number.
    pub from: String,
    /// The text, with `#{name}` placeholders filled from each recipient's vars.
    pub text: String,
    /// Kakao options, required for `ATA`/`CTA`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kakao_options: Option<KakaoTemplate>,
}

/// The Kakao part of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KakaoTemplate {
    /// Kakao channel id.
    pub pf_id: String,
    /// Approved template id.
    pub template_id: String,
}

/// One recipient and its template variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipient {
    /// The phone number.
    pub to: String,
    /// Values for the template's placeholders, by name (without `#{}`).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
}

/// Why a chunk is refused. Each one dead-letters the chunk.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChunkError {
    /// The batch id is unsafe.
    #[error("invalid batch id: {0}")]
    BatchId(#[from] BatchIdError),
    /// No recipients.
    #[error("chunk has no recipients")]
    Empty,
    /// Too many recipients.
    #[error("chunk has {0} recipients; at most {MAX_CHUNK_RECIPIENTS} are allowed")]
    TooManyRecipients(usize),
    /// The encoded entry is too large.
    #[error("chunk is {0} bytes; at most {MAX_CHUNK_BYTES} are allowed")]
    TooLarge(usize),
    /// Unknown message type.
    #[error("template type {:?} is not one of SMS, LMS, ATA, CTA", clip(.0, QUOTE_MAX))]
    BadType(String),
    /// AlimTalk without Kakao options.
    #[error("template type {0} needs kakao_options (pf_id, template_id)")]
    MissingKakao(String),
    /// Text too long.
    #[error("template text is {0} characters; at most {MAX_TEXT_CHARS} are allowed")]
    TextTooLong(usize),
    /// Sender missing.
    #[error("template has no `from` number")]
    NoSender,
    /// A template field other than the text is too long.
    #[error("template field `{field}` is {len} characters; at most {max} are allowed")]
    FieldTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A recipient's number is empty or absurdly long.
    #[error("recipient {index} has an unusable number {:?}", clip(.to, QUOTE_MAX))]
    BadNumber {
        /// Position in the chunk.
        index: usize,
        /// The number as given.
        to: String,
    },
    /// The same number twice in one chunk.
    #[error("recipient {index} repeats the number {:?}", clip(.to, QUOTE_MAX))]
    DuplicateRecipient {
        /// Position in the chunk.
        index: usize,
        /// The repeated number.
        to: String,
    },
    /// A placeholder without a value.
    #[error("recipient {index} has no value for placeholder #{{{}}}", clip(.name, QUOTE_MAX))]
    MissingVariable {
        /// Position in the chunk.
        index: usize,
        /// The placeholder's name.
        name: String,
    },
    /// A variable value is too long.
    #[error(
        "recipient {index} variable {} is longer than {MAX_VAR_CHARS} characters",
        clip(.name, QUOTE_MAX)
    )]
    VariableTooLong {
        /// Position in the chunk.
        index: usize,
        /// The variable's name.
        name: String,
    },
}

impl Template {
    /// The placeholder names used in the text, in order of first use.
    pub fn placeholders(&self) -> Vec<String> {
        placeholders(&self.text)
    }

    /// Checks the template on its own.
    pub fn validate(&self) -> Result<(), ChunkError> {
        if !matches!(self.kind.as_str(), "SMS" | "LMS" | "ATA" | "CTA") {
            return Err(ChunkError::BadType(self.kind.clone()));
        }
        if matches!(self.kind.as_str(), "ATA" | "CTA") && self.kakao_options.is_none() {
            return Err(ChunkError::MissingKakao(self.kind.clone()));
        }
        if self.from.trim().is_empty() {
            return Err(ChunkError::NoSender);
        }
        let mut fields = vec![("from", &self.from, MAX_SENDER_CHARS)];
        if let Some(k) = &self.kakao_options {
            fields.push(("kakaoOptions.pfId", &k.pf_id, MAX_KAKAO_ID_CHARS));
            fields.push((
                "kakaoOptions.templateId",
                &k.template_id,
                MAX_KAKAO_ID_CHARS,
            ));
        }
        for (field, value, max) in fields {
            let len = value.chars().count();
            if len > max {
                return Err(ChunkError::FieldTooLong { field, len, max });
            }
        }
        let chars = self.text.chars().count();
        if chars > MAX_TEXT_CHARS {
            return Err(ChunkError::TextTooLong(chars));
        }
        Ok(())
    }

    /// The text with `#{name}` replaced by `vars[name]`.
    pub fn render(&self, vars: &BTreeMap<String, String>) -> String {
        let mut out = String::with_capacity(self.text.len() + 16);
        let mut rest = self.text.as_str();
        while let Some(start) = rest.find("#{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    let name = &after[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&rest[start..start + 2 + end + 1]),
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// Names of the `#{name}` placeholders in a text.
pub fn placeholders(text: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("#{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        rest = &after[end + 1..];
    }
    names
}

impl Chunk {
    /// Checks everything that can be checked without the batch's state.
    pub fn validate(&self) -> Result<(), ChunkError> {
        validate_batch_id(&self.batch)?;
        self.template.validate()?;
        if self.recipients.is_empty() {
            return Err(ChunkError::Empty);
        }
        if self.recipients.len() > MAX_CHUNK_RECIPIENTS {
            return Err(ChunkError::TooManyRecipients(self.recipients.len()));
        }
        // The same limit as `decode`'s, so that a producer (`submit`, or the
        // Rust API) never appends a chunk that the worker would refuse.
        let bytes = self.encode().len();
        if bytes > MAX_CHUNK_BYTES {
            return Err(ChunkError::TooLarge(bytes));
        }
        let names = self.template.placeholders();
        let mut seen = HashSet::with_capacity(self.recipients.len());
        for (index, r) in self.recipients.iter().enumerate() {
            if r.to.is_empty() || r.to.len() > 32 {
                return Err(ChunkError::BadNumber {
                    index,
                    to: r.to.clone(),
                });
            }
            if !seen.insert(r.to.as_str()) {
                return Err(ChunkError::DuplicateRecipient {
                    index,
                    to: r.to.clone(),
                });
            }
            for name in &names {
                if !r.vars.contains_key(name) {
                    return Err(ChunkError::MissingVariable {
                        index,
                        name: name.clone(),
                    });
                }
            }
            if let Some((name, _)) = r
                .vars
                .iter()
                .find(|(_, v)| v.chars().count() > MAX_VAR_CHARS)
            {
                return Err(ChunkError::VariableTooLong {
                    index,
                    name: name.clone(),
                });
            }
        }
        Ok(())
    }

    /// A digest of the chunk's content. Two deliveries of the same chunk have
    /// the same digest whatever encoder wrote them (the digest is taken over
    /// our own canonical re-encoding, with variables in name order).
    pub fn digest(&self) -> String {
        let canonical = super::encode_payload(self);
        let hash = Sha256::digest(&canonical);
        hex::encode(&hash[..8])
    }

    /// Encodes the chunk (the `d` field of an ingest entry).
    pub fn encode(&self) -> Vec<u8> {
        super::encode_payload(self)
    }

    /// Decodes an ingest `d` field, refusing oversized input before parsing it.
    pub fn decode(bytes: &[u8]) -> Result<Chunk, super::DecodeError> {
        if bytes.len() > MAX_CHUNK_BYTES {
            return Err(super::DecodeError::TooLarge(bytes.len()));
        }
        super::decode_payload("chunk", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(text: &str) -> Template {
        Template {
            kind: "SMS".into(),
            from: "0212345678".into(),
            text: text.into(),
            kakao_options: None,
        }
    }

    #[test]
    fn renders_placeholders() {
        let t = template("Hi #{name}, code #{code}. #{missing} #{");
        let vars = BTreeMap::from([
            ("name".to_string(), "Kim".to_string()),
            ("code".to_string(), "42".to_string()),
        ]);
        assert_eq!(t.render(&vars), "Hi Kim, code 42. #{missing} #{");
        assert_eq!(t.placeholders(), vec!["name", "code", "missing"]);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = Chunk {
            batch: "b1".into(),
            seq: 0,
            last: true,
            template: template("Hi #{name}"),
            recipients: vec![Recipient {
                to: "01012345678".into(),
                vars: BTreeMap::new(),
            }],
        };
        assert_eq!(
            c.validate(),
            Err(ChunkError::MissingVariable {
                index: 0,
                name: "name".into()
            })
        );
        c.recipients[0].vars.insert("name".into(), "Lee".into());
        assert_eq!(c.validate(), Ok(()));
        c.recipients.push(c.recipients[0].clone());
        assert!(matches!(
            c.validate(),
            Err(ChunkError::DuplicateRecipient { index: 1, .. })
        ));
        c.batch = "a{b}".into();
        assert!(matches!(c.validate(), Err(ChunkError::BatchId(_))));
    }

    #[test]
    fn digest_ignores_encoding_but_not_content() {
        let c = Chunk {
            batch: "b1".into(),
            seq: 3,
            last: false,
            template: template("x"),
            recipients: vec![Recipient {
                to: "01012345678".into(),
                vars: BTreeMap::new(),
            }],
        };
        let mut d = c.clone();
        assert_eq!(c.digest(), d.digest());
        d.recipients[0].to = "01012345679".into();
        assert_ne!(c.digest(), d.digest());
    }
}
