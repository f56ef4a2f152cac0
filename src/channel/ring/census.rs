//! What a channel ring says, read word by word: for the inspector (`inspect.rs`), which reads
//! it of a private copy of a region's bytes and trusts none of them. (A child of `ring.rs`, so
//! that it sees the ring's private fields.)

use super::{CONSUMER_ENTRIES, MAX_SLOTS, RingState};
use crate::owned_slot::OwnerState;
use crate::process::ProcessIdentity;
use crate::sync::Ordering;

/// A channel ring as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RingCensus {
    pub(crate) slots: u64,
    pub(crate) capacity: u64,
    pub(crate) elem_size: u64,
    /// Consumer entries the ring was made with.
    pub(crate) entries: u64,
    pub(crate) producer: Option<(OwnerState, ProcessIdentity)>,
    pub(crate) sent: u64,
    /// Threads asleep waiting for an item (consumers' blocking `recv`).
    pub(crate) sent_sleepers: u32,
    /// Every consumer entry not free.
    pub(crate) consumers: Vec<ConsumerCensus>,
}

/// One consumer entry as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConsumerCensus {
    pub(crate) entry: u32,
    pub(crate) state: OwnerState,
    pub(crate) owner: ProcessIdentity,
    /// Items it released.
    pub(crate) released: u64,
    /// Threads asleep waiting for its release (the producer's blocking `acquire`).
    pub(crate) sleepers: u32,
}

impl RingState {
    /// What the ring says, read word by word; `None` when its slot or entry count is out of
    /// range (not a ring this crate made).
    pub(crate) fn census(&self) -> Option<RingCensus> {
        let entries = self.consumers.load(Ordering::Relaxed);
        let slots = self.slots.load(Ordering::Relaxed);
        if !(1..=CONSUMER_ENTRIES as u64).contains(&entries)
            || !(1..=MAX_SLOTS as u64).contains(&slots)
        {
            return None;
        }
        let (producer, producer_id) = self.producer.load_identity();
        let consumers = (0u32..)
            .zip(&self.consumer)
            .filter_map(|(entry, c)| {
                let (owner, id) = c.owner.load_identity();
                (owner.state != OwnerState::Free).then(|| ConsumerCensus {
                    entry,
                    state: owner.state,
                    owner: id,
                    released: c.released.load(Ordering::Relaxed),
                    sleepers: c.released_bell.sleepers(),
                })
            })
            .collect();
        Some(RingCensus {
            slots,
            capacity: self.capacity.load(Ordering::Relaxed),
            elem_size: self.elem_size.load(Ordering::Relaxed),
            entries,
            producer: (producer.state != OwnerState::Free).then_some((producer.state, producer_id)),
            sent: self.sent.load(Ordering::Relaxed),
            sent_sleepers: self.sent_bell.sleepers(),
            consumers,
        })
    }
}
