//! The memory behind pool buffers: [`PoolBuffer`], an allocation of an [`IpcPool`], and the
//! allocation's life (quarantined while importers hold it); and the
//! pools behind [`HandleType::Pool`] buffers, one per context (another once it is full), kept
//! while any of their buffers lives.

use super::*;

/// A typed allocation from an [`IpcPool`]; it dereferences to its [`GpuSlice`].
///
/// Dropping it frees the allocation (`cuMemFree`, which does not wait for queued work: see
/// [asynchronous work](GpuSlice#asynchronous-work)) once no importer holds it; until then it is
/// quarantined, and handles of it are stale at once. [`free_async`](Self::free_async) orders
/// the free on a stream instead.
pub struct PoolBuffer<T: Pod> {
    pub(super) slice: GpuSlice<T>,
    pub(super) alloc: PoolAlloc,
}

/// One allocation of a pool and its block in the pool's table, whatever its element type: the
/// memory of a [`PoolBuffer`], and of an [`IpcBuffer`](crate::IpcBuffer) of
/// [`HandleType::Pool`]. Freed (or quarantined while importers hold it) on drop.
pub(crate) struct PoolAlloc {
    pub(super) owner: Arc<Owner>,
    pub(super) ptr: sys::CUdeviceptr,
    /// Its block in the ledger: index, generation, and the bytes allocated (our record; the
    /// shared table's copy is for importers).
    pub(super) placed: Placed,
    /// Recorded after the allocation on its stream.
    pub(super) ready: sys::CUevent,
    pub(super) freed: bool,
    /// From a pool of [`SHARED`] (an [`IpcBuffer`](crate::IpcBuffer) of [`HandleType::Pool`]).
    pub(super) shared: bool,
}

// SAFETY: the event is an opaque driver handle used with the context pushed; the rest is Send.
unsafe impl Send for PoolAlloc {}
// SAFETY: `&self` methods only synchronise on the event (thread-safe in the driver) and read the
// shared table.
unsafe impl Sync for PoolAlloc {}

crate::slice::deref_to!(PoolBuffer<T> => slice: GpuSlice<T>);

impl<T: Pod> PoolBuffer<T> {
    /// The handle a process that imported the pool opens with [`ImportedPool::open`]: the
    /// allocation's `cuMemPoolExportPointer` data with the pool's id, the buffer's block and
    /// generation, length and element type, checksummed. Waits first until the allocation has
    /// completed on its stream (`cuEventSynchronize`), since an importer must not touch it
    /// before.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventSynchronize` or `cuMemPoolExportPointer`.
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn handle(&self) -> Result<PoolHandle<T>> {
        self.alloc.handle(self.slice.len)
    }

    /// Wait until the allocation has completed on the stream it was made on, at most
    /// `timeout` (`cuEventQuery`, polled with a short back-off). [`handle`](Self::handle) and
    /// [`descriptor`](Self::descriptor) wait for it without a bound (`cuEventSynchronize`):
    /// call this first where a stream held up by a hung kernel or a dead peer's wait must not
    /// hold the caller for ever. Returns at once once it has completed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Cuda`] naming `cuEventQuery`; [`Error::InvalidState`]
    /// after the buffer was freed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, RawStream};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let pool = IpcPool::new(&ctx)?;
    /// let buf = pool.alloc::<f32>(1 << 20, &RawStream::LEGACY)?;
    /// buf.wait_allocated(Duration::from_secs(5))?;
    /// let descriptor = buf.descriptor()?; // no wait left
    /// # let _ = descriptor;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuEventQuery")]
    pub fn wait_allocated(&self, timeout: std::time::Duration) -> Result<()> {
        self.alloc.wait_ready(timeout)
    }

    /// Whether a process (another, or an import in this one) holds this buffer now.
    #[must_use]
    pub fn is_viewed(&self) -> bool {
        self.alloc.is_viewed()
    }

