//! Raw legacy IPC handles: the 64-byte `cudaIpcMemHandle_t` that PyTorch, CuPy, Numba and C/C++
//! peers exchange, with an offset and a size, for sharing with processes that do not use this
//! crate.
//!
//! A raw handle carries none of the envelope this crate's own handles have (element type,
//! length, exporter identity, export token, checksum) and takes no lease, so most of what
//! [`ImportedBuffer::open`](crate::ImportedBuffer::open) checks cannot be checked. What still is:
//! the byte range lies inside the allocation the driver mapped (`cuPointerGetAttributes`), its
//! offset suits the element type's alignment, the memory's device is this context's or
//! reachable from it as a peer, the handle is not one this process exported, and — if the
//! caller names the exporter — the exporter is alive, at every open (a re-open of a handle
//! this process maps already too). The rest is what
//! [`ImportedBuffer::open_raw`](crate::ImportedBuffer::open_raw)'s caller vouches for.
//!
//! # The layout, for C and C++ peers
//!
//! [`RawExport`] is `#[repr(C)]`, 104 bytes, native-endian, no padding:
//!
//! ```c
//! #include <stdint.h>
//! struct cuda_ipc_raw_export {
//!     uint8_t  handle[64];      /* cudaIpcMemHandle_t / CUipcMemHandle, as the driver wrote it */
//!     uint64_t offset;          /* bytes from the allocation's start to the data */
//!     uint64_t bytes;           /* bytes of data from there */
//!     uint8_t  device_uuid[16]; /* the device holding the memory (cuDeviceGetUuid) */
//!     uint32_t device_ordinal;  /* its ordinal in the exporter's numbering */
//!     uint32_t exporter_pid;    /* the exporting process */
//! };
//! ```
//!
//! A C peer opens it with `cudaIpcOpenMemHandle(&base, *(cudaIpcMemHandle_t *)e.handle,
//! cudaIpcMemLazyEnablePeerAccess)` and uses `(char *)base + e.offset`.
//!
//! # Sharing with PyTorch, CuPy and C++
//!
//! Peers that do not use this crate speak the raw 64-byte `cudaIpcMemHandle_t` plus an offset and a
//! size. `RawMemHandle` holds those bytes (`RawMemHandle::from_torch` also takes PyTorch's 66-byte
//! form: a version byte, `b'c'`, the handle); `IpcBuffer::raw_export` gives a foreign peer a
//! `RawExport` (a C struct: `examples/interop/cuda_ipc_raw.h`), and the `unsafe`
//! `ImportedBuffer::open_raw` opens a foreign export. A raw handle carries no type, length,
//! exporter or token, so `open_raw` checks what it still can — the range lies inside the mapped
//! allocation (`cuPointerGetAttributes`), the offset suits `T`'s alignment, the memory's device is
//! reachable, the handle is not this process's own, a named exporter is alive — and its caller
//! vouches for the rest: the peer keeps the memory allocated for this use until the views drop. Raw
//! exports take no lease: keep the `IpcBuffer` alive until the foreign peer says it is done.
//!
//! ```rust,no_run
//! use cuda_ipc::{GpuContext, ImportedBuffer};
//! use cuda_ipc::raw::{RawImport, RawMemHandle};
//!
//! fn open_torch_tensor(
//!     ctx: &GpuContext,
//!     handle: &[u8], // untyped_storage()._share_cuda_()[1]
//!     offset: u64,   // [3] + tensor.storage_offset() * element_size
//!     numel: usize,
//!     pid: u32,      // the PyTorch process
//! ) -> cuda_ipc::Result<Vec<f32>> {
//!     let import = RawImport::new(RawMemHandle::from_torch(handle)?, offset, numel).exporter_pid(pid);
//!     // SAFETY: the PyTorch process keeps the tensor alive until we tell it we are done.
//!     let tensor = unsafe { ImportedBuffer::<f32>::open_raw(ctx, &import)? };
//!     let mut host = vec![0.0; tensor.len()];
//!     tensor.copy_to_host(&mut host)?;
//!     Ok(host)
//! }
//! ```
//!
//! The Python side — what to send from a PyTorch tensor, and how to open a Rust export with CuPy
//! and view it in PyTorch without a copy — is `examples/interop/cuda_ipc_peer.py` (`torch_export`,
//! `cupy_open`). `tests/interop.rs` runs it against the machine's own torch 2.11 and CuPy 14.2 on
//! the H200s: a tensor opened in Rust, written, and the write seen by PyTorch; a tensor at byte
//! 4160 inside a caching-allocator block; a Rust buffer opened by CuPy and written through
//! PyTorch; a range past the block refused; a dead Python exporter a clear `PeerGone` (or, if
//! not named, `CUDA_ERROR_INVALID_HANDLE` from the driver at once). Opening a PyTorch tensor costs
//! 57.2 µs the first time (1.02× the raw driver calls) and 0.11 µs again while mapped, against
//! 428 µs p50 for `torch.multiprocessing`'s own CUDA-tensor hand-off measured in the same run
//! (`cargo bench --bench torch_interop`, BENCHMARKS.md).

