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
    readiness: Option<super::readiness::Readiness>,
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
        super::bell::sweep_once();
        let region = ShmOptions::new(crate::shm::CHANNELS)
            .random_suffix(true)
            .create_with(|s: &RingState| {
                s.slots
                    .store(geometry.slots, crate::sync::Ordering::Relaxed);
                s.consumers
                    .store(geometry.consumers, crate::sync::Ordering::Relaxed);
                s.capacity
                    .store(geometry.capacity, crate::sync::Ordering::Relaxed);
                held = s.producer.claim_pausing(&me, || {}).unwrap_or(0);
                Ok(())
            })?;
        Ok(Self {
            region,
            geometry,
            held,
            next: 1,
            detached: Vec::new(),
            readiness: None,
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
        Ring::of(&self.region, self.geometry)
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
        Ring::of(&self.region, self.geometry)
            .acquire_detaching(self.next, timeout, |i| detached.push(i))?;
        Ok(self.geometry.slot_of(self.next))
    }

    /// Wait on a descriptor from now on: bind the producer's bell.
    pub fn listen(&mut self) -> Result<()> {
        self.readiness = Some(super::readiness::Readiness::new(
            self.region.name(),
            super::bell::End::Producer,
        )?);
        Ok(())
    }

    /// The descriptor that turns readable when
    /// [`try_acquire_listening`](Self::try_acquire_listening) may find the slot free (after
    /// [`listen`](Self::listen)).
    #[must_use]
    pub fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.readiness.as_ref().map(AsFd::as_fd)
    }

    /// The next item's slot index if it is free; else `None`, armed: the descriptor turns
    /// readable when the consumer holding it releases, closes or dies.
    /// In a broadcast channel, consumers found dead holding the slot are detached (as
    /// `IpcSender::try_acquire` does) and the slot checked again.
    pub fn try_acquire_listening(&mut self) -> Result<Option<usize>> {
        let ring = Ring::of(&self.region, self.geometry);
        let mut free =
            super::readiness::try_acquire_armed(&ring, self.readiness.as_mut(), self.next)?;
        if !free && self.geometry.is_broadcast() {
            let before = self.detached.len();
            let detached = &mut self.detached;
            ring.reap_dead_consumers(|i| detached.push(i));
            if self.detached.len() > before {
                free =
                    super::readiness::try_acquire_armed(&ring, self.readiness.as_mut(), self.next)?;
            }
        }
        Ok(free.then(|| self.geometry.slot_of(self.next)))
    }

    /// The next item's slot index if it is free, looked at without arming anything (an
    /// `async` wait's spin, as `Listening::acquire_async` spins).
    pub fn peek_acquire(&mut self) -> Result<Option<usize>> {
        let free = Ring::of(&self.region, self.geometry).try_acquire(self.next)?;
        Ok(free.then(|| self.geometry.slot_of(self.next)))
    }

    /// Wait for the next item's slot on the descriptor, not the futex (listening from the
    /// first call): its index.
    pub fn acquire_listening(&mut self, timeout: Duration) -> Result<usize> {
        wait_listening(self, timeout, "IPC channel acquire (listening)")
    }

    /// Await the next item's slot (its index), as `Listening::acquire_async` does.
    #[cfg(feature = "async")]
    pub async fn acquire_async(&mut self) -> Result<usize> {
        await_listening(self).await
    }

    /// Publish the next item.
    pub fn send(&mut self, len: u64) -> Result<()> {
        self.send_with_header(len, &[])
    }

    /// Publish the next item with a header.
    pub fn send_with_header(&mut self, len: u64, header: &[u8]) -> Result<()> {
        Ring::of(&self.region, self.geometry).publish_from(self.next, 1, [(len, header)])?;
        self.next += 1;
        Ok(())
    }

    /// Publish the next item as a producer `SIGKILL`ed right after its ring does: the ring
    /// takes the listeners armed, and nobody tells them.
    pub fn send_untold(&mut self, len: u64) -> Result<()> {
        Ring::new(self.region.get(), self.geometry).publish_from(self.next, 1, [(len, &[][..])])?;
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
        self.readiness = None; // the bell first, as `Endpoint`'s drop
        Ring::of(&self.region, self.geometry).close_producer(self.held);
    }
}

/// An end that waits on its bell's descriptor: the producer for a free slot, a consumer for
/// an item.
trait Listens {
    /// What a successful try yields.
    type Found;
    fn listen(&mut self) -> Result<()>;
    fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>>;
    /// One try; `None` leaves the descriptor armed.
    fn try_listening(&mut self) -> Result<Option<Self::Found>>;
    /// One try that arms nothing (a spin's).
    #[cfg(feature = "async")]
    fn peek(&mut self) -> Result<Option<Self::Found>>;
}

impl Listens for HostProducer {
    type Found = usize;
    fn listen(&mut self) -> Result<()> {
        HostProducer::listen(self)
    }
    fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        HostProducer::ready_fd(self)
    }
    fn try_listening(&mut self) -> Result<Option<usize>> {
        self.try_acquire_listening()
    }
    #[cfg(feature = "async")]
    fn peek(&mut self) -> Result<Option<usize>> {
        self.peek_acquire()
    }
}

impl Listens for HostConsumer {
    type Found = (usize, u64);
    fn listen(&mut self) -> Result<()> {
        HostConsumer::listen(self)
    }
    fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        HostConsumer::ready_fd(self)
    }
    fn try_listening(&mut self) -> Result<Option<(usize, u64)>> {
        self.try_recv_listening()
    }
    #[cfg(feature = "async")]
    fn peek(&mut self) -> Result<Option<(usize, u64)>> {
        self.peek_recv()
    }
}

