//! The exporting side of a buffer: what an [`IpcBuffer`] is ([`Export`]: a `cuMemAlloc`
//! allocation, a POSIX-fd allocation, or a pool's) and the work only an exporter does —
//! allocate, seal a handle, wait for importers, free or defer the free.

use std::time::Duration;

use bytemuck::Pod;

use crate::context::GpuContext;
use crate::driver;
use crate::error::{Capability, Error, ObjectState, Result, TypeConflict};
use crate::handle::{Envelope, Handle, HandleKind, HandleType, type_tag_of};
use crate::ledger::{self, Record};
use crate::memory::allocation_bytes;
use crate::poll::Backoff;
use crate::pool::PoolAlloc;
use crate::raw::RawMemHandle;
use crate::slice::GpuSlice;
use crate::vmm::VmmMemory;

/// Device memory this process allocated, holding `len` values of `T`, that other processes can
/// map through a typed [`IpcMemHandle<T>`](crate::IpcMemHandle): they open it as an [`ImportedBuffer<T>`](crate::ImportedBuffer).
///
/// - [`new`](Self::new) allocates with `cuMemAlloc` (never stream-ordered pool memory, which
///   legacy IPC rejects) in a [`GpuContext`]; [`handle`](Self::handle) exports it.
/// - [`ImportedBuffer::open`](crate::ImportedBuffer::open) maps it in another process, after validating the handle and
///   taking a lease (see there).
/// - Dropping an exported buffer never waits: new opens of its handle are refused from then
///   on, and the memory is freed as soon as no importer maps it — at once, or later (see
///   [below](#dropping-an-exported-buffer)). [`close`](Self::close) waits for importers, up
///   to a timeout, and reports what is left.
///
/// Use it from any CUDA crate: [`as_raw_ptr`](GpuSlice::as_raw_ptr) for kernel arguments (or
/// `device_ptr` with the `cust` feature, `.arg(&buf)` in cudarc's launch builder with the
/// `cudarc` feature), host copies (synchronous, or asynchronous on any [`AsStream`](crate::AsStream)), memset.
///
/// `IpcBuffer<T>` is `Send` and `Sync` (so is `ImportedBuffer<T>`). Device memory is not Rust memory: methods take `&self`,
/// and concurrent writes from several processes are a GPU data race for the caller to order
/// (with [`IpcEvent`](crate::IpcEvent)s and barriers), not undefined behaviour in this process.
///
/// # Asynchronous work
///
/// The synchronous methods ([`copy_from_host`](GpuSlice::copy_from_host),
/// [`copy_to_host`](GpuSlice::copy_to_host), [`memset_bytes`](GpuSlice::memset_bytes)) are done with
/// the memory when they return. The `*_async` methods, like kernels launched on
/// [`as_raw_ptr`](GpuSlice::as_raw_ptr), only *enqueue* work that touches the memory later; the
/// buffer does not track that work, and dropping the last view of an import unmaps the memory
/// (`cuIpcCloseMemHandle`) and dropping an export frees it (`cuMemFree`) without waiting for
/// it. That is why they are `unsafe`: the caller keeps the buffer alive until the work has
/// completed (synchronise the stream, or an event recorded after the work, before dropping).
/// The same holds for [`IpcSignal::signal`](crate::GpuSignal::signal) and
/// [`IpcSignal::wait`](crate::GpuSignal::wait).
///
/// Safe code cannot enqueue work on a buffer and then drop it (this does not compile):
///
/// ```compile_fail,E0133
/// use cuda_ipc::{AsStream, IpcBuffer};
///
/// fn copy_then_drop(dst: IpcBuffer<u32>, src: &IpcBuffer<u32>, stream: &(impl AsStream + ?Sized)) {
///     dst.copy_from_device_async(src, stream).ok(); // error: call to unsafe function
///     drop(dst); // would unmap or free `dst` while the copy may still be queued
/// }
/// ```
///
/// # Dropping an exported buffer
///
/// Drop marks the export *closing* (every later open of its handle is refused with
/// [`Error::StaleHandle`]) and frees the memory if no live importer maps it. If one does, the
/// free is deferred: the memory stays allocated, on a per-process list, until a scan finds that
/// its last importer has unmapped it or died; scans run when this process allocates or exports
/// again and when [`collect_deferred`](crate::collect_deferred) is called. Nothing is freed
/// under an importer, and nothing is kept after its importers are gone (beyond the next scan).
/// POSIX-fd buffers need none of this: the driver keeps their memory while any process maps it.
/// A [`HandleType::Pool`] buffer's allocation waits in its pool's quarantine instead, freed at
/// the pool's next allocation or by the same scans (the pool itself goes when it has no buffer
/// and nothing in quarantine).
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// // Exporter:
/// let ctx = GpuContext::new(0)?;
/// let buf = IpcBuffer::<f32>::zeroed(&ctx, 1 << 20)?;
/// let handle: IpcMemHandle<f32> = buf.handle()?; // put it in a ShmCell for the peer
///
/// // Importer, in another process:
/// let peer = ImportedBuffer::open(&ctx, &handle)?;
/// let mut host = vec![0f32; peer.len()];
/// peer.copy_to_host(&mut host)?;
/// # Ok(()) }
/// ```
pub struct IpcBuffer<T: Pod> {
    pub(super) slice: GpuSlice<T>,
    pub(super) export: Export,
    /// Set by [`read_only_for_importers`](IpcBuffer::read_only_for_importers): every handle
    /// says so, and importers must open it read-only.
    pub(super) read_only: bool,
}

