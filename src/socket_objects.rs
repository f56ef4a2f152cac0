//! Shareable objects over an [`FdSocket`]: what each one's message is — its handle, and the
//! descriptors that are the capability to map it — and how the other side turns a message
//! back into the object, with every check on what arrived.
//!
//! The socket (`fd.rs`) carries bytes and descriptors and knows no object; each object knows
//! nothing of sockets. This file is where the two meet, one block per kind:
//!
//! | Sent | Message | Received as |
//! |------|---------|-------------|
//! | [`IpcBuffer`] (legacy) | its 184-byte handle | [`ImportedBuffer`] ([`FdSocket::recv_buffer`]) or, refused, [`ReadOnlyBuffer`] |
//! | [`IpcBuffer`] (POSIX fd) | its handle and one descriptor of its memory | [`ImportedBuffer`], [`ReadOnlyBuffer`] |
//! | [`IpcBuffer`] (pool) | its pool's handle, the pool's descriptor, then the buffer's [`PoolHandle`] | [`ImportedBuffer`], [`ReadOnlyBuffer`] (the type alone) |
//! | [`IpcArena`] | its handle and one descriptor | [`ImportedArena`], [`ReadOnlyArena`] |
//! | [`IpcPool`] | its handle and one descriptor | [`ImportedPool`], [`ReadOnlyPool`] |
//!
//! A message with the wrong number of descriptors, or whose handle type disagrees with them,
//! is refused ([`Error::HandleTypeMismatch`]) with every descriptor closed.
//!
//! # The way a call goes
//!
//! `send_buffer`: the buffer makes its handle (and descriptor) as an export does (`buffer.rs`,
//! see there), then the socket sends one message (`fd.rs`, `os/socket.rs`: `sendmsg` with
//! `SCM_RIGHTS`). `recv_buffer`: the socket receives one message (`fd.rs`), this file reads
//! it into a [`BufferMessage`] — the handle's bytes (`handle.rs`, `envelope.rs`) and the
//! descriptors it must come with — and opens it as `ImportedBuffer::open_fd` (or `open`,
//! `open_pooled`) does (`buffer.rs`, then as an open goes there).

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use bytemuck::Pod;

use crate::arena::ReadOnlyArena;
use crate::arena::{ImportedArena, IpcArena, IpcArenaHandle};
use crate::buffer::IpcMemHandle;
use crate::buffer::{ImportedBuffer, IpcBuffer};
use crate::context::GpuContext;
use crate::error::{Error, Result, TypeConflict};
use crate::fd::{FdMessage, FdSocket};
use crate::handle::HandleType;
use crate::pool::ReadOnlyPool;
use crate::pool::{ImportedPool, IpcPool, IpcPoolHandle, PoolHandle};
use crate::read_only::ReadOnlyBuffer;

