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

impl Error {
    /// The exporting process `pid` (of a buffer, event, signal, arena, pool or channel) is
    /// gone: dead, or from before this boot.
    pub(crate) fn exporter_gone(pid: u32) -> Self {
        Error::PeerGone {
            pid,
            role: PeerRole::Exporter,
        }
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

/// What is wrong with a handle refused as [`Error::CorruptHandle`]: match the variant to
/// branch; `Display` says it in full.
///
/// # Examples
///
/// ```
/// use cuda_ipc::{Error, IpcEventHandle, IpcMemHandle};
/// use cuda_ipc::error::HandleDefect;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// // Bytes that are not a handle at all.
/// let err = IpcEventHandle::from_bytes(&[0u8; 10]).unwrap_err();
/// assert!(matches!(
///     err,
///     Error::CorruptHandle { defect: HandleDefect::Size { expected: 184, found: 10, .. } }
/// ));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandleDefect {
    /// Not the size of this kind of handle.
    Size {
        /// The kind of handle expected.
        what: &'static str,
        /// Its size in bytes.
        expected: usize,
        /// The bytes offered.
        found: usize,
    },
    /// Not a handle of this format: its magic number is wrong.
    Magic {
        /// The format expected.
        what: &'static str,
        /// The magic number found.
        found: u64,
    },
    /// A format version this build does not read.
    Version {
        /// The format.
        what: &'static str,
        /// The version found.
        found: u32,
        /// The versions this build reads.
        supported: &'static [u32],
    },
    /// A handle of another kind: a memory handle where an event handle was expected, and
    /// every other pair.
    Kind {
        /// The kind expected (`"a memory"`, `"an event"`, `"a signal"`, `"an arena"`,
        /// `"a pool"`).
        expected: &'static str,
        /// The kind found.
        found: &'static str,
    },
    /// The checksum does not match the contents: damaged on the way, or not written by this
    /// crate.
    Checksum {
        /// The checksum the handle carries.
        stored: u64,
        /// The checksum of its contents.
        computed: u64,
    },
    /// Reserved bytes or flags are not zero.
    Reserved,
    /// A handle type this kind of handle cannot have, or one this build does not know.
    HandleType {
        /// What is wrong.
        detail: String,
    },
    /// Fields that contradict each other or this platform: the element layout, the length,
    /// the sizes.
    Layout {
        /// What is wrong.
        detail: String,
    },
    /// It names something other than what it is opened through (another arena, pool or
    /// process's export registry), or a block or generation no export can have.
    Names {
        /// What is wrong.
        detail: String,
    },
    /// What it describes disagrees with the memory: the allocation the driver maps for it,
    /// the descriptor that came with it, or this process's mapping of the same export.
    Memory {
        /// What is wrong.
        detail: String,
    },
    /// A foreign handle this crate cannot map (a PyTorch expandable segment).
    Unsupported {
        /// What it is, and what to do instead.
        detail: String,
    },
}

impl std::fmt::Display for HandleDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Size {
                what,
                expected,
                found,
            } => write!(f, "{what} is {expected} bytes, got {found}"),
            Self::Magic { what, found } => write!(f, "bad magic {found:#x} (not {what})"),
            Self::Version {
                what,
                found,
                supported,
            } => write!(f, "{what} version {found} (this build reads {supported:?})"),
            Self::Kind { expected, found } => {
                write!(f, "{found} handle where {expected} handle was expected")
            }
            Self::Checksum { stored, computed } => write!(
                f,
                "checksum {stored:#x} does not match contents ({computed:#x})"
            ),
            Self::Reserved => f.write_str("reserved bytes or flags are not zero"),
            Self::HandleType { detail }
            | Self::Layout { detail }
            | Self::Names { detail }
            | Self::Memory { detail }
            | Self::Unsupported { detail } => f.write_str(detail),
        }
    }
}

