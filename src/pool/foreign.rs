//! Pools of programs that do not use this crate: [`ForeignPool`] and [`PoolBufferDescriptor`].
//! The guide — who frees first, what is refused, examples each way with cuda.core — is the
//! [pool module's](super#with-cudacore-and-other-programs).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use bytemuck::Pod;
use parking_lot::Mutex;

use super::import::PoolImport;
use super::view::{Hold, PoolHold, PoolView};
use crate::context::GpuContext;
use crate::driver::sys;
use crate::error::{Error, HandleDefect, Result};
use crate::memory::check_claim;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;

/// One allocation of a pool, as a program that does not use this crate shares it: the
/// `cuMemPoolExportPointer` data (`CUmemPoolPtrExportData`, 64 bytes) and the size in bytes —
/// what cuda.core's `IPCBufferDescriptor` holds. [`to_bytes`](Self::to_bytes) lays it out in
/// 72 bytes: the export data, then the size as a little-endian `u64`.
///
/// The export data maps the memory for whoever holds the pool's descriptor: `Debug` leaves it
/// out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PoolBufferDescriptor {
    /// The driver's export data of the allocation.
    pub export_data: [u8; 64],
    /// The bytes shared, from the allocation's start.
    pub bytes: u64,
}

impl PoolBufferDescriptor {
    /// The bytes of [`to_bytes`](Self::to_bytes).
    pub const SIZE: usize = 72;

    /// The export data, then the size (little-endian).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[..64].copy_from_slice(&self.export_data);
        out[64..].copy_from_slice(&self.bytes.to_le_bytes());
        out
    }

    /// Read [`to_bytes`](Self::to_bytes)'s layout.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for another length ([`HandleDefect::Size`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::pool::PoolBufferDescriptor;
    ///
    /// let d = PoolBufferDescriptor { export_data: [3; 64], bytes: 4096 };
    /// assert_eq!(PoolBufferDescriptor::from_bytes(&d.to_bytes())?, d);
    /// assert!(PoolBufferDescriptor::from_bytes(&[0; 71]).is_err());
    /// # Ok::<(), cuda_ipc::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let Ok(bytes) = <&[u8; Self::SIZE]>::try_from(bytes) else {
            return Err(Error::corrupt_handle(HandleDefect::Size {
                what: "a pool buffer descriptor",
                expected: Self::SIZE,
                found: bytes.len(),
            }));
        };
        let mut export_data = [0u8; 64];
        export_data.copy_from_slice(&bytes[..64]);
        let mut size = [0u8; 8];
        size.copy_from_slice(&bytes[64..]);
        Ok(Self {
            export_data,
            bytes: u64::from_le_bytes(size),
        })
    }

    /// The number of `T`s the descriptor covers: its size must be a positive whole number of
    /// them, at most `isize::MAX` bytes.
    fn len_of<T>(&self) -> Result<usize> {
        let size = std::mem::size_of::<T>() as u64;
        if size == 0 || self.bytes == 0 || !self.bytes.is_multiple_of(size) {
            return Err(Error::corrupt_handle(HandleDefect::Layout {
                detail: format!(
                    "{} bytes are not a whole, positive number of {}-byte elements",
                    self.bytes, size
                ),
            }));
        }
        usize::try_from(self.bytes / size)
            .ok()
            .filter(|_| self.bytes <= isize::MAX as u64)
            .ok_or_else(|| {
                Error::corrupt_handle(HandleDefect::Layout {
                    detail: format!("{} bytes do not fit this platform", self.bytes),
                })
            })
    }
}

impl std::fmt::Debug for PoolBufferDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBufferDescriptor")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

/// A pool another program exported as a POSIX file descriptor (cuda.core, C/C++), imported
/// into this process (`cuMemPoolImportFromShareableHandle`); its buffers open with
/// [`open`](Self::open) as [`PoolView`]s. `ForeignPool` is `Send`, `Sync` and cheap to clone;
/// every view keeps the import alive. The module docs say who frees first and what is refused.
#[derive(Clone)]
pub struct ForeignPool {
    import: Arc<ForeignImport>,
}

/// The import of one foreign pool: destroyed when the last clone and view are gone.
struct ForeignImport {
    driver: PoolImport,
    exporter: Option<ProcessIdentity>,
}

