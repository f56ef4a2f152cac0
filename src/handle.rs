//! Typed, validated envelopes around CUDA's 64-byte IPC handles: [`IpcMemHandle<T>`],
//! [`IpcEventHandle`] and [`IpcSignalHandle`].
//!
//! A raw CUDA IPC handle says nothing about what it names: not the element type, not the
//! length, not whether the buffer still exists. The envelope carries all of that and a
//! checksum, and it is plain data (`#[repr(C)]`, `Pod`) so it fits in a
//! [`ShmCell`](crate::ShmCell) or any byte channel. Everything in it is validated before the
//! CUDA handle inside is passed to the driver.

use std::marker::PhantomData;

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, PeerRole, Result};
use crate::process::ProcessIdentity;
use crate::shared::fnv1a64;

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

/// How an [`IpcBuffer`](crate::IpcBuffer)'s memory is shared with other processes: chosen when
/// the buffer is allocated ([`IpcBuffer::new_with`](crate::IpcBuffer::new_with)).
///
/// | | [`Legacy`](Self::Legacy) | [`PosixFd`](Self::PosixFd) |
/// |-|-|-|
/// | Allocation | `cuMemAlloc` | `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess` |
/// | What a peer needs | the 184-byte [`IpcMemHandle`] (any channel) | the handle **and** a file descriptor, sent over an [`FdSocket`](crate::FdSocket) |
/// | Who can map it | anyone who reads the handle bytes (a bearer token; any uid, any pid namespace) | only a process the descriptor was sent to (a capability) |
/// | Dropping the exporter while mapped elsewhere | never waits: the free is deferred until the last importer unmaps or dies (leases) | never waits: the driver keeps the memory while any process maps it |
/// | Opening in the exporting process | refused (CUDA cannot) | allowed |
/// | Foreign peers ([`IpcBuffer::raw_export`](crate::IpcBuffer::raw_export)) | yes (PyTorch, CuPy, C/C++) | no |
///
/// [`Auto`](Self::Auto) picks [`PosixFd`](Self::PosixFd) where the device supports it
/// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` and virtual memory
/// management), else [`Legacy`](Self::Legacy); [`IpcBuffer::handle_type`](crate::IpcBuffer::handle_type)
/// says which. [`FdSocket::send_buffer`](crate::FdSocket::send_buffer) and
/// [`recv_buffer`](crate::FdSocket::recv_buffer) carry either kind, so code that passes buffers
/// over a socket works with both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HandleType {
    /// CUDA's legacy IPC handles (`cuIpcGetMemHandle`): 64 bytes that map the memory anywhere.
    #[default]
    Legacy,
    /// Virtual-memory allocations exported as POSIX file descriptors
    /// (`cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)`).
    PosixFd,
    /// [`PosixFd`](Self::PosixFd) where the device allows it, else [`Legacy`](Self::Legacy).
    Auto,
}

impl HandleType {
    /// The envelope's code for a concrete type (`Auto` is resolved before export).
    pub(crate) fn code(self) -> u32 {
        match self {
            Self::Legacy | Self::Auto => HANDLE_LEGACY,
            Self::PosixFd => HANDLE_POSIX_FD,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        match code {
            HANDLE_LEGACY => Some(Self::Legacy),
            HANDLE_POSIX_FD => Some(Self::PosixFd),
            _ => None,
        }
    }
}

impl std::fmt::Display for HandleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Legacy => "legacy IPC",
            Self::PosixFd => "POSIX file descriptor",
            Self::Auto => "automatic",
        })
    }
}

/// Envelope codes of [`HandleType`]s.
const HANDLE_LEGACY: u32 = 0;
const HANDLE_POSIX_FD: u32 = 1;

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
    pub reserved: [u8; 4],
    pub checksum: u64,
}

const _: () = assert!(std::mem::size_of::<Envelope>() == 184);

impl Envelope {
    fn body(&self) -> &[u8] {
        let bytes = bytemuck::bytes_of(self);
        &bytes[..bytes.len() - 8]
    }