/// Try `end` until it finds what it waits for, sleeping on its descriptor between tries
/// (listening from the first call): [`Error::Timeout`] naming `what` after `timeout`.
fn wait_listening<E: Listens>(
    end: &mut E,
    timeout: Duration,
    what: &'static str,
) -> Result<E::Found> {
    if end.ready_fd().is_none() {
        end.listen()?;
    }
    let deadline = crate::poll::Deadline::after(timeout);
    loop {
        if let Some(found) = end.try_listening()? {
            return Ok(found);
        }
        if let Some(fd) = end.ready_fd() {
            let ready = crate::os::socket::wait(fd, rustix::event::PollFlags::IN, deadline)
                .map_err(|e| Error::from_os("poll", "channel readiness", e))?;
            if !ready {
                return Err(Error::Timeout {
                    what,
                    waited: timeout,
                    waiting_for: None,
                });
            }
        }
    }
}

/// Await what `end` waits for, as the `Listening` ends' async calls do: a cooperative spin
/// that arms nothing, then tries that arm, parked on the descriptor between them.
#[cfg(feature = "async")]
async fn await_listening<E: Listens>(end: &mut E) -> Result<E::Found> {
    let spin = crate::reactor::Spin::new(ring::SPIN);
    while spin.on() {
        if let Some(found) = end.peek()? {
            return Ok(found);
        }
        crate::reactor::yield_now().await;
    }
    loop {
        if let Some(found) = end.try_listening()? {
            return Ok(found);
        }
        let Some(fd) = end.ready_fd() else {
            end.listen()?;
            continue;
        };
        crate::reactor::Readable::new(fd).await?;
    }
}

/// The consumer's end.
pub struct HostConsumer {
    region: ShmRegion<RingState>,
    geometry: Geometry,
    index: usize,
    held: u64,
    received: u64,
    readiness: Option<super::readiness::Readiness>,
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
        let held = Ring::of(&region, geometry).attach(&ProcessIdentity::current(), pause)?;
        let _ = region.unlink_shared();
        Ok(Self {
            region,
            geometry,
            index: 0,
            held,
            received: 0,
            readiness: None,
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
            Ring::of(&region, geometry).attach_any(&ProcessIdentity::current(), pause)?;
        Ok(Self {
            region,
            geometry,
            index: attached.index,
            held: attached.held,
            received: attached.start,
            readiness: None,
        })
    }

    /// The items published before this consumer attached (it receives the next one first).
    #[must_use]
    pub fn received(&self) -> u64 {
        self.received
    }

    fn ring(&self) -> Ring<'_> {
        Ring::of(&self.region, self.geometry).at_entry(self.index)
    }

    /// Wait on a descriptor from now on: bind this end's bell (its first try watches the
    /// producer, as a `Listening` receiver's does).
    pub fn listen(&mut self) -> Result<()> {
        self.readiness = Some(super::readiness::Readiness::new(
            self.region.name(),
            super::bell::End::Consumer(self.index),
        )?);
        Ok(())
    }

    /// The descriptor that turns readable when [`try_recv_listening`](Self::try_recv_listening)
    /// may find something (after [`listen`](Self::listen)).
    #[must_use]
    pub fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.readiness.as_ref().map(AsFd::as_fd)
    }

    /// The next item if there is one (its slot index and length); else `None`, armed: the
    /// descriptor turns readable when the producer publishes, closes or dies.
    pub fn try_recv_listening(&mut self) -> Result<Option<(usize, u64)>> {
        let ring = Ring::of(&self.region, self.geometry).at_entry(self.index);
        let found =
            super::readiness::try_recv_armed(&ring, self.readiness.as_mut(), self.received)?;
        Ok(found.map(|len| {
            self.received += 1;
            (self.geometry.slot_of(self.received), len)
        }))
    }

    /// The next item if there is one (its slot index and length), looked at without arming
    /// anything (an `async` wait's spin, as `Listening::recv_async` spins).
    pub fn peek_recv(&mut self) -> Result<Option<(usize, u64)>> {
        let found = self.ring().try_recv(self.received)?;
        Ok(found.map(|len| {
            self.received += 1;
            (self.geometry.slot_of(self.received), len)
        }))
    }

    /// Await the next item (its slot index and length), as `Listening::recv_async` does.
    #[cfg(feature = "async")]
    pub async fn recv_async(&mut self) -> Result<(usize, u64)> {
        await_listening(self).await
    }

    /// Wait for the next item on the descriptor, not the futex (listening from the first
    /// call): its slot index and length.
    pub fn recv_listening(&mut self, timeout: Duration) -> Result<(usize, u64)> {
        wait_listening(self, timeout, "IPC channel receive (listening)")
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

impl HostConsumer {
    /// Close, as dropping does — the bell removed, then the entry given back — calling `pause`
    /// once the entry is free (the replay test attaches another consumer there).
    pub fn close_pausing(mut self, pause: impl FnOnce()) {
        self.close(pause);
    }

    fn close(&mut self, pause: impl FnOnce()) {
        if !self.region.is_home() || self.held == 0 {
            return; // as `Endpoint`'s drop: a forked child's copy is the parent's
        }
        self.readiness = None; // the bell first, as `Endpoint`'s drop
        self.ring().close_consumer(self.held);
        self.held = 0;
        pause();
    }
}

impl Drop for HostConsumer {
    fn drop(&mut self) {
        self.close(|| {});
    }
}
