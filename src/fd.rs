//! [`FdListener`] and [`FdSocket`]: passing file descriptors between processes over a
//! Unix-domain socket (`SCM_RIGHTS`), with the peer's credentials checked.
//!
//! File-descriptor handles (VMM allocations exported as POSIX fds, memory-pool exports) are
//! capabilities: only a process that was *sent* the descriptor can map the memory, unlike a
//! legacy IPC handle, whose 64 bytes are enough. Sending needs a channel the kernel trusts:
//! a Unix socket. `pidfd_getfd` would need ptrace permission over the peer, which the default
//! container seccomp and Yama settings refuse; a socket needs none.
//!
//! - Sockets are `SOCK_SEQPACKET` (each send is one record, with its descriptors: a version
//!   byte, 1, then the payload — what a program that does not use this crate writes and
//!   strips, as the [pool module's cuda.core example](crate::pool#with-cudacore-and-other-programs)
//!   does), in the
//!   abstract namespace ([`SocketName::Abstract`], no file, gone with the listener) or at a
//!   path ([`SocketName::Path`], mode `0600` right after the bind, unlinked on drop — by the
//!   process that bound it, and only while the file there is still the one it bound).
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
//! | the listener, before a `connect`                | `connect` waits for a new listener at the name: [`Error::Timeout`] at its deadline |
//!
//! The socket carries bytes and descriptors and knows no object of the crate: sending a
//! buffer, an arena or a pool ([`FdSocket::send_buffer`], [`FdSocket::send_arena`],
//! [`FdSocket::send_pool`] and their `recv_*`) is written beside the objects, in `socket_objects.rs`.
//!
//! Covered by `tests/fd_socket.rs` (real processes): a descriptor and its contents across,
//! a connect made before the listener binds, a peer that never sends, a peer killed, a
//! listener of another uid (name squatted), a connector of another uid, truncated and oversized
//! messages.
//!
//! # Sharing memory as file descriptors
//!
//! A legacy handle is 64 bytes that map the memory from any process that reads them; a POSIX-fd
//! buffer's memory travels as a file descriptor, which the kernel hands only to the process at the
//! other end of a Unix socket whose credentials were checked:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
//! use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
//!
//! fn exporter(ctx: &GpuContext) -> cuda_ipc::Result<()> {
//!     let buf = IpcBuffer::<f32>::zeroed_with(ctx, 1 << 20, HandleType::PosixFd)?;
//!     let listener = FdListener::bind(SocketName::Abstract("my-app".into()), PeerPolicy::SameUid)?;
//!     let peer = listener.accept(Duration::from_secs(5))?;
//!     peer.send_buffer(&buf, Duration::from_secs(5))?; // the envelope and a descriptor
//!     Ok(()) // dropping `buf` never waits: the importer's mapping keeps the memory alive
//! }
//!
//! fn importer(ctx: &GpuContext) -> cuda_ipc::Result<Vec<f32>> {
//!     let name = SocketName::Abstract("my-app".into());
//!     let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
//!     let buf = socket.recv_buffer::<f32>(ctx, Duration::from_secs(5))?;
//!     let mut host = vec![0.0; buf.len()];
//!     buf.copy_to_host(&mut host)?;
//!     Ok(host)
//! }
//! ```
//!
//! |  | `Legacy` | `PosixFd` | `Pool` |
//! |--|----------|-----------|--------|
//! | who can map it | any process that reads the 184-byte handle (any uid, any pid namespace) | only one the descriptor was sent to | only one the pool's descriptor was sent to |
//! | the exporter drops while mapped elsewhere | returns at once; the free is deferred until the last importer unmaps (freed at a later allocation, export or `collect_deferred()`) | returns at once (137 µs measured); the memory lives until the last importer unmaps | returns at once; the allocation waits in its pool's quarantine until the importers free their imports (freed at the pool's next allocation or `collect_deferred()`) |
//! | opened in its own process | refused (CUDA cannot) | allowed | allowed |
//! | PyTorch / CuPy / C++ peers (`raw_export`) | yes | no (`HandleTypeMismatch`) | no |
//! | one handle (`handle()`, `export_fd()`) | `handle()` | both | neither: `send_buffer`, or `export_pooled()` for another channel |
//! | size | as asked | rounded up to the allocation granularity (2 MiB on an H200) | as asked |
//!
//! Everything else is the same: the typed envelope and its checks, leases (`importers()`), stale
//! handles refused after the exporter dropped the buffer, the import cache, `PeerGone` for a
//! descriptor whose exporter died before it was opened. `IpcBuffer::export_fd` / `open_fd` are the
//! lower level for sending the descriptor your own way. `simple_ipc --handles fd` runs NVIDIA's
//! flow this way.
//!
//! **Other devices of the same process.** Virtual memory is mapped for one device: the one of the
//! context that created or opened it. Peer access between contexts (`enable_peer_access`,
//! `PeerGroup`) does not reach it, so before a kernel or a copy on another GPU of the process
//! touches a POSIX-fd buffer, an arena or a pool, grant that device access:
//!
//! ```rust,no_run
//! # fn f(buf: &cuda_ipc::IpcBuffer<f32>) -> cuda_ipc::Result<()> {
//! let gpu1 = cuda_ipc::GpuContext::new(1)?;
//! buf.grant_access(&gpu1)?; // cuMemSetAccess; IpcArena, IpcPool and their imports have it too
//! # Ok(()) }
//! ```
//!
//! Without it the driver refuses copies there (`CUDA_ERROR_INVALID_VALUE`) and kernels fault
//! (`tests/peer_access.rs`). A legacy *import* cannot be granted — the driver maps it for its
//! context only — and says so (`TypeConflict::ImportMappedPerContext`): open the handle in the
//! other context as well.
//!
//! Not here: **fabric handles** (`CU_MEM_HANDLE_TYPE_FABRIC`), the way to share memory across
//! machines of one NVLink domain (GB200 NVL72 and the like). The H200 machines report the device
//! attribute as supported, but `cuMemCreate` asking for a fabric handle fails with
//! `CUDA_ERROR_NOT_PERMITTED`, which is what a node without an IMEX channel answers (`doctor`
//! tries it rather than trusting the attribute). Using them needs the IMEX service running on
//! every node of the domain and an IMEX channel device (`/dev/nvidia-caps-imex-channels/channelN`)
//! visible to the process; with those, export gives a 64-byte handle instead of a descriptor,
//! and access is granted by the IMEX channel rather than by passing an fd. The crate does not
//! offer them until it can be tested on such a machine.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use crate::poll::Deadline;