    /// The buffer as a program that does not use this crate opens it — NVIDIA's cuda.core
    /// (`Buffer.from_ipc_descriptor`, given the pool from [`IpcPool::export_fd`]'s
    /// descriptor), or C/C++ (`cuMemPoolImportPointer`): the allocation's
    /// `cuMemPoolExportPointer` data and its size in bytes. Waits first until the allocation
    /// has completed on its stream, as [`handle`](Self::handle) does.
    ///
    /// A foreign importer takes no place in the pool's table, so nothing stops this buffer's
    /// drop from freeing the allocation under it: keep the buffer until the peer says it has
    /// freed its import (the CUDA guide's rule: importers free first). The pool's
    /// [`read_only_for_importers`](IpcPool::read_only_for_importers) binds this crate's
    /// importers only.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventSynchronize` or `cuMemPoolExportPointer`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, RawStream};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let pool = IpcPool::new(&ctx)?;
    /// let buf = pool.alloc::<f32>(1 << 20, &RawStream::LEGACY)?;
    /// let (_handle, fd) = pool.export_fd()?; // cuda.core: DeviceMemoryResource.from_allocation_handle
    /// let descriptor = buf.descriptor()?; // cuda.core: IPCBufferDescriptor(export_data, bytes)
    /// assert_eq!(descriptor.bytes, 4 << 20);
    /// # drop(fd);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn descriptor(&self) -> Result<PoolBufferDescriptor> {
        let bytes = (self.slice.len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.alloc.descriptor(bytes)
    }

    /// Free the buffer ordered on `stream` (`cuMemFreeAsync`: after the work enqueued on
    /// `stream` before it), if no importer holds it; otherwise retire it as a drop does (handles
    /// stale at once, the allocation freed once importers let go).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemFreeAsync`.
    #[doc(alias = "cuMemFreeAsync")]
    pub fn free_async(mut self, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        self.alloc.free(Some(stream.as_cu_stream()))
    }
}

impl PoolAlloc {
    /// The allocation's address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The handle of this allocation as `len` elements of `T` (see [`PoolBuffer::handle`]).
    pub(crate) fn handle<T: Pod>(&self, len: usize) -> Result<PoolHandle<T>> {
        let export = self.export_data()?;
        Ok(PoolHandle::sealed(
            self.owner.ledger.token(),
            self.placed.index,
            self.placed.generation,
            len as u64,
            export,
        ))
    }

    /// See [`PoolBuffer::descriptor`]: the allocation's export data, as `bytes` bytes.
    pub(crate) fn descriptor(&self, bytes: u64) -> Result<PoolBufferDescriptor> {
        Ok(PoolBufferDescriptor {
            export_data: self.export_data()?,
            bytes,
        })
    }

    /// See [`PoolBuffer::wait_allocated`].
    pub(crate) fn wait_ready(&self, timeout: std::time::Duration) -> Result<()> {
        if self.freed {
            return Err(Error::InvalidState {
                call: "cuEventQuery",
                state: crate::error::ObjectState::Closing,
            });
        }
        let mut wait = crate::poll::Backoff::new(
            timeout,
            std::time::Duration::from_micros(1),
            std::time::Duration::from_millis(1),
        )
        .spinning_below(std::time::Duration::from_micros(50));
        let _g = self.owner.ctx.enter()?;
        loop {
            // SAFETY: our live event (not freed: checked above; `free` takes `&mut self`).
            if unsafe { driver::event::query(self.ready) }? {
                return Ok(());
            }
            if let Err(waited) = wait.pause() {
                return Err(Error::Timeout {
                    what: "pool allocation to complete on its stream",
                    waited,
                    waiting_for: None,
                });
            }
        }
    }

    /// The allocation's `cuMemPoolExportPointer` data, once the allocation has completed.
    fn export_data(&self) -> Result<[u8; 64]> {
        if self.freed {
            // Its event is destroyed and its block retired (an owner checks first; this keeps
            // the destroyed event from ever reaching the driver).
            return Err(Error::InvalidState {
                call: "cuMemPoolExportPointer",
                state: crate::error::ObjectState::Closing,
            });
        }
        let _g = self.owner.ctx.enter()?;
        // SAFETY: our live event.
        unsafe { driver::event::synchronize(self.ready) }?;
        // SAFETY: our live allocation from an exportable pool, complete (synchronised above).
        unsafe { driver::pool::export_pointer(self.ptr) }
    }

    /// Whether [`free`](Self::free) ran (whatever it returned).
    pub(crate) fn is_freed(&self) -> bool {
        self.freed
    }