/// What was wrong with an argument refused as [`Error::InvalidArgument`]: match the variant
/// to branch; `Display` says it in full.
///
/// # Examples
///
/// ```
/// use cuda_ipc::{Error};
/// use cuda_ipc::barrier::BarrierState;
/// use cuda_ipc::error::ArgumentDefect;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let refused = BarrierState::new(0);
/// assert!(matches!(
///     refused,
///     Err(Error::InvalidArgument {
///         defect: ArgumentDefect::OutOfRange { what: "parties", value: 0, min: 1, .. },
///         ..
///     })
/// ));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgumentDefect {
    /// A count, size, value, alignment or ordinal outside the range the call accepts.
    OutOfRange {
        /// What it is (`"parties"`, `"slots"`, `"signal value"`, ...).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// Two lengths that must agree do not: a host slice and the device slice it is copied
    /// to or from, a batch and its item lengths.
    LengthMismatch {
        /// Which length.
        what: &'static str,
        /// The length required.
        expected: u64,
        /// The length given.
        found: u64,
    },
    /// `len` elements of `elem_size` bytes make no allocation: zero bytes, or more than the
    /// address space holds (also once rounded up to the allocation granularity).
    AllocationSize {
        /// Elements asked for.
        len: u64,
        /// Bytes per element.
        elem_size: u64,
    },
    /// A byte count that is not a whole number of elements.
    NotWholeElements {
        /// The byte count.
        bytes: u64,
        /// Bytes per element.
        elem_size: u64,
    },
    /// A byte offset that is not a multiple of the element type's alignment.
    Misaligned {
        /// The offset.
        offset: u64,
        /// The alignment required.
        align: u64,
    },
    /// A byte range whose end does not fit in 64 bits.
    RangeOverflow {
        /// Where it starts.
        offset: u64,
        /// Its length in bytes.
        bytes: u64,
    },
    /// A signal value not above the last one signalled (a signal is a counter).
    NotIncreasing {
        /// The value given.
        value: u64,
        /// The last value signalled.
        last: u64,
    },
    /// A context that is not its device's primary context (this crate shares memory through
    /// the primary contexts only).
    NotPrimaryContext,
    /// The process has no open descriptor of that number.
    NoSuchDescriptor {
        /// The process.
        pid: u32,
        /// The descriptor number.
        fd: i32,
    },
    /// Memory another allocator owns that cannot be shared as asked
    /// ([`ForeignExport::new`](crate::foreign::ForeignExport::new)): not device memory of the
    /// context's device, a range that leaves its allocation, or an allocation made with no
    /// shareable handle type.
    NotShareable {
        /// The address given.
        ptr: u64,
        /// Why, and what to do instead.
        detail: String,
    },
}

impl ArgumentDefect {
    /// `Ok` when `value` lies in `min..=max`; otherwise [`Error::InvalidArgument`] for `call`
    /// with [`OutOfRange`](Self::OutOfRange) naming `what`. The one place where a range check
    /// and the range its error reports are written, so they cannot disagree.
    pub(crate) fn check_range(
        call: &'static str,
        what: &'static str,
        value: u64,
        min: u64,
        max: u64,
    ) -> Result<()> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            call,
            defect: Self::OutOfRange {
                what,
                value,
                min,
                max,
            },
        })
    }
}

impl std::fmt::Display for ArgumentDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OutOfRange {
                what,
                value,
                min,
                max,
            } => write!(f, "{what} {value} is outside {min}..={max}"),
            Self::LengthMismatch {
                what,
                expected,
                found,
            } => write!(f, "{what} is {found}, expected {expected}"),
            Self::AllocationSize { len, elem_size } => write!(
                f,
                "{len} elements of {elem_size} bytes is not a valid allocation size"
            ),
            Self::NotWholeElements { bytes, elem_size } => write!(
                f,
                "{bytes} bytes are not a whole number of {elem_size}-byte elements"
            ),
            Self::Misaligned { offset, align } => write!(
                f,
                "offset {offset} is not a multiple of the element alignment {align}"
            ),
            Self::RangeOverflow { offset, bytes } => {
                write!(f, "offset {offset} + {bytes} bytes overflows")
            }
            Self::NotIncreasing { value, last } => write!(
                f,
                "signal values must increase: {value} after {last} (a signal is a counter)"
            ),
            Self::NotPrimaryContext => {
                f.write_str("the context is not its device's primary context")
            }
            Self::NoSuchDescriptor { pid, fd } => write!(f, "pid {pid} has no descriptor {fd}"),
            Self::NotShareable { ptr, detail } => {
                write!(f, "the memory at {ptr:#x} cannot be shared: {detail}")
            }
        }
    }
}