impl FdSocket {
    /// Send an exported [`IpcBuffer`] to the peer as one message: its handle, and for a
    /// [`HandleType::PosixFd`] buffer a new descriptor of its memory (the capability to map
    /// it), which this side closes once sent; for a [`HandleType::Pool`] buffer its pool's
    /// handle and a new descriptor of the pool, then the buffer's
    /// [`PoolHandle`] ([`IpcBuffer::export_pooled`]). The peer opens it
    /// with [`recv_buffer`](Self::recv_buffer). Legacy buffers travel the same way (the handle
    /// alone), so one code path serves every type.
    ///
    /// # Errors
    ///
    /// As [`IpcBuffer::handle`] / [`IpcBuffer::export_fd`] / [`IpcBuffer::export_pooled`],
    /// then as [`send`](Self::send).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    /// use cuda_ipc::fd::{FdListener, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<f32>::zeroed_with(&ctx, 1 << 20, HandleType::Auto)?;
    /// let listener = FdListener::bind(SocketName::Abstract("my-app".into()), PeerPolicy::SameUid)?;
    /// let peer = listener.accept(Duration::from_secs(5))?;
    /// peer.send_buffer(&buf, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send_buffer<T: Pod>(&self, buffer: &IpcBuffer<T>, timeout: Duration) -> Result<()> {
        match buffer.handle_type() {
            HandleType::PosixFd => {
                let (handle, fd) = buffer.export_fd()?;
                self.send(handle.as_bytes(), &[fd.as_fd()], timeout)
            }
            HandleType::Pool => {
                let (pool, fd, handle) = buffer.export_pooled()?;
                let payload = [pool.as_bytes(), handle.as_bytes()].concat();
                self.send(&payload, &[fd.as_fd()], timeout)
            }
            _ => {
                let handle = buffer.handle()?;
                self.send(handle.as_bytes(), &[], timeout)
            }
        }
    }

    /// Receive a buffer sent with [`send_buffer`](Self::send_buffer) and map it into `ctx`
    /// ([`ImportedBuffer::open_fd`] with the descriptor that came with it,
    /// [`ImportedBuffer::open_pooled`] for a pool buffer, or [`ImportedBuffer::open`] for a
    /// legacy handle), waiting at most `timeout` for the message.
    ///
    /// Everything that arrives is checked before use: the payload must be exactly one handle
    /// envelope, or a pool's handle followed by a pool buffer's handle; a POSIX-fd handle and a
    /// pool must come with exactly one descriptor and a legacy handle with none (any that came
    /// are closed).
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv) (a peer that never sends is [`Error::Timeout`]);
    /// [`Error::CorruptHandle`] for a payload that is not a handle; [`Error::HandleTypeMismatch`]
    /// when the descriptors do not match the handle's type; then as [`ImportedBuffer::open_fd`],
    /// [`ImportedBuffer::open_pooled`] or [`ImportedBuffer::open`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let name = SocketName::Abstract("my-app".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let buf = socket.recv_buffer::<f32>(&ctx, Duration::from_secs(5))?;
    /// println!("{} elements, shared as {}", buf.len(), buf.handle_type());
    /// # Ok(()) }
    /// ```
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_buffer<T: Pod>(
        &self,
        ctx: &GpuContext,
        timeout: Duration,
    ) -> Result<ImportedBuffer<T>> {
        match BufferMessage::<T>::parse(self.recv(timeout)?)? {
            BufferMessage::Legacy(handle) => ImportedBuffer::open(ctx, &handle),
            BufferMessage::PosixFd(handle, fd) => ImportedBuffer::open_fd(ctx, &handle, fd),
            BufferMessage::Pooled(pool, fd, buffer) => {
                ImportedBuffer::open_pooled(ctx, &pool, fd, &buffer)
            }
        }
    }

    /// [`recv_buffer`](Self::recv_buffer), mapping the buffer so that this process can only
    /// read it: a [`HandleType::PosixFd`] buffer mapped `PROT_READ` (the GPU refuses writes),
    /// a [`HandleType::Pool`] buffer read-only by type only
    /// ([`ReadOnlyBuffer::is_enforced_by_gpu`] says which).
    ///
    /// # Errors
    ///
    /// As [`recv_buffer`](Self::recv_buffer); a legacy buffer is
    /// [`Error::HandleTypeMismatch`] (`NoReadOnlyMapping`: the driver has no read-only legacy
    /// mapping), its handle left unopened.
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_buffer_read_only<T: Pod>(
        &self,
        ctx: &GpuContext,
        timeout: Duration,
    ) -> Result<ReadOnlyBuffer<T>> {
        match BufferMessage::<T>::parse(self.recv(timeout)?)? {
            BufferMessage::Legacy(_) => Err(Error::HandleTypeMismatch {
                handle: HandleType::Legacy,
                conflict: TypeConflict::NoReadOnlyMapping,
            }),
            BufferMessage::PosixFd(handle, fd) => ReadOnlyBuffer::open_fd(ctx, &handle, fd),
            BufferMessage::Pooled(pool, fd, buffer) => {
                crate::ImportedBuffer::open_pooled_any(ctx, &pool, fd, &buffer)
                    .map(ReadOnlyBuffer::pooled)
            }
        }
    }
}

/// What [`FdSocket::send_buffer`] sends, checked as it arrives.
enum BufferMessage<T: Pod> {
    Legacy(IpcMemHandle<T>),
    PosixFd(IpcMemHandle<T>, OwnedFd),
    Pooled(IpcPoolHandle, OwnedFd, PoolHandle<T>),
}

