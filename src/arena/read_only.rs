//! [`ReadOnlyArena`]: an arena imported so that this process can only read it (the guide is
//! the [arena module's](crate::arena#sharing-read-only)).

use std::os::fd::OwnedFd;

use bytemuck::Pod;

use super::{ArenaHandle, ArenaView, ImportedArena, IpcArenaHandle};
use crate::context::GpuContext;
use crate::error::Result;
use crate::process::ProcessIdentity;
use crate::vmm::Access;

/// An [`IpcArena`](crate::arena::IpcArena) imported so that this process can only read it: the
/// whole region mapped once with `CU_MEM_ACCESS_FLAGS_PROT_READ` (the GPU refuses writes), each of
/// its buffers opened with [`open`](Self::open) without a driver call, as a [`ReadOnlyArenaView`].
/// Otherwise an [`ImportedArena`] (an importer slot, views that keep the owner from reusing a
/// block). The way to share model weights with many readers.
///
/// `ReadOnlyArena` is `Send` and `Sync`, and cheap to clone (one shared import).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::arena::ArenaHandle;
/// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let name = SocketName::Abstract("weights".into());
/// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
/// let weights = socket.recv_arena_read_only(&ctx, Duration::from_secs(5))?; // once
/// let tensor = weights.open(&ArenaHandle::<u16>::from_bytes(&socket.recv(Duration::from_secs(5))?.payload)?)?;
/// println!("{} bf16 values at {:#x}, read-only", tensor.len(), tensor.as_raw_ptr());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadOnlyArena {
    arena: ImportedArena,
}

impl ReadOnlyArena {
    /// Map an arena read-only from its handle and the descriptor its owner sent with it: as
    /// [`ImportedArena::open_fd`], with `cuMemSetAccess` granting
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`. `fd` is consumed. Importing the same arena read-only
    /// again in the same context shares the first read-only import.
    ///
    /// # Errors
    ///
    /// As [`ImportedArena::open_fd`].
    #[doc(alias = "CU_MEM_ACCESS_FLAGS_PROT_READ")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcArenaHandle, fd: OwnedFd) -> Result<Self> {
        ImportedArena::open_fd_with(ctx, handle, fd, Access::ReadOnly).map(|arena| Self { arena })
    }

    /// Open one buffer of the arena, read-only: as [`ImportedArena::open`] (no driver call).
    ///
    /// # Errors
    ///
    /// As [`ImportedArena::open`].
    pub fn open<T: Pod>(&self, handle: &ArenaHandle<T>) -> Result<ReadOnlyArenaView<T>> {
        self.arena
            .open(handle)
            .map(|view| ReadOnlyArenaView { view })
    }

    /// Always true: arenas are mapped `PROT_READ`, and the GPU refuses writes.
    #[must_use]
    pub fn is_enforced_by_gpu(&self) -> bool {
        true
    }

    /// The arena's size in bytes, as mapped here.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.arena.capacity()
    }

    /// The owner's process.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.arena.exporter()
    }

    /// The context the arena is mapped in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        self.arena.context()
    }

    /// Give `ctx`'s device read access to the whole mapping (as
    /// [`ImportedArena::grant_access`], read-only).
    ///
    /// # Errors
    ///
    /// As [`ImportedArena::grant_access`].
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.arena.grant_access(ctx)
    }
}

impl std::fmt::Debug for ReadOnlyArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyArena")
            .field("arena", &self.arena)
            .finish()
    }
}

/// A buffer of a [`ReadOnlyArena`]: an [`ArenaView`] that dereferences to a
/// [`ReadOnlySlice`](crate::ReadOnlySlice). Work enqueued on it must complete before it is dropped
/// (see [asynchronous work](crate::GpuSlice#asynchronous-work)).
pub struct ReadOnlyArenaView<T: Pod> {
    view: ArenaView<T>,
}

crate::slice::deref_to!(ReadOnlyArenaView<T> => read_only view);

impl<T: Pod> ReadOnlyArenaView<T> {
    /// Whether the owner still has the buffer (as [`ArenaView::is_live`]).
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.view.is_live()
    }
}

impl<T: Pod> std::fmt::Debug for ReadOnlyArenaView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyArenaView")
            .field("view", &self.view)
            .finish()
    }
}
