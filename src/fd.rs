//! [`FdListener`] and [`FdSocket`]: passing file descriptors between processes over a
//! Unix-domain socket (`SCM_RIGHTS`), with the peer's credentials checked.
//!
//! File-descriptor handles (VMM allocations exported as POSIX fds, memory-pool exports) are
//! capabilities: only a process that was *sent* the descriptor can map the memory, unlike a
//! legacy IPC handle, whose 64 bytes are enough. Sending needs a channel the kernel trusts:
//! a Unix socket. `pidfd_getfd` would need ptrace permission over the peer, which the default
//! container seccomp and Yama settings refuse; a socket needs none.
//!
//! - Sockets are `SOCK_SEQPACKET` (each send is one message, with its descriptors), in the
//!   abstract namespace ([`SocketName::Abstract`], no file, gone with the listener) or at a
//!   path ([`SocketName::Path`], mode `0600` right after the bind, unlinked on drop).
//! - Both sides check the other's credentials (`SO_PEERCRED`: pid, uid, gid as the kernel saw
//!   them at `connect`/`listen`) against a [`PeerPolicy`] — the same uid by default. A
//!   listener on an abstract name has no file permissions, so this check is what keeps other
//!   users out; a connector checks the listener too, so a name squatted by another user is
//!   refused, not trusted.
//! - Every wait has a deadline; a peer that closed its socket or died is
//!   [`Error::PeerClosed`] naming its pid.
//!
//! # When the other side dies
//!
//! | The peer dies or stops...                     | This side sees                            |
//! |-----------------------------------------------|-------------------------------------------|
//! | before connecting                              | `accept`: [`Error::Timeout`] at its deadline |
//! | after `connect`, before it is accepted         | `accept` succeeds (the kernel queued it); the first `recv` is `PeerClosed` |
//! | after connecting, never sending                | `recv`: [`Error::Timeout`] at its deadline |
//! | in the middle of a `send`                       | nothing half-sent: a message and its descriptors arrive whole or not at all |
//! | after sending                                   | the message is delivered; the next `recv` is `PeerClosed` |
//! | while this side sends                           | `send`: `PeerClosed` (`EPIPE`, never `SIGPIPE`) |
//! | the listener, before a `connect`                | `connect`: [`Error::Os`] naming `connect` (`ECONNREFUSED`/`ENOENT`) |
//!
//! Covered by `tests/fd_socket.rs` (real processes): a descriptor and its contents across,
//! a peer that never sends, a peer killed, a listener of another uid (name squatted), a
//! connector of another uid, truncated and oversized messages.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use crate::poll::Deadline;

use rustix::event::PollFlags;
use rustix::io::Errno;

use bytemuck::Pod;

use crate::arena::{ImportedArena, IpcArena, IpcArenaHandle};
use crate::buffer::{ImportedBuffer, IpcBuffer};
use crate::context::GpuContext;
use crate::error::{ArgumentDefect, Error, Result, StateDefect, TypeConflict};
use crate::handle::{HandleType, IpcMemHandle};
use crate::os::socket as sys;
use crate::pool::{ImportedPool, IpcPool, IpcPoolHandle, PoolHandle};
use crate::read_only::{ReadOnlyArena, ReadOnlyBuffer, ReadOnlyPool};

/// The largest payload of one message, in bytes.
pub(crate) const MAX_PAYLOAD: usize = 64 * 1024;
/// The most descriptors one message carries.
pub(crate) const MAX_FDS: usize = sys::MAX_FDS;

/// Message framing: one version byte before the payload (so that no message is empty: an
/// empty read means the peer closed).
const FRAME_VERSION: u8 = 1;

/// Where an [`FdListener`] listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketName {
    /// A name in Linux's abstract socket namespace: no file, no permissions (the credential
    /// check is the gate), removed when the listener closes. Names are per network namespace.
    Abstract(String),
    /// A socket file at this path, mode `0600`, unlinked when the listener drops.
    Path(PathBuf),
}

impl SocketName {
    fn describe(&self) -> String {
        match self {
            Self::Abstract(name) => format!("@{name}"),
            Self::Path(path) => path.display().to_string(),
        }
    }

    fn address(&self) -> sys::Address<'_> {
        match self {
            Self::Abstract(name) => sys::Address::Abstract(name.as_bytes()),
            Self::Path(path) => sys::Address::Path(path),
        }
    }
}

