//! [`ImportedPool`]: an [`IpcPool`] imported from another process, once per process, and the
//! holds of its buffers' views on the pool's block table.

use super::*;
use crate::ledger::Holding;

/// The pools this process imported, by export token: one [`Import`] per pool per process,
/// whatever the contexts it is opened in. An import being dropped is waited for: a new import
/// of the pool must not overlap the driver's destroy of the old one.
static IMPORTS: ImportCache<[u8; 16], Import> = ImportCache::new(Dying::WaitForIt);

/// A pool imported into this process. There is one per pool per process, shared by the
/// [`ImportedPool`]s of every context. The driver maps an imported allocation at one address
/// for the whole process (unified addressing), and does not count imports: measured on H200s
/// (driver 580), a second import of the same pool, in the same or another context, gets the
/// same address for the allocation, and the first `cuMemFree` unmaps it for both (the other's
/// free then fails, its copies fail with `CUDA_ERROR_INVALID_VALUE`, and a kernel would fault).
/// Two imports would free each other's views (`tests/two_contexts.rs`).
struct Import {
    /// The driver's pool, imported in the context of the first import: its driver calls
    /// (imports, frees, the destroy) run with it current. Destroyed first in `drop`.
    driver: ManuallyDrop<PoolImport>,
    token: [u8; 16],
    /// The ordinal, in this process, of the device that holds the pool's memory.
    holder: u32,
    exporter: ProcessIdentity,
    /// The pool's block table, our lease and bit in it, and per allocation we view its
    /// imported pointer and the size the driver reports for it. Dropped after the pool is
    /// destroyed (see Drop).
    holdings: Holdings<(sys::CUdeviceptr, u64)>,
}

impl Drop for Import {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.driver) };
        // Only now may the pool be imported again (see `IMPORTS`).
        IMPORTS.forget(&self.token);
    }
}

/// An [`IpcPool`] imported from another process: each of its buffers opens with
/// [`open`](Self::open) (`cuMemPoolImportPointer`). `ImportedPool` is `Send`, `Sync` and cheap
/// to clone; every [`PoolView`] keeps the import alive. A process imports a pool once: imports
/// in other contexts (devices) share it, and a buffer opened through several of them is one
/// import of the allocation, freed when its last view in the process drops.
#[derive(Clone)]
pub struct ImportedPool {
    import: Arc<Import>,
    /// The context this pool was opened for: its views' copies and memsets run in it.
    ctx: GpuContext,
}

impl Import {
    /// Import the pool `handle` names from `fd` in `ctx`.
    fn new(
        ctx: &GpuContext,
        handle: &IpcPoolHandle,
        fd: OwnedFd,
        exporter: ProcessIdentity,
        holder: u32,
    ) -> Result<Self> {
        let env = &handle.env;
        let holdings = Holdings::open_with_table(&env.token, 0, env.generation)?;
        let driver = PoolImport::from_fd(ctx, fd.as_fd())?;
        drop(fd);
        Ok(Self {
            driver: ManuallyDrop::new(driver),
            token: env.token,
            holder,
            exporter,
            holdings,
        })
    }

    /// Make sure `ctx`'s device can read and write the pool's memory (see
    /// [`PoolImport::reach`]).
    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.driver.reach(ctx, self.holder)
    }
}

