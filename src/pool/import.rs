//! A pool this process imported from a file descriptor (`cuMemPoolImportFromShareableHandle`),
//! whoever exported it — another process of this crate ([`ImportedPool`](super::ImportedPool))
//! or another program ([`ForeignPool`](super::ForeignPool)): destroyed once, with the context
//! it was imported in current, and its memory granted to each device that asks.

use std::os::fd::BorrowedFd;

use parking_lot::Mutex;

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::Result;

/// The driver's handle of an imported pool, destroyed on drop.
pub(super) struct PoolImport {
    /// The context of the import: the pool's imports, frees and destroy run with it current.
    ctx: GpuContext,
    pool: sys::CUmemoryPool,
    /// Devices known to have read-write access to the pool's memory, by ordinal.
    access: Mutex<Vec<u32>>,
}

// SAFETY: the pool handle is an opaque driver handle used with `ctx` pushed; the rest is
// Send + Sync.
unsafe impl Send for PoolImport {}
// SAFETY: as above; the access list is behind its lock.
unsafe impl Sync for PoolImport {}

impl PoolImport {
    /// Import the pool `fd` names in `ctx`. A descriptor that is not a pool exported as a
    /// file descriptor is [`Error::Cuda`](crate::Error::Cuda) naming
    /// `cuMemPoolImportFromShareableHandle`.
    pub(super) fn from_fd(ctx: &GpuContext, fd: BorrowedFd<'_>) -> Result<Self> {
        let _g = ctx.enter()?;
        let pool = driver::pool::import_fd(fd)?;
        Ok(Self {
            ctx: ctx.clone(),
            pool,
            access: Mutex::new(Vec::new()),
        })
    }

    /// The context of the import.
    pub(super) fn ctx(&self) -> &GpuContext {
        &self.ctx
    }

    /// Import one allocation of the pool from a peer's export data (`cuMemPoolImportPointer`,
    /// which refuses data of no allocation of this pool) and hold it to `check` — the peer's
    /// claims, asked of the driver — before it is handed out: refused, it is freed again, so
    /// nothing stays mapped. Returns the pointer and what `check` found.
    pub(super) fn import_pointer<R>(
        &self,
        export_data: [u8; 64],
        check: impl FnOnce(sys::CUdeviceptr) -> Result<R>,
    ) -> Result<(sys::CUdeviceptr, R)> {
        let _g = self.ctx.enter()?;
        // SAFETY: our imported pool, live while `self` is; the driver validates the export
        // data against it (forged data is an error code).
        let ptr = unsafe { driver::pool::import_pointer(self.pool, export_data) }?;
        match check(ptr) {
            Ok(found) => Ok((ptr, found)),
            Err(e) => {
                // SAFETY: imported above, never handed out; freed once.
                let _ = unsafe { driver::mem::free(ptr) };
                Err(e)
            }
        }
    }

    /// Make sure `ctx`'s device can read and write the pool's memory, which device `holder`
    /// holds: peer access between the two (none needed on the holder itself), then asked of
    /// the driver (`cuMemPoolGetAccess`; the holder has it) and granted where missing
    /// (`cuMemPoolSetAccess`), once per device. The driver is asked rather than a peer's word
    /// trusted.
    pub(super) fn reach(&self, ctx: &GpuContext, holder: u32) -> Result<()> {
        let mut access = self.access.lock();
        if access.contains(&ctx.ordinal()) {
            return Ok(());
        }
        crate::device::check_peer(ctx.ordinal(), holder)?;
        let desc = crate::vmm::read_write(ctx.device());
        let _g = ctx.enter()?;
        // SAFETY: our imported pool, live while `self` is.
        let has = unsafe { driver::pool::access(self.pool, &desc.location) }?;
        if has != desc.flags {
            // SAFETY: as above.
            unsafe { driver::pool::set_access(self.pool, &desc) }?;
        }
        access.push(ctx.ordinal());
        Ok(())
    }
}

impl Drop for PoolImport {
    fn drop(&mut self) {
        if let Ok(_g) = self.ctx.enter() {
            // SAFETY: imported in this context, destroyed once; every view (each holds the
            // import) has freed its pointer.
            let _ = unsafe { driver::pool::destroy(self.pool) };
        }
    }
}
