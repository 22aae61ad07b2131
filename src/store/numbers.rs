//! This process's views of the batches' number logs (the batch-wide dedupe:
//! [`crate::protocol::numbers`]), kept between chunks so that each accept
//! reads only the frames other processes appended since this one's last.
//!
//! A view is behind a lock of its own: chunks of one batch accepted in this
//! process at the same time take turns, so they never race each other to
//! the log's end (a race with another process costs a `behind` and a read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::protocol::numbers::View;

/// Views kept at most; the least recently used goes first. A view past
/// 100,000 mobile numbers holds a 12.5 MB bitmap, so this bounds a worker's
/// memory for them to about 800 MB in the worst case; a dropped view is read
/// again whole (one `GETRANGE`) when its batch comes back.
const KEEP: usize = 64;

/// A shared view of one batch's log.
pub(crate) type SharedView = Arc<tokio::sync::Mutex<View>>;

/// The views, by number-log key.
#[derive(Default)]
pub(crate) struct NumberViews {
    views: Mutex<HashMap<String, (SharedView, u64)>>,
    uses: std::sync::atomic::AtomicU64,
}

impl NumberViews {
    /// The view of the log at `key` (empty the first time).
    pub(crate) fn of(&self, key: &str) -> SharedView {
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
        if let Some((view, at)) = views.get_mut(key) {
            *at = used;
            return view.clone();
        }
        if views.len() >= KEEP {
            let oldest = views
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                views.remove(&k);
            }
        }
        let view = SharedView::default();
        views.insert(key.to_string(), (view.clone(), used));
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_view_goes_first() {
        let views = NumberViews::default();
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
}