/// An allocation imported from a foreign pool, shared by its views in this process.
struct Imported {
    ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` to the end of the allocation, as the driver reports them.
    size: u64,
    /// The ordinal of the device that holds it.
    device: u32,
    views: usize,
    /// The import that made it (freed in its context, before the pool may be destroyed).
    import: Arc<ForeignImport>,
}

/// Allocations imported from foreign pools in this process, by export data. The driver maps an
/// imported allocation at one address for the whole process and does not count imports (the
/// first `cuMemFree` would unmap every view): each allocation is imported once, whatever the
/// number of views or imports of its pool, and freed with its last view. Keyed by the data
/// alone so that two imports of one pool share it, a second pool's open of data already
/// imported here shares that import without the driver's check against the second pool (the
/// memory stays mapped while any view holds it, the import that made it included).
static IMPORTED: Mutex<Option<HashMap<[u8; 64], Imported>>> = parking_lot::const_mutex(None);

impl ForeignPool {
    /// Import the pool whose POSIX file descriptor another program sent
    /// (`cuMemPoolImportFromShareableHandle`): cuda.core's
    /// `DeviceMemoryResource.allocation_handle`, or a descriptor from
    /// `cuMemPoolExportToShareableHandle`. `fd` is consumed. `exporter_pid`, if given, is
    /// checked alive now and before each [`open`](Self::open) (by pid alone: the descriptor
    /// carries no start time; [`FdSocket::peer`](crate::fd::FdSocket::peer) names the sender of
    /// a socket). Import a pool once per process and share the `ForeignPool`:
    /// cuda.core does the same with its registry.
    ///
    /// # Errors
    ///
    /// [`Error::PeerGone`] (the exporter) when the named exporter is not alive; [`Error::Cuda`]
    /// naming `cuMemPoolImportFromShareableHandle` for a descriptor that is not a pool
    /// exported as a file descriptor.
    #[doc(alias = "cuMemPoolImportFromShareableHandle")]
    pub fn open_fd(ctx: &GpuContext, fd: OwnedFd, exporter_pid: Option<u32>) -> Result<Self> {
        let exporter = exporter_pid.map(|pid| ProcessIdentity::from_parts(pid, 0));
        if let Some(id) = &exporter {
            crate::process::check_exporter_alive(id, true)?;
        }
        let driver = PoolImport::from_fd(ctx, fd.as_fd())?;
        drop(fd);
        Ok(Self {
            import: Arc::new(ForeignImport { driver, exporter }),
        })
    }

    /// Open one buffer of the pool from its descriptor as `T`s (`cuMemPoolImportPointer`),
    /// its size held to the allocation's own range (`cuPointerGetAttributes`) and its device
    /// to `ctx`'s reach (given access with `cuMemPoolSetAccess` if it is a peer's). A buffer
    /// opened again shares the import; the last view's drop frees it.
    ///
    /// # Safety
    ///
    /// The exporter keeps the allocation (does not free it, and does not exit before this
    /// process has freed it: its memory would go with the pool) until every view of it here
    /// is dropped — the CUDA guide's rule that importers free first, which no table of this
    /// crate can hold a foreign exporter to. The bytes are the exporter's to write
    /// meanwhile, as for any shared memory.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a size of zero or not a whole number of `T`s, or past the
    /// allocation; [`Error::PeerGone`] (the exporter) when the named exporter died;
    /// [`Error::Cuda`] naming `cuMemPoolImportPointer` for export data that is not an
    /// allocation of this pool (forged, or freed); [`Error::DeviceNotReachable`] for memory on
    /// a device `ctx` cannot reach; [`Error::HandleTypeMismatch`] with
    /// [`TypeConflict::ImportedTwice`](crate::error::TypeConflict::ImportedTwice) when this
    /// process holds the allocation already through an [`ImportedPool`](super::ImportedPool)
    /// (a crate peer's handle of the same [`IpcPool`](super::IpcPool) buffer) or under other
    /// export data.
    #[doc(alias = "cuMemPoolImportPointer")]
    pub unsafe fn open<T: Pod>(&self, descriptor: &PoolBufferDescriptor) -> Result<PoolView<T>> {
        let len = descriptor.len_of::<T>()?;
        let import = &self.import;
        if let Some(id) = &import.exporter {
            crate::process::check_exporter_alive(id, true)?;
        }
        let key = descriptor.export_data;
        let mut imported = IMPORTED.lock();
        let imported = imported.get_or_insert_with(HashMap::new);
        let (ptr, device) = match imported.get_mut(&key) {
            Some(known) => {
                let claimed = descriptor.bytes;
                check_claim(
                    format_args!("the descriptor claims {claimed} bytes"),
                    claimed,
                    known.size,
                )?;
                import.driver.reach(import.driver.ctx(), known.device)?;
                known.views += 1;
                (known.ptr, known.device)
            }
            None => {
                let (ptr, size, device) = import.import_pointer(descriptor)?;
                let import = import.clone();
                imported.insert(
                    key,
                    Imported {
                        ptr,
                        size,
                        device,
                        views: 1,
                        import,
                    },
                );
                (ptr, device)
            }
        };
        Ok(PoolView {
            slice: GpuSlice::new(import.driver.ctx().clone(), ptr, len),
            hold: PoolHold(Box::new(ForeignHold {
                key,
                import: import.clone(),
                device,
                home: crate::process::Home::here(),
            })),
        })
    }

    /// The exporting process, if it was named.
    #[must_use]
    pub fn exporter(&self) -> Option<ProcessIdentity> {
        self.import.exporter
    }

    /// The context the pool was imported in (its views' copies run in it).
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        self.import.driver.ctx()
    }
}

impl std::fmt::Debug for ForeignPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignPool")
            .field("exporter", &self.import.exporter.map(|e| e.pid()))
            .field("device", &self.import.driver.ctx().ordinal())
            .finish_non_exhaustive()
    }
}

impl ForeignImport {
    /// `cuMemPoolImportPointer` of the descriptor's allocation, held to its size and to the
    /// context's reach: the pointer, the bytes the driver maps from it, and the device that
    /// holds it.
    fn import_pointer(&self, d: &PoolBufferDescriptor) -> Result<(sys::CUdeviceptr, u64, u32)> {
        let (ptr, (size, device)) = self.driver.import_pointer(d.export_data, |ptr| {
            let size = crate::memory::claimed_bytes(
                ptr,
                format_args!("the descriptor claims {} bytes", d.bytes),
                d.bytes,
            )?;
            let device = crate::memory::memory_device(ptr, "foreign pool allocation")?;
            self.driver.reach(self.driver.ctx(), device)?;
            Ok((size, device))
        })?;
        Ok((ptr, size, device))
    }
}

/// A view's hold on an allocation of a [`ForeignPool`]: the last one frees the import.
struct ForeignHold {
    key: [u8; 64],
    /// The pool it was opened through.
    import: Arc<ForeignImport>,
    /// The device that holds the allocation.
    device: u32,
    home: crate::process::Home,
}

impl Hold for ForeignHold {
    /// Whether the named exporter lives (true if none was named).
    fn is_live(&self) -> bool {
        self.import
            .exporter
            .is_none_or(|id| crate::process::is_alive_cached(&id))
    }

    fn exporter(&self) -> Option<ProcessIdentity> {
        self.import.exporter
    }

    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.import.driver.reach(ctx, self.device)
    }

    fn block(&self) -> Option<u32> {
        None
    }
}

impl Drop for ForeignHold {
    fn drop(&mut self) {
        if !self.home.is_here() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        let mut imported = IMPORTED.lock();
        let Some(map) = imported.as_mut() else {
            return;
        };
        let Some(known) = map.get_mut(&self.key) else {
            return;
        };
        known.views -= 1;
        if known.views > 0 {
            return;
        }
        if let Some(last) = map.remove(&self.key) {
            // SAFETY: imported with this pool's `import_pointer`, freed once, when its last
            // view goes (before the import, which `last` holds, can be destroyed). One that
            // cannot be freed stays mapped (a leak, never a use-after-free).
            let _ = unsafe { last.import.driver.free_pointer(last.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_reads_back_and_wrong_lengths_are_refused() {
        let d = PoolBufferDescriptor {
            export_data: std::array::from_fn(|i| i as u8),
            bytes: 0x0102_0304_0506,
        };
        let bytes = d.to_bytes();
        assert_eq!(&bytes[..64], &d.export_data);
        assert_eq!(&bytes[64..], &0x0102_0304_0506u64.to_le_bytes());
        assert_eq!(PoolBufferDescriptor::from_bytes(&bytes).unwrap(), d);
        for len in [0, 64, 71, 73] {
            match PoolBufferDescriptor::from_bytes(&vec![0; len]) {
                Err(Error::CorruptHandle {
                    defect: HandleDefect::Size { found, .. },
                }) => assert_eq!(found, len),
                other => panic!("{len}: {other:?}"),
            }
        }
        assert!(
            !format!("{d:?}").contains("export_data"),
            "Debug keeps the export data out"
        );
    }

    #[test]
    fn a_size_must_be_a_positive_whole_number_of_elements() {
        let of = |bytes| PoolBufferDescriptor {
            export_data: [0; 64],
            bytes,
        };
        assert_eq!(of(4096).len_of::<u32>().unwrap(), 1024);
        assert_eq!(of(7).len_of::<u8>().unwrap(), 7);
        for (bytes, what) in [(0, "zero"), (6, "not whole"), (u64::MAX - 3, "too big")] {
            match of(bytes).len_of::<u32>() {
                Err(Error::CorruptHandle {
                    defect: HandleDefect::Layout { .. },
                }) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}
