//! What an [`Error`] says went wrong, as enums a caller matches: the defect of a
//! handle, an argument, a name or shared state, the capability a device lacks, the conflict
//! between a handle's type and its use, and the state an object was in.

use super::{Error, Result};

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