use bytemuck::{Pod, Zeroable};

use crate::error::{ArgumentDefect, Error, HandleDefect, Result};
use crate::process::ProcessIdentity;

/// The 64 bytes of a legacy CUDA IPC memory handle (`cudaIpcMemHandle_t`, `CUipcMemHandle`).
///
/// # Examples
///
/// ```
/// use cuda_ipc::raw::RawMemHandle;
///
/// // What CuPy's `cupy.cuda.runtime.ipcGetMemHandle` returns: the 64 bytes themselves.
/// let bytes = [7u8; 64];
/// let handle = RawMemHandle::from_bytes(&bytes)?;
/// assert_eq!(handle.as_bytes(), &bytes);
/// # Ok::<(), cuda_ipc::Error>(())
/// ```
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Pod, Zeroable)]
pub struct RawMemHandle(pub [u8; 64]);

/// The version bytes PyTorch's caching allocator writes in front of a shareable handle (torch 2.x:
/// 2; torch 2.13: 3, same payload).
const TORCH_HANDLE_VERSIONS: [u32; 2] = [2, 3];
/// PyTorch's type byte for a `cudaMalloc` block (a legacy IPC handle follows).
const TORCH_CUDA_MALLOC: u8 = b'c';
/// PyTorch's type byte for an expandable segment (not a legacy IPC handle).
const TORCH_EXPANDABLE_SEGMENT: u8 = b'e';

impl RawMemHandle {
    /// The handle from exactly 64 bytes (CuPy's `ipcGetMemHandle`, a C peer's
    /// `cudaIpcMemHandle_t`).
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let raw: [u8; 64] = bytes.try_into().map_err(|_| {
            Error::corrupt_handle(HandleDefect::Size {
                what: "a raw CUDA IPC handle",
                expected: 64,
                found: bytes.len(),
            })
        })?;
        Ok(Self(raw))
    }

    /// The handle from the bytes PyTorch puts in the second field of
    /// `untyped_storage()._share_cuda_()` (what `torch.multiprocessing` sends for a CUDA
    /// tensor): a version byte (2 or 3), a type byte (`'c'` for a `cudaMalloc` block), then the
    /// 64 handle bytes — 66 bytes. A bare 64-byte handle (older torch) is accepted as is.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] naming the reason, for a handle of an expandable segment
    /// (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: virtual memory, not a legacy IPC
    /// handle), an unknown version or type, or another length.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::raw::RawMemHandle;
    ///
    /// let mut from_torch = vec![2u8, b'c'];
    /// from_torch.extend_from_slice(&[9u8; 64]);
    /// assert_eq!(RawMemHandle::from_torch(&from_torch)?.0, [9u8; 64]);
    /// # Ok::<(), cuda_ipc::Error>(())
    /// ```
    pub fn from_torch(bytes: &[u8]) -> Result<Self> {
        if bytes.len() == 64 {
            return Self::from_bytes(bytes);
        }
        match bytes {
            [version, kind, rest @ ..] if rest.len() == 64 => {
                if !TORCH_HANDLE_VERSIONS.contains(&u32::from(*version)) {
                    return Err(Error::corrupt_handle(HandleDefect::Version {
                        what: "PyTorch handle",
                        found: u32::from(*version),
                        supported: &TORCH_HANDLE_VERSIONS,
                    }));
                }
                match *kind {
                    TORCH_CUDA_MALLOC => Self::from_bytes(rest),
                    TORCH_EXPANDABLE_SEGMENT => {
                        Err(Error::corrupt_handle(HandleDefect::Unsupported {
                            detail:
                                "a PyTorch expandable-segment handle (expandable_segments:True) \
                                 is virtual memory, not a legacy CUDA IPC handle; share the \
                                 tensor from a process without expandable segments"
                                    .into(),
                        }))
                    }
                    other => Err(Error::corrupt_handle(HandleDefect::HandleType {
                        detail: format!("unknown PyTorch handle type byte {other:#04x}"),
                    })),
                }
            }
            _ => Err(Error::corrupt_handle(HandleDefect::Size {
                what: "a PyTorch CUDA handle (or a bare 64-byte one)",
                expected: 66,
                found: bytes.len(),
            })),
        }
    }

    /// The 64 bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

