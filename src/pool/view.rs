//! [`PoolView`]: a buffer of an imported pool — of another process of this crate
//! ([`ImportedPool::open`](super::ImportedPool::open)) or of another program
//! ([`ForeignPool::open`](super::ForeignPool::open)) — and the hold that frees its import.

use bytemuck::Pod;

use crate::context::GpuContext;
use crate::error::Result;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;

/// A buffer of an imported pool, opened from its [`PoolHandle`](super::PoolHandle) (or, for
/// a [`ForeignPool`](super::ForeignPool), its descriptor); it dereferences to its
/// [`GpuSlice`]. Dropping the last view of a buffer in this process frees the import
/// (`cuMemFree`, complete when it returns) and then lets the owner free the allocation. Work
/// enqueued on it must complete before it is dropped (see
/// [asynchronous work](GpuSlice#asynchronous-work)).
pub struct PoolView<T: Pod> {
    pub(super) slice: GpuSlice<T>,
    pub(super) hold: PoolHold,
}

/// One view's hold on an imported allocation, whatever its element type and its pool's kind:
/// the import of a [`PoolView`], and of an [`ImportedBuffer`](crate::ImportedBuffer) of
/// [`HandleType::Pool`](crate::HandleType::Pool). Dropping the last hold of a buffer in this
/// process frees the import.
pub(crate) struct PoolHold(pub(super) Box<dyn Hold>);

/// What a hold knows of its allocation, by pool kind: the block table of an
/// [`IpcPool`](super::IpcPool)'s, or only the named exporter of a foreign one.
pub(super) trait Hold: Send + Sync {
    /// See [`PoolView::is_live`].
    fn is_live(&self) -> bool;
    /// The process that owns the pool, if known.
    fn exporter(&self) -> Option<ProcessIdentity>;
    /// Give `ctx`'s device access to the allocation's pool.
    fn grant(&self, ctx: &GpuContext) -> Result<()>;
    /// The allocation's block in its pool's table, if it has one.
    fn block(&self) -> Option<u32>;
}

crate::slice::deref_to!(PoolView<T> => slice: GpuSlice<T>);

impl<T: Pod> PoolView<T> {
    /// Whether the owner still has the buffer (false once it was freed; the view stays valid).
    /// For a [`ForeignPool`](super::ForeignPool)'s buffer, which no table tracks: whether its
    /// exporter lives, if it was named (else true).
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.hold.0.is_live()
    }

    /// The view's memory and its hold, for an [`ImportedBuffer`](crate::ImportedBuffer).
    pub(crate) fn into_parts(self) -> (GpuSlice<T>, PoolHold) {
        (self.slice, self.hold)
    }
}

impl PoolHold {
    /// The process that owns the pool, if known.
    pub(crate) fn exporter(&self) -> Option<ProcessIdentity> {
        self.0.exporter()
    }

    /// See [`ImportedPool::grant_access`](super::ImportedPool::grant_access).
    pub(crate) fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.0.grant(ctx)
    }
}

impl<T: Pod> std::fmt::Debug for PoolView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolView")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("block", &self.hold.0.block())
            .finish_non_exhaustive()
    }
}
