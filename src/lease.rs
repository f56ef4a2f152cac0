//! Leases: how an exporter learns which processes still map its buffer.
//!
//! Each exported buffer has a lease table in a [`ShmRegion`] named after the export's random
//! token (`cuda-ipc-lease.<token>`). An importer claims a slot (pid + start time) before it maps
//! the memory and frees it after unmapping; the exporter, before `cuMemFree`, marks the table
//! *closing* and waits until no live process holds a slot (dead holders are reaped). Marking and
//! claiming are sequentially consistent and each side re-checks the other's flag afterwards, so
//! either the exporter sees the new lease and waits, or the importer sees *closing* and backs
//! off with [`Error::StaleHandle`]. Once the buffer is freed the table is unlinked, so a handle
//! of a freed buffer finds no table: stale, even if a new buffer now sits at the same address.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::process::ProcessIdentity;
use crate::shared::ShmSafe;
use crate::shm::{ShmOptions, ShmRegion};

/// The most importing processes one export tracks.
pub const MAX_IMPORTERS: usize = 64;

const FREE: u32 = 0;
const CLAIMING: u32 = 1;
const HELD: u32 = 2;

#[repr(C)]
struct LeaseSlot {
    state: AtomicU32,
    pid: AtomicU32,
    start: AtomicU64,
}

#[repr(C)]
pub(crate) struct LeaseTable {
    token: [AtomicU64; 2],
    closing: AtomicU32,
    exporter_pid: AtomicU32,
    exporter_start: AtomicU64,
    slots: [LeaseSlot; MAX_IMPORTERS],
}

// SAFETY: repr(C), all fields integer atomics (valid for any bits, accessed atomically).
unsafe impl ShmSafe for LeaseTable {
    fn type_tag() -> u64 {
        u64::from_le_bytes(*b"leases01")
    }
}

fn region_name(token: &[u8; 16]) -> String {
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{hex}")
}

fn token_words(token: &[u8; 16]) -> [u64; 2] {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&token[..8]);
    hi.copy_from_slice(&token[8..]);
    [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
}

/// The exporter's side: owns (and unlinks) the lease table.
pub(crate) struct ExportLeases {
    region: ShmRegion<LeaseTable>,
}

/// Remove lease tables left in `/dev/shm` by exporters that died (a `SIGKILL`ed exporter
/// cannot unlink its own, and unless an importer of it outlives it, nobody else would). Only
/// tables of our uid with mode `0600` whose creator is dead are touched. Runs once per process.
fn reap_stale_tables() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(dir) = std::fs::read_dir(crate::os::SHM_DIR) else {
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            if let Some(name) = name.to_str()
                && name.starts_with(PREFIX)
            {
                let _ = crate::shm::reclaim_stale(name);
            }
        }
    });
}

const PREFIX: &str = "cuda-ipc-lease.";

impl ExportLeases {
    pub(crate) fn create(token: &[u8; 16]) -> Result<Self> {
        reap_stale_tables();
        let me = ProcessIdentity::current();
        let words = token_words(token);
        let region = ShmOptions::new(region_name(token)).create_with(|t: &LeaseTable| {
            t.token[0].store(words[0], Ordering::Relaxed);
            t.token[1].store(words[1], Ordering::Relaxed);
            t.exporter_pid.store(me.pid(), Ordering::Relaxed);
            t.exporter_start.store(me.start_time(), Ordering::Relaxed);
            Ok(())
        })?;
        Ok(Self { region })
    }

    /// Mark the table closing; from now on no new lease is granted.
    pub(crate) fn begin_close(&self) {
        self.region.closing.store(1, Ordering::SeqCst);
    }

    /// The live holders, reaping slots of dead ones.
    pub(crate) fn holders(&self) -> Vec<u32> {
        let mut live = Vec::new();
        for slot in &self.region.slots {
            match slot.state.load(Ordering::SeqCst) {
                FREE => {}
                state => {
                    let pid = slot.pid.load(Ordering::Relaxed);
                    let start = slot.start.load(Ordering::Relaxed);
                    // A CLAIMING slot whose pid is not written yet belongs to a live claimer.
                    if state == CLAIMING && pid == 0 {
                        live.push(0);
                    } else if ProcessIdentity::from_parts(pid, start).is_alive() {
                        live.push(pid);
                    } else {
                        let _ = slot.state.compare_exchange(
                            state,
                            FREE,
                            Ordering::SeqCst,
                            Ordering::Relaxed,
                        );
                    }
                }
            }
        }
        live
    }

    /// Close and wait up to `timeout` for every live lease to go; return the holders left.
    pub(crate) fn close_and_wait(&self, timeout: Duration) -> (Vec<u32>, Duration) {
        self.begin_close();
        let start = Instant::now();
        let mut pause = Duration::from_micros(100);
        loop {
            let holders = self.holders();
            let waited = start.elapsed();
            if holders.is_empty() || waited >= timeout {
                return (holders, waited);
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// An importer's lease; frees its slot on drop.
pub(crate) struct Lease {
    region: ShmRegion<LeaseTable>,
    slot: usize,
}

impl Lease {
    /// Claim a lease on the export named by `token`.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the table is gone, names another export, or is closing;
    /// [`Error::TooManyImporters`]; region open errors otherwise.
    pub(crate) fn acquire(token: &[u8; 16], generation: u64) -> Result<Self> {
        let stale = || Error::StaleHandle { generation };
        let region = match ShmOptions::new(region_name(token))
            .open_timeout(Duration::from_millis(200))
            .open::<LeaseTable>()
        {
            Ok(r) => r,
            Err(Error::NotFound { .. }) | Err(Error::NotReady { .. }) => return Err(stale()),
            Err(e) => return Err(e),
        };
        let words = token_words(token);
        if region.token[0].load(Ordering::Relaxed) != words[0]
            || region.token[1].load(Ordering::Relaxed) != words[1]
        {
            return Err(stale());
        }
        if region.closing.load(Ordering::SeqCst) != 0 {
            return Err(stale());
        }
        let me = ProcessIdentity::current();
        for (i, slot) in region.slots.iter().enumerate() {
            if slot
                .state
                .compare_exchange(FREE, CLAIMING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                slot.start.store(me.start_time(), Ordering::Relaxed);
                slot.pid.store(me.pid(), Ordering::Relaxed);
                slot.state.store(HELD, Ordering::SeqCst);
                let lease = Self { region, slot: i };
                // Dekker with `begin_close`: the exporter either sees our slot or we see this.
                if lease.region.closing.load(Ordering::SeqCst) != 0 {
                    return Err(stale()); // drop frees the slot
                }
                return Ok(lease);
            }
        }
        Err(Error::TooManyImporters { max: MAX_IMPORTERS })
    }

    fn exporter(&self) -> ProcessIdentity {
        ProcessIdentity::from_parts(
            self.region.exporter_pid.load(Ordering::Relaxed),
            self.region.exporter_start.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.region.slots[self.slot]
            .state
            .store(FREE, Ordering::SeqCst);
        // The exporter died without unlinking its table: the last importer cleans it up.
        if !self.exporter().is_alive()
            && self
                .region
                .slots
                .iter()
                .all(|s| s.state.load(Ordering::SeqCst) == FREE)
        {
            self.region.acquire_ownership();
        }
    }
}