use rustix::event::PollFlags;
use rustix::io::Errno;

use crate::error::{ArgumentDefect, Error, Result, StateDefect};
use crate::os::socket as sys;

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
            waiting_for: None,
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
///
/// A listener at a [`SocketName::Path`] removes its socket file when it drops, in the process
/// that bound it only (a child forked without `exec` that drops its copy leaves the parent's
/// file alone) and only while that path still names the file it bound (device and inode: a
/// file someone put there since is not its to remove).
#[derive(Debug)]
pub struct FdListener {
    fd: OwnedFd,
    name: SocketName,
    policy: PeerPolicy,
    /// The process that bound the socket: the only one whose drop unlinks its file.
    home: crate::process::Home,
    /// The socket file's device and inode, for a [`SocketName::Path`].
    file: Option<(u64, u64)>,
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
        let (fd, file) = sys::listen(&name.address()).map_err(|e| match e {
            Errno::ADDRINUSE => Error::AddressInUse {
                name: name.describe(),
            },
            e => os_error("bind/listen", &name, e),
        })?;
        Ok(Self {
            fd,
            name,
            policy,
            home: crate::process::Home::here(),
            file,
        })
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
        let waiting = crate::trace::Waiting::start("fd socket accept");
        let deadline = Deadline::after(timeout);
        waiting.end(loop {
            let ready = wait_ready(
                self.fd.as_fd(),
                PollFlags::IN,
                &self.name,
                deadline,
                "fd socket accept",
                timeout,
            );
            match ready.and_then(|()| self.try_accept()) {
                Ok(Some(socket)) => break Ok(socket),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        })
    }

    /// As [`accept`](Self::accept), without waiting: the next connection if one is queued now
    /// (`None`: none yet), its peer checked.
    ///
    /// # Errors
    ///
    /// As [`accept`](Self::accept), without [`Error::Timeout`].
    pub fn try_accept(&self) -> Result<Option<FdSocket>> {
        loop {
            match sys::accept(self.fd.as_fd()) {
                Ok(fd) => {
                    let peer = check_peer(fd.as_fd(), &self.name, &self.policy)?;
                    return Ok(Some(FdSocket {
                        fd,
                        peer,
                        peer_id: crate::process::ProcessIdentity::of_pid(peer.pid),
                        name: self.name.clone(),
                    }));
                }
                // Another thread took it, or the connector went away.
                Err(Errno::AGAIN | Errno::CONNABORTED) => return Ok(None),
                Err(Errno::INTR) => {}
                Err(e) => return Err(os_error("accept", &self.name, e)),
            }
        }
    }