    pub(crate) fn seal(mut self) -> Self {
        self.magic = MAGIC;
        self.version = VERSION;
        self.checksum = checksum(self.body());
        self
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

    /// The exporter, if it ran since this boot (else it is gone: [`Error::PeerGone`] (the exporter)).
    pub(crate) fn exporter_this_boot(&self) -> Result<ProcessIdentity> {
        let exporter = self.exporter();
        if self.boot_id != crate::os::boot_id() {
            return Err(Error::PeerGone {
                pid: exporter.pid(),
                role: PeerRole::Exporter,
            });
        }
        Ok(exporter)
    }

    /// The checks on an exporter that need no system call: it ran since this boot (else it
    /// is gone), and it is not this process (CUDA refuses a self-open). Returns the exporter.
    pub(crate) fn foreign_exporter(&self) -> Result<ProcessIdentity> {
        let exporter = self.exporter_this_boot()?;
        let me = ProcessIdentity::current();
        if exporter.is_same_process(&me) {
            return Err(Error::SameProcess { pid: me.pid() });
        }
        Ok(exporter)
    }

    /// Structural checks on bytes from another process: magic, version, kind, checksum,
    /// reserved bytes, and a plausible element layout.
    pub(crate) fn validate(&self, kind: u16) -> Result<()> {
        let bad = |reason: String| Err(Error::CorruptHandle { reason });
        if self.magic != MAGIC {
            return bad(format!("bad magic {:#x}", self.magic));
        }
        if self.version != VERSION {
            return bad(format!(
                "version {} (this build reads {VERSION})",
                self.version
            ));
        }
        if self.kind != kind {
            let what = |k| match k {
                KIND_MEM => "a memory",
                KIND_EVENT => "an event",
                KIND_SIGNAL => "a signal",
                KIND_ARENA => "an arena",
                KIND_POOL => "a pool",
                _ => "an unknown",
            };
            return bad(format!(
                "{} handle where {} handle was expected",
                what(self.kind),
                what(kind)
            ));
        }
        let sum = checksum(self.body());
        if sum != self.checksum {
            return bad(format!(
                "checksum {:#x} does not match contents ({sum:#x})",
                self.checksum
            ));
        }
        if self.reserved != [0; 4] {
            return bad("reserved bytes are not zero".into());
        }
        match (kind, HandleType::from_code(self.handle_type)) {
            (_, None) => return bad(format!("unknown handle type {}", self.handle_type)),
            (KIND_POOL, Some(HandleType::PosixFd))
                if self.cuda != [0; 64]
                    || (self.len, self.elem_size, self.elem_align) != (1, 1, 1) =>
            {
                return bad("a pool handle carries no size or CUDA bytes".into());
            }
            (KIND_POOL, Some(HandleType::PosixFd)) => {}
            (KIND_ARENA | KIND_POOL, Some(t)) if t != HandleType::PosixFd => {
                return bad(format!(
                    "{t} handle type on an arena or pool (they are shared as file descriptors)"
                ));
            }
            (KIND_MEM | KIND_ARENA, Some(HandleType::PosixFd)) => {
                let bytes = self.vmm_bytes();
                let wanted = self.len.saturating_mul(u64::from(self.elem_size));
                if self.cuda[8..] != [0; 56] || bytes < wanted || bytes > isize::MAX as u64 {
                    return bad(format!(
                        "a file-descriptor handle mapping {bytes} bytes for {} × {} bytes",
                        self.len, self.elem_size
                    ));
                }
            }
            (KIND_MEM, Some(_)) => {}
            (_, Some(t)) if t != HandleType::Legacy => {
                return bad(format!("{t} handle type on a non-memory handle"));
            }
            _ => {}
        }
        if kind == KIND_SIGNAL
            && (self.len, self.elem_size, self.elem_align, self.type_tag)
                != (1, 8, 8, type_tag_of::<u64>())
        {
            return bad(format!(
                "a signal is one 8-byte counter, not {} × {} bytes",
                self.len, self.elem_size
            ));
        }
        if kind == KIND_ARENA && (self.elem_size, self.elem_align) != (1, 1) {
            return bad(format!(
                "an arena is counted in bytes, not {}-byte elements",
                self.elem_size
            ));
        }
        if matches!(kind, KIND_MEM | KIND_SIGNAL | KIND_ARENA) {
            if !self.elem_align.is_power_of_two() || !self.elem_size.is_multiple_of(self.elem_align)
            {
                return bad(format!(
                    "element size {} / alignment {} is not a valid layout",
                    self.elem_size, self.elem_align
                ));
            }
            let bytes = self.len.checked_mul(u64::from(self.elem_size));
            if bytes.is_none_or(|b| b == 0 || b > isize::MAX as u64) {
                return bad(format!("length {} × {} bytes", self.len, self.elem_size));
            }
        }
        Ok(())
    }
}

/// The envelope checksum: a word-at-a-time multiply-xorshift hash. Each step
/// `h = ((h ^ w) * P) ^ (that >> 29)` is a bijection of `h` for a fixed word `w`, so changing any
/// bits of one word changes the result: every single-bit flip is caught (tested below). It is an
/// integrity check against corruption and bugs, not a MAC: a handle is a bearer token anyway.
pub(crate) fn checksum(body: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ body.len() as u64;
    for chunk in body.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(P);
        h ^= h >> 29;
    }
    h
}

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