impl ImportedPool {
    /// Import a pool from its handle and the descriptor its owner sent with it
    /// (`cuMemPoolImportFromShareableHandle`), taking an importer slot in its lease table, and
    /// give `ctx`'s device access to its memory if the driver says it has none
    /// (`cuMemPoolGetAccess`, `cuMemPoolSetAccess`). `fd` is consumed. A pool this process has
    /// imported already, in any context, is shared: the call then checks the handle (and the
    /// exporter alive, as every open does), closes `fd` unused and gives `ctx`'s device access.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`]; [`Error::PeerGone`] (the exporter) (a pool of a dead process,
    /// before the descriptor is used); [`Error::DeviceNotReachable`]; [`Error::StaleHandle`] when
    /// the owner dropped the pool; [`Error::TooManyImporters`]; [`Error::Cuda`] naming
    /// `cuMemPoolImportFromShareableHandle` (a descriptor that is not a pool), `cuMemPoolGetAccess`
    /// or `cuMemPoolSetAccess`; [`Error::HandleTypeMismatch`]
    /// ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)) when the owner shares the
    /// pool read-only ([`ReadOnlyPool::open_fd`](crate::pool::ReadOnlyPool::open_fd) opens it).
    #[doc(alias = "cuMemPoolImportFromShareableHandle")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcPoolHandle, fd: OwnedFd) -> Result<Self> {
        handle.refuse_if_read_only()?;
        Self::open_fd_any(ctx, handle, fd)
    }

    /// [`open_fd`](Self::open_fd) whether or not the exporter shares the pool read-only (for
    /// [`ReadOnlyPool`]).
    pub(crate) fn open_fd_any(
        ctx: &GpuContext,
        handle: &IpcPoolHandle,
        fd: OwnedFd,
    ) -> Result<Self> {
        let Admitted {
            exporter,
            memory_device,
            trace: _open,
        } = handle.admit(ctx, true)?;
        let token = handle.env.token;
        let generation = handle.env.generation;
        // The owner dropped the pool: its handles are stale (the import lives on for the
        // views still held). Known and open: shared.
        let import = match IMPORTS.entry(&token) {
            Entry::Live(hit) if hit.holdings.is_closing() => {
                return Err(Error::StaleHandle { generation });
            }
            Entry::Live(hit) => hit,
            Entry::Vacant(vacancy) => vacancy.fill(Arc::new(Import::new(
                ctx,
                handle,
                fd,
                exporter,
                memory_device,
            )?)),
        };
        import.grant(ctx)?;
        Ok(Self {
            import,
            ctx: ctx.clone(),
        })
    }

    /// Open one buffer of the pool: checks the handle (checksum, element type, this pool),
    /// enters its block (stale once the owner freed it), imports the allocation
    /// (`cuMemPoolImportPointer`) and checks its size. Opening the same buffer again in this
    /// process shares the import.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a damaged handle, one of another pool, or one whose length
    /// the allocation does not hold; [`Error::TypeMismatch`]; [`Error::StaleHandle`] when the
    /// buffer was freed; [`Error::PeerGone`] (the exporter) when the owner died (views opened
    /// before stay mapped); [`Error::HandleTypeMismatch`] with
    /// [`TypeConflict::ImportedTwice`](crate::error::TypeConflict::ImportedTwice) when this
    /// process holds the allocation through a [`ForeignPool`];
    /// [`Error::Cuda`] naming `cuMemPoolImportPointer`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    /// use cuda_ipc::pool::PoolHandle;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let name = SocketName::Abstract("pool".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let pool = socket.recv_pool(&ctx, Duration::from_secs(5))?; // once
    /// let bytes = socket.recv(Duration::from_secs(5))?.payload; // per buffer
    /// let view = pool.open(&PoolHandle::<u32>::from_bytes(&bytes)?)?;
    /// let mut host = vec![0u32; view.len()];
    /// view.copy_to_host(&mut host)?;
    /// drop(view); // frees our import; the owner may free the allocation after this
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolImportPointer")]
    pub fn open<T: Pod>(&self, handle: &PoolHandle<T>) -> Result<PoolView<T>> {
        let import = &self.import;
        // A `PoolHandle`'s structure was checked when it was made (`from_bytes`) or sealed by
        // this crate; the rest is checked here.
        let h = &handle.raw;
        let (bytes, len) = check_buffer_of::<T>(
            (h.elem_size, h.elem_align, h.type_tag),
            h.len,
            (&h.token, &import.token),
            "pool",
        )?;
        let memory = |detail: String| Error::corrupt_handle(HandleDefect::Memory { detail });
        // Every open asks after the owner, as the pool's import did (a pinned pidfd's answer).
        crate::process::check_exporter_alive(&import.exporter, true)?;
        // A second handle of the allocation is held to the size the driver reported.
        let again = |&(ptr, size): &(sys::CUdeviceptr, u64)| {
            if size < bytes {
                return Err(memory(format!(
                    "the handle claims {bytes} bytes; the allocation holds {size} \
                     (cuPointerGetAttributes)"
                )));
            }
            Ok(ptr)
        };
        let ptr = match import.holdings.enter(h.index, h.generation, || {})? {
            Holding::Held(view) => {
                let ptr = again(view.kept())?;
                view.count();
                ptr
            }
            Holding::Entered(first) => {
                let (ptr, size) = import_pointer(import, first.block(), h, bytes)?;
                first.fill((ptr, size));
                ptr
            }
        };
        Ok(PoolView {
            slice: GpuSlice::new(self.ctx.clone(), ptr, len),
            hold: PoolHold(Box::new(LedgerHold {
                import: import.clone(),
                index: h.index,
            })),
        })
    }

    /// The process that owns the pool.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.import.exporter
    }

    /// The context this pool was opened for (its views' copies and memsets run in it).
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Let the device of `ctx`, another context of this process, read and write every buffer
    /// of the pool this process opens, now and later, from kernels and copies there (asked of
    /// the driver with `cuMemPoolGetAccess`, granted with `cuMemPoolSetAccess` where missing).
    /// Opening the pool in a context grants that context's device already, so this is for
    /// handing a view's pointer to another device without opening the pool there. A process
    /// imports a pool once, so access granted here holds for every [`ImportedPool`] of it in
    /// this process.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the pool's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemPoolGetAccess` or
    /// `cuMemPoolSetAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// let name = SocketName::Abstract("pool".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let pool = socket.recv_pool(&gpu0, Duration::from_secs(5))?;
    /// pool.grant_access(&gpu1)?; // views' pointers may now go to kernels on GPU 1 too
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.import.grant(ctx)
    }
}

