//! Durability: whether what Redis acknowledged is still there after a crash,
//! in one place. The worker decides what to wait for
//! ([`crate::worker::durability`]: the modes, the start-up choice, the
//! waits of adds and sends); this is the Redis half it rests on.
//!
//! The modes, by what Redis keeps:
//! - **No AOF, or `appendfsync always`** (`DurableWait::None`): nothing to
//!   wait for. Without an AOF a crash loses the batches' state anyway (the
//!   worker warns); with `always` every acknowledged write is on disk.
//! - **`appendfsync everysec` with an exact `WAITAOF`** (Redis 7.2+, a single
//!   server; `DurableWait::WaitAof`): an add or a send waits for one
//!   group-committed round of [`aof`] that reads the events it rests on,
//!   writes a marker and waits for its fsync. A fact not found is reported
//!   gone: Redis lost it.
//! - **`everysec` without it** (`DurableWait::Window`): an add or a send
//!   waits until the events it rests on are [`witness::WINDOW`] old (the
//!   entry ids' clock), then reads them again.
//!
//! Whatever the mode, every worker remembers the last event each handling
//! appended ([`witness`]): an entry is acknowledged only while that event
//! is still recorded (`ack_recorded.lua`, `dead_letter.lua`, the consumer's
//! acker), and once it is older than the window the event is read back, so
//! that writes Redis lost are reported (`groupcast_redis_writes_lost_total`)
//! and recorded for `verify`.

pub mod aof;
pub mod witness;