crate::slice::deref_to!(IpcBuffer<T> => slice: GpuSlice<T>);

impl<T: Pod> std::fmt::Debug for IpcBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("device", &self.slice.ctx.ordinal())
            .field("handle_type", &self.handle_type())
            .finish_non_exhaustive()
    }
}

/// The error of a request for one handle (or one descriptor, or a raw handle) of a
/// [`HandleType::Pool`] buffer.
pub(crate) fn pooled() -> Error {
    Error::HandleTypeMismatch {
        handle: HandleType::Pool,
        conflict: TypeConflict::Pooled,
    }
}

/// What an exported buffer's memory is, with the bookkeeping of its exports.
pub(crate) enum Export {
    /// `cuMemAlloc`, exported as legacy handles (`cuIpcGetMemHandle`).
    Legacy {
        published: Published,
        /// Freed, or its free deferred: nothing is left to do.
        released: bool,
    },
    /// `cuMemCreate` + a mapping, exported as POSIX file descriptors; the memory is `None`
    /// once released (the driver frees it when the last importer unmaps).
    Vmm {
        published: Published,
        memory: Option<VmmMemory>,
    },
    /// An allocation of a pool this process shares between such buffers (the pool's table
    /// holds its importers and generation).
    Pooled(PoolAlloc),
}

/// The export's block in this process's registry and the device it names.
pub(crate) struct Published {
    uuid: [u8; 16],
    /// Published at the first export (a buffer never exported has none); moved to the
    /// deferred-free list when the buffer is dropped while mapped elsewhere.
    record: parking_lot::Mutex<Option<Record>>,
}

impl Published {
    fn new(ctx: &GpuContext) -> Self {
        Self {
            uuid: ctx.uuid(),
            record: parking_lot::Mutex::new(None),
        }
    }

    /// The device's UUID, as handles name it.
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// The token and generation of the export's block, published now if this is the first
    /// export.
    fn token(&self) -> Result<([u8; 16], u64)> {
        let mut record = self.record.lock();
        let record = match &mut *record {
            Some(r) => r,
            None => record.insert(Record::publish()?),
        };
        Ok((record.token(), record.generation()))
    }

    /// The processes mapping the export now.
    pub(crate) fn importers(&self) -> Vec<u32> {
        self.record
            .lock()
            .as_ref()
            .map_or_else(Vec::new, Record::importers)
    }

    /// A process that holds the export but died without letting go; nothing is reaped.
    fn dead_importer(&self) -> Option<u32> {
        self.record.lock().as_ref()?.dead_importer()
    }
}

impl<T: Pod> IpcBuffer<T> {
    /// The work of [`IpcBuffer::new_with`].
    pub(crate) fn allocate(ctx: &GpuContext, len: usize, handle_type: HandleType) -> Result<Self> {
        let bytes = allocation_bytes::<T>("IpcBuffer::new", len)?;
        crate::ledger::collect_if_pending();
        let posix_fd = match handle_type {
            HandleType::Pool => {
                let alloc = crate::pool::alloc_shared(ctx, bytes)?;
                return Ok(Self::from_parts(
                    GpuSlice::new(ctx.clone(), alloc.ptr(), len),
                    Export::Pooled(alloc),
                ));
            }
            HandleType::Legacy => false,
            HandleType::Auto => crate::vmm::supports_posix_fd(ctx.device())?,
            HandleType::PosixFd => {
                if !crate::vmm::supports_posix_fd(ctx.device())? {
                    return Err(Error::Unsupported {
                        device: ctx.ordinal(),
                        what: "export virtual memory as POSIX file descriptors",
                        missing: Capability::VmmPosixFd,
                    });
                }
                true
            }
        };
        let published = Published::new(ctx);
        let (ptr, export) = if posix_fd {
            let memory = VmmMemory::create(ctx, bytes)?;
            let ptr = memory.ptr();
            let memory = Some(memory);
            (ptr, Export::Vmm { published, memory })
        } else {
            let _g = ctx.enter()?;
            let ptr = driver::mem::alloc(bytes)?;
            let released = false;
            (
                ptr,
                Export::Legacy {
                    published,
                    released,
                },
            )
        };
        Ok(Self::from_parts(
            GpuSlice::new(ctx.clone(), ptr, len),
            export,
        ))
    }

