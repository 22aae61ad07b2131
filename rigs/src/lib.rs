//! groupcast's rigs: what runs the product on one machine for a look, a
//! measurement or a test, and is no part of the product library.
//!
//! - [`mock`]: a mock of the provider, with a ledger and fault injection;
//! - [`redis_server`], [`redis_cluster`]: private `redis-server` processes
//!   (a single server, or a cluster of them) started on free ports;
//! - `demo`, `bench`, `mock_provider`: the `groupcast` commands that use
//!   them (`demo`, `bench`, `mock-provider`), private: only [`cli`] runs
//!   them, so that the compiler's dead-code check sees their insides;
//! - [`cli`]: the `groupcast` command line, the product's commands
//!   (`groupcast::cli`) and these three.
//!
//! The binary (`src/main.rs`) lives here rather than in the product's
//! package because it offers these commands, and the product library may not
//! depend on its rigs.

#![warn(unreachable_pub, missing_docs)]

mod bench;
pub mod cli;
mod demo;
pub mod mock;
mod mock_provider;
pub mod redis_cluster;
pub mod redis_server;
