//! Model check of the lease protocol: an exporter closing (scan, reap, "free") against two
//! importers, one of which is killed right after its claim's compare-exchange. Invariants:
//! no slot is ever held by two importers, and the memory is never freed while a live
//! importer holds a lease.
use super::*;
use loom::sync::Arc;
use loom::sync::atomic::AtomicBool;

struct Model {
    closing: AtomicU32,
    slots: [OwnedSlot; 2],
    /// The exporter freed the memory.
    freed: AtomicBool,
    /// Importers currently using the memory.
    using: AtomicU32,
    /// The importer with pid 3 was killed.
    killed: AtomicBool,
}

impl Model {
    fn slots(&self) -> Slots<'_> {
        Slots {
            closing: &self.closing,
            slots: &self.slots,
        }
    }
    fn alive(&self, id: &ProcessIdentity) -> bool {
        !(id.pid() == 3 && self.killed.load(Ordering::SeqCst))
    }
}

fn id(pid: u32) -> ProcessIdentity {
    ProcessIdentity::from_parts(pid, 1)
}

#[test]
fn close_never_frees_under_a_live_lease() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.max_branches = 100_000;
    builder.check(|| {
        let m = Arc::new(Model {
            closing: AtomicU32::new(0),
            slots: [OwnedSlot::new(), OwnedSlot::new()],
            freed: AtomicBool::new(false),
            using: AtomicU32::new(0),
            killed: AtomicBool::new(false),
        });
        // A live importer: claim, use, release.
        let live = {
            let m = m.clone();
            loom::thread::spawn(move || {
                if let Claim::Granted(i, held) = m.slots().claim(&id(2)) {
                    m.using.fetch_add(1, Ordering::SeqCst);
                    assert!(!m.freed.load(Ordering::SeqCst), "freed under a live lease");
                    m.using.fetch_sub(1, Ordering::SeqCst);
                    m.slots().release(i, held);
                }
            })
        };
        // An importer killed right after its compare-exchange.
        let victim = {
            let m = m.clone();
            loom::thread::spawn(move || {
                for slot in &m.slots {
                    if slot.claim_and_stall(&id(3)).is_some() {
                        break;
                    }
                }
                m.killed.store(true, Ordering::SeqCst);
            })
        };
        // The exporter: close, scan and reap until no holder, then free.
        m.slots().begin_close();
        loop {
            if m.slots().holders(&|i| m.alive(i), true).is_empty() {
                break;
            }
            loom::thread::yield_now();
        }
        m.freed.store(true, Ordering::SeqCst);
        assert_eq!(m.using.load(Ordering::SeqCst), 0, "freed while in use");
        live.join().unwrap();
        victim.join().unwrap();
        // Every slot ends free, or holds the victim, which may have taken it after the
        // exporter's last scan (it died before it could see *closing*; it never mapped).
        assert!(
            m.slots
                .iter()
                .all(|s| s.load().word == 0 || s.load().pid == 3)
        );
    });
}

/// An owner reaping a dead importer's slot (take it, clear its bit, give it back) against
/// an importer that finds the table full and takes the same dead slot over. Invariant:
/// once the importer holds the slot and has set its bit, nobody clears that bit under it.
/// (With the owner clearing bits *before* taking the slot, as it did before the
/// take-over existed, the model finds the bit cleared under the new holder.)
#[test]
fn a_dead_slot_taken_over_keeps_its_new_holders_bit() {
    loom::model(|| {
        let m = Arc::new((AtomicU32::new(0), [OwnedSlot::new()], AtomicU64::new(0)));
        let slots = || Slots {
            closing: &m.0,
            slots: &m.1,
        };
        // Slot 0 is held by pid 3, which died holding bit 0.
        assert!(matches!(slots().claim(&id(3)), Claim::Granted(0, _)));
        m.2.store(1, Ordering::SeqCst);
        let alive = |i: &ProcessIdentity| i.pid() != 3;
        let importer = {
            let m = m.clone();
            loom::thread::spawn(move || {
                let slots = Slots {
                    closing: &m.0,
                    slots: &m.1,
                };
                let bits = &m.2;
                let claim = slots.claim_or_take_over(
                    &id(2),
                    &alive,
                    &mut |_| {
                        bits.fetch_and(!1, Ordering::SeqCst);
                    },
                    || {},
                );
                if let Claim::Granted(i, held) = claim {
                    bits.fetch_or(1, Ordering::SeqCst); // enters a block
                    loom::thread::yield_now();
                    assert_ne!(bits.load(Ordering::SeqCst) & 1, 0, "bit cleared under us");
                    bits.fetch_and(!1, Ordering::SeqCst);
                    slots.release(i, held);
                }
            })
        };
        // The owner's reap.
        for (i, held) in slots().take_dead(&id(1), &alive) {
            m.2.fetch_and(!1, Ordering::SeqCst);
            slots().release(i, held);
        }
        importer.join().unwrap();
    });
}

/// Two claimers, one slot, a release in between: never both granted at once.
#[test]
fn one_slot_is_never_granted_twice() {
    loom::model(|| {
        let m = Arc::new((AtomicU32::new(0), [OwnedSlot::new()], AtomicU32::new(0)));
        let claimers: Vec<_> = (2..4)
            .map(|p| {
                let m = m.clone();
                loom::thread::spawn(move || {
                    let slots = Slots {
                        closing: &m.0,
                        slots: &m.1,
                    };
                    if let Claim::Granted(i, held) = slots.claim(&id(p)) {
                        assert_eq!(m.2.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        m.2.fetch_sub(1, Ordering::SeqCst);
                        slots.release(i, held);
                    }
                })
            })
            .collect();
        for c in claimers {
            c.join().unwrap();
        }
    });
}