    /// See [`IpcPool::grant_access`] (for the whole pool).
    pub(crate) fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.owner.grant(ctx)
    }

    /// The pool this allocation came from (its handle and descriptor travel to importers).
    pub(crate) fn pool(&self) -> IpcPool {
        IpcPool {
            owner: self.owner.clone(),
        }
    }

    /// Whether a process (another, or an import in this one) holds the allocation now.
    pub(crate) fn is_viewed(&self) -> bool {
        self.owner.ledger.is_viewed(&self.placed)
    }

    /// The pids of the live processes that hold the allocation now.
    pub(crate) fn importers(&self) -> Vec<u32> {
        self.owner.ledger.holders_of(self.placed.index)
    }

    /// Retire the allocation (new opens of its handles are stale from here on) without freeing
    /// it, and wait up to `timeout` until no importer holds it, reaping importers proven dead.
    /// The allocation stays ours: [`free`](Self::free) (or drop) gives it back.
    ///
    /// # Errors
    ///
    /// [`Error::LeasesOutstanding`] naming the importers still holding it.
    pub(crate) fn wait_unheld(&self, timeout: Duration) -> Result<()> {
        self.owner.ledger.retire(&self.placed);
        let unheld = || {
            if !self.is_viewed() {
                return true;
            }
            self.owner.reclaim(Reap::Always);
            !self.is_viewed()
        };
        Backoff::for_importers(timeout).until_unheld(unheld, || self.importers())
    }

    /// Free the allocation — ordered on `stream`, or now — if no importer holds it; otherwise
    /// quarantine it until they let go. Handles are stale from here on. Once only.
    pub(crate) fn free(&mut self, stream: Option<sys::CUstream>) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        self.freed = true;
        let owner = &self.owner;
        let _g = owner.ctx.enter()?;
        // SAFETY: our live event, destroyed once (`freed` guards).
        let _ = unsafe { driver::event::destroy(self.ready) };
        // Under the quarantine's lock (as a reclaim takes it, then the ledger's): a block the
        // ledger quarantines is on the list before any reclaim can look for it.
        let mut retired = owner.retired.lock();
        if owner.ledger.free(self.placed) {
            retired.push(Retired {
                placed: self.placed,
                ptr: self.ptr,
            });
            return Ok(());
        }
        drop(retired);
        match stream {
            // SAFETY: our allocation, retired with no importer holding it; freed once, ordered
            // on the caller's live stream.
            Some(s) => unsafe { driver::pool::free_async(self.ptr, s) },
            // SAFETY: as above, freed once, now (queued work on it is the caller's duty).
            None => unsafe { driver::mem::free(self.ptr) },
        }
    }
}

impl Drop for PoolAlloc {
    fn drop(&mut self) {
        if !self.owner.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        let _ = self.free(None);
        if self.shared {
            drop_shared(&self.owner);
        }
    }
}

impl<T: Pod> std::fmt::Debug for PoolBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("generation", &self.alloc.placed.generation)
            .finish_non_exhaustive()
    }
}

/// The pools [`HandleType::Pool`] buffers come from, by context: one while it has free blocks
/// (another once it is full). A pool is kept while it has a buffer or an allocation in
/// quarantine (a buffer dropped while an importer holds it), and destroyed when it has neither
/// — by the drop of its last buffer, or by a later [`collect_shared`] — so that it never keeps
/// a context (or its shared-memory tables) alive after its buffers. Who holds a pool changes
/// under this lock only.
pub(super) static SHARED: Mutex<Vec<(usize, Arc<Owner>)>> = parking_lot::const_mutex(Vec::new());

/// Whether a shared pool's allocation went to quarantine (or a pool may have been left without
/// buffers) since [`collect_shared`] last looked (for [`SHARED_QUARANTINE`]).
static SHARED_PENDING: AtomicBool = AtomicBool::new(false);

/// After a shared pool's allocation was freed or quarantined, as it goes: if it was the pool's
/// last buffer and nothing waits in the pool's quarantine, destroy the pool (else a later
/// [`collect_shared`] does).
pub(super) fn drop_shared(owner: &Arc<Owner>) {
    let mut shared = SHARED.lock();
    // The list's reference and the dropping allocation's only: no other buffer, and nobody
    // about to allocate from it (that takes a reference under this lock first). A third
    // reference may be another thread's, looking through the context's pools for room: if it
    // allocates elsewhere, this pool is left with no buffer, so the next pending scan (at an
    // allocation, an export or `collect_deferred`) must look at it.
    if Arc::strong_count(owner) != 2 {
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
        return;
    }
    if owner.reclaim(Reap::IfHeld) != 0 {
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
        return;
    }
    let gone = shared
        .iter()
        .position(|(_, o)| Arc::ptr_eq(o, owner))
        .map(|i| shared.swap_remove(i));
    drop(shared);
    drop(gone); // destroys the pool, after the lock (driver calls, shared-memory unlinks)
}

