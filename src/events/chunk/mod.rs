//! The ingest format: one chunk of a batch, as an upstream producer writes it.
//!
//! An ingest stream entry has the fields `v` (`1`), `t` (`chunk`) and `d` (a
//! MessagePack map of [`Chunk`]). See `schemas/chunk.schema.json`.
//!
//! - `model`: the chunk, owned ([`Chunk`]) and read in place ([`ChunkRef`]).
//! - `validate`: the limits and the checks ([`ChunkError`]).
//! - `codec`: MessagePack by hand: the one reader of the usual shape
//!   ([`ChunkRef::decode`], from which [`Chunk::decode`] is derived), and the
//!   canonical encoding that the digest hashes.

mod codec;
mod model;
mod validate;

pub use codec::{chunk_encoded_len, recipient_encoded_len, ChunkEncoder};
pub use model::{
    placeholders, Chunk, ChunkRef, KakaoRef, KakaoTemplate, Recipient, RecipientFields,
    RecipientRef, Template, TemplateRef, VarsRef,
};
pub use validate::{
    ChunkError, MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_KAKAO_ID_CHARS, MAX_SENDER_CHARS,
    MAX_TEXT_CHARS, MAX_VAR_CHARS,
};

#[cfg(test)]
mod tests;