/// The type tag of `T` in envelopes: FNV-1a of its type name.
pub(crate) fn type_tag_of<T>() -> u64 {
    fnv1a64(std::any::type_name::<T>().as_bytes())
}

/// An exported [`IpcBuffer<T>`](crate::IpcBuffer): CUDA's memory handle in a typed,
/// checksummed envelope, 184 bytes of plain data.
///
/// It carries the element size, alignment and type tag of `T`, the length, the device UUID,
/// the exporter's pid, start time and boot id, a per-export random token and generation, and a
/// checksum. Pass it to another process through a [`ShmCell`](crate::ShmCell) (it is `Pod`)
/// or as bytes ([`as_bytes`](Self::as_bytes) / [`from_bytes`](Self::from_bytes)), and open it
/// there with [`ImportedBuffer::open`](crate::ImportedBuffer::open).
///
/// A handle of a [`HandleType::PosixFd`] buffer says what the memory is but cannot map it: the
/// memory comes as a file descriptor, sent with the handle over an
/// [`FdSocket`](crate::FdSocket) ([`FdSocket::send_buffer`](crate::FdSocket::send_buffer)) or
/// any other `SCM_RIGHTS` channel ([`IpcBuffer::export_fd`](crate::IpcBuffer::export_fd),
/// [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd)).
///
/// `Debug` never prints the CUDA handle bytes: a legacy CUDA IPC handle is a bearer token that
/// any local process can open.
#[repr(transparent)]
pub struct IpcMemHandle<T> {
    pub(crate) env: Envelope,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for IpcMemHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for IpcMemHandle<T> {}
impl<T> PartialEq for IpcMemHandle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.env == other.env
    }
}
impl<T> Eq for IpcMemHandle<T> {}

// SAFETY: repr(transparent) over `Envelope` (Zeroable) and a zero-sized PhantomData.
unsafe impl<T: 'static> Zeroable for IpcMemHandle<T> {}
// SAFETY: repr(transparent) over `Envelope`, which is Pod (no padding, all integers and byte
// arrays); the PhantomData adds no bytes. Any bit pattern is a value (validated on open).
unsafe impl<T: 'static> Pod for IpcMemHandle<T> {}

impl<T> IpcMemHandle<T> {
    /// The size of a handle's bytes ([`as_bytes`](Self::as_bytes)).
    pub const SIZE: usize = HANDLE_SIZE;

    pub(crate) fn from_envelope(env: Envelope) -> Self {
        Self {
            env,
            _elem: PhantomData,
        }
    }