/// `cuMemPoolImportPointer` of `h`'s allocation, checked to hold `bytes`: the pointer and the
/// size the driver reports.
fn import_pointer(
    import: &Import,
    block: &Block,
    h: &RawPoolHandle,
    bytes: u64,
) -> Result<(sys::CUdeviceptr, u64)> {
    let (_, published) = block.range();
    if published < bytes {
        return Err(Error::corrupt_handle(HandleDefect::Memory {
            detail: format!("the handle claims {bytes} bytes; the owner allocated {published}"),
        }));
    }
    import.driver.import_pointer(h.export, |ptr| {
        crate::memory::claimed_bytes(ptr, format_args!("the handle claims {bytes} bytes"), bytes)
    })
}

impl std::fmt::Debug for ImportedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPool")
            .field("exporter", &self.import.exporter.pid())
            .field("device", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// A hold on an [`IpcPool`]'s allocation: our bit in its block.
struct LedgerHold {
    import: Arc<Import>,
    index: u32,
}

impl view::Hold for LedgerHold {
    fn is_live(&self) -> bool {
        self.import.holdings.is_live(self.index)
    }

    fn exporter(&self) -> Option<ProcessIdentity> {
        Some(self.import.exporter)
    }

    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.import.grant(ctx)
    }

    fn block(&self) -> Option<u32> {
        Some(self.index)
    }
}

impl Drop for LedgerHold {
    fn drop(&mut self) {
        if !self.import.holdings.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        let driver = &self.import.driver;
        self.import.holdings.leave(self.index, |(ptr, _)| {
            // An import that could not be freed keeps the bit: the owner then never frees the
            // allocation under it (a leak, never a use-after-free).
            // SAFETY: imported with this pool's `import_pointer`, freed once, when its last
            // view goes; before the bit clears, as the guide requires.
            unsafe { driver.free_pointer(ptr) }
        });
    }
}