/// What [`IpcBuffer::raw_export`](crate::IpcBuffer::raw_export) gives a foreign peer: the raw
/// handle and where the data lies in the allocation it maps. It is [`Pod`], so it can be sent
/// as bytes or stored in a [`ShmCell`](crate::shm::ShmCell).
///
/// The layout, for C and C++ peers (`#[repr(C)]`, 104 bytes, native-endian, no padding; also
/// `examples/interop/cuda_ipc_raw.h`):
///
/// ```c
/// #include <stdint.h>
/// struct cuda_ipc_raw_export {
///     uint8_t  handle[64];      /* cudaIpcMemHandle_t / CUipcMemHandle */
///     uint64_t offset;          /* bytes from the allocation's start to the data */
///     uint64_t bytes;           /* bytes of data */
///     uint8_t  device_uuid[16]; /* the device holding the memory (cuDeviceGetUuid) */
///     uint32_t device_ordinal;  /* its ordinal in the exporter's numbering */
///     uint32_t exporter_pid;    /* the exporting process */
/// };
/// ```
///
/// A C peer opens it with `cudaIpcOpenMemHandle(&base, *(cudaIpcMemHandle_t *)e.handle,
/// cudaIpcMemLazyEnablePeerAccess)` and uses `(char *)base + e.offset`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct RawExport {
    /// The legacy IPC handle of the allocation.
    pub handle: RawMemHandle,
    /// Bytes from the allocation's start to the data.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
    /// The device holding the memory.
    pub device_uuid: [u8; 16],
    /// The device's ordinal in the exporter's numbering.
    pub device_ordinal: u32,
    /// The exporting process.
    pub exporter_pid: u32,
}

/// What [`ImportedBuffer::open_raw`](crate::ImportedBuffer::open_raw) opens: a raw handle, where
/// the data lies in its allocation, and how many elements.
///
/// # Examples
///
/// ```
/// use cuda_ipc::raw::{RawImport, RawMemHandle};
///
/// let import = RawImport::new(RawMemHandle([0; 64]), 512, 1024).exporter_pid(4242);
/// assert_eq!((import.offset, import.len), (512, 1024));
/// assert_eq!(import.exporter.map(|id| id.pid()), Some(4242));
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RawImport {
    /// The legacy IPC handle of the allocation.
    pub handle: RawMemHandle,
    /// Bytes from the allocation's start to the data.
    pub offset: u64,
    /// Elements of data.
    pub len: usize,
    /// The exporting process, if known: checked alive at every open (a re-open of a mapped
    /// handle too), and kept for liveness checks. Named by pid alone
    /// ([`exporter_pid`](Self::exporter_pid)) it cannot be told from a later process that
    /// reuses the pid; a full identity ([`exporter`](Self::exporter), as
    /// [`FdSocket::recv_foreign`](crate::fd::FdSocket::recv_foreign) records the sender) can.
    pub exporter: Option<ProcessIdentity>,
}

impl RawImport {
    /// `len` elements at byte `offset` of the allocation `handle` maps.
    #[must_use]
    pub fn new(handle: RawMemHandle, offset: u64, len: usize) -> Self {
        Self {
            handle,
            offset,
            len,
            exporter: None,
        }
    }

    /// Name the exporting process by its pid (recommended: a dead exporter is then a clear
    /// [`Error::PeerGone`] (the exporter) instead of the driver's error). A pid alone cannot
    /// tell the exporter from a process that reuses its pid after its death: where the
    /// exporter's [`ProcessIdentity`] is known, name it with [`exporter`](Self::exporter).
    #[must_use]
    pub fn exporter_pid(mut self, pid: u32) -> Self {
        self.exporter = Some(ProcessIdentity::from_parts(pid, 0));
        self
    }

    /// Name the exporting process by its identity (pid, start time and, where known, pidfs
    /// inode, as [`FdSocket::recv_foreign`](crate::fd::FdSocket::recv_foreign) records the
    /// sender of its socket), so that a dead exporter whose pid was reused reads as dead.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::ProcessIdentity;
    /// use cuda_ipc::raw::{RawImport, RawMemHandle};
    ///
    /// let me = ProcessIdentity::current();
    /// let import = RawImport::new(RawMemHandle([0; 64]), 0, 16).exporter(me);
    /// assert_eq!(import.exporter, Some(me));
    /// ```
    #[must_use]
    pub fn exporter(mut self, id: ProcessIdentity) -> Self {
        self.exporter = Some(id);
        self
    }

    /// From a [`RawExport`] written by another process (this crate's or a C peer's), for
    /// elements of `T` covering its bytes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the byte count is not a whole number of `T`s.
    pub fn from_export<T>(export: &RawExport) -> Result<Self> {
        let size = std::mem::size_of::<T>() as u64;
        if size == 0 || !export.bytes.is_multiple_of(size) {
            return Err(Error::InvalidArgument {
                call: "RawImport::from_export",
                defect: ArgumentDefect::NotWholeElements {
                    bytes: export.bytes,
                    elem_size: size,
                },
            });
        }
        let len = usize::try_from(export.bytes / size).map_err(|_| Error::InvalidArgument {
            call: "RawImport::from_export",
            defect: ArgumentDefect::AllocationSize {
                len: export.bytes / size,
                elem_size: size,
            },
        })?;
        Ok(Self {
            handle: export.handle,
            offset: export.offset,
            len,
            exporter: Some(export.exporter_pid)
                .filter(|&p| p != 0)
                .map(|p| ProcessIdentity::from_parts(p, 0)),
        })
    }

