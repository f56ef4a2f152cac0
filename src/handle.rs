//! [`Handle<K>`]: one typed, validated envelope around CUDA's 64-byte IPC handles (and the
//! descriptions of file-descriptor exports) for every kind of export —
//! [`IpcMemHandle<T>`](crate::IpcMemHandle), [`IpcEventHandle`](crate::IpcEventHandle),
//! [`IpcSignalHandle`](crate::IpcSignalHandle), and the arena's and pool's handles.
//!
//! A raw CUDA IPC handle says nothing about what it names: not the element type, not the
//! length, not whether the buffer still exists. The envelope carries all of that and a
//! checksum, and it is plain data (`#[repr(C)]`, `Pod`) so it fits in a
//! [`ShmCell`](crate::shm::ShmCell) or any byte channel. Everything in it is validated before the
//! CUDA handle inside is passed to the driver.

use std::marker::PhantomData;

use bytemuck::{Pod, Zeroable};

use crate::context::GpuContext;
use crate::device;
use crate::envelope;
use crate::error::{Error, HandleDefect, Result, TypeConflict};
pub use crate::handle_type::HandleType;
use crate::process::ProcessIdentity;
use crate::shm_safe::fnv1a64;
use crate::trace;

/// "CIPH" little-endian.
const MAGIC: u32 = u32::from_le_bytes(*b"CIPH");
/// Envelope layout version.
pub(crate) const VERSION: u16 = 1;
/// Envelope kinds.
pub(crate) const KIND_MEM: u16 = 1;
pub(crate) const KIND_EVENT: u16 = 2;
pub(crate) const KIND_SIGNAL: u16 = 3;
pub(crate) const KIND_ARENA: u16 = 4;
pub(crate) const KIND_POOL: u16 = 5;

/// Size of an envelope in bytes.
pub(crate) const HANDLE_SIZE: usize = std::mem::size_of::<Envelope>();

/// The envelope common to memory and event handles.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub magic: u32,
    pub version: u16,
    pub kind: u16,
    pub elem_size: u32,
    pub elem_align: u32,
    pub type_tag: u64,
    /// Elements (memory) or 0 (events).
    pub len: u64,
    /// Per-process export counter.
    pub generation: u64,
    pub exporter_pid: u32,
    pub device_ordinal: u32,
    pub exporter_start: u64,
    pub boot_id: [u8; 16],
    pub device_uuid: [u8; 16],
    /// Memory and signals: the exporting process's registry (a random id, 12 bytes) and the
    /// export's block in it (4 bytes, little-endian); with the generation, one export for ever.
    /// Arenas and pools: a random id of the export. Names its tables; keys the import cache.
    pub token: [u8; 16],
    /// Legacy: the driver's 64-byte handle. POSIX fd: the bytes mapped (granularity-rounded,
    /// little-endian) in the first 8, then zeroes; the memory itself comes as a descriptor.
    pub cuda: [u8; 64],
    /// A [`HandleType`] code (memory only; 0 for events and signals).
    pub handle_type: u32,
    /// [`FLAG_READ_ONLY`] or 0.
    pub flags: u8,
    pub reserved: [u8; 3],
    pub checksum: u64,
}

/// [`Envelope::flags`]: the exporter shares the memory read-only (POSIX-fd buffers, arenas and
/// pools): importers must open it with the read-only types, and a read-write open is refused.
pub(crate) const FLAG_READ_ONLY: u8 = 1;

const _: () = assert!(std::mem::size_of::<Envelope>() == 184);

envelope::sealed_format!(
    Envelope,
    envelope::Format {
        magic: MAGIC,
        version: VERSION,
        versions: &[VERSION as u32],
        what: "a cuda-ipc handle",
    },
    |raw| raw.reserved == [0; 3] && raw.flags & !FLAG_READ_ONLY == 0
);

impl Envelope {
    pub(crate) fn seal(self) -> Self {
        envelope::seal(self)
    }

    /// The handle type (after [`validate`](Self::validate): a known one).
    pub(crate) fn handle_type(&self) -> HandleType {
        HandleType::from_code(self.handle_type).unwrap_or(HandleType::Legacy)
    }