    /// The work of [`IpcBuffer::zeroed_with`].
    pub(crate) fn allocate_zeroed(
        ctx: &GpuContext,
        len: usize,
        handle_type: HandleType,
    ) -> Result<Self> {
        let buf = Self::allocate(ctx, len, handle_type)?;
        buf.fill_fresh(0)?;
        Ok(buf)
    }

    fn from_parts(slice: GpuSlice<T>, export: Export) -> Self {
        Self {
            slice,
            export,
            read_only: false,
        }
    }

    /// Set every byte of a buffer nothing else uses yet, on a private non-blocking stream, and
    /// wait until it is done.
    fn fill_fresh(&self, value: u8) -> Result<()> {
        let bytes = match &self.export {
            Export::Vmm {
                memory: Some(m), ..
            } => m.size(),
            _ => self.byte_len(),
        };
        let _g = self.slice.ctx.enter()?;
        let stream = driver::stream::create_non_blocking()?;
        // SAFETY: the device range is this buffer's `bytes` bytes (its mapping, for a POSIX-fd
        // buffer), which nothing else uses yet; the stream is live, and synchronised before
        // the call returns.
        let mut rc = unsafe { driver::mem::set_bytes_async(self.slice.ptr, value, bytes, stream) };
        if rc.is_ok() {
            // SAFETY: a live stream of this context.
            rc = unsafe { driver::stream::synchronize(stream) };
        }
        // SAFETY: created above and destroyed once; its work is done (or never started).
        let _ = unsafe { driver::stream::destroy(stream) };
        rc
    }

    /// The handle of kind `K` (whose elements are `T`s: a buffer's, a signal's counter, a
    /// channel's slots) that exports this buffer.
    pub(crate) fn export_handle<K: HandleKind>(&self) -> Result<Handle<K>> {
        let published = match &self.export {
            Export::Pooled(_) => return Err(pooled()),
            Export::Vmm { published, .. } | Export::Legacy { published, .. } => published,
        };
        // The ledger first (deferred frees collected, the block published before any handle
        // exists: every importer finds it), then the driver.
        crate::ledger::collect_if_pending();
        let (token, generation) = published.token()?;
        let (cuda, handle_type) = match &self.export {
            Export::Vmm { memory, .. } => {
                let mut cuda = [0u8; 64];
                let size = memory.as_ref().map_or(0, VmmMemory::size);
                cuda[..8].copy_from_slice(&(size as u64).to_le_bytes());
                (cuda, HandleType::PosixFd)
            }
            _ => (self.legacy_ipc_handle()?.0, HandleType::Legacy),
        };
        let env = Envelope {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            len: self.slice.len as u64,
            device_uuid: published.uuid,
            token,
            handle_type: handle_type.code(),
            ..Envelope::exported(K::CODE, generation, self.slice.ctx.ordinal(), cuda)
        };
        Ok(Handle::from_envelope(env.seal()))
    }

    /// The driver's legacy handle of this exported `cuMemAlloc` buffer (`cuIpcGetMemHandle`),
    /// remembered as this process's own (so that opening it here is refused before CUDA).
    pub(crate) fn legacy_ipc_handle(&self) -> Result<RawMemHandle> {
        let raw = {
            let _g = self.slice.ctx.enter()?;
            // SAFETY: a pointer this buffer allocated with cuMemAlloc in this context, live
            // while `self` is (the callers match `Export::Legacy` first).
            unsafe { crate::memory::legacy_handle(self.slice.ptr) }?
        };
        Ok(RawMemHandle(raw))
    }