/// A device capability the driver reports missing, in an [`Error::Unsupported`]; what
/// [`probe()`](crate::probe::probe()) checks under the key named on each variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability {
    /// Virtual memory exported as POSIX file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` and
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`; probe key
    /// `vmm_posix_fd`). Without it: [`HandleType::Legacy`](crate::handle_type::HandleType::Legacy) buffers.
    VmmPosixFd,
    /// Stream-ordered memory pools exported as POSIX file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` and the POSIX-fd bit of
    /// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`; probe key `pool_ipc`).
    PoolPosixFd,
    /// 64-bit stream memory operations (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`;
    /// probe key `stream_mem_ops_64`). Without it: [`IpcEvent`](crate::IpcEvent) instead of
    /// signals and channels.
    StreamMemOps64,
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::VmmPosixFd => {
                "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED or \
                 CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0 (use \
                 HandleType::Legacy)"
            }
            Self::PoolPosixFd => {
                "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0 or \
                 CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES lacks POSIX file descriptors"
            }
            Self::StreamMemOps64 => {
                "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0 (use IpcEvent)"
            }
        })
    }
}

/// What did not match in an [`Error::HandleTypeMismatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TypeConflict {
    /// A handle (or a pool's export) arrived with the wrong number of file descriptors: a
    /// POSIX-fd handle needs exactly one, a legacy handle none. Any that arrived are closed.
    /// A POSIX-fd handle without its descriptor is a capability not granted: only a process
    /// the exporter sent the descriptor to can map the memory.
    Descriptors {
        /// Descriptors the handle needs.
        expected: usize,
        /// Descriptors that came with it.
        found: usize,
    },
    /// The call needs a buffer of the other handle type: a descriptor exists only for
    /// [`HandleType::PosixFd`](crate::handle_type::HandleType::PosixFd) memory; a raw legacy handle (for
    /// PyTorch, CuPy or C/C++ peers) only for [`HandleType::Legacy`](crate::handle_type::HandleType::Legacy)
    /// memory.
    Needs(crate::handle_type::HandleType),
    /// A read-write open of memory its exporter shares read-only
    /// ([`Handle::is_read_only`](crate::Handle::is_read_only)): open it with
    /// [`ReadOnlyBuffer`](crate::ReadOnlyBuffer), [`ReadOnlyArena`](crate::arena::ReadOnlyArena) or
    /// [`ReadOnlyPool`](crate::pool::ReadOnlyPool) (or the sockets' `recv_*_read_only`).
    ReadOnly,
    /// A read-only open of legacy memory: `cuIpcOpenMemHandle` maps read-write only, so this
    /// crate refuses rather than give a read-only type over a writable mapping. Share the
    /// memory as [`HandleType::PosixFd`](crate::handle_type::HandleType::PosixFd) (or in an arena) to map it
    /// read-only.
    NoReadOnlyMapping,
    /// Another device was to be granted access to a legacy import. `cuIpcOpenMemHandle` maps
    /// the memory for the context that opened it only, and peer access to that context does
    /// not reach it (measured on H200s: a kernel on the other device faults); open the handle
    /// in the other device's context as well (a mapping of its own, at another address), or
    /// share the memory as [`HandleType::PosixFd`](crate::handle_type::HandleType::PosixFd).
    ImportMappedPerContext,
    /// A [`HandleType::Pool`](crate::handle_type::HandleType::Pool) buffer was asked for one handle (or a
    /// raw one, or one descriptor): it travels as its pool's handle and descriptor and the
    /// buffer's [`PoolHandle`](crate::pool::PoolHandle) —
    /// [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer), or
    /// [`IpcBuffer::export_pooled`](crate::IpcBuffer::export_pooled) for another channel.
    Pooled,
    /// A pool allocation this process already holds through another import was to be opened
    /// again: through both an [`ImportedPool`](crate::pool::ImportedPool) and a
    /// [`ForeignPool`](crate::pool::ForeignPool) (a crate peer and a cuda.core peer sharing one
    /// [`IpcPool`](crate::pool::IpcPool)), or under another buffer's handle or export data. The
    /// driver maps an imported allocation at one address per process and counts no imports,
    /// so the first free would unmap the other's views: open it again through the pool object
    /// that holds it (its views share one import), or after its views are gone.
    ImportedTwice,
}

