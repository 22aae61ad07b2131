//! groupcast: bulk notifications through a provider's group API,
//! event-sourced on Redis Streams.
//!
//! Where a chunk goes, in order: the ingest stream ([`keys`]) → a loader
//! ([`worker::loader`]) → `accept` ([`store::batch`]) → a provider add
//! ([`worker::ops`]) → `loaded` → a send work item → `send` → `poll` →
//! the report. Every step is an event ([`events`]); the batch's state is
//! their fold ([`projection`]).

pub mod board;
pub mod cli;
pub mod events;
pub mod keys;
pub mod metrics;
pub mod mock;
pub mod phone;
pub mod producer;
pub mod projection;
pub mod protocol;
pub mod provider;
pub mod redis_cluster;
pub mod redis_server;
pub mod store;
pub mod verify;
pub mod worker;
