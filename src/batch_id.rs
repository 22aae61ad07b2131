//! The batch id's rules: which ids are accepted.
//!
//! Below both the keys (an id is part of every key of its batch) and the
//! events (a chunk and the batch options name batch ids), so that neither
//! imports the other for it.

use thiserror::Error;

/// Longest accepted batch id, in bytes.
pub const MAX_BATCH_ID_LEN: usize = 128;

/// Why a batch id was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BatchIdError {
    /// The id is empty.
    #[error("batch id is empty")]
    Empty,
    /// The id is longer than [`MAX_BATCH_ID_LEN`].
    #[error("batch id is {0} bytes long; at most {MAX_BATCH_ID_LEN} are allowed")]
    TooLong(usize),
    /// The id has a character outside `[A-Za-z0-9._-]`.
    #[error(
        "batch id has the character {0:?}; only letters, digits, '.', '_' and '-' are allowed"
    )]
    BadChar(char),
}

/// Checks a batch id. Only `[A-Za-z0-9._-]` is allowed, so that an id can
/// never open or close a hash tag (`{`, `}`), add a key separator (`:`), or
/// smuggle in whitespace or glob characters.
pub fn validate_batch_id(id: &str) -> Result<(), BatchIdError> {
    if id.is_empty() {
        return Err(BatchIdError::Empty);
    }
    if id.len() > MAX_BATCH_ID_LEN {
        return Err(BatchIdError::TooLong(id.len()));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(BatchIdError::BadChar(c));
    }
    Ok(())
}
