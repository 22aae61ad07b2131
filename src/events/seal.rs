//! The `seal` ingest entry: a producer declares its batch's last seq after
//! writing its chunks, when it learns where the batch ends only after the
//! last row (a streaming job). `t` = `seal`, `d` = this, a MessagePack map
//! with named fields (`schemas/seal.schema.json`). Read by the loader
//! (`seal.lua` records it).

use serde::{Deserialize, Serialize};

use super::{decode_payload, encode_payload, DecodeError};

/// The most bytes a seal's payload may have: a batch id and a number.
pub(crate) const SEAL_MAX_BYTES: usize = 1024;

/// A batch's last seq, declared after its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The batch.
    pub batch: String,
    /// Its last seq: the batch takes seqs 0..=last.
    pub last: u32,
}

impl Seal {
    /// The entry's `d`.
    pub fn encode(&self) -> Vec<u8> {
        encode_payload(self)
    }

    /// Reads a seal's `d` (at most [`SEAL_MAX_BYTES`]).
    pub fn decode(bytes: &[u8]) -> Result<Seal, DecodeError> {
        if bytes.len() > SEAL_MAX_BYTES {
            return Err(DecodeError::TooLarge(bytes.len()));
        }
        decode_payload("seal", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_reads_back_and_refuses_what_is_not_one() {
        let s = Seal {
            batch: "spring".into(),
            last: 41,
        };
        assert_eq!(Seal::decode(&s.encode()).ok(), Some(s));
        let too_big =
            rmp_serde::to_vec_named(&serde_json::json!({"batch": "b", "last": 5_000_000_000u64}))
                .unwrap_or_default();
        assert!(Seal::decode(&too_big).is_err());
        let no_last =
            rmp_serde::to_vec_named(&serde_json::json!({"batch": "b"})).unwrap_or_default();
        assert!(Seal::decode(&no_last).is_err());
        assert!(Seal::decode(&vec![0x90; SEAL_MAX_BYTES + 1]).is_err());
    }
}