impl<T: Pod> BufferMessage<T> {
    /// A message's payload — one handle envelope, or a pool's handle followed by a pool
    /// buffer's — and its descriptors: one for a POSIX-fd handle or a pool, none for a legacy
    /// handle. Anything else is refused, the descriptors closed; nothing is opened.
    fn parse(FdMessage { payload, fds }: FdMessage) -> Result<Self> {
        if payload.len() == IpcPoolHandle::SIZE + PoolHandle::<T>::SIZE {
            let (pool, buffer) = payload.split_at(IpcPoolHandle::SIZE);
            let pool = IpcPoolHandle::from_bytes(pool)?;
            let buffer = PoolHandle::<T>::from_bytes(buffer)?;
            let fd = only_descriptor(HandleType::Pool, fds)?;
            return Ok(Self::Pooled(pool, fd, buffer));
        }
        let handle = IpcMemHandle::<T>::from_bytes(&payload)?;
        match handle.handle_type() {
            HandleType::Legacy if fds.is_empty() => Ok(Self::Legacy(handle)),
            HandleType::Legacy => Err(Error::HandleTypeMismatch {
                handle: HandleType::Legacy,
                conflict: TypeConflict::Descriptors {
                    expected: 0,
                    found: fds.len(),
                },
            }),
            handle_type => {
                let fd = only_descriptor(handle_type, fds)?;
                Ok(Self::PosixFd(handle, fd))
            }
        }
    }
}

/// The one descriptor a handle of `handle_type` must arrive with; any other number is
/// [`Error::HandleTypeMismatch`] (those that came are closed with `fds`).
fn only_descriptor(handle_type: HandleType, mut fds: Vec<OwnedFd>) -> Result<OwnedFd> {
    match (fds.pop(), fds.len()) {
        (Some(fd), 0) => Ok(fd),
        (last, others) => Err(Error::HandleTypeMismatch {
            handle: handle_type,
            conflict: TypeConflict::Descriptors {
                expected: 1,
                found: others + usize::from(last.is_some()),
            },
        }),
    }
}

impl FdSocket {
    /// Send an [`IpcArena`] to the peer: its handle and a new descriptor of its memory, which
    /// this side closes once sent. The peer maps it with [`recv_arena`](Self::recv_arena);
    /// buffers allocated from the arena then travel as [`ArenaHandle`](crate::arena::ArenaHandle)
    /// bytes alone, over this socket or any other channel.
    ///
    /// # Errors
    ///
    /// As [`IpcArena::export_fd`], then as [`send`](Self::send).
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send_arena(&self, arena: &IpcArena, timeout: Duration) -> Result<()> {
        let (handle, fd) = arena.export_fd()?;
        self.send(handle.as_bytes(), &[fd.as_fd()], timeout)
    }

    /// Receive an arena sent with [`send_arena`](Self::send_arena) and map it into `ctx`
    /// ([`ImportedArena::open_fd`]), waiting at most `timeout` for the message. The payload
    /// must be exactly an arena envelope with exactly one descriptor (any others are closed).
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv); [`Error::CorruptHandle`] for a payload that is not an arena
    /// handle; [`Error::HandleTypeMismatch`] without exactly one descriptor; then as
    /// [`ImportedArena::open_fd`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::arena::ArenaHandle;
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let name = SocketName::Abstract("kv".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let arena = socket.recv_arena(&ctx, Duration::from_secs(5))?;
    /// let msg = socket.recv(Duration::from_secs(5))?;
    /// let block = arena.open(&ArenaHandle::<f32>::from_bytes(&msg.payload)?)?; // no driver call
    /// println!("{} floats", block.len());
    /// # Ok(()) }
    /// ```
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_arena(&self, ctx: &GpuContext, timeout: Duration) -> Result<ImportedArena> {
        let (payload, fd) = self.recv_with_one_fd(timeout)?;
        ImportedArena::open_fd(ctx, &IpcArenaHandle::from_bytes(&payload)?, fd)
    }

    /// One message that must carry exactly one descriptor; any other count is
    /// [`Error::HandleTypeMismatch`], the descriptors closed. The payload is returned
    /// unchecked.
    /// [`recv_arena`](Self::recv_arena), mapping the arena read-only
    /// ([`ReadOnlyArena::open_fd`]: the GPU refuses writes through it).
    ///
    /// # Errors
    ///
    /// As [`recv_arena`](Self::recv_arena).
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_arena_read_only(
        &self,
        ctx: &GpuContext,
        timeout: Duration,
    ) -> Result<ReadOnlyArena> {
        let (payload, fd) = self.recv_with_one_fd(timeout)?;
        ReadOnlyArena::open_fd(ctx, &IpcArenaHandle::from_bytes(&payload)?, fd)
    }

    fn recv_with_one_fd(&self, timeout: Duration) -> Result<(Vec<u8>, OwnedFd)> {
        let FdMessage { payload, fds } = self.recv(timeout)?;
        Ok((payload, only_descriptor(HandleType::PosixFd, fds)?))
    }
}

