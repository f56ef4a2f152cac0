//! A pool this process imported from a file descriptor (`cuMemPoolImportFromShareableHandle`),
//! whoever exported it — another process of this crate ([`ImportedPool`](super::ImportedPool))
//! or another program ([`ForeignPool`](super::ForeignPool)): destroyed once, with the context
//! it was imported in current, and its memory granted to each device that asks.
//!
//! # One import of an allocation per process
//!
//! The driver maps an imported pool allocation at one address for the whole process and does
//! not count imports: a second `cuMemPoolImportPointer` of an allocation already imported
//! (through another import of its pool, or the same) returns the same address, and the first
//! `cuMemFree` unmaps it for every holder. Each pool kind shares its own re-opens before the
//! driver is asked (an [`ImportedPool`](super::ImportedPool) by block, a
//! [`ForeignPool`](super::ForeignPool) by export data); what neither can see — one allocation
//! opened through both, or under another buffer's handle or export data — is caught here:
//! every imported address is recorded until its free, and an import that returns an address
//! already held is refused ([`TypeConflict::ImportedTwice`]) and not freed (the memory is the
//! holder's). The record's lock is held from the import to the record and from the free to
//! the removal, so no import can see an address between another's free and its removal.

use std::collections::BTreeSet;
use std::os::fd::BorrowedFd;

use parking_lot::Mutex;

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{Error, Result, TypeConflict};

/// Test hook: leave refused imports mapped, so that a test can show its check sees the leak
/// (`pool::__testing::leak_refused_imports`).
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(super) static LEAK_REFUSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether the test hook asks refused imports to be left mapped (never, outside the tests).
/// Test hook: the address of the last import refused on its checks (0: none yet), for a test
/// to ask the driver whether it is still mapped (`pool::__testing::take_refused_import`).
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(super) static LAST_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn leaks_refused() -> bool {
    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    return LEAK_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(any(test, fuzzing, cuda_ipc_test_hooks)))]
    false
}

/// Every pool allocation this process holds an import of, by the address the driver maps it
/// at (see the module docs). The innermost lock: taken under a pool's block table
/// (`ImportedPool`) or a `ForeignPool`'s map of its imports, never the other way round.
static HELD: Mutex<BTreeSet<sys::CUdeviceptr>> = parking_lot::const_mutex(BTreeSet::new());

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
    /// file descriptor is [`Error::Cuda`] naming
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
    /// nothing stays mapped. An address this process already holds is refused and left to its
    /// holder (module docs). Returns the pointer and what `check` found; the pointer is
    /// recorded until [`free_pointer`](Self::free_pointer).
    ///
    /// # Errors
    ///
    /// [`Error::HandleTypeMismatch`] with [`TypeConflict::ImportedTwice`] for an allocation
    /// held already; `check`'s error; [`Error::Cuda`] naming `cuMemPoolImportPointer`.
    pub(super) fn import_pointer<R>(
        &self,
        export_data: [u8; 64],
        check: impl FnOnce(sys::CUdeviceptr) -> Result<R>,
    ) -> Result<(sys::CUdeviceptr, R)> {
        let mut held = HELD.lock();
        let _g = self.ctx.enter()?;
        // SAFETY: our imported pool, live while `self` is; the driver validates the export
        // data against it (forged data is an error code).
        let ptr = unsafe { driver::pool::import_pointer(self.pool, export_data) }?;
        if held.contains(&ptr) {
            // The driver handed back the mapping another import holds: not ours to free.
            return Err(Error::HandleTypeMismatch {
                handle: crate::HandleType::Pool,
                conflict: TypeConflict::ImportedTwice,
            });
        }
        match check(ptr) {
            Ok(found) => {
                held.insert(ptr);
                Ok((ptr, found))
            }
            Err(e) => {
                #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
                LAST_REFUSED.store(ptr, std::sync::atomic::Ordering::Relaxed);
                // SAFETY: imported above by this call, never handed out, held by no one else
                // (checked above); freed once.
                let freed = !leaks_refused() && unsafe { driver::mem::free(ptr) }.is_ok();
                if !freed {
                    // Still mapped: recorded, so that no later import takes it for its own.
                    held.insert(ptr);
                }
                Err(e)
            }
        }
    }

    /// Free an allocation [`import_pointer`](Self::import_pointer) returned (`cuMemFree`, in
    /// the import's context), once its last view in this process is gone; whether it was
    /// freed (if not, it stays recorded and mapped: a leak, never a use-after-free).
    ///
    /// # Safety
    ///
    /// `ptr` came from this import's `import_pointer`, no view of it remains, and it is freed
    /// once.
    pub(super) unsafe fn free_pointer(&self, ptr: sys::CUdeviceptr) -> bool {
        let mut held = HELD.lock();
        let freed = self.ctx.enter().is_ok_and(|_g| {
            // SAFETY: the caller's promise: imported here, unviewed, freed once.
            unsafe { driver::mem::free(ptr) }.is_ok()
        });
        if freed {
            held.remove(&ptr);
        }
        freed
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