/// Free what the shared pools hold in quarantine once its importers let go (reaping importers
/// proven dead), and destroy the pools left with no buffer and nothing in quarantine. Returns
/// how many quarantined allocations still wait for live importers, and their bytes. Part of
/// [`collect_deferred`](crate::collect_deferred).
fn collect_shared() -> (usize, usize) {
    let mut shared = SHARED.lock();
    let (mut held, mut bytes) = (0, 0usize);
    let mut gone = Vec::new();
    let mut i = 0;
    while i < shared.len() {
        let owner = &shared[i].1;
        let left = owner.reclaim(Reap::Always);
        if left == 0 && Arc::strong_count(owner) == 1 {
            gone.push(shared.swap_remove(i));
            continue;
        }
        held += left;
        // Our own records of the sizes, summed without wrapping (each is a real allocation).
        bytes = bytes.saturating_add(owner.quarantined_bytes());
        i += 1;
    }
    SHARED_PENDING.store(held != 0, StdOrdering::Relaxed);
    drop(shared);
    drop(gone);
    (held, bytes)
}

/// Once per process: have `exit` remove from `/dev/shm` the tables of the shared pools still
/// listed — those whose quarantine still waited for importers (which keep what they opened;
/// an owner that exits is gone for new opens anyway). Not run when the process is killed: then
/// the next process's sweep removes them.
fn unlink_shared_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments whose body cannot
        // panic (a `try_lock` and unlink system calls whose errors are ignored), so it never
        // unwinds across the C boundary, and it does not call `exit`. A failed registration
        // only leaves the names to the sweep.
        let _ = unsafe { crate::os::at_exit(unlink_shared) };
    });
}

extern "C" fn unlink_shared() {
    // `try_lock`: an exit from inside an allocation must not deadlock (the names then stay).
    if let Some(shared) = SHARED.try_lock() {
        for (_, owner) in shared.iter().filter(|(_, o)| o.ledger.is_home()) {
            owner.ledger.unlink_names();
        }
    }
}

/// The shared pools' quarantine, collected with the deferred frees
/// ([`collect_deferred`](crate::collect_deferred), and at every allocation and export when
/// [`SHARED_PENDING`] says something may wait); registered at the first shared pool.
static SHARED_QUARANTINE: Pending = Pending {
    pending: || SHARED_PENDING.load(StdOrdering::Relaxed),
    collect: || {
        let (held, bytes) = collect_shared();
        DeferredFrees {
            pending: held,
            pending_bytes: bytes,
            ..DeferredFrees::default()
        }
    },
};

/// Allocate `bytes` for an [`IpcBuffer`](crate::IpcBuffer) of [`HandleType::Pool`] from a pool
/// of `ctx` this process shares between such buffers (created when none has a free block),
/// and wait until the allocation is complete: like `cuMemAlloc` memory, it is ready for any
/// stream when this returns.
pub(crate) fn alloc_shared(ctx: &GpuContext, bytes: usize) -> Result<PoolAlloc> {
    let got = alloc_shared_in(ctx, bytes);
    if got.is_err() {
        // A pool made or taken for it may be left without a buffer: a later scan looks.
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
    }
    got
}

fn alloc_shared_in(ctx: &GpuContext, bytes: usize) -> Result<PoolAlloc> {
    let key = ctx.as_raw() as usize;
    loop {
        let pools: Vec<Arc<Owner>> = SHARED
            .lock()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, o)| o.clone())
            .collect();
        for owner in &pools {
            match alloc_ready(owner, bytes) {
                // A full pool: its last buffer may go while this call holds it, leaving it to
                // a later scan.
                Err(Error::TooManyBuffers { .. }) => {
                    SHARED_PENDING.store(true, StdOrdering::Relaxed);
                }
                other => return other,
            }
        }
        // Every pool of this context is full (or there is none): one more.
        let pool = IpcPool::new(ctx)?;
        SHARED.lock().push((key, pool.owner.clone()));
        unlink_shared_at_exit();
        register_pending(&SHARED_QUARANTINE);
        match alloc_ready(&pool.owner, bytes) {
            // Filled by other threads in between: look again.
            Err(Error::TooManyBuffers { .. }) => continue,
            other => return other,
        }
    }
}