    /// As [`accept`](Self::accept), awaited (feature `async`): the task waits, not a thread.
    /// No time limit of its own: compose one with the runtime's. **Cancel-safe:** a
    /// connection is accepted whole or stays queued for the next call.
    ///
    /// # Errors
    ///
    /// As [`accept`](Self::accept), without [`Error::Timeout`]; [`Error::Os`] if the reactor
    /// cannot start or watch the listener.
    #[cfg(feature = "async")]
    pub async fn accept_async(&self) -> Result<FdSocket> {
        let waiting = crate::trace::Waiting::start("fd socket accept (awaited)");
        waiting.end(crate::reactor::until(self.fd.as_fd(), || self.try_accept()).await)
    }

    /// Where this listener listens.
    #[must_use]
    pub fn name(&self) -> &SocketName {
        &self.name
    }
}

impl AsFd for FdListener {
    /// The listening socket: readable when a connection waits (for a
    /// [`WaitSet`](crate::wait::WaitSet) or a reactor).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for FdListener {
    fn drop(&mut self) {
        // Only the process that bound it (a forked child's copy is its parent's), and only
        // the file it bound (the bind fails on an existing file; one put there since is
        // someone else's). Drop cannot report: a file left behind makes the next bind at the
        // path `AddressInUse`.
        if let (SocketName::Path(path), Some(id)) = (&self.name, self.file)
            && self.home.is_here()
        {
            let _ = sys::unlink_if_same(path, id);
        }
    }
}

/// A connected socket that sends and receives messages with file descriptors.
#[derive(Debug)]
pub struct FdSocket {
    fd: OwnedFd,
    peer: PeerCred,
    /// The peer's process, identified when the connection was made (its pid, start time and
    /// pidfs inode: a reused pid is another process).
    peer_id: crate::process::ProcessIdentity,
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
    /// [`wait_ready`] on this socket.
    fn wait_ready(
        &self,
        flags: PollFlags,
        deadline: Deadline,
        what: &'static str,
        timeout: Duration,
    ) -> Result<()> {
        wait_ready(self.fd.as_fd(), flags, &self.name, deadline, what, timeout)
    }
}

impl FdSocket {
    /// The largest payload one message carries.
    pub const MAX_PAYLOAD: usize = MAX_PAYLOAD;
    /// The most descriptors one message carries.
    pub const MAX_FDS: usize = MAX_FDS;
}

impl FdSocket {
    /// Connect to a listener at `name`, checking that the listening process is one `policy`
    /// allows (a name squatted by another user is refused). Waits at most `timeout` for the
    /// name to be listened on (two processes started together need not order their starts)
    /// and, while the listener's backlog is full, for room in it; a zero `timeout` tries once.
    ///
    /// # Errors
    ///
    /// [`Error::PeerRefused`] for a listener the policy does not allow; [`Error::Timeout`]
    /// when nobody listened at `name` within `timeout` (`ECONNREFUSED` or `ENOENT` until then)
    /// or its backlog stayed full (`EAGAIN`); [`Error::Os`] naming `connect` for any other
    /// failure.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// // The listener may start after us: wait up to 10 s for it.
    /// let name = SocketName::Abstract("my-app.weights".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(10))?;
    /// println!("connected to pid {}", socket.peer().pid);
    /// # Ok::<(), cuda_ipc::Error>(())
    /// ```
    #[doc(alias = "SO_PEERCRED")]
    pub fn connect(name: &SocketName, policy: &PeerPolicy, timeout: Duration) -> Result<Self> {
        let waiting = crate::trace::Waiting::start("fd socket connect");
        waiting.end(Self::connect_untraced(name, policy, timeout))
    }

