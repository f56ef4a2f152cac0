use super::*;

/// Bytes of the ring's shared state: the last this many bytes of a channel region's file.
pub const RING_STATE_BYTES: usize = std::mem::size_of::<RingState>();

/// The producer's end: creates the region.
pub struct HostProducer {
    region: ShmRegion<RingState>,
    geometry: Geometry,
    held: u64,
    next: u64,
    detached: Vec<usize>,
}

impl HostProducer {
    /// Create a channel region of `slots` slots of `capacity` elements, one consumer.
    pub fn create(slots: usize, capacity: u64) -> Result<Self> {
        Self::create_with(slots, capacity, 1)
    }

    /// Create a channel region of `slots` slots of `capacity` elements for `consumers`
    /// consumer entries (more than one: a broadcast channel).
    pub fn create_with(slots: usize, capacity: u64, consumers: usize) -> Result<Self> {
        let geometry = Geometry {
            slots: slots as u64,
            capacity,
            consumers: consumers.clamp(1, ring::CONSUMER_ENTRIES) as u64,
        };
        let me = ProcessIdentity::current();
        let mut held = 0;
        crate::shm::reclaim_stale_once(crate::shm::CHANNELS);
        let region = ShmOptions::new(crate::shm::CHANNELS)
            .random_suffix(true)
            .create_with(|s: &RingState| {
                s.slots
                    .store(geometry.slots, crate::sync::Ordering::Relaxed);
                s.consumers
                    .store(geometry.consumers, crate::sync::Ordering::Relaxed);
                held = s.producer.claim_pausing(&me, || {}).unwrap_or(0);
                Ok(())
            })?;
        Ok(Self {
            region,
            geometry,
            held,
            next: 1,
            detached: Vec::new(),
        })
    }

    /// The consumer entries detached so far because their consumer died (broadcast).
    #[must_use]
    pub fn detached(&self) -> &[usize] {
        &self.detached
    }

    /// The pids of the consumers attached now.
    #[must_use]
    pub fn attached(&self) -> Vec<u32> {
        Ring::new(self.region.get(), self.geometry)
            .attached()
            .into_iter()
            .map(|(_, id)| id.pid())
            .collect()
    }

    /// The region's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.region.name()
    }

    /// Wait for the next item's slot; its index.
    pub fn acquire(&mut self, timeout: Duration) -> Result<usize> {
        let detached = &mut self.detached;
        Ring::new(self.region.get(), self.geometry)
            .acquire_detaching(self.next, timeout, |i| detached.push(i))?;
        Ok(self.geometry.slot_of(self.next))
    }

    /// Publish the next item.
    pub fn send(&mut self, len: u64) -> Result<()> {
        self.send_with_header(len, &[])
    }

    /// Publish the next item with a header.
    pub fn send_with_header(&mut self, len: u64, header: &[u8]) -> Result<()> {
        Ring::new(self.region.get(), self.geometry).publish_from(self.next, 1, [(len, header)])?;
        self.next += 1;
        Ok(())
    }

    /// Whether a consumer has attached.
    #[must_use]
    pub fn has_consumer(&self) -> bool {
        self.region.get().consumer[0].owner.load().state != crate::owned_slot::OwnerState::Free
    }
}

impl Drop for HostProducer {
    fn drop(&mut self) {
        if !self.region.is_home() {
            return; // as `Endpoint`'s drop: a forked child's copy is the parent's
        }
        Ring::new(self.region.get(), self.geometry).close_producer(self.held);
    }
}

/// The consumer's end.
pub struct HostConsumer {
    region: ShmRegion<RingState>,
    geometry: Geometry,
    index: usize,
    held: u64,
    received: u64,
}

/// The channel region called `name`, opened, and its geometry (`consumers` entries, 1 to
/// [`CONSUMER_ENTRIES`](ring::CONSUMER_ENTRIES)).
fn open_region(
    name: &str,
    slots: usize,
    capacity: u64,
    consumers: usize,
) -> Result<(ShmRegion<RingState>, Geometry)> {
    let geometry = Geometry {
        slots: slots as u64,
        capacity,
        consumers: consumers.clamp(1, ring::CONSUMER_ENTRIES) as u64,
    };
    Ok((ShmOptions::new(name).open::<RingState>()?, geometry))
}

impl HostConsumer {
    /// Open the region called `name` and attach, calling `pause` inside the claim (while
    /// the owner word reads `Claiming`); then unlink the name, as the real receiver does.
    pub fn open_pausing(
        name: &str,
        slots: usize,
        capacity: u64,
        pause: impl FnOnce(),
    ) -> Result<Self> {
        let (region, geometry) = open_region(name, slots, capacity, 1)?;
        let held = Ring::new(region.get(), geometry).attach(&ProcessIdentity::current(), pause)?;
        let _ = region.unlink_shared();
        Ok(Self {
            region,
            geometry,
            index: 0,
            held,
            received: 0,
        })
    }

    /// Open the broadcast channel region called `name` (`consumers` entries) and attach to
    /// a free entry, calling `pause` inside the claim; the name stays (others attach later).
    pub fn attach_pausing(
        name: &str,
        slots: usize,
        capacity: u64,
        consumers: usize,
        pause: impl FnOnce(),
    ) -> Result<Self> {
        let (region, geometry) = open_region(name, slots, capacity, consumers)?;
        let attached =
            Ring::new(region.get(), geometry).attach_any(&ProcessIdentity::current(), pause)?;
        Ok(Self {
            region,
            geometry,
            index: attached.index,
            held: attached.held,
            received: attached.start,
        })
    }

    /// The items published before this consumer attached (it receives the next one first).
    #[must_use]
    pub fn received(&self) -> u64 {
        self.received
    }

    fn ring(&self) -> Ring<'_> {
        Ring::new(self.region.get(), self.geometry).at_entry(self.index)
    }

    /// Wait for the next item: its slot index and length.
    pub fn recv(&mut self, timeout: Duration) -> Result<(usize, u64)> {
        let len = self.ring().recv(self.received, timeout)?;
        self.received += 1;
        Ok((self.geometry.slot_of(self.received), len))
    }

    /// The last item's header.
    pub fn header(&self) -> Result<Vec<u8>> {
        self.ring().header(self.received)
    }

    /// Release the last item received.
    pub fn release(&mut self) -> Result<()> {
        self.ring().release(self.received)
    }
}

impl Drop for HostConsumer {
    fn drop(&mut self) {
        if !self.region.is_home() {
            return; // as `Endpoint`'s drop: a forked child's copy is the parent's
        }
        self.ring().close_consumer(self.held);
    }
}