    /// For a POSIX-fd envelope: the bytes the exporter mapped.
    pub(crate) fn vmm_bytes(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.cuda[..8]);
        u64::from_le_bytes(b)
    }

    pub(crate) fn exporter(&self) -> ProcessIdentity {
        ProcessIdentity::from_parts(self.exporter_pid, self.exporter_start)
    }

    /// An envelope of `kind` exported by this process from a context on `device_ordinal`,
    /// carrying `cuda`; the caller fills the kind-specific fields, then seals.
    pub(crate) fn exported(
        kind: u16,
        generation: u64,
        device_ordinal: u32,
        cuda: [u8; 64],
    ) -> Self {
        let me = ProcessIdentity::current();
        Self {
            kind,
            generation,
            exporter_pid: me.pid(),
            device_ordinal,
            exporter_start: me.start_time(),
            boot_id: crate::os::boot_id(),
            cuda,
            ..Zeroable::zeroed()
        }
    }

    /// The exporter, if it ran since this boot (else it is gone: [`Error::PeerGone`] (the
    /// exporter)).
    pub(crate) fn exporter_this_boot(&self) -> Result<ProcessIdentity> {
        envelope::admit_exporter(self.exporter(), &self.boot_id, true)
    }

    /// The checks on an exporter that need no system call: it ran since this boot (else it
    /// is gone), and it is not this process (CUDA refuses a self-open). Returns the exporter.
    pub(crate) fn foreign_exporter(&self) -> Result<ProcessIdentity> {
        envelope::admit_exporter(self.exporter(), &self.boot_id, false)
    }

    /// Structural checks on bytes from another process: magic, version, kind, checksum,
    /// reserved bytes, and a plausible element layout.
    pub(crate) fn validate(&self, kind: u16) -> Result<()> {
        let bad = |defect| Err(Error::corrupt_handle(defect));
        let handle_type = |detail: String| bad(HandleDefect::HandleType { detail });
        envelope::check_identity(self)?;
        // Before the checksum: a handle of another kind says so.
        if self.kind != kind {
            return bad(HandleDefect::Kind {
                expected: kind_name(kind),
                found: kind_name(self.kind),
            });
        }
        envelope::check_integrity(self)?;
        if self.flags & FLAG_READ_ONLY != 0 && !matches!(kind, KIND_MEM | KIND_ARENA | KIND_POOL) {
            return handle_type(format!("a {} handle marked read-only", kind_name(kind)));
        }
        if self.flags & FLAG_READ_ONLY != 0 && self.handle_type == HandleType::Legacy.code() {
            return handle_type(
                "a legacy handle marked read-only (the driver maps legacy handles read-write only)"
                    .into(),
            );
        }
        self.check_handle_type(kind)?;
        self.check_layout(kind)
    }

    /// [`validate`](Self::validate)'s checks of the handle type against the kind (and of a
    /// file-descriptor handle's size).
    fn check_handle_type(&self, kind: u16) -> Result<()> {
        let bad = |defect| Err(Error::corrupt_handle(defect));
        let layout = |detail: String| bad(HandleDefect::Layout { detail });
        let handle_type = |detail: String| bad(HandleDefect::HandleType { detail });
        match (kind, HandleType::from_code(self.handle_type)) {
            (_, None) => return handle_type(format!("unknown handle type {}", self.handle_type)),
            (KIND_POOL, Some(HandleType::PosixFd))
                if self.cuda != [0; 64]
                    || (self.len, self.elem_size, self.elem_align) != (1, 1, 1) =>
            {
                return layout("a pool handle carries no size or CUDA bytes".into());
            }
            (KIND_POOL, Some(HandleType::PosixFd)) => {}
            (KIND_ARENA | KIND_POOL, Some(t)) if t != HandleType::PosixFd => {
                return handle_type(format!(
                    "{t} handle type on an arena or pool (they are shared as file descriptors)"
                ));
            }
            (KIND_MEM | KIND_ARENA, Some(HandleType::PosixFd)) => {
                let bytes = self.vmm_bytes();
                let wanted = self.len.saturating_mul(u64::from(self.elem_size));
                if self.cuda[8..] != [0; 56] || bytes < wanted || bytes > isize::MAX as u64 {
                    return layout(format!(
                        "a file-descriptor handle mapping {bytes} bytes for {} × {} bytes",
                        self.len, self.elem_size
                    ));
                }
            }
            (KIND_MEM, Some(_)) => {}
            (_, Some(t)) if t != HandleType::Legacy => {
                return handle_type(format!("{t} handle type on a non-memory handle"));
            }
            _ => {}
        }
        Ok(())
    }

    /// [`validate`](Self::validate)'s checks of the element layout and length against the
    /// kind.
    fn check_layout(&self, kind: u16) -> Result<()> {
        let layout = |detail: String| Err(Error::corrupt_handle(HandleDefect::Layout { detail }));
        if kind == KIND_SIGNAL
            && (self.len, self.elem_size, self.elem_align, self.type_tag)
                != (1, 8, 8, type_tag_of::<u64>())
        {
            return layout(format!(
                "a signal is one 8-byte counter, not {} × {} bytes",
                self.len, self.elem_size
            ));
        }
        if kind == KIND_ARENA && (self.elem_size, self.elem_align) != (1, 1) {
            return layout(format!(
                "an arena is counted in bytes, not {}-byte elements",
                self.elem_size
            ));
        }
        if matches!(kind, KIND_MEM | KIND_SIGNAL | KIND_ARENA) {
            if !self.elem_align.is_power_of_two() || !self.elem_size.is_multiple_of(self.elem_align)
            {
                return layout(format!(
                    "element size {} / alignment {} is not a valid layout",
                    self.elem_size, self.elem_align
                ));
            }
            let bytes = self.len.checked_mul(u64::from(self.elem_size));
            if bytes.is_none_or(|b| b == 0 || b > isize::MAX as u64) {
                return layout(format!("length {} × {} bytes", self.len, self.elem_size));
            }
        }
        Ok(())
    }
}

