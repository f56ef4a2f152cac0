use super::*;
use std::time::Instant;

/// The owner judged a slot's holder dead; before it acts, an importer that found the
/// table full takes the slot over (clearing the dead holder's bits) and holds it. The
/// owner's take, against the word it judged, must fail, and its next look must see a live
/// holder: it never clears the new holder's bits.
#[test]
fn an_owner_acting_on_a_stale_judgement_never_takes_a_slot_taken_over() {
    let closing = AtomicU32::new(0);
    let slots = [OwnedSlot::new()];
    let s = Slots {
        closing: &closing,
        slots: &slots,
    };
    let dead = ProcessIdentity::from_parts(4_194_000, 1);
    let Claim::Granted(0, word) = s.claim(&dead) else {
        panic!("the first claim takes slot 0");
    };
    let alive = |i: &ProcessIdentity| i.pid() != dead.pid();
    let judged = s.dead_slots(&alive);
    assert_eq!(judged, vec![(0, word)], "the owner's judgement");
    let me = ProcessIdentity::current();
    let mut cleared = Vec::new();
    let got = s.claim_or_take_over(&me, &alive, &mut |i| cleared.push(i), || {});
    assert!(matches!(got, Claim::Granted(0, _)), "{got:?}");
    assert_eq!(cleared, vec![0], "the taker clears the dead holder's bits");
    let owner = ProcessIdentity::from_parts(me.pid(), me.start_time() + 1);
    assert!(
        slots[0].claim_from(word, &owner, || {}).is_none(),
        "the owner took a slot on a stale judgement"
    );
    assert!(
        s.take_dead(&owner, &alive).is_empty(),
        "a live holder is not dead"
    );
    // And a table with a free slot is claimed normally, without a take-over.
    let s2 = [OwnedSlot::new(), OwnedSlot::new()];
    let t = Slots {
        closing: &closing,
        slots: &s2,
    };
    assert!(matches!(t.claim(&dead), Claim::Granted(0, _)));
    let mut none = Vec::new();
    let got = t.claim_or_take_over(&me, &alive, &mut |i| none.push(i), || {});
    assert!(
        matches!(got, Claim::Granted(1, _)) && none.is_empty(),
        "{got:?}"
    );
}

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

/// Slots on the heap and a liveness oracle: the replay tests below drive each party's
/// steps by hand, in the order of an interleaving that once went wrong.
struct Table {
    closing: AtomicU32,
    slots: Vec<OwnedSlot>,
    dead: std::cell::RefCell<Vec<u32>>,
}

impl Table {
    fn new(n: usize) -> Self {
        Self {
            closing: AtomicU32::new(0),
            slots: (0..n).map(|_| OwnedSlot::new()).collect(),
            dead: Default::default(),
        }
    }
    fn slots(&self) -> Slots<'_> {
        Slots {
            closing: &self.closing,
            slots: &self.slots,
        }
    }
    fn kill(&self, id: &ProcessIdentity) {
        self.dead.borrow_mut().push(id.pid());
    }
    fn holders(&self, reap: bool) -> Vec<u32> {
        let dead = self.dead.borrow().clone();
        self.slots()
            .holders(&move |id: &ProcessIdentity| !dead.contains(&id.pid()), reap)
    }
}

fn pid(p: u32) -> ProcessIdentity {
    ProcessIdentity::from_parts(p, 1000 + u64::from(p))
}

/// A replay of a reported interleaving: P releases slot 0 and exits; C takes
/// the slot and is preempted before naming itself; the exporter's `importers()` finds the
/// slot naming dead P and reaps it; D claims slot 0; C resumes; D releases; close finds no
/// holder and frees while C maps. Once slot 0 was granted to C and D at once. Now C's
/// claim names C in the same step, so nothing about P remains to mislead the reaper.
#[test]
fn a_slot_released_by_a_dead_holder_is_never_granted_twice() {
    let t = Table::new(1);
    let (p, c, d) = (pid(10), pid(11), pid(12));
    let Claim::Granted(i, held) = t.slots().claim(&p) else {
        panic!("P's claim")
    };
    t.slots().release(i, held);
    t.kill(&p);
    let c_claiming = t.slots[0].claim_and_stall(&c).expect("C takes slot 0");
    assert_eq!(
        t.holders(false),
        vec![11],
        "the stalled claimer is named, and live"
    );
    assert_eq!(t.slots().claim(&d), Claim::Full, "D must not get C's slot");
    let c_held = t.slots[0]
        .resume_claim(c_claiming, &c)
        .expect("C completes");
    t.slots().begin_close();
    assert_eq!(t.holders(true), vec![11], "close must wait for C");
    t.slots().release(0, c_held);
    assert!(t.holders(true).is_empty());
}

/// A claimer killed between its compare-exchange and finishing: the slot names it, it
/// reads as a holder while alive, and the exporter's close reaps it once it is dead (the
/// slot once read `CLAIMING` with pid 0 and no close could ever reap it).
#[test]
fn a_claimer_killed_mid_claim_is_reaped_by_the_close() {
    let t = Table::new(2);
    let k = pid(20);
    t.slots[0].claim_and_stall(&k).unwrap();
    assert_eq!(t.holders(false), vec![20]);
    t.kill(&k);
    assert!(t.holders(false).is_empty(), "dead: not a holder");
    assert_ne!(t.slots[0].load().word, 0, "but not reaped outside a close");
    t.slots().begin_close();
    assert!(t.holders(true).is_empty());
    assert_eq!(t.slots[0].load().word, 0, "reaped by the close");
}

/// The reaper judged a holder dead; before its compare-exchange, the slot changed hands.
/// The stale judgement must free nothing.
#[test]
fn a_reap_never_frees_a_slot_that_changed_hands() {
    let t = Table::new(1);
    let (p, c) = (pid(30), pid(31));
    let Claim::Granted(_, p_word) = t.slots().claim(&p) else {
        panic!()
    };
    t.slots().release(0, p_word);
    let Claim::Granted(_, c_word) = t.slots().claim(&c) else {
        panic!()
    };
    assert!(!t.slots[0].reap(p_word));
    assert_eq!(t.slots[0].load().word, c_word);
}

/// Defect 7: `dead_holder` read the state, then the pid: a holder that released and
/// exited in between was reported dead while holding nothing. Now the word is judged
/// whole and re-read before reporting.
#[test]
fn dead_holder_does_not_report_a_slot_released_meanwhile() {
    let t = Table::new(1);
    let p = pid(40);
    let Claim::Granted(i, held) = t.slots().claim(&p) else {
        panic!()
    };
    let slots = t.slots();
    // The liveness check runs between the reads: P releases and dies right there.
    let judge = |_: &ProcessIdentity| {
        slots.release(i, held);
        false
    };
    assert_eq!(slots.dead_holder(u64::MAX, 1, &judge), None);
}

#[test]
fn a_claim_during_close_backs_off_and_frees_its_slot() {
    let t = Table::new(1);
    t.slots().begin_close();
    assert_eq!(t.slots().claim(&pid(50)), Claim::Closing);
    assert_eq!(t.slots[0].load().word, 0);
}