    /// The bytes `offset..end` of the allocation that `len` `T`s at `offset` cover, checked as
    /// far as a raw handle allows before the driver is asked: at least one element, `offset`
    /// aligned for `T`, no overflow, and not a handle this process exported.
    pub(crate) fn byte_range<T>(&self, call: &'static str) -> Result<std::ops::Range<u64>> {
        let invalid = |defect| Error::InvalidArgument { call, defect };
        let size = std::mem::size_of::<T>() as u64;
        let bytes = (self.len as u64)
            .checked_mul(size)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                invalid(ArgumentDefect::AllocationSize {
                    len: self.len as u64,
                    elem_size: size,
                })
            })?;
        let align = std::mem::align_of::<T>() as u64;
        if !self.offset.is_multiple_of(align) {
            return Err(invalid(ArgumentDefect::Misaligned {
                offset: self.offset,
                align,
            }));
        }
        let end = self.offset.checked_add(bytes).ok_or_else(|| {
            invalid(ArgumentDefect::RangeOverflow {
                offset: self.offset,
                bytes,
            })
        })?;
        if crate::memory::is_own_legacy(&self.handle.0) {
            return Err(Error::SameProcess {
                pid: std::process::id(),
            });
        }
        Ok(self.offset..end)
    }

    /// The exporter the caller named, if alive now (pinned with a pidfd for later checks): by
    /// its identity where the caller knew it, else by pid alone.
    pub(crate) fn live_exporter(&self) -> Result<Option<ProcessIdentity>> {
        let Some(id) = self.exporter else {
            return Ok(None);
        };
        crate::process::check_exporter_alive(&id, false)?;
        Ok(Some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_handles_are_parsed_and_expandable_segments_refused() {
        let mut h = vec![2u8, b'c'];
        h.extend_from_slice(&[5; 64]);
        assert_eq!(RawMemHandle::from_torch(&h).unwrap().0, [5; 64]);
        h[0] = 3;
        assert!(RawMemHandle::from_torch(&h).is_ok());
        h[1] = b'e';
        let defect = |r: Result<RawMemHandle>| match r {
            Err(Error::CorruptHandle { defect }) => defect,
            other => panic!("{other:?}"),
        };
        let e = defect(RawMemHandle::from_torch(&h));
        assert!(
            matches!(&e, HandleDefect::Unsupported { detail } if detail.contains("expandable")),
            "{e}"
        );
        h[1] = b'x';
        assert!(matches!(
            defect(RawMemHandle::from_torch(&h)),
            HandleDefect::HandleType { .. }
        ));
        h[1] = b'c';
        h[0] = 9;
        assert!(matches!(
            defect(RawMemHandle::from_torch(&h)),
            HandleDefect::Version { found: 9, .. }
        ));
        assert!(matches!(
            defect(RawMemHandle::from_torch(&[0; 65])),
            HandleDefect::Size { found: 65, .. }
        ));
        assert!(RawMemHandle::from_torch(&[1; 64]).is_ok());
        assert!(RawMemHandle::from_bytes(&[0; 63]).is_err());
    }

    #[test]
    fn the_export_layout_is_the_documented_c_struct() {
        assert_eq!(std::mem::size_of::<RawExport>(), 104);
        assert_eq!(std::mem::align_of::<RawExport>(), 8);
        assert_eq!(std::mem::offset_of!(RawExport, offset), 64);
        assert_eq!(std::mem::offset_of!(RawExport, bytes), 72);
        assert_eq!(std::mem::offset_of!(RawExport, device_uuid), 80);
        assert_eq!(std::mem::offset_of!(RawExport, device_ordinal), 96);
        assert_eq!(std::mem::offset_of!(RawExport, exporter_pid), 100);
    }

    #[test]
    fn an_import_from_an_export_counts_whole_elements() {
        let e = RawExport {
            handle: RawMemHandle([1; 64]),
            offset: 256,
            bytes: 4096,
            device_uuid: [0; 16],
            device_ordinal: 0,
            exporter_pid: 77,
        };
        let i = RawImport::from_export::<f32>(&e).unwrap();
        assert_eq!((i.offset, i.len), (256, 1024));
        assert_eq!(i.exporter, Some(ProcessIdentity::from_parts(77, 0)));
        assert!(RawImport::from_export::<[u8; 3]>(&e).is_err());
    }
}
