//! The consumer slot of the entry a task handles: a consumer keeps
//! `concurrency` entries in hand, and an entry that only waits (for time to
//! pass, for the disk) gives its slot back meanwhile.
//!
//! Its own module, below both the consumer (which gives each entry's task a
//! slot) and the ops (which wait without it), so that neither imports the
//! other for it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

tokio::task_local! {
    /// The consumer slot of the entry this task handles.
    static SLOT: Arc<Slot>;
}

/// An entry's place among its consumer's `concurrency` entries in hand.
/// An entry that only waits for time to pass (the durability window) or for
/// the disk (`WAITAOF`) gives it back meanwhile, so that the consumer goes
/// on with other entries, and takes one again before it goes on.
pub(crate) struct Slot {
    permits: Arc<Semaphore>,
    held: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    /// Room for entries waiting without a slot, shared by the consumer, in
    /// KiB of their stream entries ([`WAITING_KIB`]).
    waiting: Arc<Semaphore>,
    /// What this entry takes of that room while it waits, in KiB.
    weight: u32,
}

/// How much of a consumer's entries may wait without a slot at once, in KiB
/// of their stream entries (32 MiB): beyond that an entry waits holding its
/// slot, so that the consumer reads no more until some wait ends, and the
/// entries in hand (and, through the producers' backpressure on unread
/// chunks, Redis's memory) stay bounded. Counted in bytes rather than
/// entries: under `everysec` every chunk of a round waits for the same
/// fsync, so a round should hold a thousand small chunks (W3's, 100
/// recipients) as well as a hundred large ones (W1's, 5,000); counted in entries (16 per slot,
/// 128 a consumer) a round held a few batches of small chunks and many
/// small batches took a round each.
pub(crate) const WAITING_KIB: usize = 32 * 1024;

/// The least an entry takes of [`WAITING_KIB`] (KiB): at most 1,024
/// entries of a consumer wait without a slot, however small.
pub(crate) const WAITING_MIN_KIB: u32 = 32;

/// What an entry of `bytes` takes of [`WAITING_KIB`] while it waits.
pub(crate) fn waiting_weight(bytes: usize) -> u32 {
    let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
    kib.clamp(WAITING_MIN_KIB, WAITING_KIB as u32)
}

/// Sleeps `delay` without holding the entry's consumer slot (see
/// [`without_slot`]). False when the task handles no consumer entry
/// (nothing slept): the caller waits otherwise.
pub(crate) async fn wait_without_slot(delay: Duration) -> bool {
    if SLOT.try_with(|_| ()).is_err() {
        return false;
    }
    without_slot(tokio::time::sleep(delay)).await;
    true
}

/// Awaits `wait` (a wait for time to pass, or for the disk) without holding
/// the entry's consumer slot, so that other entries are read and handled
/// meanwhile, then takes a slot again; when the consumer's entries waiting
/// so already fill [`WAITING_KIB`], or when the task handles no consumer
/// entry, awaits it as it is.
pub(crate) async fn without_slot<T>(wait: impl std::future::Future<Output = T>) -> T {
    let Ok(slot) = SLOT.try_with(Arc::clone) else {
        return wait.await;
    };
    let Ok(room) = slot.waiting.clone().try_acquire_many_owned(slot.weight) else {
        return wait.await;
    };
    let given_back = slot.held.lock().map(|mut h| h.take()).unwrap_or(None);
    drop(given_back);
    let out = wait.await;
    drop(room);
    if let Ok(p) = slot.permits.clone().acquire_owned().await {
        if let Ok(mut h) = slot.held.lock() {
            *h = Some(p);
        }
    }
    out
}

impl Slot {
    /// The slot of an entry of `bytes` the consumer just took a permit
    /// for.
    pub(crate) fn new(
        permits: Arc<Semaphore>,
        held: OwnedSemaphorePermit,
        waiting: Arc<Semaphore>,
        bytes: usize,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            permits,
            held: std::sync::Mutex::new(Some(held)),
            waiting,
            weight: waiting_weight(bytes),
        })
    }
}

/// Runs `task` as the handling of the entry whose slot `slot` is: its waits
/// through [`without_slot`] give the slot back.
pub(crate) fn scope<F: std::future::Future>(
    slot: Arc<Slot>,
    task: F,
) -> impl std::future::Future<Output = F::Output> {
    SLOT.scope(slot, task)
}

#[cfg(test)]
mod tests {
    use super::{waiting_weight, WAITING_KIB, WAITING_MIN_KIB};

    #[test]
    fn an_entry_waits_for_its_size_with_a_floor_and_a_ceiling() {
        assert_eq!(waiting_weight(0), WAITING_MIN_KIB, "however small");
        assert_eq!(waiting_weight(6 * 1024), WAITING_MIN_KIB);
        assert_eq!(waiting_weight(300 * 1024 + 1), 301, "rounded up");
        assert_eq!(
            waiting_weight(usize::MAX),
            WAITING_KIB as u32,
            "never past the room"
        );
        // A thousand small chunks fit in one consumer's room; a hundred of
        // 5,000 recipients (about 300 KiB each) too.
        assert!(1_000 * WAITING_MIN_KIB as usize <= WAITING_KIB);
        assert!(100 * waiting_weight(300 * 1024) as usize <= WAITING_KIB);
    }
}