    /// The envelope's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.env)
    }

    /// Rebuild a handle from bytes received from another process, checking length, magic,
    /// version, kind, checksum and layout (the type and the exporter are checked on open).
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let env = envelope_from_bytes(bytes)?;
        env.validate(KIND_MEM)?;
        Ok(Self::from_envelope(env))
    }

    /// Number of elements of the exported buffer (as the envelope says).
    pub fn len(&self) -> usize {
        usize::try_from(self.env.len).unwrap_or(usize::MAX)
    }

    /// Whether the envelope claims zero elements (never true for a valid handle).
    pub fn is_empty(&self) -> bool {
        self.env.len == 0
    }

    /// The exporting process.
    pub fn exporter(&self) -> ProcessIdentity {
        self.env.exporter()
    }

    /// The UUID of the device that holds the memory.
    pub fn device_uuid(&self) -> [u8; 16] {
        self.env.device_uuid
    }

    /// The exporter's per-process export counter.
    pub fn generation(&self) -> u64 {
        self.env.generation
    }

    /// How the memory is shared: [`HandleType::Legacy`] or [`HandleType::PosixFd`] (never
    /// `Auto`).
    pub fn handle_type(&self) -> HandleType {
        self.env.handle_type()
    }
}

impl<T> std::fmt::Debug for IpcMemHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMemHandle")
            .field("type", &std::any::type_name::<T>())
            .field("handle_type", &self.env.handle_type())
            .field("len", &self.env.len)
            .field("exporter_pid", &self.env.exporter_pid)
            .field("generation", &self.env.generation)
            .field("device", &self.env.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// An exported [`IpcEvent`](crate::IpcEvent): CUDA's event handle in a checksummed envelope
/// (same layout as [`IpcMemHandle`], kind "event"). `Debug` never prints the CUDA bytes.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcEventHandle {
    pub(crate) env: Envelope,
}

impl IpcEventHandle {
    /// The size of a handle's bytes.
    pub const SIZE: usize = HANDLE_SIZE;

    /// The envelope's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.env)
    }

    /// Rebuild a handle from bytes, checking length, magic, version, kind and checksum.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let env = envelope_from_bytes(bytes)?;
        env.validate(KIND_EVENT)?;
        Ok(Self { env })
    }

    /// The exporting process.
    pub fn exporter(&self) -> ProcessIdentity {
        self.env.exporter()
    }
}

impl std::fmt::Debug for IpcEventHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcEventHandle")
            .field("exporter_pid", &self.env.exporter_pid)
            .field("generation", &self.env.generation)
            .field("device", &self.env.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// An exported [`IpcSignal`](crate::IpcSignal): the memory handle of its 8-byte counter in
/// a checksummed envelope of kind "signal" (same layout and rules as [`IpcMemHandle`]: exporter
/// identity, device UUID, per-export token and generation). A memory or event handle is refused
/// where a signal handle is expected, and the reverse. `Debug` never prints the CUDA bytes.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcSignalHandle {
    pub(crate) env: Envelope,
}

impl IpcSignalHandle {
    /// The size of a handle's bytes.
    pub const SIZE: usize = HANDLE_SIZE;

    /// The envelope's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.env)
    }

    /// Rebuild a handle from bytes, checking length, magic, version, kind, checksum and that
    /// it describes one 8-byte counter (the exporter is checked on open).
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong.
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
        let env = envelope_from_bytes(bytes)?;
        env.validate(KIND_SIGNAL)?;
        Ok(Self { env })
    }

    /// The exporting process.
    pub fn exporter(&self) -> ProcessIdentity {
        self.env.exporter()
    }

    /// The UUID of the device that holds the counter.
    pub fn device_uuid(&self) -> [u8; 16] {
        self.env.device_uuid
    }

    /// The exporter's per-process export counter.
    pub fn generation(&self) -> u64 {
        self.env.generation
    }
}

impl std::fmt::Debug for IpcSignalHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcSignalHandle")
            .field("exporter_pid", &self.env.exporter_pid)
            .field("generation", &self.env.generation)
            .field("device", &self.env.device_ordinal)
            .finish_non_exhaustive()
    }
}

/// Recompute the checksum of envelope bytes in place (no-op for the wrong length), as a forger
/// would: fuzz targets reach the checks behind the checksum with it, and tests forge handles
/// whose checksum is valid. Not part of the API (`__private::reseal`).
#[doc(hidden)]
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() == HANDLE_SIZE {
        let sum = checksum(&bytes[..HANDLE_SIZE - 8]);
        bytes[HANDLE_SIZE - 8..].copy_from_slice(&sum.to_le_bytes());
    }
}

