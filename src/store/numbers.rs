//! This process's views of the batches' number logs (the batch-wide dedupe:
//! [`crate::protocol::numbers`]), kept between chunks so that each accept
//! reads only the frames other processes appended since this one's last.
//!
//! A view is behind a lock of its own, and chunks of one batch accepted in
//! this process at the same time do not each take it in turn: they wait in
//! the view's line, and whoever holds the lock accepts all those waiting at
//! once (one read of the log, then one call of `accept.lua` with every
//! chunk, each claimed as if those before it were appended). So they never
//! race each other to the log's end, and race another process's appends (a
//! `behind`, and a read) once a round rather than once a chunk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::numbers::View;

/// Views kept at most; the least recently used goes first. A view past
/// 100,000 mobile numbers holds a 12.5 MB bitmap, so this bounds a worker's
/// memory for them to about 400 MB when 32 large batches are in flight at
/// once; a dropped view is read again whole (one `GETRANGE`) when its batch
/// comes back.
const KEEP: usize = 32;
/// A view not used for this long is dropped: its batch has most likely
/// ended (its log is deleted at the report), and it would otherwise hold
/// its memory until 32 newer batches push it out.
const IDLE: Duration = Duration::from_secs(300);

/// A shared view of one batch's log, with its line of `W`s (the chunks
/// waiting to be accepted through it: [`super::batch::Waiting`]).
pub(crate) type SharedView<W> = Arc<Shared<W>>;

/// One batch's view, and what waits to go through it.
pub(crate) struct Shared<W> {
    /// The view; whoever holds it takes everyone in line.
    pub(crate) view: tokio::sync::Mutex<View>,
    waiting: Mutex<Vec<W>>,
}

impl<W> Default for Shared<W> {
    fn default() -> Self {
        Shared {
            view: Default::default(),
            waiting: Mutex::new(Vec::new()),
        }
    }
}

impl<W> Shared<W> {
    /// Puts `w` in line for the view.
    pub(crate) fn wait(&self, w: W) {
        self.line().push(w);
    }

    /// Everyone in line, in the order they came; the line is empty after.
    pub(crate) fn take_waiting(&self) -> Vec<W> {
        std::mem::take(&mut *self.line())
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Vec<W>> {
        // Nothing panics while the line is held: a poisoned one is whole.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A view kept: when it was last asked for, and its use number.
type Kept<W> = (SharedView<W>, Instant, u64);

/// The views, by number-log key.
pub(crate) struct NumberViews<W> {
    /// By key: the view, when it was last asked for, and a use counter (the
    /// order of uses, which `Instant` may not tell apart).
    views: Mutex<HashMap<String, Kept<W>>>,
    uses: std::sync::atomic::AtomicU64,
}

impl<W> Default for NumberViews<W> {
    fn default() -> Self {
        NumberViews {
            views: Mutex::new(HashMap::new()),
            uses: Default::default(),
        }
    }
}

impl<W> NumberViews<W> {
    /// The view of the log at `key` (empty the first time).
    pub(crate) fn of(&self, key: &str) -> SharedView<W> {
        self.of_at(key, Instant::now())
    }

    /// [`NumberViews::of`] at `now`.
    fn of_at(&self, key: &str, now: Instant) -> SharedView<W> {
        let used = self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A poisoned map only loses the views: they are read again.
        let mut views = match self.views.lock() {
            Ok(v) => v,
            Err(poisoned) => {
                let mut v = poisoned.into_inner();
                v.clear();
                v
            }
        };
        views.retain(|k, (_, at, _)| k == key || now.saturating_duration_since(*at) < IDLE);
        if let Some((view, at, n)) = views.get_mut(key) {
            (*at, *n) = (now, used);
            return view.clone();
        }
        if views.len() >= KEEP {
            let oldest = views
                .iter()
                .min_by_key(|(_, (_, _, n))| *n)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                views.remove(&k);
            }
        }
        let view = SharedView::default();
        views.insert(key.to_string(), (view.clone(), now, used));
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_view_goes_first() {
        let views = NumberViews::<()>::default();
        let first = views.of("b:0");
        let one = views.of("b:1");
        for k in 2..KEEP {
            views.of(&format!("b:{k}"));
        }
        // b:0 used again: b:1 is now the oldest, and goes for a new one.
        assert!(Arc::ptr_eq(&first, &views.of("b:0")));
        views.of("b:new");
        assert!(Arc::ptr_eq(&first, &views.of("b:0")));
        assert!(!Arc::ptr_eq(&one, &views.of("b:1")), "b:1 was kept");
    }

    #[test]
    fn a_view_idle_for_long_is_dropped() {
        let views = NumberViews::<()>::default();
        let start = Instant::now();
        let idle = views.of_at("b:idle", start);
        let busy = views.of_at("b:busy", start);
        let later = start + IDLE - Duration::from_secs(1);
        assert!(Arc::ptr_eq(&busy, &views.of_at("b:busy", later)));
        // Past IDLE since its last use, b:idle is gone; b:busy is not.
        let after = start + IDLE + Duration::from_secs(1);
        assert!(Arc::ptr_eq(&busy, &views.of_at("b:busy", after)));
        assert!(!Arc::ptr_eq(&idle, &views.of_at("b:idle", after)));
    }
}
