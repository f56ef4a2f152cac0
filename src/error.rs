//! The crate's one error type.
//!
//! Every variant says which operation failed and with what: the OS error and the shared-memory
//! name, the header field that did not match and both values, the peer that was lost. Callers
//! branch on the variant; the `Display` text is for people.
//!
//! # Freeing, and what errors say
//!
//! Dropping an exported buffer never waits: new opens of its handle are refused at once
//! (`StaleHandle`), and the memory is freed as soon as no importer maps it — at once, or later,
//! when the last importer has unmapped or died (the free is *deferred*; this process frees deferred
//! buffers at its next allocation or export, or when you call `collect_deferred()`). To wait and
//! know, call `close(timeout)`: it hands the buffer back if importers remain. A process that dies
//! on the other side is `Error::PeerGone { pid, role }`, the `PeerRole` saying who it was (an
//! `Exporter` whose handle you open or wait on, an `Importer` of your signal or channel, a
//! `BarrierParty`). A handle refused as `Error::CorruptHandle { defect }` says why in a
//! `HandleDefect` to match on: `Size`, `Magic`, `Version`, `Kind` (another kind's handle),
//! `Checksum`, `Layout`, `Names` (another export's table), `Memory` (it disagrees with what the
//! driver maps), `Unsupported` (a PyTorch expandable segment), ... The other errors with a reason
//! carry it as an enum too: `InvalidArgument { call, defect: ArgumentDefect }` (`OutOfRange` with
//! the value and the bounds, `AllocationSize`, `LengthMismatch`, `NotIncreasing` for a signal,
//! ...), `Corrupt { what, defect: StateDefect }` (shared state a peer broke: `NotInitialised`,
//! `OutOfRange`, `Counter`, `Mismatch`, `DriverAnswer`, ...), `InvalidState { call, state:
//! ObjectState }`, `InvalidName { name, defect: NameDefect }`, `HandleTypeMismatch { handle,
//! conflict: TypeConflict }` (`Descriptors { expected, found }` — a POSIX-fd handle without its
//! descriptor is `expected: 1, found: 0` — or `Needs(HandleType)`), `Unsupported { missing:
//! Capability, .. }` (`StreamMemOps64`: use events instead of signals) and `DeviceNotReachable {
//! peer, .. }` (`None`: not visible here). `Display` is for people; match the variants.
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{Error, GpuContext, IpcBuffer};
//!
//! fn main() -> cuda_ipc::Result<()> {
//!     let ctx = GpuContext::new(0)?;
//!     let buf = IpcBuffer::<u32>::zeroed(&ctx, 1024)?;
//!     // ... publish buf.handle()?; importers open it ...
//!     match buf.close(Duration::from_secs(2)) {
//!         Ok(()) => println!("freed"),
//!         Err(e) => {
//!             if let Error::LeasesOutstanding { pids, .. } = e.error() {
//!                 println!("{pids:?} still map it; freed once they let go");
//!             }
//!             drop(e); // the buffer in it: its free is deferred
//!         }
//!     }
//!     let left = cuda_ipc::collect_deferred();
//!     println!("{} bytes still mapped by other processes", left.pending_bytes);
//!     Ok(())
//! }
//! ```

use std::io;
use std::time::Duration;

mod defect;
pub use defect::{
    ArgumentDefect, Capability, HandleDefect, NameDefect, ObjectState, StateDefect, TypeConflict,
};