impl std::fmt::Display for TypeConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Descriptors {
                expected: 1,
                found: 0,
            } => f.write_str(
                "the handle arrived without its file descriptor: only a process the exporter \
                 sent the descriptor to can map the memory (FdSocket::recv_buffer, \
                 ImportedBuffer::open_fd)",
            ),
            Self::Descriptors { expected, found } => write!(
                f,
                "{found} file descriptor(s) arrived with it where it needs {expected}; all closed"
            ),
            Self::Pooled => f.write_str(
                "a pool buffer travels as its pool's handle and descriptor and the buffer's \
                 pool handle, not as one handle: FdSocket::send_buffer, or \
                 IpcBuffer::export_pooled",
            ),
            Self::ImportedTwice => f.write_str(
                "this process already holds the allocation through another pool import (an \
                 ImportedPool and a ForeignPool of one pool, or another buffer's handle): the \
                 driver maps it once per process and counts no imports, so one free would unmap \
                 both; open it through the pool object that holds it",
            ),
            Self::ImportMappedPerContext => f.write_str(
                "a legacy import is mapped for the context that opened it only; open the handle \
                 in the other device's context too (its own mapping), or share the memory as \
                 HandleType::PosixFd",
            ),
            Self::Needs(crate::handle_type::HandleType::PosixFd) => f.write_str(
                "a cuMemAlloc buffer has no file descriptor; allocate with HandleType::PosixFd, \
                 or send its handle() bytes",
            ),
            Self::Needs(crate::handle_type::HandleType::Legacy) => f.write_str(
                "raw legacy handles exist only for cuMemAlloc memory; allocate with \
                 HandleType::Legacy to share with PyTorch, CuPy or C/C++ peers",
            ),
            Self::Needs(other) => write!(f, "the call needs {other} memory"),
            Self::ReadOnly => f.write_str(
                "the exporter shares this memory read-only: open it with ReadOnlyBuffer, \
                 ReadOnlyArena or ReadOnlyPool (or a socket's recv_*_read_only)",
            ),
            Self::NoReadOnlyMapping => f.write_str(
                "the driver maps legacy IPC memory read-write only (cuIpcOpenMemHandle): share \
                 it as HandleType::PosixFd, or in an arena, to map it read-only",
            ),
        }
    }
}

/// The rule a shared-memory name broke, in an [`Error::InvalidName`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameDefect {
    /// Nothing after the optional leading `/`.
    Empty,
    /// Longer than a name may be: `NAME_MAX` (255 bytes) less any random suffix, or what a
    /// channel handle holds.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A `/` after the optional leading one.
    Slash,
    /// A NUL byte.
    Nul,
    /// `.` or `..`.
    Dots,
}

impl std::fmt::Display for NameDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("empty"),
            Self::TooLong { len, max } => write!(
                f,
                "{len} bytes, longer than the {max} allowed (with room for any random suffix)"
            ),
            Self::Slash => f.write_str("contains '/' after the optional leading one"),
            Self::Nul => f.write_str("contains a NUL byte"),
            Self::Dots => f.write_str("is '.' or '..'"),
        }
    }
}