/// Which peers a socket accepts, checked against `SO_PEERCRED` on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PeerPolicy {
    /// Only processes of this process's effective uid (the default).
    #[default]
    SameUid,
    /// Only processes of these uids.
    Uids(Vec<u32>),
    /// Any process that can reach the socket. With an abstract name that is every process of
    /// the network namespace: use only where something else authenticates the peer.
    Anyone,
}

impl PeerPolicy {
    fn allows(&self, uid: u32) -> bool {
        match self {
            Self::SameUid => uid == crate::os::euid(),
            Self::Uids(uids) => uids.contains(&uid),
            Self::Anyone => true,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::SameUid => format!("only uid {}", crate::os::euid()),
            Self::Uids(uids) => format!("only uids {uids:?}"),
            Self::Anyone => "anyone".into(),
        }
    }
}

/// The credentials of the process at the other end of a socket, as the kernel recorded them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Its pid, as this process's pid namespace sees it; **0** when the peer runs in a pid
    /// namespace this one cannot see (a container's, say): the kernel then has no number to
    /// give ([`PeerPolicy`] judges uids only), and errors that name the peer
    /// ([`Error::PeerClosed`]) carry the 0.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
}

fn os_error(call: &'static str, name: &SocketName, e: Errno) -> Error {
    Error::Os {
        call,
        name: name.describe(),
        source: std::io::Error::from_raw_os_error(e.raw_os_error()),
    }
}

/// Wait until `fd` is ready for `flags`, at most until `deadline`: on time out,
/// [`Error::Timeout`] for `what` after `timeout` (the caller's whole budget).
fn wait_ready(
    fd: BorrowedFd<'_>,
    flags: PollFlags,
    name: &SocketName,
    deadline: Deadline,
    what: &'static str,
    timeout: Duration,
) -> Result<()> {
    match sys::wait(fd, flags, deadline) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Timeout {
            what,
            waited: timeout,
        }),
        Err(e) => Err(os_error("poll", name, e)),
    }
}

fn check_peer(fd: BorrowedFd<'_>, name: &SocketName, policy: &PeerPolicy) -> Result<PeerCred> {
    let (pid, uid, gid) =
        sys::peer_cred(fd).map_err(|e| os_error("getsockopt(SO_PEERCRED)", name, e))?;
    if !policy.allows(uid) {
        return Err(Error::PeerRefused {
            pid,
            uid,
            name: name.describe(),
            policy: policy.describe(),
        });
    }
    Ok(PeerCred { pid, uid, gid })
}

/// A listening socket that hands out [`FdSocket`]s to peers its [`PeerPolicy`] allows.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let name = SocketName::Abstract(format!("my-app-{}", std::process::id()));
/// let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid)?;
/// // In the peer process: FdSocket::connect(&name, PeerPolicy::SameUid, Duration::from_secs(5))
/// let socket = listener.accept(Duration::from_secs(5))?;
/// let file = std::fs::File::open("/dev/null").expect("open");
/// socket.send(b"here is a descriptor", &[std::os::fd::AsFd::as_fd(&file)], Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FdListener {
    fd: OwnedFd,
    name: SocketName,
    policy: PeerPolicy,
}

impl FdListener {
    /// Listen at `name`, accepting peers `policy` allows.
    ///
    /// # Errors
    ///
    /// [`Error::AddressInUse`] when something already listens there (or a file exists at the
    /// path: it is never removed for you); [`Error::Os`] naming the failed call otherwise.
    #[doc(alias = "listen")]
    pub fn bind(name: SocketName, policy: PeerPolicy) -> Result<Self> {
        let fd = sys::listen(&name.address()).map_err(|e| match e {
            Errno::ADDRINUSE => Error::AddressInUse {
                name: name.describe(),
            },
            e => os_error("bind/listen", &name, e),
        })?;
        Ok(Self { fd, name, policy })
    }

    /// The next connection whose peer the policy allows, waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when no peer connected in time; [`Error::PeerRefused`] for a peer the
    /// policy does not allow (its connection is closed; call `accept` again for the next);
    /// [`Error::Os`] naming the failed call.
    #[doc(alias = "accept4")]
    #[doc(alias = "SO_PEERCRED")]
    pub fn accept(&self, timeout: Duration) -> Result<FdSocket> {
        let deadline = Deadline::after(timeout);
        loop {
            wait_ready(
                self.fd.as_fd(),
                PollFlags::IN,
                &self.name,
                deadline,
                "fd socket accept",
                timeout,
            )?;
            match sys::accept(self.fd.as_fd()) {
                Ok(fd) => {
                    let peer = check_peer(fd.as_fd(), &self.name, &self.policy)?;
                    return Ok(FdSocket {
                        fd,
                        peer,
                        name: self.name.clone(),
                    });
                }
                // Another thread took it, or the connector went away: wait again.
                Err(Errno::AGAIN | Errno::CONNABORTED | Errno::INTR) => {}
                Err(e) => return Err(os_error("accept", &self.name, e)),
            }
        }
    }