/// `Result` with this crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in this crate.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a `_` arm.
///
/// # Examples
///
/// Branch on what the caller can act on; `Display` says the rest for people:
///
/// ```no_run
/// use cuda_ipc::{Error, GpuContext, ImportedBuffer, IpcMemHandle};
/// use cuda_ipc::error::PeerRole;
///
/// fn open(ctx: &GpuContext, handle: &IpcMemHandle<f32>) -> Option<ImportedBuffer<f32>> {
///     match ImportedBuffer::open(ctx, handle) {
///         Ok(buf) => Some(buf),
///         // The exporter freed the buffer (even if a new one sits at its address).
///         Err(Error::StaleHandle { .. }) => None,
///         // The exporting process died: stop waiting for it.
///         Err(Error::PeerGone { pid, role: PeerRole::Exporter }) => {
///             eprintln!("exporter {pid} is gone");
///             None
///         }
///         Err(other) => {
///             eprintln!("cannot open the buffer: {other}");
///             None
///         }
///     }
/// }
/// # fn main() {}
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shared-memory name was rejected before any system call was made. [`NameDefect`]
    /// says which rule it broke.
    #[error("invalid shared-memory name {name:?}: {defect}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// The rule it broke.
        defect: NameDefect,
    },

    /// An argument is out of its documented range. [`ArgumentDefect`] says which and how.
    #[error("invalid argument to {call}: {defect}")]
    InvalidArgument {
        /// The function that rejected the argument.
        call: &'static str,
        /// What was wrong.
        defect: ArgumentDefect,
    },

    /// The object is not in a state where the call is possible: initialising a barrier twice
    /// (internally also: re-exporting a mapping, which the public types rule out). Unlike
    /// [`Error::InvalidArgument`], no argument would have made the call succeed.
    #[error("{call} not possible: {state}")]
    InvalidState {
        /// The function that was called.
        call: &'static str,
        /// The state that rules it out.
        state: ObjectState,
    },

    /// Exclusive create found the name already taken.
    #[error("shared-memory region {name:?} already exists")]
    AlreadyExists {
        /// The region's name.
        name: String,
    },

    /// Open found no region of that name.
    #[error("shared-memory region {name:?} does not exist")]
    NotFound {
        /// The region's name.
        name: String,
    },

    /// The OS refused access (`EACCES`/`EPERM`).
    #[error("permission denied on shared-memory region {name:?} ({call})")]
    PermissionDenied {
        /// The region's name.
        name: String,
        /// The system call that failed.
        call: &'static str,
    },

    /// The name in `/dev/shm` is a symbolic link; it is never followed.
    #[error("shared-memory region {name:?} is a symbolic link; refusing to follow it")]
    Symlink {
        /// The region's name.
        name: String,
    },

    /// The name in `/dev/shm` is not a regular file.
    #[error("shared-memory region {name:?} is not a regular file (file type {file_type:#o})")]
    NotRegularFile {
        /// The region's name.
        name: String,
        /// The `S_IFMT` bits found.
        file_type: u32,
    },

    /// The region belongs to another user: it could be a squatter's.
    #[error("shared-memory region {name:?} is owned by uid {found}, expected our euid {expected}")]
    WrongOwner {
        /// The region's name.
        name: String,
        /// Our effective uid.
        expected: u32,
        /// The owner found.
        found: u32,
    },

    /// The region grants group or other permissions: it must be exactly `0600`.
    #[error("shared-memory region {name:?} has mode {mode:#o}; group/other bits must be clear")]
    InsecurePermissions {
        /// The region's name.
        name: String,
        /// The permission bits found.
        mode: u32,
    },

    /// The file size does not match what the header or the caller's type requires.
    #[error("shared-memory region {name:?} is {found} bytes, expected {expected}")]
    SizeMismatch {
        /// The region's name.
        name: String,
        /// The size required.
        expected: u64,
        /// The size found.
        found: u64,
    },

    /// The region's creator has not published its header (yet): it is still initialising, or it
    /// died before finishing.
    #[error("shared-memory region {name:?} is not ready after {waited:?}{}",
        if *.creator_dead { " (its creator has exited)" } else { "" })]
    NotReady {
        /// The region's name.
        name: String,
        /// How long open waited for the header.
        waited: Duration,
        /// The creator's identity was readable and that process is gone.
        creator_dead: bool,
    },

    /// A header field read from shared memory does not hold what this process expects: a
    /// different layout, a different program, or corruption.
    #[error(
        "shared-memory region {name:?}: header field `{field}` is {found:#x}, expected {expected:#x}"
    )]
    HeaderMismatch {
        /// The region's name.
        name: String,
        /// The header field.
        field: &'static str,
        /// The value this process expects.
        expected: u64,
        /// The value found.
        found: u64,
    },

    /// Shared state read from another process (or an answer from the driver) failed
    /// validation: a peer wrote what the protocol never writes, or something outside the
    /// protocol wrote the memory. [`StateDefect`] says what was found.
    #[error("corrupt shared state in {what}: {defect}")]
    Corrupt {
        /// Which structure.
        what: &'static str,
        /// What was wrong.
        defect: StateDefect,
    },

    /// `/dev/shm` has no room for the region (`fallocate` reported `ENOSPC`).
    #[error("no space in /dev/shm for {len} bytes of region {name:?}")]
    NoSpace {
        /// The region's name.
        name: String,
        /// The bytes asked for.
        len: u64,
    },

    /// A barrier already has as many participants as it was created for.
    #[error("barrier is full: all {parties} participant slots are taken")]
    BarrierFull {
        /// The barrier's party count.
        parties: u32,
    },

    /// A process this one depends on is gone: the exporter of an object opened here, an
    /// importer of an object exported here (a lease holder that died without closing it, so
    /// whatever it was expected to do will not happen), or a barrier participant (which
    /// poisons the barrier: every later wait fails at once). [`PeerRole`] says which.
    #[error("{}", .role.describe(*.pid))]
    PeerGone {
        /// The process.
        pid: u32,
        /// What it was to this process.
        role: PeerRole,
    },

    /// The barrier was poisoned explicitly with
    /// [`ProcessBarrier::poison`](crate::barrier::ProcessBarrier::poison).
    #[error("barrier was poisoned by pid {pid}")]
    Poisoned {
        /// The process that poisoned it.
        pid: u32,
    },

    /// A bounded wait ran out of time. The barrier is not poisoned: the caller withdrew its
    /// arrival and may wait again.
    #[error("{what} timed out after {waited:?}{}", waiting_for_suffix(*.waiting_for))]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// The live process that held the wait up, where one is known: a channel producer's
        /// acquire names the consumer that has not released the slot (in a broadcast channel,
        /// the slowest attached one), a receive names the producer.
        waiting_for: Option<u32>,
    },

    /// A CUDA driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Cuda {
        /// The driver function.
        call: &'static str,
        /// The raw `CUresult`.
        code: i32,
        /// Its name (`CUDA_ERROR_...`), from a table or the driver.
        name: String,
    },

    /// No CUDA driver library could be loaded (see [`driver::library_path`]): the process
    /// runs on a machine without the NVIDIA driver, or the library is not on the loader's
    /// path.
    ///
    /// [`driver::library_path`]: crate::driver::library_path
    #[error("no CUDA driver library: tried {tried} ({reason})")]
    DriverNotFound {
        /// The libraries tried, in order.
        tried: String,
        /// What the dynamic loader said for each.
        reason: String,
    },

    /// An NCCL call failed ([`crate::nccl`]): the call, its `ncclResult_t`, and NCCL's own text
    /// (`ncclGetErrorString` and `ncclGetLastError`).
    #[error("{call} failed: {name} ({code}){}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// The raw `ncclResult_t` (-1: the library lacks the call).
        code: i32,
        /// Its name (`ncclInvalidUsage`, ...).
        name: &'static str,
        /// What NCCL said about it.
        detail: String,
    },

    /// No NCCL library could be loaded ([`crate::nccl::library_path`]).
    #[error("no NCCL library: tried {tried} ({reason})")]
    NcclNotFound {
        /// The libraries tried, in order.
        tried: String,
        /// What the dynamic loader said for each.
        reason: String,
    },

    /// The loaded driver library has no entry point for `call`: the driver is older than the
    /// call needs.
    #[error(
        "the CUDA driver (version {driver_version}) has no entry point for {call}; a newer driver is needed"
    )]
    DriverTooOld {
        /// The driver function.
        call: &'static str,
        /// The driver's CUDA version (`cuDriverGetVersion`, e.g. 12040), 0 if unknown.
        driver_version: i32,
    },

    /// A socket peer's credentials (`SO_PEERCRED`) are not ones the [`PeerPolicy`] allows:
    /// for a listener, the connecting process; for a connector, the listening one (a name
    /// squatted by another user).
    ///
    /// [`PeerPolicy`]: crate::fd::PeerPolicy
    #[error("socket {name}: peer pid {pid} (uid {uid}) refused ({policy})")]
    PeerRefused {
        /// The peer's pid.
        pid: u32,
        /// The peer's effective uid.
        uid: u32,
        /// The socket's name.
        name: String,
        /// What the policy allows.
        policy: String,
    },

    /// The process at the other end of a socket closed it or died.
    #[error("socket peer pid {pid} closed the connection (it exited, died or dropped its socket)")]
    PeerClosed {
        /// The peer's pid.
        pid: u32,
    },

    /// A bootstrap peer ([`crate::bootstrap`]) was refused: it is not a cuda-ipc bootstrap
    /// peer, does not have the shared secret, or sent a message that failed its check
    /// (forged, altered, replayed, out of order, over the size bound). The connection is not
    /// used again.
    #[error("bootstrap peer {peer} refused: {reason}")]
    BootstrapRefused {
        /// The peer's address.
        peer: String,
        /// Why.
        reason: &'static str,
    },

    /// `pidfd_getfd` was refused: taking another process's descriptor needs ptrace-attach
    /// permission over it (same uid and Yama `ptrace_scope` 0, or `CAP_SYS_PTRACE`), which
    /// default container settings deny.
    #[error(
        "pidfd_getfd on pid {pid} was refused (it needs ptrace permission over that process; \
         send the descriptor over an FdSocket instead)"
    )]
    PtraceDenied {
        /// The process whose descriptor was asked for.
        pid: u32,
    },

    /// Something already listens at a socket name (or a file exists at the path).
    #[error("socket {name} is already in use")]
    AddressInUse {
        /// The socket's name.
        name: String,
    },

    /// The CUDA driver reports no usable GPU (`cuInit`).
    #[error("no CUDA device: cuInit returned {name} ({code})")]
    NoDevice {
        /// The raw `CUresult` of `cuInit`.
        code: i32,
        /// Its name.
        name: String,
    },

    /// Bytes offered as a handle are not a valid handle, or the handle contradicts what it
    /// names. [`HandleDefect`] says what is wrong.
    #[error("corrupt IPC handle: {defect}")]
    CorruptHandle {
        /// What failed validation.
        defect: HandleDefect,
    },

    /// A handle was opened in the process that exported it (CUDA refuses this with
    /// `CUDA_ERROR_INVALID_CONTEXT`); use the exporting buffer itself.
    #[error("IPC handle opened in its own exporting process (pid {pid})")]
    SameProcess {
        /// Our pid.
        pid: u32,
    },

    /// The handle's element type differs from the type it is opened as.
    #[error(
        "IPC handle holds {found_size}-byte elements (align {found_align}, tag {found_tag:#x}), opened as {expected} ({expected_size} bytes, align {expected_align}, tag {expected_tag:#x})"
    )]
    TypeMismatch {
        /// The type it is opened as.
        expected: &'static str,
        /// Its size.
        expected_size: u32,
        /// Its alignment.
        expected_align: u32,
        /// Its tag.
        expected_tag: u64,
        /// The exported element size.
        found_size: u32,
        /// The exported alignment.
        found_align: u32,
        /// The exported tag.
        found_tag: u64,
    },

    /// The handle's length differs from the length the opener requires.
    #[error("IPC handle holds {found} elements, expected {expected}")]
    LengthMismatch {
        /// The length required.
        expected: usize,
        /// The length exported.
        found: u64,
    },

    /// The memory's device cannot be reached from the opening context: not visible to this
    /// process, or no peer access between the two devices.
    #[error(
        "device {uuid} holding the IPC memory is not reachable from device {from}: {}",
        match .peer {
            None => "the device is not visible to this process".to_owned(),
            Some(to) => format!("no peer access from device {from} to device {to}"),
        }
    )]
    DeviceNotReachable {
        /// The UUID of the device that holds the memory.
        uuid: String,
        /// The opening context's device ordinal.
        from: u32,
        /// The memory's device ordinal in this process; `None` when it is not visible to
        /// this process (`CUDA_VISIBLE_DEVICES`, a container's device list).
        peer: Option<u32>,
    },

    /// The buffer the handle named has been freed (or is being freed): opening it could map a
    /// newer allocation at the same address, so it is refused.
    #[error("stale IPC handle: the exported buffer (generation {generation}) no longer exists")]
    StaleHandle {
        /// The handle's export generation.
        generation: u64,
    },

    /// The other side of an [`IpcChannel`](crate::channel::IpcSender) closed it: the producer
    /// dropped its sender and every item it sent was received, or the consumer dropped its
    /// receiver.
    #[error("the IPC channel's {role} (pid {pid}) closed it")]
    ChannelClosed {
        /// The process that closed it.
        pid: u32,
        /// Its role: `"producer"` or `"consumer"`.
        role: &'static str,
    },

    /// An [`IpcChannel`](crate::channel::IpcSender) already has its consumer (a channel is opened
    /// by one consumer for its whole life).
    #[error("the IPC channel already has a consumer (pid {pid})")]
    ChannelInUse {
        /// The consumer's pid.
        pid: u32,
    },

    /// The device cannot do what was asked: the driver reports a [`Capability`] missing.
    #[error("device {device} cannot {what}: {missing}")]
    Unsupported {
        /// The device ordinal.
        device: u32,
        /// The operation.
        what: &'static str,
        /// The capability the driver reports missing.
        missing: Capability,
    },

    /// A handle arrived without what its [`HandleType`](crate::handle_type::HandleType) needs, or with
    /// what it does not: a POSIX-fd handle without its descriptor (only a process the exporter
    /// sent the descriptor to can map the memory), a legacy handle with descriptors attached,
    /// or a request only the other type supports.
    #[error("{handle} handle: {conflict}")]
    HandleTypeMismatch {
        /// The handle type of the handle (or buffer) concerned.
        handle: crate::handle_type::HandleType,
        /// What does not match.
        conflict: TypeConflict,
    },

    /// An exported buffer still had importers when its owner's `close` gave up waiting: the
    /// memory was not freed under them (it is freed once they unmap, if the buffer is dropped).
    #[error("exported buffer still mapped by pid(s) {pids:?} after {waited:?}; not freed")]
    LeasesOutstanding {
        /// The importers still holding leases.
        pids: Vec<u32>,
        /// How long close waited.
        waited: Duration,
    },

    /// An [`IpcArena`](crate::arena::IpcArena) cannot place an allocation: not enough contiguous
    /// free bytes, or every block index is in use. Freed buffers that importers still view are
    /// `quarantined` until their views drop (or their processes die); dropping views, or
    /// [`IpcArena::collect`](crate::arena::IpcArena::collect), makes room.
    #[error(
        "the arena cannot place {requested} bytes: {free} bytes free, {quarantined} bytes \
         waiting for importers to drop their views, {buffers} of {max_buffers} buffers in use"
    )]
    ArenaFull {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free (not necessarily contiguous).
        free: u64,
        /// Bytes of freed buffers that importers still view.
        quarantined: u64,
        /// Buffers live or quarantined.
        buffers: usize,
        /// The most buffers the arena holds.
        max_buffers: usize,
    },

    /// An [`IpcPool`](crate::pool::IpcPool), or this process's exported buffers and signals (the
    /// export registry), already has the most buffers it tracks live (or freed while importers
    /// still hold them); drop some, or let importers drop their views.
    #[error("already {max} buffers live or waiting for importers")]
    TooManyBuffers {
        /// The limit.
        max: usize,
    },

    /// The exporter already has the most importing processes it can track: an arena or pool
    /// counts its own importers; buffers and signals count every process importing any of
    /// the exporting process's buffers and signals.
    #[error("the exporter already has {max} importing processes")]
    TooManyImporters {
        /// The limit.
        max: usize,
    },

    /// A system call failed in a way not covered by a more specific variant.
    #[error("{call} failed on {name:?}")]
    Os {
        /// The system call.
        call: &'static str,
        /// The object it acted on (a shared-memory name, a path).
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The tail of a [`Error::Timeout`] message naming the process waited for.
fn waiting_for_suffix(pid: Option<u32>) -> String {
    pid.map(|pid| format!(" (waiting for pid {pid})"))
        .unwrap_or_default()
}

impl crate::trace::Ending for Error {
    fn ending(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "timeout",
            Error::PeerGone { .. } => "peer_gone",
            Error::ChannelClosed { .. } => "closed",
            _ => "error",
        }
    }
}