/// The state of an object that refused a call as [`Error::InvalidState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjectState {
    /// It is initialised already ([`BarrierState::init`](crate::barrier::BarrierState::init) runs
    /// once, in the region's creator).
    AlreadyInitialised,
    /// It was imported from another process: only the exporter's own object can be exported;
    /// share the handle it was opened from.
    Imported,
    /// It was made in process `made_in`, and this process is a child forked from it without
    /// `exec`: an inherited object does nothing here (no driver call, no shared-state change,
    /// nothing unlinked), because its CUDA context and its slots in shared memory are the
    /// parent's. Create new objects in the child instead.
    Inherited {
        /// The pid of the process the object was made in.
        made_in: u32,
    },
    /// A `close` of it began (and, not finishing, handed it back): it is closed to new work;
    /// close it again or drop it.
    Closing,
}

impl std::fmt::Display for ObjectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AlreadyInitialised => "it is already initialised",
            Self::Imported => {
                "an imported object cannot be exported again; share the original handle"
            }
            Self::Inherited { made_in } => {
                return write!(
                    f,
                    "it was made in process {made_in} and inherited by this forked child, \
                     where it does nothing (make a new one here)"
                );
            }
            Self::Closing => "it is closing (a close began): close it again or drop it",
        })
    }
}

/// What was found in shared state refused as [`Error::Corrupt`]: match the variant to
/// branch; `Display` says it in full. [`Error::Corrupt`]'s `what` names the structure.
///
/// Nothing a caller passes causes these: a peer process broke the protocol, something outside
/// it wrote the shared memory, or the driver answered what no valid call returns. Report it;
/// retrying reads the same state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateDefect {
    /// The structure was never initialised by its creator.
    NotInitialised,
    /// A field holds a value this build does not know: a magic number, a format version, a
    /// record kind.
    UnknownValue {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: u64,
    },
    /// A field (or a difference of two) outside the range the protocol keeps it in.
    OutOfRange {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: u64,
        /// The smallest valid value.
        min: u64,
        /// The largest valid value.
        max: u64,
    },
    /// A counter that is not where this side's own count puts it: another process wrote it
    /// out of turn.
    Counter {
        /// The counter.
        field: &'static str,
        /// What it holds.
        found: u64,
        /// What it should hold.
        expected: u64,
    },
    /// A field that contradicts the handle that named the structure.
    Mismatch {
        /// The field.
        field: &'static str,
    },
    /// Something the protocol guarantees is not there.
    Missing {
        /// What is missing.
        what: &'static str,
    },
    /// A socket message the kernel cut short: longer than any message of this crate, or
    /// with more descriptors. The descriptors that did arrive are closed.
    Truncated {
        /// How many descriptors arrived (and were closed).
        fds_closed: usize,
    },
    /// The driver answered with a value no valid call returns.
    DriverAnswer {
        /// The driver function.
        call: &'static str,
        /// Its answer.
        value: i64,
    },
}

impl std::fmt::Display for StateDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotInitialised => f.write_str("not initialised by its creator"),
            Self::UnknownValue { field, value } => write!(f, "unknown {field} {value:#x}"),
            Self::OutOfRange {
                field,
                value,
                min,
                max,
            } => write!(f, "{field} {value} is outside {min}..={max}"),
            Self::Counter {
                field,
                found,
                expected,
            } => write!(
                f,
                "{field} is {found} where this side's count says {expected}"
            ),
            Self::Mismatch { field } => write!(f, "its {field} does not match the handle's"),
            Self::Missing { what } => write!(f, "{what} is missing"),
            Self::Truncated { fds_closed } => write!(
                f,
                "a message cut short by the kernel (too long, or too many descriptors); the \
                 {fds_closed} descriptor(s) that arrived are closed"
            ),
            Self::DriverAnswer { call, value } => {
                write!(f, "{call} answered {value}, which no valid call returns")
            }
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
