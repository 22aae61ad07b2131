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
    /// Room for entries waiting without a slot, shared by the consumer.
    waiting: Arc<Semaphore>,
}

/// Entries of a consumer that may wait without a slot at once, per slot:
/// beyond that an entry waits holding its slot, so that the consumer reads
/// no more until some wait ends: the entries in hand (and, through the
/// producers' backpressure on unread chunks, Redis's memory) stay bounded.
pub(crate) const WAITING_PER_SLOT: usize = 16;

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
/// meanwhile, then takes a slot again; when [`WAITING_PER_SLOT`] entries per
/// slot already wait so, or when the task handles no consumer entry, awaits
/// it as it is.
pub(crate) async fn without_slot<T>(wait: impl std::future::Future<Output = T>) -> T {
    let Ok(slot) = SLOT.try_with(Arc::clone) else {
        return wait.await;
    };
    let Ok(room) = slot.waiting.clone().try_acquire_owned() else {
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
    /// The slot of an entry the consumer just took a permit for.
    pub(crate) fn new(
        permits: Arc<Semaphore>,
        held: OwnedSemaphorePermit,
        waiting: Arc<Semaphore>,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            permits,
            held: std::sync::Mutex::new(Some(held)),
            waiting,
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