    /// A process other than this one that holds this export (has it mapped) but has died
    /// without letting go; nothing is reaped.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        match &self.export {
            Export::Legacy { published, .. } | Export::Vmm { published, .. } => {
                published.dead_importer()
            }
            Export::Pooled(_) => None,
        }
    }

    /// Wait for importers up to `timeout` and free, keeping the buffer (retired, or released)
    /// for a caller that hands it back on an error.
    pub(crate) fn close_in_place(&mut self, timeout: Duration) -> Result<()> {
        self.wait_for_importers(timeout)
            .and_then(|()| self.release())
    }

    /// Refuse `call` once the memory was released (by a `close` that handed the buffer back
    /// because the driver refused the free, the only way a released buffer stays reachable):
    /// its record is gone, so a new export would publish a fresh one for memory this buffer no
    /// longer owns, and a pool allocation's event is destroyed.
    pub(crate) fn check_unreleased(&self, call: &'static str) -> Result<()> {
        let released = match &self.export {
            Export::Legacy { released, .. } => *released,
            Export::Vmm { memory, .. } => memory.is_none(),
            Export::Pooled(alloc) => alloc.is_freed(),
        };
        if released {
            return Err(Error::InvalidState {
                call,
                state: ObjectState::Closing,
            });
        }
        Ok(())
    }

    /// For a `cuMemAlloc` export: retire it (new opens are stale) and wait up to `timeout`
    /// until no importer maps it (then it may be freed), reaping importers proven dead. A pool
    /// buffer waits until no importer holds it; a POSIX-fd buffer has nothing to wait for (the
    /// driver keeps its memory while anyone maps it).
    pub(crate) fn wait_for_importers(&self, timeout: Duration) -> Result<()> {
        let record = match &self.export {
            Export::Pooled(alloc) => return alloc.wait_unheld(timeout),
            Export::Vmm { .. } | Export::Legacy { released: true, .. } => return Ok(()),
            Export::Legacy { published, .. } => &published.record,
        };
        let mut record = record.lock();
        let Some(record) = record.as_mut() else {
            return Ok(()); // never exported with a handle: nobody can map it
        };
        if !record.retire() {
            return Ok(());
        }
        let unheld = || {
            ledger::collect_exports();
            !record.is_held()
        };
        Backoff::for_importers(timeout).until_unheld(unheld, || record.importers())
    }

    /// Give the memory back without waiting: freed now, or deferred while importers map it.
    pub(crate) fn release(&mut self) -> Result<()> {
        let bytes = self.byte_len();
        match &mut self.export {
            Export::Pooled(alloc) => alloc.free(None),
            Export::Vmm { published, memory } => {
                // Dropping the record retires the export: new opens fail from here on
                // (StaleHandle); existing importers keep their mappings, which hold the
                // memory: the driver frees it when the last one unmaps.
                drop(published.record.lock().take());
                drop(memory.take());
                Ok(())
            }
            Export::Legacy { released: true, .. } => Ok(()),
            Export::Legacy {
                published,
                released,
            } => {
                *released = true;
                let record = published.record.lock().take();
                ledger::free_or_defer(&self.slice.ctx, self.slice.ptr, bytes, record)
            }
        }
    }
}

impl<T: Pod> Drop for IpcBuffer<T> {
    fn drop(&mut self) {
        if !self.slice.ctx.is_home() {
            // Inherited by a forked child: the parent's (see `process::Home`). Its parts
            // (records, leases, pools) refuse to act here too.
            return;
        }
        // Never waits: freed now, or deferred while importers map it. A failed cuMemFree
        // cannot be reported from drop; `IpcBuffer::close` reports it.
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{Error, ObjectState};
    use crate::{GpuContext, HandleType, IpcBuffer};

    fn closing(r: crate::Result<impl Sized>) -> Option<&'static str> {
        match r {
            Err(Error::InvalidState {
                call,
                state: ObjectState::Closing,
            }) => Some(call),
            _ => None,
        }
    }

    /// What a `close` hands back when the driver refused its free: a buffer whose `release`
    /// ran. The refusal cannot be caused on purpose, so `release` runs here as the close runs
    /// it (and succeeds): every export of the released buffer is refused, naming its call.
    #[test]
    #[ignore = "requires a CUDA device"]
    fn a_released_buffer_exports_nothing_more() {
        let ctx = GpuContext::new(0).expect("a CUDA device (this test runs on a GPU machine)");
        for kind in [HandleType::Legacy, HandleType::PosixFd, HandleType::Pool] {
            let mut buf = IpcBuffer::<u32>::new_with(&ctx, 4096, kind).unwrap();
            // Exported once before, as a buffer handed back by a close would have been.
            match kind {
                HandleType::Legacy => drop(buf.handle().unwrap()),
                HandleType::PosixFd => drop(buf.export_fd().unwrap()),
                _ => drop(buf.export_pooled().unwrap()),
            }
            buf.release().unwrap();
            assert_eq!(closing(buf.handle()), Some("IpcBuffer::handle"), "{kind:?}");
            assert_eq!(
                closing(buf.export_fd()),
                Some("IpcBuffer::export_fd"),
                "{kind:?}"
            );
            assert_eq!(
                closing(buf.export_pooled()),
                Some("IpcBuffer::export_pooled"),
                "{kind:?}"
            );
            assert_eq!(
                closing(buf.raw_export()),
                Some("IpcBuffer::raw_export"),
                "{kind:?}"
            );
            // Its drop finds nothing left to free.
            drop(buf);
        }
    }
}
