use super::*;

/// Bytes of a lease table's shared state: the last this many bytes of its file.
pub const TABLE_BYTES: usize = std::mem::size_of::<LeaseTable>();

/// The `/dev/shm` name of the lease table of export `token`.
#[must_use]
pub fn table_name(token: &[u8; 16]) -> String {
    region_name(token)
}

/// An exporter's lease table (no memory behind it).
pub struct Export(ExportLeases);

impl Export {
    /// Create the table for `token`.
    ///
    /// # Errors
    ///
    /// As the lease table's creation.
    pub fn create(token: &[u8; 16]) -> Result<Self> {
        ExportLeases::create(token).map(Self)
    }

    /// What `importers()` reports: the live holders' pids.
    #[must_use]
    pub fn holders(&self) -> Vec<u32> {
        self.0.holders()
    }

    /// What a drop does before `cuMemFree`: close, wait, reap; the holders left.
    #[allow(
        clippy::must_use_candidate,
        reason = "it closes the table; the holders are information"
    )]
    pub fn close_and_wait(&self, timeout: Duration) -> Vec<u32> {
        self.0.close_and_wait(timeout).0
    }

    /// What a drop does, and each later sweep of a deferred free: close, one reaping
    /// scan; the holders left (empty: the memory would be freed now).
    #[allow(
        clippy::must_use_candidate,
        reason = "it closes the table; the holders are information"
    )]
    pub fn close_and_scan(&self) -> Vec<u32> {
        self.0.close_and_scan()
    }
}

/// An importer's lease.
pub struct Held(Lease);

impl Held {
    /// Claim a lease on the export `token`.
    ///
    /// # Errors
    ///
    /// As `ImportedBuffer::open`'s lease step.
    pub fn acquire(token: &[u8; 16]) -> Result<Self> {
        Lease::acquire(token, 0).map(Self)
    }

    /// [`acquire`](Self::acquire), calling `pause` at the claim's two windows (after the
    /// slot reads *claiming*, and after it reads *held* but before the closing check).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    pub fn acquire_pausing(token: &[u8; 16], pause: impl FnMut()) -> Result<Self> {
        Lease::acquire_pausing(token, 0, &mut |_| {}, pause).map(Self)
    }

    /// The slot held.
    #[must_use]
    pub fn slot(&self) -> usize {
        self.0.slot
    }
}