    /// [`connect`](Self::connect) without its trace.
    fn connect_untraced(name: &SocketName, policy: &PeerPolicy, timeout: Duration) -> Result<Self> {
        let fd = match sys::connect(&name.address(), timeout) {
            Ok(fd) => fd,
            Err(sys::ConnectFailure::NotYet { errno, waited }) => {
                return Err(Error::Timeout {
                    what: if errno == Errno::AGAIN {
                        "FdSocket::connect (the listener's backlog stayed full)"
                    } else {
                        "FdSocket::connect (nobody listened at the name)"
                    },
                    waited,
                    waiting_for: None,
                });
            }
            Err(sys::ConnectFailure::Failed(e)) => return Err(os_error("connect", name, e)),
        };
        let peer = check_peer(fd.as_fd(), name, policy)?;
        Ok(Self {
            fd,
            peer,
            peer_id: crate::process::ProcessIdentity::of_pid(peer.pid),
            name: name.clone(),
        })
    }

    /// The process at the other end.
    #[must_use]
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// The peer's process as identified when the connection was made (pid, start time,
    /// pidfs inode), for liveness checks that must not mistake a process that later reuses
    /// its pid for it; not alive where its pid is not visible (0).
    pub(crate) fn peer_identity(&self) -> crate::process::ProcessIdentity {
        self.peer_id
    }

    /// Send `payload` (1 to [`MAX_PAYLOAD`](Self::MAX_PAYLOAD) bytes) and `fds` (at most
    /// [`MAX_FDS`](Self::MAX_FDS)) as one message, waiting at most `timeout` for room in the
    /// socket.
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
                Err(Errno::AGAIN) => {
                    self.wait_ready(PollFlags::OUT, deadline, "fd socket send", timeout)?
                }
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
        let waiting = crate::trace::Waiting::start("fd socket receive");
        let deadline = Deadline::after(timeout);
        let mut buf = vec![0u8; MAX_PAYLOAD + 1];
        waiting.end(loop {
            match self.recv_into(&mut buf) {
                Ok(Some(message)) => break Ok(message),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if let Err(e) = self.wait_ready(PollFlags::IN, deadline, "fd socket receive", timeout) {
                break Err(e);
            }
        })
    }

    /// As [`recv`](Self::recv), without waiting: the next message if one is there now
    /// (`None`: none yet). One `recvmsg`: a message is taken whole or not at all. With the
    /// socket's descriptor (`AsFd`) in a reactor or a [`WaitSet`](crate::wait::WaitSet): wait
    /// for it to turn readable, then call this until `None`.
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv), without [`Error::Timeout`].
    pub fn try_recv(&self) -> Result<Option<FdMessage>> {
        self.recv_into(&mut vec![0u8; MAX_PAYLOAD + 1])
    }

    /// [`try_recv`](Self::try_recv) into `buf` (at least `MAX_PAYLOAD + 1` bytes): one buffer
    /// for all the tries of a waiting [`recv`](Self::recv).
    fn recv_into(&self, buf: &mut [u8]) -> Result<Option<FdMessage>> {
        loop {
            match sys::recv(self.fd.as_fd(), buf) {
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
                    return Ok(Some(FdMessage {
                        payload: buf[1..r.bytes].to_vec(),
                        fds: r.fds,
                    }));
                }
                Err(Errno::AGAIN) => return Ok(None),
                Err(Errno::INTR) => {}
                Err(Errno::CONNRESET) => return Err(Error::PeerClosed { pid: self.peer.pid }),
                Err(e) => return Err(os_error("recvmsg", &self.name, e)),
            }
        }
    }

    /// As [`recv`](Self::recv), awaited (feature `async`): the task waits, not a thread (one
    /// reactor thread per process wakes it; any runtime). No time limit of its own: compose
    /// one with the runtime's; a peer that closes or dies ends it with
    /// [`Error::PeerClosed`]. **Cancel-safe:** a message is taken whole or not at all.
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv), without [`Error::Timeout`]; [`Error::Os`] if the reactor
    /// cannot start or watch the socket.
    #[cfg(feature = "async")]
    pub async fn recv_async(&self) -> Result<FdMessage> {
        let waiting = crate::trace::Waiting::start("fd socket receive (awaited)");
        waiting.end(crate::reactor::until(self.fd.as_fd(), || self.try_recv()).await)
    }

    /// Await the socket's turning readable (a message, or the peer's close) without taking
    /// anything (feature `async`): then any `recv_*` call with a zero timeout finds its
    /// message. Cancel-safe.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] if the reactor cannot start or watch the socket.
    #[cfg(feature = "async")]
    pub async fn readable(&self) -> Result<()> {
        crate::reactor::Readable::new(self.fd.as_fd()).await
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
