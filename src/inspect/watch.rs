//! [`Watch`]: snapshots one after another, telling how long each channel has made no progress.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{Snapshot, snapshot};
use crate::error::Result;

/// Snapshots taken one after another (`doctor --live --watch`, `python -m cuda_ipc inspect
/// --watch`), each channel's [`unchanged_for`](super::Channel::unchanged_for) filled in: how
/// long its counts — items sent, each consumer's items released — have stood still since this
/// watch last saw them move (or first saw the channel). A channel with items in flight and no
/// progress for long is stuck on its consumer; one with none in flight is only idle.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// let mut watch = cuda_ipc::inspect::Watch::new();
/// loop {
///     let snap = watch.snapshot()?;
///     for c in &snap.channels {
///         let in_flight: u64 = c.consumers.iter().map(|x| x.in_flight).sum();
///         if in_flight > 0 && c.unchanged_for >= Some(Duration::from_secs(10)) {
///             println!("{} has not moved for {:?}", c.name, c.unchanged_for);
///         }
///     }
///     std::thread::sleep(Duration::from_secs(2));
/// }
/// # Ok::<(), cuda_ipc::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Watch {
    /// Each channel seen last time: its counts, and since when they have not moved.
    seen: BTreeMap<String, (Vec<u64>, Instant)>,
}

impl Watch {
    /// A watch that has seen nothing yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The next [`snapshot`], with each channel's progress against the ones before.
    ///
    /// # Errors
    ///
    /// As [`snapshot`].
    pub fn snapshot(&mut self) -> Result<Snapshot> {
        let mut snap = snapshot()?;
        self.progress(&mut snap, Instant::now());
        Ok(snap)
    }

    /// Fill in `snap`'s channels' progress as of `now`, and remember their counts.
    pub(super) fn progress(&mut self, snap: &mut Snapshot, now: Instant) {
        let mut seen = BTreeMap::new();
        for c in &mut snap.channels {
            let counts: Vec<u64> = std::iter::once(c.sent)
                .chain(c.consumers.iter().map(|x| x.released))
                .collect();
            let since = match self.seen.remove(&c.name) {
                Some((before, since)) if before == counts => since,
                _ => now,
            };
            c.unchanged_for = Some(now.saturating_duration_since(since));
            seen.insert(c.name.clone(), (counts, since));
        }
        self.seen = seen;
    }
}