impl Error {
    /// The exporting process `pid` (of a buffer, event, signal, arena, pool or channel) is
    /// gone: dead, or from before this boot.
    pub(crate) fn exporter_gone(pid: u32) -> Self {
        Self::peer_gone(pid, PeerRole::Exporter)
    }

    /// Process `pid`, which was `role` to this one, is gone: every [`Error::PeerGone`] is made
    /// here, so that each death seen is one trace event.
    pub(crate) fn peer_gone(pid: u32, role: PeerRole) -> Self {
        crate::trace::event!("peer gone", pid, role = ?role);
        Error::PeerGone { pid, role }
    }

    /// Map an OS error from a call on a named region to the variant a caller branches on.
    pub(crate) fn from_os(call: &'static str, name: &str, err: rustix::io::Errno) -> Self {
        use rustix::io::Errno;
        let name = name.to_owned();
        match err {
            Errno::EXIST => Error::AlreadyExists { name },
            Errno::NOENT => Error::NotFound { name },
            Errno::ACCESS | Errno::PERM => Error::PermissionDenied { name, call },
            Errno::LOOP => Error::Symlink { name },
            _ => Error::Os {
                call,
                name,
                source: io::Error::from_raw_os_error(err.raw_os_error()),
            },
        }
    }
}

impl Error {
    /// [`Error::CorruptHandle`] of `defect`.
    pub(crate) fn corrupt_handle(defect: HandleDefect) -> Self {
        Self::CorruptHandle { defect }
    }
}

