//! Many waits in one thread: a [`WaitSet`] holds any number of descriptors — listening channel
//! ends ([`Listening`](crate::channel::Listening)), sockets ([`FdSocket`](crate::fd::FdSocket)),
//! a signal's host wait ([`SignalWatch`]), an event's completion ([`EventWatch`]), a barrier
//! arrival ([`BarrierArrival`](crate::barrier::BarrierArrival)), anything `AsFd` — and
//! deadlines, and [`wait`](WaitSet::wait) returns when one is ready, naming which. A channel
//! end or a socket is *told* (its descriptor turns readable when the other side acts or
//! dies); a signal or an event, which the GPU writes and nothing announces, and a barrier,
//! whose completion wakes a futex no reactor can poll, are *looked at* on a back-off from
//! 10 µs to 1 ms (their descriptor is a timer).
//!
//! The set keeps its own copy of each descriptor (`dup`), not a borrow, so the objects stay
//! free to be used (`try_recv` takes `&mut`) while attached. A ready entry stays ready until
//! its object is served (a channel end's `try_` call drains it): the set is level-triggered,
//! so an entry not served is reported again by the next `wait`.
//!
//! # Signals and events: watches that look
//!
//! Nothing tells the host when a GPU word changes or an event completes, except a thread
//! blocked in the driver or a host callback behind a stream of ours waiting on the word or the
//! event — and such a stream cannot be called off: parked on a value nobody writes, or on
//! recorded work that never ends (the very cases of a cancelled wait), it stays parked, and
//! every later `cuMemFree` of the process waits for it. So a watch *looks*, as the blocking
//! waits do, on their back-off (10 µs doubling to 1 ms), paced by a timer descriptor instead
//! of a sleeping thread: between looks it costs no thread and no CPU. Each look is what one
//! round of the blocking wait does: a read of the counter (a copy on the signal's own stream)
//! or a `cuEventQuery`, and every 10 ms the other processes' liveness.
//!
//! A watch holds no state in what it watches: dropped at any point (a cancelled future), it
//! leaves nothing for the next wait.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_ipc::channel::IpcReceiver;
//! use cuda_ipc::wait::WaitSet;
//! use cuda_ipc::{GpuContext, RawStream};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! # let ctx = GpuContext::new(0)?;
//! # let handles: Vec<cuda_ipc::channel::IpcChannelHandle<f32>> = todo!();
//! let mut receivers = Vec::new();
//! let mut set = WaitSet::new()?;
//! for handle in &handles {
//!     let rx = IpcReceiver::<f32>::open(&ctx, handle)?.listening()?;
//!     set.attach(&rx)?; // its key is its index: keys are given in order from 0
//!     receivers.push(rx);
//! }
//! loop {
//!     for key in set.wait(Some(Duration::from_secs(1)))? {
//!         let rx = &mut receivers[key.index()];
//!         while let Some(item) = rx.try_recv(&RawStream::LEGACY)? {
//!             item.release()?;
//!         }
//!     }
//! }
//! # }
//! ```

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::os;

mod watch;
pub use watch::{EventWatch, SignalWatch};

/// What a [`WaitSet`] names an attachment by: given in order from 0 by
/// [`attach`](WaitSet::attach) and [`attach_deadline`](WaitSet::attach_deadline), never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(u64);

impl Key {
    /// The key's number (the count of attachments made before it), for indexing.
    #[must_use]
    pub fn index(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

/// Many descriptors and deadlines, waited for at once in one thread: see the module docs.
///
/// # Examples
///
/// Any descriptor (`AsFd`) can be attached; here two sockets, one of which has a message:
///
/// ```
/// use std::os::unix::net::UnixDatagram;
/// use std::time::{Duration, Instant};
/// use cuda_ipc::wait::WaitSet;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (quiet, _a) = UnixDatagram::pair()?;
/// let (busy, b) = UnixDatagram::pair()?;
/// let mut set = WaitSet::new()?;
/// let _ = set.attach(&quiet)?;
/// let key = set.attach(&busy)?;
/// let soon = set.attach_deadline(Instant::now() + Duration::from_secs(5));
/// b.send(b"hello")?;
/// assert_eq!(set.wait(None)?, vec![key]); // readable: named until the message is read
/// busy.recv(&mut [0; 8])?;
/// assert!(set.wait(Some(Duration::ZERO))?.is_empty());
/// assert!(set.detach(soon));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WaitSet {
    set: OwnedFd,
    /// Each attached descriptor's copy, by key.
    fds: Vec<(Key, OwnedFd)>,
    /// Each deadline not yet passed, by key.
    deadlines: Vec<(Key, Instant)>,
    next: u64,
}

impl WaitSet {
    /// An empty set.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] for a failed `epoll_create1`.
    pub fn new() -> Result<Self> {
        let set = os::epoll::set().map_err(|e| Error::from_os("epoll_create1", "wait set", e))?;
        Ok(Self {
            set,
            fds: Vec::new(),
            deadlines: Vec::new(),
            next: 0,
        })
    }