/// How errors name an envelope kind.
fn kind_name(kind: u16) -> &'static str {
    match kind {
        KIND_MEM => "a memory",
        KIND_EVENT => "an event",
        KIND_SIGNAL => "a signal",
        KIND_ARENA => "an arena",
        KIND_POOL => "a pool",
        _ => "an unknown",
    }
}

#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(crate) use envelope::checksum;

/// Refuse an element layout read from another process (size, alignment, type tag) that is
/// not `T`'s, naming both.
pub(crate) fn check_element<T>(size: u32, align: u32, tag: u64) -> Result<()> {
    let expected = (
        std::mem::size_of::<T>() as u32,
        std::mem::align_of::<T>() as u32,
        type_tag_of::<T>(),
    );
    if (size, align, tag) == expected {
        return Ok(());
    }
    Err(Error::TypeMismatch {
        expected: std::any::type_name::<T>(),
        expected_size: expected.0,
        expected_align: expected.1,
        expected_tag: expected.2,
        found_size: size,
        found_align: align,
        found_tag: tag,
    })
}

/// What an arena's or a pool's `open` checks first of a handle of one of its buffers, each
/// word a peer's: the element layout is `T`'s, the handle names this export (`token`, the
/// export's `ours`; `of`: "arena" or "pool"), and its `len` elements are more than 0 bytes and
/// at most `isize::MAX`. Returns the bytes and the elements.
pub(crate) fn check_buffer_of<T>(
    (size, align, tag): (u32, u32, u64),
    len: u64,
    (token, ours): (&[u8; 16], &[u8; 16]),
    of: &str,
) -> Result<(u64, usize)> {
    check_element::<T>(size, align, tag)?;
    if token != ours {
        return Err(Error::corrupt_handle(HandleDefect::Names {
            detail: format!("the handle names another {of}"),
        }));
    }
    len.checked_mul(u64::from(size))
        .filter(|&b| b > 0 && b <= isize::MAX as u64)
        .and_then(|bytes| Some((bytes, usize::try_from(len).ok()?)))
        .ok_or_else(|| {
            Error::corrupt_handle(HandleDefect::Layout {
                detail: format!("length {len} × {size} bytes"),
            })
        })
}

/// The type tag of `T` in envelopes: FNV-1a of its type name.
pub(crate) fn type_tag_of<T>() -> u64 {
    fnv1a64(std::any::type_name::<T>().as_bytes())
}