pub(crate) fn envelope_from_bytes(bytes: &[u8]) -> Result<Envelope> {
    if bytes.len() != HANDLE_SIZE {
        return Err(Error::CorruptHandle {
            reason: format!("{} bytes, expected {HANDLE_SIZE}", bytes.len()),
        });
    }
    Ok(bytemuck::pod_read_unaligned(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Envelope {
        Envelope {
            kind: KIND_MEM,
            elem_size: 4,
            elem_align: 4,
            type_tag: type_tag_of::<f32>(),
            len: 1024,
            generation: 3,
            exporter_pid: 42,
            exporter_start: 9,
            boot_id: [1; 16],
            device_uuid: [2; 16],
            token: [3; 16],
            cuda: [4; 64],
            ..Zeroable::zeroed()
        }
        .seal()
    }

    #[test]
    fn sealed_envelope_validates_and_round_trips() {
        let h = IpcMemHandle::<f32>::from_envelope(sample());
        let back = IpcMemHandle::<f32>::from_bytes(h.as_bytes()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.len(), 1024);
    }

    #[test]
    fn debug_never_shows_the_cuda_bytes() {
        let mut env = sample();
        env.cuda = [0xAB; 64];
        let text = format!("{:?}", IpcMemHandle::<f32>::from_envelope(env.seal()));
        assert!(
            !text.contains("171") && !text.to_lowercase().contains("ab, "),
            "{text}"
        );
        assert!(!text.contains("cuda"), "{text}");
    }

    #[test]
    fn wrong_kind_length_and_zeroes_are_rejected() {
        let h = IpcMemHandle::<f32>::from_envelope(sample());
        assert!(IpcEventHandle::from_bytes(h.as_bytes()).is_err());
        assert!(IpcMemHandle::<f32>::from_bytes(&h.as_bytes()[1..]).is_err());
        assert!(IpcMemHandle::<f32>::from_bytes(&[0u8; HANDLE_SIZE]).is_err());
    }

    fn fd_sample(bytes: u64) -> Envelope {
        let mut cuda = [0u8; 64];
        cuda[..8].copy_from_slice(&bytes.to_le_bytes());
        Envelope {
            cuda,
            handle_type: HANDLE_POSIX_FD,
            ..sample()
        }
        .seal()
    }

    #[test]
    fn fd_handles_carry_their_size_and_type() {
        let h = IpcMemHandle::<f32>::from_bytes(
            IpcMemHandle::<f32>::from_envelope(fd_sample(2 << 20)).as_bytes(),
        )
        .unwrap();
        assert_eq!(h.handle_type(), HandleType::PosixFd);
        assert_eq!(h.env.vmm_bytes(), 2 << 20);
        assert_eq!(
            IpcMemHandle::<f32>::from_envelope(sample()).handle_type(),
            HandleType::Legacy
        );
        assert!(format!("{h:?}").contains("PosixFd"), "{h:?}");
    }

    #[test]
    fn fd_handles_that_cannot_hold_their_length_are_rejected() {
        // 1024 × 4 bytes do not fit in 4095 mapped bytes; 0 bytes; a size past isize::MAX.
        for bytes in [4095, 0, u64::MAX] {
            let err = fd_sample(bytes).validate(KIND_MEM).unwrap_err();
            assert!(err.to_string().contains("file-descriptor handle"), "{err}");
        }
        assert!(fd_sample(4096).validate(KIND_MEM).is_ok());
        // Bytes after the size must be zero.
        let mut env = fd_sample(4096);
        env.cuda[9] = 1;
        assert!(env.seal().validate(KIND_MEM).is_err());
    }

    #[test]
    fn unknown_handle_types_and_fd_events_or_signals_are_rejected() {
        let unknown = Envelope {
            handle_type: 7,
            ..sample()
        }
        .seal();
        let err = unknown.validate(KIND_MEM).unwrap_err();
        assert!(err.to_string().contains("unknown handle type 7"), "{err}");
        for kind in [KIND_EVENT, KIND_SIGNAL] {
            let env = Envelope {
                kind,
                handle_type: HANDLE_POSIX_FD,
                ..signal_sample()
            }
            .seal();
            let err = env.validate(kind).unwrap_err();
            assert!(err.to_string().contains("non-memory handle"), "{err}");
        }
    }

    fn signal_sample() -> Envelope {
        Envelope {
            kind: KIND_SIGNAL,
            elem_size: 8,
            elem_align: 8,
            type_tag: type_tag_of::<u64>(),
            len: 1,
            ..sample()
        }
        .seal()
    }

    #[test]
    fn arena_and_pool_envelopes_are_file_descriptors_and_nothing_else() {
        let mut arena = fd_sample(4 << 20);
        arena.kind = KIND_ARENA;
        (arena.elem_size, arena.elem_align, arena.len) = (1, 1, 4 << 20);
        assert!(arena.seal().validate(KIND_ARENA).is_ok());
        assert!(
            arena.seal().validate(KIND_MEM).is_err(),
            "an arena is not a buffer"
        );
        let mut legacy = arena;
        legacy.handle_type = HandleType::Legacy.code();
        assert!(legacy.seal().validate(KIND_ARENA).is_err());
        let mut typed = arena;
        (typed.elem_size, typed.elem_align, typed.len) = (4, 4, 1 << 20);
        assert!(
            typed.seal().validate(KIND_ARENA).is_err(),
            "arenas count bytes"
        );

        let mut pool = arena;
        pool.kind = KIND_POOL;
        pool.len = 1;
        pool.cuda = [0; 64];
        assert!(pool.seal().validate(KIND_POOL).is_ok());
        let mut sized = pool;
        sized.cuda[0] = 1;
        assert!(
            sized.seal().validate(KIND_POOL).is_err(),
            "a pool carries no size"
        );
        let mut legacy = pool;
        legacy.handle_type = HandleType::Legacy.code();
        assert!(legacy.seal().validate(KIND_POOL).is_err());
    }

    #[test]
    fn signal_handles_round_trip_and_are_not_buffers_or_events() {
        let h = IpcSignalHandle {
            env: signal_sample(),
        };
        assert_eq!(IpcSignalHandle::from_bytes(h.as_bytes()).unwrap(), h);
        let err = IpcMemHandle::<u64>::from_bytes(h.as_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .contains("a signal handle where a memory handle was expected"),
            "{err}"
        );
        assert!(IpcEventHandle::from_bytes(h.as_bytes()).is_err());
        let buffer = IpcMemHandle::<u64>::from_envelope(sample());
        assert!(IpcSignalHandle::from_bytes(buffer.as_bytes()).is_err());
    }

    #[test]
    fn a_signal_envelope_must_describe_one_u64() {
        for (len, size, align, tag) in [
            (2, 8, 8, type_tag_of::<u64>()),
            (1, 4, 4, type_tag_of::<u32>()),
            (1, 8, 8, type_tag_of::<f64>()),
        ] {
            let mut e = signal_sample();
            (e.len, e.elem_size, e.elem_align, e.type_tag) = (len, size, align, tag);
            assert!(e.seal().validate(KIND_SIGNAL).is_err(), "{len} {size}");
        }
    }

    #[test]
    fn bad_layouts_are_rejected_even_when_sealed() {
        for (size, align, len) in [(4, 3, 1), (3, 2, 1), (4, 4, 0), (8, 8, u64::MAX)] {
            let mut e = sample();
            e.elem_size = size;
            e.elem_align = align;
            e.len = len;
            assert!(e.seal().validate(KIND_MEM).is_err(), "{size} {align} {len}");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = IpcMemHandle::<u8>::from_bytes(&bytes);
            let _ = IpcEventHandle::from_bytes(&bytes);
            let _ = IpcSignalHandle::from_bytes(&bytes);
        }

        #[test]
        fn every_single_bit_flip_is_rejected(bit in 0usize..(HANDLE_SIZE * 8)) {
            let env = sample();
            let mut bytes = bytemuck::bytes_of(&env).to_vec();
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(IpcMemHandle::<f32>::from_bytes(&bytes).is_err());
        }
    }
}
