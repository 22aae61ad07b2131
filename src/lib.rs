//! groupcast: bulk notifications through a provider's group API,
//! event-sourced on Redis Streams.
//!
//! Where a chunk goes, in order: the ingest stream ([`keys`]) → a loader
//! ([`worker::loader`]) → `accept` ([`store::batch`]) → a provider add
//! ([`worker::ops`]) → `loaded` → a send work item → `send` → `poll` →
//! the report. Every step is an event ([`events`]); the batch's state is
//! their fold ([`projection`]).
//!
//! Layout:
//! - [`events`]: the event envelope, every event type and the ingest chunk.
//! - [`keys`]: key names, shard hash tags; [`batch_id`]: the batch id's rules.
//! - [`store`]: the only module that speaks Redis (connection, typed calls to
//!   the scripts in `streams/scripts/`, queue plumbing).
//! - [`projection`]: a batch's state as a fold of its events.
//! - [`protocol`]: the scripts' decisions as pure functions (the model's).
//! - [`worker`]: the roles (loader, operator and one op per provider call,
//!   consumer, maintenance, watchdog, limiter).
//! - [`provider`]: the provider client and its request bodies.
//! - [`producer`]: cutting recipients into chunks and appending them.
//! - [`verify`]: the invariant checks; [`metrics`]: the metric catalogue.
//! - [`cli`]: one file per command (`cli::board`: the operator's web page);
//!   [`human`]: durations and times as people write them; [`redact`]:
//!   secrets out of URLs before anything prints them.
//!
//! Layers, lowest first: a module imports only from its own layer's
//! modules below it (`tests/layers.rs` checks it) and no two import each other:
//! 1. [`batch_id`], [`human`], [`phone`], [`seq_ranges`], [`redact`],
//!    [`results`] (the recipients' outcomes and their stored record);
//! 2. [`events`] (work items too: [`events::work_item`]), then [`keys`];
//! 3. [`projection`], then [`protocol`];
//! 4. [`store`] and [`provider`];
//! 5. [`verify`], [`producer`], [`metrics`];
//! 6. [`worker`];
//! 7. [`cli`] (the commands, the board among them).
//!
//! The rigs are another package of the workspace (`rigs/`,
//! `groupcast-rigs`): the mock provider, the private Redis servers and
//! clusters, the `demo`, `bench` and `mock-provider` commands, and the
//! `groupcast` binary, which offers those with this library's commands
//! ([`cli::Command`]).
//!
//! The public surface: what the binary, the rigs and the integration tests
//! use, and nothing else.
//! - [`cli`]: the product's command line ([`cli::Cli`], [`cli::Command`],
//!   [`cli::run`]) with the pieces the rigs' commands share
//!   ([`cli::CliError`], [`cli::start_logging`], [`cli::exit_code`]);
//! - the library under it, which the demo, the bench and the tests drive
//!   directly: [`events`], [`keys`], [`store`], [`projection`],
//!   [`protocol`] (the model checker's), [`provider`], [`producer`],
//!   [`worker`], [`verify`], [`metrics`], [`phone`], [`results`].
//!
//! Whatever no code outside this library names is `pub(crate)` or private
//! (`unreachable_pub` holds it so), so that the compiler's dead-code check
//! sees it; that covers `batch_id`, `human`, `redact`, `seq_ranges`, the
//! modules of the commands the tests do not reach into (`audit`, `status`,
//! ...), and most of the worker's.

#![warn(unreachable_pub, missing_docs)]
// The guides (this one, the modules') link to the private parts they
// describe: `cargo doc --document-private-items` renders those links.
#![allow(rustdoc::private_intra_doc_links)]

mod batch_id;
pub mod cli;
pub mod events;
mod human;
pub mod keys;
pub mod metrics;
pub mod phone;
pub mod producer;
pub mod projection;
pub mod protocol;
pub mod provider;
mod redact;
pub mod results;
mod seq_ranges;
pub mod store;
pub mod verify;
pub mod worker;
