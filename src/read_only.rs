//! Read-only sharing: imports through which this process can only read — one copy of model
//! weights, KV-cache blocks or a dataset that many reader processes map, where a stray write
//! in one reader must not corrupt everyone's data.
//!
//! [`ReadOnlyBuffer`] is here; the arena's and the pool's are beside them. What is guaranteed where
//! is documented once, on [`ReadOnlySlice`](crate::ReadOnlySlice) (public docs: this module is
//! private), under "What the GPU enforces".

use std::os::fd::OwnedFd;

use bytemuck::Pod;

use crate::buffer::ImportedBuffer;
use crate::buffer::IpcMemHandle;
use crate::context::GpuContext;
use crate::error::Result;
use crate::process::ProcessIdentity;

/// A buffer another process exported, mapped so that this process can only read it (see
/// [`ReadOnlySlice`](crate::ReadOnlySlice#what-the-gpu-enforces)): a
/// [`HandleType::PosixFd`](crate::HandleType::PosixFd) buffer mapped `PROT_READ` (the GPU refuses
/// writes), or a [`HandleType::Pool`](crate::HandleType::Pool) buffer received with
/// [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) (the type alone:
/// pools cannot be mapped read-only). It dereferences to its
/// [`ReadOnlySlice`](crate::ReadOnlySlice); otherwise it is an [`ImportedBuffer`] (a lease on the
/// export, the mapping kept alive after the exporter drops its buffer).
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
/// let name = SocketName::Abstract("weights".into());
/// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
/// let weights = socket.recv_buffer_read_only::<f32>(&ctx, Duration::from_secs(5))?;
/// assert!(weights.is_enforced_by_gpu()); // a POSIX-fd buffer
/// let mut host = vec![0f32; weights.len()];
/// weights.copy_to_host(&mut host)?;
/// # Ok(()) }
/// ```
pub struct ReadOnlyBuffer<T: Pod> {
    inner: ImportedBuffer<T>,
    enforced: bool,
}

crate::slice::deref_to!(ReadOnlyBuffer<T> => read_only inner);

impl<T: Pod> ReadOnlyBuffer<T> {
    /// Map a [`HandleType::PosixFd`](crate::HandleType::PosixFd) buffer read-only from its
    /// handle and descriptor: as [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd),
    /// with `cuMemSetAccess` granting `CU_MEM_ACCESS_FLAGS_PROT_READ`. `fd` is consumed.
    ///
    /// # Errors
    ///
    /// As [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd); a legacy handle is
    /// [`Error::HandleTypeMismatch`](crate::Error::HandleTypeMismatch) (`NoReadOnlyMapping`:
    /// the driver has no read-only legacy mapping).
    #[doc(alias = "CU_MEM_ACCESS_FLAGS_PROT_READ")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcMemHandle<T>, fd: OwnedFd) -> Result<Self> {
        ImportedBuffer::open_fd_read_only(ctx, handle, fd).map(|inner| Self {
            inner,
            enforced: true,
        })
    }

    /// A pool buffer, read-only by type only (pools cannot be mapped read-only).
    pub(crate) fn pooled(inner: ImportedBuffer<T>) -> Self {
        Self {
            inner,
            enforced: false,
        }
    }

    /// Whether the GPU refuses writes through this mapping (true for POSIX-fd buffers), or only the
    /// type does (pool buffers: see the
    /// [`ReadOnlySlice`](crate::ReadOnlySlice#what-the-gpu-enforces)).
    #[must_use]
    pub fn is_enforced_by_gpu(&self) -> bool {
        self.enforced
    }

    /// The exporting process.
    #[must_use]
    pub fn exporter(&self) -> Option<ProcessIdentity> {
        self.inner.exporter()
    }

    /// Give `ctx`'s device read access to the mapping (as
    /// [`ImportedBuffer::grant_access`](crate::ImportedBuffer::grant_access), read-only).
    ///
    /// # Errors
    ///
    /// As [`ImportedBuffer::grant_access`](crate::ImportedBuffer::grant_access).
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.inner.grant_access(ctx)
    }
}

impl<T: Pod> std::fmt::Debug for ReadOnlyBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyBuffer")
            .field("slice", &**self)
            .field("enforced_by_gpu", &self.enforced)
            .finish_non_exhaustive()
    }
}