    /// Where this listener listens.
    #[must_use]
    pub fn name(&self) -> &SocketName {
        &self.name
    }
}

impl Drop for FdListener {
    fn drop(&mut self) {
        if let SocketName::Path(path) = &self.name {
            // Ours since the bind (the bind fails on an existing file). Drop cannot report.
            let _ = sys::unlink(path);
        }
    }
}

/// A connected socket that sends and receives messages with file descriptors.
#[derive(Debug)]
pub struct FdSocket {
    fd: OwnedFd,
    peer: PeerCred,
    name: SocketName,
}

/// One message received: its payload and the descriptors that came with it (close-on-exec,
/// owned: dropping them closes them).
#[derive(Debug)]
pub struct FdMessage {
    /// The bytes sent.
    pub payload: Vec<u8>,
    /// The descriptors sent, in order.
    pub fds: Vec<OwnedFd>,
}

impl FdSocket {
    /// The largest payload one message carries.
    pub const MAX_PAYLOAD: usize = MAX_PAYLOAD;
    /// The most descriptors one message carries.
    pub const MAX_FDS: usize = MAX_FDS;
}

impl FdSocket {
    /// Connect to a listener at `name`, checking that the listening process is one `policy`
    /// allows (a name squatted by another user is refused), retrying at most `timeout` while
    /// its backlog is full.
    ///
    /// # Errors
    ///
    /// [`Error::PeerRefused`] for a listener the policy does not allow; [`Error::Os`] naming
    /// `connect` (`ECONNREFUSED` or `ENOENT`: nobody listens there).
    #[doc(alias = "SO_PEERCRED")]
    pub fn connect(name: &SocketName, policy: &PeerPolicy, timeout: Duration) -> Result<Self> {
        let fd = sys::connect(&name.address(), Deadline::after(timeout))
            .map_err(|e| os_error("connect", name, e))?;
        let peer = check_peer(fd.as_fd(), name, policy)?;
        Ok(Self {
            fd,
            peer,
            name: name.clone(),
        })
    }

