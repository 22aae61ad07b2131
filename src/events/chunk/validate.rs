//! What a chunk may be: the limits, and the checks that need nothing but
//! the chunk (the batch's state decides the rest, in the accept script).

use thiserror::Error;

use super::codec;
use super::model::{placeholders, Chunk, ChunkRef, Parts, RecipientFields, Template, TemplateRef};
use crate::batch_id::{validate_batch_id, BatchIdError};
use crate::events::options::{check_ad_text, AdTextError, OptionsError};
use crate::events::{clip, QUOTE_MAX};

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
    /// The batch options are unusable.
    #[error("chunk options: {0}")]
    Options(#[from] OptionsError),
    /// An advertising batch's text lacks what the law asks of it.
    #[error("{0}")]
    AdText(#[from] AdTextError),
}

impl Template {
    /// Checks the template on its own.
    pub fn validate(&self) -> Result<(), ChunkError> {
        self.view().validate()
    }
}

impl TemplateRef<'_> {
    /// Checks the template on its own (as [`Template::validate`]).
    pub fn validate(&self) -> Result<(), ChunkError> {
        if !matches!(self.kind, "SMS" | "LMS" | "ATA" | "CTA") {
            return Err(ChunkError::BadType(self.kind.to_string()));
        }
        if matches!(self.kind, "ATA" | "CTA") && self.kakao_options.is_none() {
            return Err(ChunkError::MissingKakao(self.kind.to_string()));
        }
        if self.from.trim().is_empty() {
            return Err(ChunkError::NoSender);
        }
        let mut fields = [
            ("from", self.from, MAX_SENDER_CHARS),
            ("", "", 0),
            ("", "", 0),
        ];
        if let Some(k) = &self.kakao_options {
            fields[1] = ("kakaoOptions.pfId", k.pf_id, MAX_KAKAO_ID_CHARS);
            fields[2] = ("kakaoOptions.templateId", k.template_id, MAX_KAKAO_ID_CHARS);
        }
        for (field, value, max) in fields {
            let len = value.chars().count();
            if len > max {
                return Err(ChunkError::FieldTooLong { field, len, max });
            }
        }
        // A text of at most MAX_TEXT_CHARS bytes has at most as many
        // characters: count them only when the bytes could be too many.
        if self.text.len() > MAX_TEXT_CHARS {
            let chars = self.text.chars().count();
            if chars > MAX_TEXT_CHARS {
                return Err(ChunkError::TextTooLong(chars));
            }
        }
        Ok(())
    }
}

impl Chunk {
    /// Checks everything that can be checked without the batch's state.
    pub fn validate(&self) -> Result<(), ChunkError> {
        self.parts().validate()
    }
}

impl ChunkRef<'_> {
    /// Checks everything that can be checked without the batch's state
    /// (as [`Chunk::validate`]).
    pub fn validate(&self) -> Result<(), ChunkError> {
        self.parts().validate()
    }
}

impl<R: RecipientFields> Parts<'_, R> {
    /// [`Chunk::validate`], for owned and borrowed chunks alike.
    fn validate(&self) -> Result<(), ChunkError> {
        let (template, recipients) = (&self.template, self.recipients);
        validate_batch_id(self.batch)?;
        template.validate()?;
        if !self.options.is_empty() {
            self.options.resolve()?;
        }
        // Checked here, so the worker refuses such a chunk before it
        // reaches the provider (and `submit` before it appends anything).
        if self.options.ad.is_some() {
            check_ad_text(template.text)?;
        }
        if recipients.is_empty() {
            return Err(ChunkError::Empty);
        }
        if recipients.len() > MAX_CHUNK_RECIPIENTS {
            return Err(ChunkError::TooManyRecipients(recipients.len()));
        }
        // The same limit as `decode`'s, so that a producer (`submit`, or the
        // Rust API) never appends a chunk that the worker would refuse: the
        // length of `Chunk::encode`, counted without encoding.
        let bytes = codec::encoded_len(self);
        if bytes > MAX_CHUNK_BYTES {
            return Err(ChunkError::TooLarge(bytes));
        }
        let names = placeholders(template.text);
        // A number repeated (in this chunk or across chunks) is not an
        // error: the batch-wide dedupe in `accept.lua` sends it once.
        for (index, r) in recipients.iter().enumerate() {
            let to = r.to();
            if to.is_empty() || to.len() > 32 {
                return Err(ChunkError::BadNumber {
                    index,
                    to: to.to_string(),
                });
            }
            for name in &names {
                if r.var(name).is_none() {
                    return Err(ChunkError::MissingVariable {
                        index,
                        name: name.clone(),
                    });
                }
            }
            if let Some((name, _)) = r
                .vars()
                .find(|(_, v)| v.len() > MAX_VAR_CHARS && v.chars().count() > MAX_VAR_CHARS)
            {
                return Err(ChunkError::VariableTooLong {
                    index,
                    name: name.to_string(),
                });
            }
        }
        Ok(())
    }
}
