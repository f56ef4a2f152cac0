//! Channel ends a reactor polls: [`Listening`], an [`IpcReceiver`] or [`IpcSender`] whose
//! readiness is one file descriptor (`AsFd`) — readable when its `try_` call may find
//! something: an item sent, a slot released, the peer closed or dead.
//!
//! A listening end's [`IpcReceiver::try_recv`] / [`IpcSender::try_acquire`] that finds
//! nothing *arms* it before returning `None` (`readiness.rs`, `bell.rs`): the other side's
//! next publish, release or close then makes the descriptor readable, and the peer's death
//! does too. So the loop is: try; on `None`, wait for the descriptor (`poll`, an async
//! runtime's `AsyncFd`, a [`WaitSet`](crate::wait::WaitSet)); try again. The descriptor is a
//! hint, never the truth: a wake may find nothing (the call arms again), and the calls never
//! wait on it themselves.

use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use bytemuck::Pod;

use super::bell::End;
use super::endpoint::Endpoint;
use super::readiness::{self, Readiness};
use super::ring::Ring;
#[cfg(feature = "async")]
use super::ring::SPIN;
use super::{IpcReceiver, IpcSender};
#[cfg(feature = "async")]
use super::{Received, SendSlot};
use crate::error::Result;
#[cfg(feature = "async")]
use crate::stream::AsStream;

/// A channel end that can be waited for on a file descriptor: see the module docs. It
/// dereferences to the end (`IpcReceiver<T>` or `IpcSender<T>`), whose `try_recv` /
/// `try_acquire` arm the descriptor when they find nothing.
///
/// # Examples
///
/// ```no_run
/// use std::os::fd::AsFd;
/// use std::time::Duration;
/// use cuda_ipc::channel::IpcReceiver;
/// use cuda_ipc::{GpuContext, RawStream};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// # let ctx = GpuContext::new(0)?;
/// # let handle = todo!();
/// let mut rx = IpcReceiver::<f32>::open(&ctx, &handle)?.listening()?;
/// loop {
///     match rx.try_recv(&RawStream::LEGACY)? {
///         Some(item) => item.release()?,
///         // Armed: wait for the descriptor (here with poll(2); an async runtime registers it).
///         None => wait_readable(rx.as_fd()),
///     }
/// }
/// # }
/// # fn wait_readable(_: std::os::fd::BorrowedFd<'_>) {}
/// ```
#[derive(Debug)]
pub struct Listening<E> {
    end: E,
    /// The descriptor of the end's readiness, owned by the end (its endpoint's `readiness`,
    /// set before this is made and never replaced or dropped while it lives).
    fd: RawFd,
}

impl<E> Deref for Listening<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.end
    }
}

impl<E> DerefMut for Listening<E> {
    fn deref_mut(&mut self) -> &mut E {
        &mut self.end
    }
}

impl<E> AsFd for Listening<E> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `fd` is the readiness set the end owns (field docs): open for as long as
        // `self`, so for the borrow's lifetime.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl<E> AsRawFd for Listening<E> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl<T: Pod> IpcReceiver<T> {
    /// Make this receiver pollable in place (as [`listening`](Self::listening) does) and
    /// return its descriptor, which stays open until the receiver drops. Calling it again
    /// returns the same descriptor. For bindings and reactors that hold the receiver
    /// elsewhere; [`Listening`] is the typed form.
    ///
    /// # Errors
    ///
    /// As [`listening`](Self::listening).
    pub fn listen(&mut self) -> Result<BorrowedFd<'_>> {
        let fd = self.end.listen(End::Consumer(self.end.entry))?;
        // SAFETY: the end's readiness set, open until the end drops (it is never replaced).
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Make this receiver pollable: bind its bell (a socket in `/dev/shm`, removed when the
    /// receiver goes) and watch the producer's exit. The descriptor starts readable, so that
    /// a reactor's first wait returns at once and the first `try_recv` arms it.
    ///
    /// # Errors
    ///
    /// [`Error::AddressInUse`](crate::Error::AddressInUse) if a live process holds this
    /// consumer's bell; [`Error::Os`](crate::Error::Os) for a failed `socket`, `bind` or
    /// `epoll_create1`.
    pub fn listening(mut self) -> Result<Listening<Self>> {
        let fd = self.listen()?.as_raw_fd();
        Ok(Listening { end: self, fd })
    }
}

impl<T: Pod> IpcSender<T> {
    /// Make this sender pollable in place (as [`listening`](Self::listening) does) and return
    /// its descriptor, which stays open until the sender drops.
    ///
    /// # Errors
    ///
    /// As [`IpcReceiver::listening`].
    pub fn listen(&mut self) -> Result<BorrowedFd<'_>> {
        let fd = self.end.listen(End::Producer)?;
        // SAFETY: the end's readiness set, open until the end drops (it is never replaced).
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Make this sender pollable: bind its bell (a socket in `/dev/shm`, removed when the
    /// sender goes); the consumer it waits for is watched when a `try_acquire` arms. The
    /// descriptor starts readable, so that a reactor's first wait returns at once.
    ///
    /// # Errors
    ///
    /// As [`IpcReceiver::listening`].
    pub fn listening(mut self) -> Result<Listening<Self>> {
        let fd = self.listen()?.as_raw_fd();
        Ok(Listening { end: self, fd })
    }
}

impl<T: Pod> Endpoint<T> {
    /// Bind this end's readiness (once) and return its descriptor (readable to begin with).
    fn listen(&mut self, end: End) -> Result<RawFd> {
        let readiness = match &mut self.readiness {
            Some(r) => r,
            empty => empty.insert(Readiness::new(self.region.name(), end)?),
        };
        Ok(readiness.as_fd().as_raw_fd())
    }