    fn key(&mut self) -> Key {
        self.next += 1;
        Key(self.next - 1)
    }

    /// Attach `source`: [`wait`](Self::wait) names its key while it is readable. The set
    /// holds a copy of its descriptor (`dup`), so `source` stays free to use; detach it (or
    /// drop the set) to let the copy go.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] for a failed `dup` or `epoll_ctl` (a descriptor `epoll` cannot watch,
    /// such as a regular file).
    pub fn attach(&mut self, source: &impl AsFd) -> Result<Key> {
        let fd = source.as_fd().try_clone_to_owned().map_err(|e| Error::Os {
            call: "dup",
            name: "wait set".to_owned(),
            source: e,
        })?;
        let key = self.key();
        os::epoll::add(self.set.as_fd(), fd.as_fd(), key.0)
            .map_err(|e| Error::from_os("epoll_ctl", "wait set", e))?;
        self.fds.push((key, fd));
        Ok(key)
    }

    /// Attach a deadline: [`wait`](Self::wait) names its key once `at` has passed (then it is
    /// gone from the set).
    pub fn attach_deadline(&mut self, at: Instant) -> Key {
        let key = self.key();
        self.deadlines.push((key, at));
        key
    }

    /// Detach `key` (a descriptor's copy is closed); whether it was attached.
    pub fn detach(&mut self, key: Key) -> bool {
        if let Some(i) = self.fds.iter().position(|(k, _)| *k == key) {
            let (_, fd) = self.fds.swap_remove(i);
            os::epoll::remove(self.set.as_fd(), fd.as_fd());
            return true;
        }
        let before = self.deadlines.len();
        self.deadlines.retain(|(k, _)| *k != key);
        self.deadlines.len() != before
    }

    /// Wait until an attachment is ready or `timeout` passes (`None`: no limit but the
    /// deadlines attached): the keys of the ready ones, in no particular order (empty at the
    /// timeout). A set with nothing attached and no timeout returns at once, empty.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] for a failed `epoll_wait`.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Vec<Key>> {
        let waiting = crate::trace::Waiting::start("a wait set");
        waiting.end(self.wait_untraced(timeout))
    }

    /// [`wait`](Self::wait) without its trace.
    fn wait_untraced(&mut self, timeout: Option<Duration>) -> Result<Vec<Key>> {
        if self.fds.is_empty() && self.deadlines.is_empty() && timeout.is_none() {
            return Ok(Vec::new());
        }
        let now = Instant::now();
        let first_deadline = self
            .deadlines
            .iter()
            .map(|(_, at)| at.saturating_duration_since(now))
            .min();
        let limit = match (timeout, first_deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        let mut ready: Vec<Key> = os::epoll::wait(self.set.as_fd(), limit)
            .map_err(|e| Error::from_os("epoll_wait", "wait set", e))?
            .into_iter()
            .map(Key)
            .collect();
        let now = Instant::now();
        self.deadlines.retain(|&(key, at)| {
            let passed = at <= now;
            if passed {
                ready.push(key);
            }
            !passed
        });
        Ok(ready)
    }
}

impl AsFd for WaitSet {
    /// The set itself: readable while any descriptor attached is (deadlines aside), so that a
    /// set can be waited for inside another set or by a reactor.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.set.as_fd()
    }
}

#[cfg(test)]
mod tests;