    /// The process at the other end.
    #[must_use]
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// Send `payload` (1 to [`MAX_PAYLOAD`](Self::MAX_PAYLOAD) bytes) and `fds` (at most [`MAX_FDS`](Self::MAX_FDS)) as one
    /// message, waiting at most `timeout` for room in the socket.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty or oversized payload or too many descriptors;
    /// [`Error::PeerClosed`] when the peer is gone; [`Error::Timeout`]; [`Error::Os`] naming
    /// `sendmsg`.
    #[doc(alias = "sendmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send(&self, payload: &[u8], fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<()> {
        let call = "FdSocket::send";
        ArgumentDefect::check_range(
            call,
            "payload bytes",
            payload.len() as u64,
            1,
            MAX_PAYLOAD as u64,
        )?;
        ArgumentDefect::check_range(call, "descriptors", fds.len() as u64, 0, MAX_FDS as u64)?;
        let mut framed = Vec::with_capacity(payload.len() + 1);
        framed.push(FRAME_VERSION);
        framed.extend_from_slice(payload);
        let deadline = Deadline::after(timeout);
        loop {
            match sys::send(self.fd.as_fd(), &framed, fds) {
                Ok(()) => return Ok(()),
                Err(Errno::AGAIN) => wait_ready(
                    self.fd.as_fd(),
                    PollFlags::OUT,
                    &self.name,
                    deadline,
                    "fd socket send",
                    timeout,
                )?,
                Err(Errno::INTR) => {}
                Err(Errno::PIPE | Errno::CONNRESET) => {
                    return Err(Error::PeerClosed { pid: self.peer.pid });
                }
                Err(e) => return Err(os_error("sendmsg", &self.name, e)),
            }
        }
    }

    /// Receive the next message, waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::PeerClosed`] when the peer closed its socket or died; [`Error::Timeout`];
    /// [`Error::Corrupt`] for a message that was cut short (more bytes or descriptors than
    /// this side accepts: the descriptors that did arrive are closed) or not framed by this
    /// crate (an empty record among them: the connection stays up, and the next `recv`
    /// reads the next message); [`Error::Os`] naming `recvmsg`.
    #[doc(alias = "recvmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv(&self, timeout: Duration) -> Result<FdMessage> {
        let deadline = Deadline::after(timeout);
        let mut buf = vec![0u8; MAX_PAYLOAD + 1];
        loop {
            match sys::recv(self.fd.as_fd(), &mut buf) {
                // End of file, or an empty record (which no sender of this crate makes: every
                // frame has its version byte) while the connection stays up.
                Ok(r) if r.bytes == 0 && sys::peer_hung_up(self.fd.as_fd()) => {
                    return Err(Error::PeerClosed { pid: self.peer.pid });
                }
                Ok(r) if r.bytes == 0 => {
                    drop(r.fds); // closed: no message of ours carries them
                    return Err(Error::Corrupt {
                        what: "fd socket message",
                        defect: StateDefect::Missing {
                            what: "the frame's version byte (an empty record)",
                        },
                    });
                }
                Ok(r) if r.truncated => {
                    return Err(Error::Corrupt {
                        what: "fd socket message",
                        defect: StateDefect::Truncated {
                            fds_closed: r.fds.len(),
                        },
                    });
                }
                Ok(r) => {
                    if buf[0] != FRAME_VERSION {
                        return Err(Error::Corrupt {
                            what: "fd socket message",
                            defect: StateDefect::UnknownValue {
                                field: "frame version",
                                value: buf[0].into(),
                            },
                        });
                    }
                    return Ok(FdMessage {
                        payload: buf[1..r.bytes].to_vec(),
                        fds: r.fds,
                    });
                }
                Err(Errno::AGAIN) => wait_ready(
                    self.fd.as_fd(),
                    PollFlags::IN,
                    &self.name,
                    deadline,
                    "fd socket receive",
                    timeout,
                )?,
                Err(Errno::INTR) => {}
                Err(Errno::CONNRESET) => return Err(Error::PeerClosed { pid: self.peer.pid }),
                Err(e) => return Err(os_error("recvmsg", &self.name, e)),
            }
        }
    }
}

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
                crate::buffer::BufferCore::open_pooled(ctx, &pool, fd, &buffer)
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

impl AsFd for FdSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Copy descriptor `fd` of process `pid` into this process without its cooperation
/// (`pidfd_getfd`, Linux 5.6+): the opt-in alternative to receiving it over an [`FdSocket`],
/// for processes that may use it.
///
/// The kernel allows it only with ptrace-attach permission over `pid` — the same uid *and*
/// Yama's `ptrace_scope` at 0 (or `CAP_SYS_PTRACE`) — which the default seccomp and Yama
/// settings of containers deny; an [`FdSocket`] needs none of it. The number `fd` is the
/// other process's (it must tell you, e.g. through shared memory), and the descriptor it names
/// may have changed by the time this runs: use it only with a peer that keeps it open and says
/// so.
///
/// # Errors
///
/// [`Error::PtraceDenied`] when the kernel refuses (`EPERM`); [`Error::InvalidArgument`] when
/// `pid` has no descriptor `fd` (`EBADF`); [`Error::Os`] naming `pidfd_getfd` otherwise (no
/// such process: `ESRCH`; a kernel before 5.6: `ENOSYS`).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> cuda_ipc::Result<()> {
/// # let (peer_pid, peer_fd) = (4242, 7);
/// match cuda_ipc::fd::take_fd_from_process(peer_pid, peer_fd) {
///     Ok(fd) => println!("got {fd:?}"),
///     Err(cuda_ipc::Error::PtraceDenied { .. }) => println!("not allowed here: use an FdSocket"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[doc(alias = "pidfd_getfd")]
pub fn take_fd_from_process(pid: u32, fd: i32) -> Result<OwnedFd> {
    crate::os::pidfd_getfd(pid, fd).map_err(|e| match e {
        Errno::PERM | Errno::ACCESS => Error::PtraceDenied { pid },
        Errno::BADF => Error::InvalidArgument {
            call: "take_fd_from_process",
            defect: ArgumentDefect::NoSuchDescriptor { pid, fd },
        },
        e => Error::Os {
            call: "pidfd_getfd",
            name: format!("pid {pid} fd {fd}"),
            source: std::io::Error::from_raw_os_error(e.raw_os_error()),
        },
    })
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
