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

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

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

impl LeaseTable {
    /// The pid of a process other than this one that holds a lease but is dead (it died with
    /// the export mapped), if any. Read-only: slots are reaped only by the exporter's close.
    pub(crate) fn dead_holder(&self) -> Option<u32> {
        let me = std::process::id();
        self.slots.iter().find_map(|slot| {
            if slot.state.load(Ordering::SeqCst) != HELD {
                return None;
            }
            let pid = slot.pid.load(Ordering::Relaxed);
            let start = slot.start.load(Ordering::Relaxed);
            let id = ProcessIdentity::from_parts(pid, start);
            (pid != 0 && pid != me && !crate::process::is_alive_cached(&id)).then_some(pid)
        })
    }
}

/// The exporter's side: owns (and unlinks) the lease table.
pub(crate) struct ExportLeases {
    region: ShmRegion<LeaseTable>,
}

/// Remove lease tables left in `/dev/shm` by exporters that died (a `SIGKILL`ed exporter
/// cannot unlink its own, and unless an importer of it outlives it, nobody else would). Only
/// tables of our uid with mode `0600` whose creator is dead are touched; returns how many were
/// removed. Every process does this once, at its first export; call it to clean up sooner.
///
/// # Examples
///
/// ```
/// let removed = cuda_ipc::reclaim_stale_lease_tables();
/// println!("removed {removed} stale lease tables");
/// ```
pub fn reclaim_stale_lease_tables() -> usize {
    let Ok(dir) = std::fs::read_dir(crate::os::SHM_DIR) else {
        return 0;
    };
    dir.flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(PREFIX))
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| crate::shm::reclaim_stale(name).unwrap_or(false))
        })
        .count()
}

fn reap_stale_tables() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        reclaim_stale_lease_tables();
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

    /// The table itself.
    pub(crate) fn table(&self) -> &LeaseTable {
        &self.region
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
    table: Arc<ShmRegion<LeaseTable>>,
    slot: usize,
}

/// Lease tables this process has mapped, by token, kept after their leases are released so that
/// opening the same export again skips the `open` + `fstat` + `mmap` of its table (about 15 µs).
/// Tokens are random and never reused, so a cached table is always the right one; once its
/// exporter closes it, the *closing* flag says so and the entry is dropped. Bounded: the oldest
/// entries go first.
static TABLES: Mutex<Vec<CachedTable>> = Mutex::new(Vec::new());
type CachedTable = ([u8; 16], Arc<ShmRegion<LeaseTable>>);
const MAX_CACHED_TABLES: usize = 64;

fn cached_table(token: &[u8; 16]) -> Option<Arc<ShmRegion<LeaseTable>>> {
    let mut tables = TABLES.lock();
    let i = tables.iter().position(|(t, _)| t == token)?;
    if tables[i].1.closing.load(Ordering::SeqCst) != 0 {
        tables.remove(i);
        return None;
    }
    Some(tables[i].1.clone())
}

fn cache_table(token: &[u8; 16], table: &Arc<ShmRegion<LeaseTable>>) {
    let mut tables = TABLES.lock();
    tables.retain(|(_, t)| t.closing.load(Ordering::Relaxed) == 0);
    if tables.len() >= MAX_CACHED_TABLES {
        tables.remove(0);
    }
    tables.push((*token, table.clone()));
}

fn forget_table(token: &[u8; 16]) {
    TABLES.lock().retain(|(t, _)| t != token);
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
        let table = match cached_table(token) {
            Some(t) => t,
            None => {
                let region = match ShmOptions::new(region_name(token))
                    .open_timeout(Duration::from_millis(200))
                    .open::<LeaseTable>()
                {
                    Ok(r) => r,
                    Err(Error::NotFound { .. }) | Err(Error::NotReady { .. }) => {
                        return Err(stale());
                    }
                    Err(e) => return Err(e),
                };
                let words = token_words(token);
                if region.token[0].load(Ordering::Relaxed) != words[0]
                    || region.token[1].load(Ordering::Relaxed) != words[1]
                {
                    return Err(stale());
                }
                let table = Arc::new(region);
                cache_table(token, &table);
                table
            }
        };
        if table.closing.load(Ordering::SeqCst) != 0 {
            forget_table(token);
            return Err(stale());
        }
        let me = ProcessIdentity::current();
        for (i, slot) in table.slots.iter().enumerate() {
            if slot
                .state
                .compare_exchange(FREE, CLAIMING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                slot.start.store(me.start_time(), Ordering::Relaxed);
                slot.pid.store(me.pid(), Ordering::Relaxed);
                slot.state.store(HELD, Ordering::SeqCst);
                let lease = Self { table, slot: i };
                // Dekker with `begin_close`: the exporter either sees our slot or we see this.
                if lease.table.closing.load(Ordering::SeqCst) != 0 {
                    forget_table(token);
                    return Err(stale()); // drop frees the slot
                }
                return Ok(lease);
            }
        }
        Err(Error::TooManyImporters { max: MAX_IMPORTERS })
    }

    /// The table this lease is held in.
    pub(crate) fn table(&self) -> &LeaseTable {
        &self.table
    }

    fn exporter(&self) -> ProcessIdentity {
        ProcessIdentity::from_parts(
            self.table.exporter_pid.load(Ordering::Relaxed),
            self.table.exporter_start.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.table.slots[self.slot]
            .state
            .store(FREE, Ordering::SeqCst);
        // The exporter died without unlinking its table: the last importer cleans it up (and
        // stops caching it).
        if !crate::process::is_alive_cached(&self.exporter())
            && self
                .table
                .slots
                .iter()
                .all(|s| s.state.load(Ordering::SeqCst) == FREE)
        {
            TABLES.lock().retain(|(_, t)| !Arc::ptr_eq(t, &self.table));
            let _ = self.table.unlink_shared();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_granted_released_and_refused_once_closing() {
        let token = [0x5a; 16];
        let _ = crate::shm::unlink(&region_name(&token));
        let export = ExportLeases::create(&token).unwrap();
        let t = Instant::now();
        for _ in 0..1000 {
            drop(Lease::acquire(&token, 1).unwrap());
        }
        eprintln!("lease acquire + release: {:?} each", t.elapsed() / 1000);
        let held = Lease::acquire(&token, 1).unwrap();
        assert_eq!(export.holders(), vec![std::process::id()]);
        export.begin_close();
        assert!(matches!(
            Lease::acquire(&token, 7),
            Err(Error::StaleHandle { generation: 7 })
        ));
        drop(held);
        let (left, _) = export.close_and_wait(Duration::from_millis(10));
        assert!(left.is_empty());
        drop(export);
        assert!(matches!(
            Lease::acquire(&token, 8),
            Err(Error::StaleHandle { generation: 8 })
        ));
    }
}