/// A `close` that did not finish: the error, and the object back, so that the caller can try
/// again or drop it (see [`IpcBuffer::close`](crate::IpcBuffer::close)). Converts into
/// [`Error`] with `?`, dropping the object.
pub struct CloseError<B>(Box<(Error, B)>);

impl<B> CloseError<B> {
    pub(crate) fn new(error: Error, value: B) -> Self {
        Self(Box::new((error, value)))
    }

    /// What went wrong.
    #[must_use]
    pub fn error(&self) -> &Error {
        &self.0.0
    }

    /// The object, still closing (new opens of its handle are refused).
    #[must_use]
    pub fn into_inner(self) -> B {
        self.0.1
    }

    /// The error and the object.
    #[must_use]
    pub fn into_parts(self) -> (Error, B) {
        *self.0
    }
}

impl<B> From<CloseError<B>> for Error {
    fn from(e: CloseError<B>) -> Self {
        e.0.0
    }
}

impl<B> std::fmt::Debug for CloseError<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloseError")
            .field("error", self.error())
            .field("object", &std::any::type_name::<B>())
            .finish()
    }
}

impl<B> std::fmt::Display for CloseError<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "close failed: {}", self.error())
    }
}

impl<B> std::error::Error for CloseError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error())
    }
}

/// What a process reported by [`Error::PeerGone`] was to this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerRole {
    /// The process that exported the object opened here (buffer, event, signal, arena, pool,
    /// or a channel's producer). It has exited, however it ended.
    Exporter,
    /// A process that had opened an object this process exported or shares (the object's
    /// kind: `"signal"`, `"channel"`) and died without closing it.
    Importer(&'static str),
    /// A participant of a [`ProcessBarrier`](crate::barrier::ProcessBarrier), in participant slot
    /// `slot`: it died, or it `left` (dropped its handle) while the others waited.
    BarrierParty {
        /// Its participant slot.
        slot: u32,
        /// It dropped its handle rather than dying.
        left: bool,
    },
}

impl PeerRole {
    fn describe(self, pid: u32) -> String {
        match self {
            PeerRole::Exporter => format!("the exporting process (pid {pid}) has exited"),
            PeerRole::Importer(what) => {
                format!("pid {pid}, which had opened this {what}, died without closing it")
            }
            PeerRole::BarrierParty { slot, left } => format!(
                "barrier peer pid {pid} (slot {slot}) {}; the barrier is poisoned",
                if left { "left the barrier" } else { "died" }
            ),
        }
    }
}