/// A handle of an export: the CUDA handle (or, for file-descriptor exports, a description of the
/// memory that comes as a descriptor) in a typed, checksummed envelope, 184 bytes of plain data.
/// `K` is what it names — [`IpcBuffer<T>`](crate::IpcBuffer), [`IpcEvent`](crate::IpcEvent),
/// [`IpcSignal`](crate::IpcSignal), [`IpcArena`](crate::arena::IpcArena) or
/// [`IpcPool`](crate::pool::IpcPool) — and each has a short name:
/// [`IpcMemHandle<T>`](crate::IpcMemHandle), [`IpcEventHandle`](crate::IpcEventHandle),
/// [`IpcSignalHandle`](crate::IpcSignalHandle),
/// [`IpcArenaHandle`](crate::arena::IpcArenaHandle), [`IpcPoolHandle`](crate::pool::IpcPoolHandle).
///
/// Every handle carries the same fields, checked the same way: the kind (a memory handle is refused
/// where an event handle is expected, and every other pair), the element size, alignment and type
/// tag (a `Handle<IpcBuffer<f32>>` does not open as `u32`), the length, the UUID of the device that
/// holds the memory (or where the event was created), the exporter's pid, start time and boot id (a
/// dead or rebooted exporter is refused before the driver sees the bytes), the export's token and
/// generation (a dropped export's handle is stale, never another export's), and a checksum over all
/// of it. Every `open` runs the same checks in the same order — validate, then lease (events take
/// none), then map — so a bad handle costs no lease and no mapping.
///
/// Pass a handle to another process through a [`ShmCell`](crate::shm::ShmCell) (it is `Pod`) or as
/// bytes ([`as_bytes`](Self::as_bytes) / [`from_bytes`](Self::from_bytes)). A handle of a
/// [`HandleType::PosixFd`] export says what the memory is but cannot map it: the memory comes
/// as a file descriptor, sent with the handle over an [`FdSocket`](crate::fd::FdSocket) or any
/// other `SCM_RIGHTS` channel.
///
/// `Debug` never prints the CUDA bytes: a legacy CUDA IPC handle is a bearer token that any
/// local process can open.
///
/// # Examples
///
/// Code that moves handles works for every kind:
///
/// ```
/// use cuda_ipc::{Handle, HandleKind, IpcEventHandle, IpcMemHandle};
///
/// fn to_wire<K: HandleKind>(handle: &Handle<K>) -> Vec<u8> {
///     handle.as_bytes().to_vec()
/// }
///
/// fn from_wire<K: HandleKind>(bytes: &[u8]) -> cuda_ipc::Result<Handle<K>> {
///     Handle::from_bytes(bytes)
/// }
///
/// // Bytes that are not a handle, or a handle of another kind, are refused.
/// assert!(from_wire::<cuda_ipc::IpcEvent>(&[0u8; IpcEventHandle::SIZE]).is_err());
/// # let _ = to_wire::<cuda_ipc::IpcBuffer<f32>>;
/// # let _: Option<IpcMemHandle<f32>> = None;
/// ```
#[repr(transparent)]
pub struct Handle<K: HandleKind> {
    pub(crate) env: Envelope,
    _kind: PhantomData<fn() -> K>,
}

/// The seal of [`HandleKind`]: each kind implements both beside its own type.
pub(crate) mod sealed {
    pub trait Sealed {}

    /// What a kind's handle carries as its element: a `Pod` type, whose layout an open checks,
    /// or [`Untyped`].
    pub trait Element: 'static {
        /// Whether an open checks the envelope's element layout against this type's.
        const TYPED: bool;
    }
    impl<T: bytemuck::Pod> Element for T {
        const TYPED: bool = true;
    }
    /// The element of kinds without one (arenas, pools and events: their buffers' own handles
    /// carry theirs).
    #[derive(Debug)]
    pub struct Untyped;
    impl Element for Untyped {
        const TYPED: bool = false;
    }
}

/// What [`Handle::admit`] found: the exporter, alive and not this process (unless the handle
/// came with its descriptor), and the ordinal of the device holding its memory (for an
/// event, the context's own).
pub(crate) struct Admitted {
    pub(crate) exporter: ProcessIdentity,
    pub(crate) memory_device: u32,
    /// The open's trace span: keep it (bound to a name, not `_`) until the open ends.
    pub(crate) trace: trace::Scope,
}

