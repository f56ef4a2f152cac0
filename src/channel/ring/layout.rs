//! Where a channel ring's fields lie in its payload: for the inspector (`inspect/parse.rs`),
//! which reads a copy of a region's bytes and trusts none of them. (A child of `ring.rs`, so
//! that it sees the ring's private fields.)

use super::{ConsumerEntry, RingState, doorbell};

/// Where a channel ring's fields lie in its payload, in bytes: for the inspector
/// (`inspect/parse.rs`), which reads a copy of a region's bytes and trusts none of them.
pub(crate) struct RingLayout {
    pub(crate) size: usize,
    pub(crate) slots: usize,
    pub(crate) consumers: usize,
    pub(crate) capacity: usize,
    pub(crate) elem_size: usize,
    pub(crate) producer: usize,
    pub(crate) sent: usize,
    pub(crate) sent_bell: usize,
    pub(crate) consumer: usize,
    pub(crate) entry_size: usize,
    pub(crate) entry_owner: usize,
    pub(crate) entry_released: usize,
    pub(crate) entry_bell: usize,
    /// A doorbell's count of threads asleep on its futex.
    pub(crate) bell_sleepers: usize,
}

/// The ring's [`RingLayout`].
pub(crate) const RING_LAYOUT: RingLayout = RingLayout {
    size: std::mem::size_of::<RingState>(),
    slots: std::mem::offset_of!(RingState, slots),
    consumers: std::mem::offset_of!(RingState, consumers),
    capacity: std::mem::offset_of!(RingState, capacity),
    elem_size: std::mem::offset_of!(RingState, elem_size),
    producer: std::mem::offset_of!(RingState, producer),
    sent: std::mem::offset_of!(RingState, sent),
    sent_bell: std::mem::offset_of!(RingState, sent_bell),
    consumer: std::mem::offset_of!(RingState, consumer),
    entry_size: std::mem::size_of::<ConsumerEntry>(),
    entry_owner: std::mem::offset_of!(ConsumerEntry, owner),
    entry_released: std::mem::offset_of!(ConsumerEntry, released),
    entry_bell: std::mem::offset_of!(ConsumerEntry, released_bell),
    bell_sleepers: doorbell::SLEEPERS,
};
