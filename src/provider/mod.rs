//! The provider client: a typed, signed HTTP client for the provider's group
//! API (`docs/provider-api.md`, a subset of Solapi Message API v4).
//!
//! - [`model`]: the JSON objects.
//! - [`add_body`]: the add request's body, written straight from a chunk.
//! - [`auth`]: request signing (and verification, for the mock).
//! - [`error`]: failures with their retry decision as data.
//! - [`client`]: [`ProviderClient`] and its [`ProviderConfig`].

pub mod add_body;
pub mod auth;
pub(crate) mod client;
pub(crate) mod error;
pub mod model;

pub use client::{ProviderClient, ProviderConfig, MAX_MESSAGES_PER_REQUEST};
pub use error::{ProviderError, ProviderErrorKind, RetryDecision};
pub use model::{
    AddMessagesResponse, CreateGroupRequest, Group, GroupCount, GroupStatus, KakaoOptions,
    ListedMessage, Message, MessagePage, MessageResult, MessageType, Registration,
};