/// What a [`Handle`] can name: [`IpcBuffer<T>`](crate::IpcBuffer), [`IpcEvent`](crate::IpcEvent),
/// [`IpcSignal`](crate::IpcSignal), [`IpcArena`](crate::arena::IpcArena) and
/// [`IpcPool`](crate::pool::IpcPool). Sealed: the envelope's checks are this crate's.
pub trait HandleKind: sealed::Sealed {
    /// The handle's short name, as `Debug` prints it (`"IpcMemHandle"`, `"IpcEventHandle"`, ...).
    const NAME: &'static str;
    /// The envelope's kind code.
    #[doc(hidden)]
    const CODE: u16;
    /// Whether the kind's handle names memory, whose device an open must reach (an event
    /// opens in a context of any device).
    #[doc(hidden)]
    const HOLDS_MEMORY: bool = true;
    /// The element type a handle of this kind carries, whose layout an open checks: `T` for a
    /// buffer of `T`s, `u64` for a signal's counter; none for arenas, pools and events.
    #[doc(hidden)]
    type Element: sealed::Element;
}

/// A buffer of an [`IpcArena`](crate::arena::IpcArena) or an [`IpcPool`](crate::pool::IpcPool),
/// as another process names it: plain data ([`as_bytes`](Self::as_bytes) /
/// [`from_bytes`](Self::from_bytes)) with the buffer's block, generation, length and element
/// type, checksummed. It maps nothing by itself: only a process that imported the arena or
/// pool (which took its descriptor) can open it. Its two kinds are
/// [`ArenaHandle<T>`](crate::arena::ArenaHandle) and [`PoolHandle<T>`](crate::pool::PoolHandle).
pub struct BufferHandle<K: BufferKind, T> {
    pub(crate) raw: K::Raw,
    _elem: PhantomData<fn() -> T>,
}

/// What a [`BufferHandle`] can name a buffer of: [`IpcArena`](crate::arena::IpcArena) and
/// [`IpcPool`](crate::pool::IpcPool). Sealed: the formats are this crate's.
pub trait BufferKind: sealed::Sealed {
    /// The sealed bytes of a handle of this kind.
    #[doc(hidden)]
    type Raw: Pod + PartialEq;
    /// The handle's name, as `Debug` prints it.
    #[doc(hidden)]
    const NAME: &'static str;
    /// Read a handle's bytes, checking its structure (size, magic, version, checksum,
    /// reserved bytes).
    #[doc(hidden)]
    fn open(bytes: &[u8]) -> Result<Self::Raw>;
    /// The buffer's length in elements and its generation.
    #[doc(hidden)]
    fn len_and_generation(raw: &Self::Raw) -> (u64, u64);
    /// The fields `Debug` shows beyond the type, length and generation (never bytes that map
    /// memory).
    #[doc(hidden)]
    fn describe(raw: &Self::Raw, d: &mut std::fmt::DebugStruct<'_, '_>);
}

impl<K: BufferKind, T> BufferHandle<K, T> {
    /// Size of a handle in bytes.
    pub const SIZE: usize = std::mem::size_of::<K::Raw>();

    /// A handle of sealed bytes `raw`.
    pub(crate) fn from_raw(raw: K::Raw) -> Self {
        Self {
            raw,
            _elem: PhantomData,
        }
    }

    /// The handle's bytes, to send to a peer.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.raw)
    }

    /// A handle from bytes another process sent; its structure (size, magic, version,
    /// checksum, reserved bytes) is checked here, the rest when it is opened.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        K::open(bytes).map(Self::from_raw)
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        usize::try_from(K::len_and_generation(&self.raw).0).unwrap_or(usize::MAX)
    }

    /// Whether the buffer holds no elements (never, for handles the crate made).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        K::len_and_generation(&self.raw).0 == 0
    }

    /// The buffer's generation: each allocation of a block has its own.
    #[must_use]
    pub fn generation(&self) -> u64 {
        K::len_and_generation(&self.raw).1
    }
}

impl<K: BufferKind, T> Clone for BufferHandle<K, T> {
    fn clone(&self) -> Self {
        Self::from_raw(self.raw)
    }
}