impl FdSocket {
    /// Send an [`IpcPool`] to the peer: its handle and a new descriptor of the pool, which this
    /// side closes once sent. The peer imports it with [`recv_pool`](Self::recv_pool); the
    /// pool's buffers then travel as [`PoolHandle`] bytes alone.
    ///
    /// # Errors
    ///
    /// As [`IpcPool::export_fd`], then as [`send`](Self::send).
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send_pool(&self, pool: &IpcPool, timeout: Duration) -> Result<()> {
        let (handle, fd) = pool.export_fd()?;
        self.send(handle.as_bytes(), &[fd.as_fd()], timeout)
    }

    /// Receive a pool sent with [`send_pool`](Self::send_pool) and import it into `ctx`
    /// ([`ImportedPool::open_fd`]), waiting at most `timeout`. The payload must be exactly a
    /// pool envelope with exactly one descriptor (any others are closed).
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv); [`Error::CorruptHandle`] for a payload that is not a pool
    /// handle; [`Error::HandleTypeMismatch`] without exactly one descriptor; then as
    /// [`ImportedPool::open_fd`].
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_pool(&self, ctx: &GpuContext, timeout: Duration) -> Result<ImportedPool> {
        let (payload, fd) = self.recv_with_one_fd(timeout)?;
        ImportedPool::open_fd(ctx, &IpcPoolHandle::from_bytes(&payload)?, fd)
    }

    /// [`recv_pool`](Self::recv_pool), as a [`ReadOnlyPool`]: read-only by type only (the
    /// driver cannot map pool memory read-only; see [`ReadOnlyPool`]).
    ///
    /// # Errors
    ///
    /// As [`recv_pool`](Self::recv_pool).
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_pool_read_only(&self, ctx: &GpuContext, timeout: Duration) -> Result<ReadOnlyPool> {
        let (payload, fd) = self.recv_with_one_fd(timeout)?;
        ReadOnlyPool::open_fd(ctx, &IpcPoolHandle::from_bytes(&payload)?, fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An open descriptor of nothing in particular.
    fn some_fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    fn message(payload: Vec<u8>, fds: usize) -> FdMessage {
        FdMessage {
            payload,
            fds: (0..fds).map(|_| some_fd()).collect(),
        }
    }

    fn pooled_payload() -> Vec<u8> {
        let (pool, buffer) = crate::pool::made_up_handles::<u32>();
        [pool.as_bytes(), buffer.as_bytes()].concat()
    }

    fn descriptors(r: Result<BufferMessage<u32>>) -> Option<(HandleType, usize, usize)> {
        match r {
            Err(Error::HandleTypeMismatch {
                handle,
                conflict: TypeConflict::Descriptors { expected, found },
            }) => Some((handle, expected, found)),
            _ => None,
        }
    }

    #[test]
    fn a_pool_buffer_message_needs_exactly_its_pools_descriptor() {
        let parsed = BufferMessage::<u32>::parse(message(pooled_payload(), 1));
        assert!(matches!(parsed, Ok(BufferMessage::Pooled(..))));
        for n in [0, 2] {
            assert_eq!(
                descriptors(BufferMessage::parse(message(pooled_payload(), n))),
                Some((HandleType::Pool, 1, n)),
                "{n} descriptors"
            );
        }
    }

    #[test]
    fn a_damaged_pool_buffer_message_is_a_corrupt_handle() {
        let len = pooled_payload().len();
        // A byte of the pool's handle, then one of the buffer's.
        for at in [40, len - 20] {
            let mut payload = pooled_payload();
            payload[at] ^= 0x10;
            assert!(
                matches!(
                    BufferMessage::<u32>::parse(message(payload, 1)),
                    Err(Error::CorruptHandle { .. })
                ),
                "byte {at}"
            );
        }
        // Neither one handle nor the pair.
        let mut payload = pooled_payload();
        payload.pop();
        assert!(matches!(
            BufferMessage::<u32>::parse(message(payload, 1)),
            Err(Error::CorruptHandle { .. })
        ));
    }
}