    /// Consumer: the length of item `received + 1` if it was published; else `None`, armed if
    /// this end listens (`readiness.rs`).
    pub(super) fn try_recv_armed(&mut self, received: u64) -> Result<Option<u64>> {
        let ring = Ring::of(&self.region, self.geometry).at_entry(self.entry);
        readiness::try_recv_armed(&ring, self.readiness.as_mut(), received)
    }

    /// Consumer: the length of item `received + 1` if it was published, looked at without
    /// arming anything (an `async` wait's spin).
    #[cfg(feature = "async")]
    pub(super) fn peek_recv(&self, received: u64) -> Result<Option<u64>> {
        Ring::of(&self.region, self.geometry)
            .at_entry(self.entry)
            .try_recv(received)
    }

    /// Producer: whether item `k`'s slot is free, looked at without arming anything.
    #[cfg(feature = "async")]
    pub(super) fn peek_acquire(&self, k: u64) -> Result<bool> {
        Ring::of(&self.region, self.geometry)
            .at_entry(self.entry)
            .try_acquire(k)
    }

    /// Producer: whether item `k`'s slot is free; if not, armed if this end listens
    /// (`readiness.rs`).
    pub(super) fn try_acquire_armed(&mut self, k: u64) -> Result<bool> {
        let ring = Ring::of(&self.region, self.geometry).at_entry(self.entry);
        readiness::try_acquire_armed(&ring, self.readiness.as_mut(), k)
    }
}

#[cfg(feature = "async")]
impl<T: Pod> Listening<IpcReceiver<T>> {
    /// Await the next item, then enqueue on `stream` the wait for the producer's GPU writes
    /// of it, as [`IpcReceiver::recv`] does: the task, not a thread, waits (feature `async`;
    /// any runtime: `crate::reactor`'s one thread per process wakes it). No time limit of its
    /// own: compose one with the runtime's (`tokio::time::timeout`); the producer's death ends
    /// it with [`Error::PeerGone`](crate::Error::PeerGone).
    ///
    /// **Cancel-safe:** dropped before it returns, it has taken nothing (the next call gets
    /// the same item).
    ///
    /// # Errors
    ///
    /// As [`IpcReceiver::recv`], without [`Error::Timeout`](crate::Error::Timeout);
    /// [`Error::Os`](crate::Error::Os) if the reactor cannot start or watch the descriptor.
    pub async fn recv_async<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Received<'a, T>> {
        let waiting = crate::trace::Waiting::start("IPC channel receive (awaited)");
        waiting.end(self.recv_async_untraced(stream).await)
    }

    /// [`recv_async`](Self::recv_async) without its trace.
    async fn recv_async_untraced<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Received<'a, T>> {
        let spin = crate::reactor::Spin::new(SPIN);
        loop {
            let rx = &mut self.end;
            rx.end.check_open("Listening::recv_async")?;
            let spinning = spin.on();
            let found = if spinning {
                rx.end.peek_recv(rx.received)?
            } else {
                rx.end.try_recv_armed(rx.received)?
            };
            if let Some(len) = found {
                return self.end.take_item(stream, len);
            }
            if spinning {
                crate::reactor::yield_now().await;
            } else {
                crate::reactor::Readable::new(self.as_fd()).await?;
            }
        }
    }
}

#[cfg(feature = "async")]
impl<T: Pod> Listening<IpcSender<T>> {
    /// Await a free slot for the next item, as [`IpcSender::acquire`] does: the task, not a
    /// thread, waits (feature `async`). No time limit of its own; a one-consumer channel's
    /// consumer dying ends it with [`Error::PeerGone`](crate::Error::PeerGone), and in a
    /// broadcast channel dead consumers are detached.
    ///
    /// **Cancel-safe:** dropped before it returns, it holds no slot.
    ///
    /// # Errors
    ///
    /// As [`IpcSender::acquire`], without [`Error::Timeout`](crate::Error::Timeout);
    /// [`Error::Os`](crate::Error::Os) if the reactor cannot start or watch the descriptor.
    pub async fn acquire_async<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<SendSlot<'a, T>> {
        let waiting = crate::trace::Waiting::start("IPC channel acquire (awaited)");
        waiting.end(self.acquire_async_untraced(stream).await)
    }

    /// [`acquire_async`](Self::acquire_async) without its trace.
    async fn acquire_async_untraced<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<SendSlot<'a, T>> {
        let spin = crate::reactor::Spin::new(SPIN);
        loop {
            self.end.end.check_open("Listening::acquire_async")?;
            let spinning = spin.on();
            let free = if spinning {
                self.end.end.peek_acquire(self.end.next)?
            } else {
                self.end.try_acquire_host()?
            };
            if free {
                return self.end.take_slot(stream);
            }
            if spinning {
                crate::reactor::yield_now().await;
            } else {
                crate::reactor::Readable::new(self.as_fd()).await?;
            }
        }
    }
}