impl<K: BufferKind, T> PartialEq for BufferHandle<K, T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl<K: BufferKind, T> std::fmt::Debug for BufferHandle<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (len, generation) = K::len_and_generation(&self.raw);
        let mut d = f.debug_struct(K::NAME);
        d.field("type", &std::any::type_name::<T>())
            .field("len", &len)
            .field("generation", &generation);
        K::describe(&self.raw, &mut d);
        d.finish_non_exhaustive()
    }
}

impl<K: HandleKind> Clone for Handle<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: HandleKind> Copy for Handle<K> {}
impl<K: HandleKind> PartialEq for Handle<K> {
    fn eq(&self, other: &Self) -> bool {
        self.env == other.env
    }
}
impl<K: HandleKind> Eq for Handle<K> {}

// SAFETY: repr(transparent) over `Envelope` (Zeroable) and a zero-sized PhantomData.
unsafe impl<K: HandleKind + 'static> Zeroable for Handle<K> {}
// SAFETY: repr(transparent) over `Envelope`, which is Pod (no padding, all integers and byte
// arrays); the PhantomData adds no bytes. Any bit pattern is a value (validated on open).
unsafe impl<K: HandleKind + 'static> Pod for Handle<K> {}

impl<K: HandleKind> Handle<K> {
    /// The size of a handle's bytes ([`as_bytes`](Self::as_bytes)), the same for every kind.
    pub const SIZE: usize = HANDLE_SIZE;

    pub(crate) fn from_envelope(env: Envelope) -> Self {
        Self {
            env,
            _kind: PhantomData,
        }
    }

