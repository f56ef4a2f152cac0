//! [`ReadOnlyPool`]: a pool imported for reading, by type only (the guide is the
//! [arena module's](crate::arena#sharing-read-only)).

use std::os::fd::OwnedFd;

use bytemuck::Pod;

use super::{ImportedPool, IpcPoolHandle, PoolHandle, PoolView};
use crate::context::GpuContext;
use crate::error::Result;
use crate::process::ProcessIdentity;

/// An [`IpcPool`](crate::pool::IpcPool) imported for reading: an [`ImportedPool`] whose buffers
/// open as [`ReadOnlyPoolView`]s, which have no method that writes. **The GPU does not enforce
/// it**: `cuMemPoolSetAccess` refuses `CU_MEM_ACCESS_FLAGS_PROT_READ` (see
/// [`ReadOnlySlice`](crate::ReadOnlySlice#what-the-gpu-enforces)), so the pool's memory is mapped
/// read-write underneath and a kernel handed its address can still write it. Use an arena where the
/// GPU must refuse writes.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let name = SocketName::Abstract("kv-pool".into());
/// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
/// let pool = socket.recv_pool_read_only(&ctx, Duration::from_secs(5))?;
/// assert!(!pool.is_enforced_by_gpu());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadOnlyPool {
    pool: ImportedPool,
}

impl ReadOnlyPool {
    /// Import a pool for reading: as [`ImportedPool::open_fd`] (read-write underneath: the
    /// type alone is read-only). An import of the same pool in this process is shared, as
    /// there.
    ///
    /// # Errors
    ///
    /// As [`ImportedPool::open_fd`].
    pub fn open_fd(ctx: &GpuContext, handle: &IpcPoolHandle, fd: OwnedFd) -> Result<Self> {
        ImportedPool::open_fd_any(ctx, handle, fd).map(|pool| Self { pool })
    }

    /// Open one buffer of the pool for reading: as [`ImportedPool::open`].
    ///
    /// # Errors
    ///
    /// As [`ImportedPool::open`].
    pub fn open<T: Pod>(&self, handle: &PoolHandle<T>) -> Result<ReadOnlyPoolView<T>> {
        self.pool.open(handle).map(|view| ReadOnlyPoolView { view })
    }

    /// Always false: the driver cannot map pool memory read-only (see the type's docs).
    #[must_use]
    pub fn is_enforced_by_gpu(&self) -> bool {
        false
    }

    /// The owner's process.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.pool.exporter()
    }

    /// The context the pool was imported in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        self.pool.context()
    }
}

impl std::fmt::Debug for ReadOnlyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyPool")
            .field("pool", &self.pool)
            .finish()
    }
}

/// A buffer of a [`ReadOnlyPool`]: a [`PoolView`] that dereferences to a
/// [`ReadOnlySlice`](crate::ReadOnlySlice) (the type alone is read-only; see [`ReadOnlyPool`]).
pub struct ReadOnlyPoolView<T: Pod> {
    view: PoolView<T>,
}

crate::slice::deref_to!(ReadOnlyPoolView<T> => read_only view);

impl<T: Pod> ReadOnlyPoolView<T> {
    /// Whether the owner still has the buffer (as [`PoolView::is_live`]).
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.view.is_live()
    }
}

impl<T: Pod> std::fmt::Debug for ReadOnlyPoolView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyPoolView")
            .field("view", &self.view)
            .finish()
    }
}