    /// The envelope's bytes, to send to a peer.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.env)
    }

    /// Whether the exporter shares this memory read-only (its owner was made with
    /// `read_only_for_importers`): it opens only with the read-only types
    /// ([`ReadOnlyBuffer`](crate::ReadOnlyBuffer), [`ReadOnlyArena`](crate::arena::ReadOnlyArena),
    /// [`ReadOnlyPool`](crate::pool::ReadOnlyPool)), and a read-write open is refused.
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        self.env.flags & FLAG_READ_ONLY != 0
    }

    /// This handle, marked read-only for importers (and sealed again) when `read_only` says
    /// so: what every owner's export does with its `read_only_for_importers` setting.
    pub(crate) fn marked_read_only_if(mut self, read_only: bool) -> Self {
        if read_only {
            self.env.flags |= FLAG_READ_ONLY;
            self.env = self.env.seal();
        }
        self
    }

    /// For a read-write open: refused when the exporter shares the memory read-only.
    pub(crate) fn refuse_if_read_only(&self) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::HandleTypeMismatch {
                handle: HandleType::from_code(self.env.handle_type).unwrap_or(HandleType::PosixFd),
                conflict: crate::error::TypeConflict::ReadOnly,
            });
        }
        Ok(())
    }

    /// Rebuild a handle from bytes received from another process, checking length, magic,
    /// version, kind, checksum and layout. The element type, the exporter and the export are
    /// checked on open (as for arena and pool buffer handles), so a handle can be read as
    /// bytes and passed on by code that does not know its element type.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong (another kind's handle included).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::{Error, IpcSignalHandle};
    ///
    /// assert!(matches!(
    ///     IpcSignalHandle::from_bytes(&[0u8; IpcSignalHandle::SIZE]),
    ///     Err(Error::CorruptHandle { .. })
    /// ));
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let handle = Self::from_envelope(envelope_from_bytes(bytes)?);
        handle.check_structure()?;
        Ok(handle)
    }

    /// The structure: magic, version, kind, checksum, reserved bytes, layout.
    pub(crate) fn check_structure(&self) -> Result<()> {
        self.env.validate(K::CODE)
    }

    /// The admission every open passes, in one step, before it looks at its import cache,
    /// takes a lease or lets the driver see a byte: the envelope ([`check_envelope`]); the
    /// exporter alive (`process::check_exporter_alive`, an answer at most 100 µs old); and,
    /// for a kind that holds memory, the memory's device visible and reachable from `ctx`
    /// (`device::check_reachable`). A cache hit is then held only to what its own entry
    /// knows (the export not closing, described as the first open described it); a miss
    /// takes its lease and maps.
    ///
    /// [`check_envelope`]: Self::check_envelope
    ///
    /// The open's trace span (`open`, with the kind, bytes, exporter and generation the
    /// handle names) begins here and lasts as long as the [`Admitted`] the caller holds.
    pub(crate) fn admit(&self, ctx: &GpuContext, with_fd: bool) -> Result<Admitted> {
        let trace = trace::scope!(
            "open",
            kind = kind_name(K::CODE),
            bytes = self.env.len.saturating_mul(u64::from(self.env.elem_size)),
            exporter = self.env.exporter().pid(),
            generation = self.env.generation
        );
        let admitted = self.check_envelope(with_fd).and_then(|exporter| {
            crate::process::check_exporter_alive(&exporter, with_fd)?;
            let memory_device = if K::HOLDS_MEMORY {
                device::check_reachable(ctx, &self.env.device_uuid)?
            } else {
                ctx.ordinal()
            };
            Ok((exporter, memory_device))
        });
        #[cfg(feature = "tracing")]
        if let Err(e) = &admitted {
            trace::event!("open refused", error = %e);
        }
        let (exporter, memory_device) = admitted?;
        Ok(Admitted {
            exporter,
            memory_device,
            trace,
        })
    }

    /// What an open checks that asks nothing of the system: the structure and element type;
    /// that the handle type and the descriptor agree (`with_fd`: one came with the handle) — a
    /// POSIX-fd export maps only with its descriptor, a legacy one never comes with one —; and
    /// that the exporter ran since this boot and, for a handle without a descriptor, is not
    /// this process (CUDA refuses to open a legacy handle or an event where it was exported).
    /// Returns the exporter.
    pub(crate) fn check_envelope(&self, with_fd: bool) -> Result<ProcessIdentity> {
        self.check_structure()?;
        let env = &self.env;
        if <K::Element as sealed::Element>::TYPED {
            check_element::<K::Element>(env.elem_size, env.elem_align, env.type_tag)?;
        }
        let handle = self.env.handle_type();
        // A POSIX-fd export maps only with its descriptor; a legacy one never has one.
        let expected = usize::from(handle == HandleType::PosixFd);
        let found = usize::from(with_fd);
        if matches!(handle, HandleType::PosixFd | HandleType::Legacy) && expected != found {
            return Err(Error::HandleTypeMismatch {
                handle,
                conflict: TypeConflict::Descriptors { expected, found },
            });
        }
        if with_fd {
            self.env.exporter_this_boot()
        } else {
            self.env.foreign_exporter()
        }
    }

    /// The exporting process.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.env.exporter()
    }

    /// The UUID of the device that holds the memory (buffers, signals, arenas, pools) or on
    /// which the event was created (events open in a context of any device, as NVIDIA's
    /// `simpleIPC` does: each process waits on every device's events).
    #[must_use]
    pub fn device_uuid(&self) -> [u8; 16] {
        self.env.device_uuid
    }

    /// The export's generation in its exporter: with the token, it names one export for ever
    /// (a handle of a dropped export is stale, never another export's).
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.env.generation
    }
}

impl<K: HandleKind> std::fmt::Debug for Handle<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env = &self.env;
        let mut d = f.debug_struct(K::NAME);
        if K::CODE == KIND_MEM {
            d.field("type", &std::any::type_name::<K::Element>())
                .field("handle_type", &env.handle_type())
                .field("len", &env.len);
        }
        if K::CODE == KIND_ARENA {
            d.field("capacity", &env.len);
        }
        d.field("exporter_pid", &env.exporter_pid)
            .field("generation", &env.generation)
            .field("device", &device::uuid_string(&env.device_uuid))
            .finish_non_exhaustive()
    }
}

/// Recompute the checksum of envelope bytes in place (no-op for the wrong length), as a forger
/// would: fuzz targets reach the checks behind the checksum with it, and tests forge handles
/// whose checksum is valid. Not part of the API (`__private::reseal`).
#[doc(hidden)]
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub fn reseal(bytes: &mut [u8]) {
    envelope::reseal_bytes::<Envelope>(bytes);
}

pub(crate) fn envelope_from_bytes(bytes: &[u8]) -> Result<Envelope> {
    envelope::read(bytes)
}

#[cfg(test)]
mod tests;
