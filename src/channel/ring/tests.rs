//! Replays of the protocol's dangerous interleavings, one step at a time on one thread.
use super::*;
use crate::owned_slot::Owner;

fn ring(state: &RingState, slots: u64) -> Ring<'_> {
    Ring::new(
        state,
        Geometry {
            slots,
            capacity: 100,
            consumers: 1,
        },
    )
}

/// A broadcast ring of `slots` slots and `consumers` entries.
fn broadcast(state: &RingState, slots: u64, consumers: u64) -> Ring<'_> {
    Ring::new(
        state,
        Geometry {
            slots,
            capacity: 100,
            consumers,
        },
    )
}

fn me() -> ProcessIdentity {
    ProcessIdentity::current()
}

/// A broadcast ring whose producer (this process) has claimed it.
fn broadcasting(state: &RingState, slots: u64, consumers: u64) -> Ring<'_> {
    producer(state);
    broadcast(state, slots, consumers)
}

/// A consumer of this process attached to `p` without a pause.
#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn attach(p: &Ring<'_>) -> Attached {
    p.attach_any(&me(), || {}).unwrap()
}

/// A consumer that attaches after items were sent starts at the next item; the producer
/// never waited for it before it attached, and waits for it from then on.
#[test]
fn a_late_consumer_starts_at_the_next_item_and_holds_the_producer_from_then_on() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 2, 3);
    for k in 1..=5 {
        assert!(
            p.try_acquire(k).unwrap(),
            "nobody attached: item {k} is written"
        );
        p.publish(k, k).unwrap();
    }
    let a = attach(&p);
    assert_eq!((a.index, a.start), (0, 5));
    let c = broadcast(&s, 2, 3).at_entry(a.index);
    assert_eq!(
        c.try_recv(a.start).unwrap(),
        None,
        "items 1..=5 are not its"
    );
    assert!(p.try_acquire(6).unwrap() && p.try_acquire(7).unwrap());
    p.publish(6, 60).unwrap();
    p.publish(7, 70).unwrap();
    assert!(
        !p.try_acquire(8).unwrap(),
        "item 6 is the late consumer's until released"
    );
    assert_eq!(c.try_recv(5).unwrap(), Some(60));
    c.release(6).unwrap();
    assert!(p.try_acquire(8).unwrap());
}

/// Every attached consumer must release a slot before it is written again; one slow
/// consumer holds the producer, a fast one does not free it.
#[test]
fn a_slot_comes_back_only_when_every_attached_consumer_released_it() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 2);
    let a = attach(&p);
    let b = attach(&p);
    assert_eq!((a.index, b.index), (0, 1));
    let (ca, cb) = (p_at(&s, 1, 2, a.index), p_at(&s, 1, 2, b.index));
    p.publish(1, 10).unwrap();
    assert_eq!(ca.try_recv(0).unwrap(), Some(10));
    assert_eq!(cb.try_recv(0).unwrap(), Some(10));
    ca.release(1).unwrap();
    assert!(!p.try_acquire(2).unwrap(), "b still holds item 1");
    cb.release(1).unwrap();
    assert!(p.try_acquire(2).unwrap());
}

/// A live consumer that stops releasing is back-pressure, not a death: the producer's
/// acquire times out naming that consumer's process, and nothing is detached; a receive
/// that times out names the producer.
#[test]
fn a_stalled_live_consumer_is_named_by_the_producers_time_out() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 3);
    let fast = attach(&p);
    let slow = attach(&p);
    p.publish(1, 10).unwrap();
    p_at(&s, 1, 3, fast.index).release(1).unwrap();
    let mut detached = Vec::new();
    let e = p
        .acquire_detaching(2, Duration::from_millis(30), |i| detached.push(i))
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { waiting_for: Some(pid), .. } if pid == me().pid()),
        "names the consumer: {e}"
    );
    assert!(e.to_string().contains("waiting for pid"), "{e}");
    assert!(detached.is_empty(), "a live consumer is never detached");
    assert_eq!(p.attached().len(), 2);
    let e = p_at(&s, 1, 3, slow.index)
        .recv(1, Duration::from_millis(30))
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { waiting_for: Some(pid), .. } if pid == me().pid()),
        "a receive names the producer: {e}"
    );
}

fn p_at(s: &RingState, slots: u64, consumers: u64, index: usize) -> Ring<'_> {
    broadcast(s, slots, consumers).at_entry(index)
}

/// A consumer preempted inside its attach (`Claiming`) holds the producer back — it is
/// choosing where it starts — until it is `Held`; killed there, the producer's liveness
/// check frees the entry and goes on, and the entry can be attached again.
#[test]
fn a_consumer_killed_mid_attach_holds_the_producer_only_until_it_is_reaped() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 2);
    let _stalled = s.consumer[0].owner.claim_and_stall(&dead()).unwrap();
    assert!(!p.try_acquire(1).unwrap(), "a claim in progress blocks");
    let mut detached = Vec::new();
    p.acquire_detaching(1, Duration::from_secs(5), |i| detached.push(i))
        .unwrap();
    assert!(
        detached.is_empty(),
        "a claimer never attached: nothing to detach"
    );
    assert_eq!(s.consumer[0].owner.load().state, OwnerState::Free);
    let again = attach(&p);
    assert_eq!(again.index, 0);
}

/// A consumer that dies attached is detached (`Held → Left`, its entry reported so the
/// producer's GPU half forces its counter); the other consumers carry on.
#[test]
fn a_dead_consumer_is_detached_and_the_others_carry_on() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 3);
    let live = attach(&p);
    // A dead process's attached entry, as one killed while holding item 1.
    let word = s.consumer[1].owner.claim_pausing(&dead(), || {}).unwrap();
    assert_eq!(Owner::decode(word).state, OwnerState::Held);
    p.publish(1, 1).unwrap();
    let c = p_at(&s, 1, 3, live.index);
    assert_eq!(c.try_recv(0).unwrap(), Some(1));
    c.release(1).unwrap();
    let mut detached = Vec::new();
    p.acquire_detaching(2, Duration::from_secs(5), |i| detached.push(i))
        .unwrap();
    assert_eq!(detached, [1]);
    assert_eq!(s.consumer[1].owner.load().state, OwnerState::Left);
    assert_eq!(p.attached().len(), 1);
    assert!(
        p.consumer_status().is_ok(),
        "a broadcast producer is not ended by a death"
    );
}

/// A consumer that closed leaves its entry `Left`: the producer stops waiting for it, and
/// a new consumer takes the entry and starts at the next item.
#[test]
fn a_left_entry_is_taken_again_by_a_new_consumer_starting_at_the_next_item() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 2);
    let first = attach(&p);
    let _other = attach(&p);
    p.publish(1, 1).unwrap();
    p_at(&s, 1, 2, first.index).close_consumer(first.held);
    assert!(
        !p.try_acquire(2).unwrap(),
        "the other consumer still holds item 1"
    );
    p_at(&s, 1, 2, 1).release(1).unwrap();
    assert!(
        p.try_acquire(2).unwrap(),
        "the closed one is not waited for"
    );
    p.publish(2, 2).unwrap();
    let again = attach(&p);
    assert_eq!((again.index, again.start), (first.index, 2));
    assert!(matches!(
        p.attach_any(&me(), || {}),
        Err(Error::ChannelInUse { .. })
    ));
}

/// The race behind a late attach, in one order: the producer checks the entries (none
/// attached) for item 3 of a one-slot ring, then a consumer claims and reads `sent`, then
/// the producer writes and publishes item 3 (over item 2's slot). The consumer starts
/// after item 2 — it never receives the item whose slot was overwritten — and the
/// producer's next check waits for it.
#[test]
fn an_attach_between_the_producers_check_and_its_publish_starts_after_the_overwritten_item() {
    let s = RingState::boxed();
    let p = broadcasting(&s, 1, 2);
    p.publish(1, 1).unwrap();
    p.publish(2, 2).unwrap();
    assert!(p.try_acquire(3).unwrap(), "nobody attached");
    let a = attach(&p);
    assert_eq!(
        a.start, 2,
        "item 2's slot is being overwritten: not received"
    );
    p.publish(3, 3).unwrap();
    let c = p_at(&s, 1, 2, a.index);
    assert_eq!(c.try_recv(a.start).unwrap(), Some(3));
    assert!(!p.try_acquire(4).unwrap(), "item 3 is the consumer's");
    c.release(3).unwrap();
    assert!(p.try_acquire(4).unwrap());
}

#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn producer(state: &RingState) -> u64 {
    state
        .producer
        .claim_pausing(&ProcessIdentity::current(), || {})
        .unwrap()
}

/// A dead process's identity (pid 0 is never alive; use a pid that cannot exist).
fn dead() -> ProcessIdentity {
    ProcessIdentity::from_parts(4_194_000, 1)
}

/// Counters a peer scribbled: once `released > sent` panicked the consumer in debug
/// builds (`sent - released`) and `sent = released = u64::MAX` made the producer wait for
/// a `Timeout` (`released + slots` wrapped) instead of reporting `Corrupt`.
#[test]
fn scribbled_counters_are_corrupt_on_both_sides_never_a_panic_or_a_wait() {
    let is_corrupt = |r: Result<bool>| matches!(r, Err(Error::Corrupt { .. }));
    let s = RingState::boxed();
    let r = ring(&s, 2);
    producer(&s);
    r.publish(1, 10).unwrap();
    // The consumer received nothing yet, so it released nothing: 5 is forged.
    s.consumer[0].released.store(5, Ordering::Relaxed);
    assert!(matches!(r.try_recv(0), Err(Error::Corrupt { .. })));
    assert!(is_corrupt(r.try_acquire(2)), "released > sent");
    s.sent.store(u64::MAX, Ordering::Relaxed);
    s.consumer[0].released.store(u64::MAX, Ordering::Relaxed);
    assert!(is_corrupt(r.try_acquire(2)), "released + slots wraps");
    assert!(matches!(r.try_recv(0), Err(Error::Corrupt { .. })));
}

/// A batch is published in one step: an error (here a forged `sent`) leaves nothing of it
/// published. Once a batch published item by item, so a failure on its second item
/// came after the first was the consumer's, and `SendBatch::send` reported an error for a
/// batch partly delivered.
#[test]
fn a_batch_is_published_whole_or_not_at_all() {
    let s = RingState::boxed();
    let r = ring(&s, 4);
    producer(&s);
    r.publish_from(1, 3, [(10, &[][..]), (20, &[]), (30, &[])])
        .unwrap();
    assert_eq!(s.sent.load(Ordering::Relaxed), 3);
    assert_eq!(r.try_recv(0).unwrap(), Some(10));
    s.sent.store(9, Ordering::Relaxed); // forged by the peer
    assert!(matches!(
        r.publish_from(4, 2, [(40, &[][..]), (50, &[])]),
        Err(Error::Corrupt { .. })
    ));
    assert_eq!(s.sent.load(Ordering::Relaxed), 9, "nothing published");
    assert_eq!(s.lens[3].load(Ordering::Relaxed), 0, "no length written");
}

/// Headers travel with their items, exactly, across the ring's wrap; a slot's next item
/// without a header shows none (not the previous item's), in a batch too.
#[test]
fn headers_travel_with_their_items_and_never_go_stale() {
    let s = RingState::boxed();
    let r = ring(&s, 2);
    producer(&s);
    let full: Vec<u8> = (0..HEADER_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let sizes = [0, 1, 7, 8, 9, 4095, HEADER_BYTES, 3];
    for (i, &n) in sizes.iter().enumerate() {
        let k = i as u64 + 1;
        assert!(r.try_acquire(k).unwrap());
        r.publish_from(k, 1, [(k, &full[..n])]).unwrap();
        assert_eq!(r.try_recv(k - 1).unwrap(), Some(k));
        assert_eq!(r.header(k).unwrap(), &full[..n], "item {k}, {n} bytes");
        r.release(k).unwrap();
    }
    // Item 9 goes to slot 0, whose last item (7) had a 4,096-byte header: it shows none.
    let k = sizes.len() as u64 + 1;
    r.publish(k, 1).unwrap();
    assert!(r.header(k).unwrap().is_empty());
    r.release(k).unwrap();
    r.publish_from(k + 1, 2, [(1, &b"ab"[..]), (2, &[][..])])
        .unwrap();
    assert_eq!(r.header(k + 1).unwrap(), b"ab");
    assert!(
        r.header(k + 2).unwrap().is_empty(),
        "batch item without a header"
    );
}

/// A header over the bound is refused before anything is written; a forged header length
/// is `Corrupt`, never a read past the slot's words.
#[test]
fn an_oversized_or_forged_header_is_refused() {
    let s = RingState::boxed();
    let r = ring(&s, 4);
    producer(&s);
    let big = vec![1u8; HEADER_BYTES + 1];
    assert!(matches!(
        r.publish_from(1, 2, [(5, &[][..]), (6, &big[..])]),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(s.sent.load(Ordering::Relaxed), 0, "nothing published");
    assert_eq!(s.lens[0].load(Ordering::Relaxed), 0, "no length written");
    r.publish_from(1, 1, [(5, &b"abc"[..])]).unwrap();
    assert_eq!(r.try_recv(0).unwrap(), Some(5));
    let forged = 5 | (HEADER_BYTES as u64 + 1) << LEN_BITS; // the peer's
    s.lens[0].store(forged, Ordering::Relaxed);
    assert!(matches!(r.try_recv(0), Err(Error::Corrupt { .. })));
    assert!(matches!(r.header(1), Err(Error::Corrupt { .. })));
    s.lens[0].store(u64::MAX, Ordering::Relaxed);
    assert!(matches!(r.try_recv(0), Err(Error::Corrupt { .. })));
    assert!(matches!(r.header(1), Err(Error::Corrupt { .. })));
}

#[test]
fn items_flow_in_order_and_the_ring_bounds_the_producer() {
    let s = RingState::boxed();
    let r = ring(&s, 2);
    producer(&s);
    assert!(r.try_acquire(1).unwrap() && r.try_acquire(2).unwrap());
    r.publish(1, 10).unwrap();
    r.publish(2, 20).unwrap();
    assert!(!r.try_acquire(3).unwrap(), "full: item 1 not released");
    assert_eq!(r.try_recv(0).unwrap(), Some(10));
    r.release(1).unwrap();
    assert!(r.try_acquire(3).unwrap());
    assert_eq!(r.try_recv(1).unwrap(), Some(20));
    assert_eq!(r.try_recv(2).unwrap(), None);
}

/// The consumer found nothing to receive; the producer publishes its last item and
/// closes; the consumer's status check must see the item, not report "closed".
#[test]
fn a_close_right_after_the_last_publish_still_delivers_it() {
    let s = RingState::boxed();
    let r = ring(&s, 2);
    let held = producer(&s);
    assert_eq!(r.try_recv(0).unwrap(), None);
    r.publish(1, 5).unwrap();
    r.close_producer(held);
    r.producer_status(0).unwrap();
    assert_eq!(r.recv(0, Duration::from_millis(50)).unwrap(), 5);
    r.release(1).unwrap();
    let e = r.recv(1, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ChannelClosed {
                role: "producer",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_dead_producer_ends_a_wait_with_exporter_gone() {
    let s = RingState::boxed();
    let r = ring(&s, 2);
    s.producer.claim_pausing(&dead(), || {}).unwrap();
    let t = Instant::now();
    let e = r.recv(0, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PeerGone {
                pid: 4_194_000,
                role: PeerRole::Exporter
            }
        ),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// A consumer killed between its claim and `Held` leaves a `Claiming` word naming it: the
/// producer reports its death, and nobody else can attach in its place.
#[test]
fn a_consumer_killed_mid_attach_is_reported_dead() {
    let s = RingState::boxed();
    let r = ring(&s, 1);
    producer(&s);
    let _stalled = s.consumer[0].owner.claim_and_stall(&dead()).unwrap();
    r.publish(1, 1).unwrap();
    let e = r.acquire(2, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PeerGone {
                pid: 4_194_000,
                role: PeerRole::Importer(_)
            }
        ),
        "{e}"
    );
    let e = r.attach(&ProcessIdentity::current(), || {}).unwrap_err();
    assert!(matches!(e, Error::ChannelInUse { pid: 4_194_000 }), "{e}");
}

#[test]
fn a_closed_consumer_ends_the_producer_even_with_room() {
    let s = RingState::boxed();
    let r = ring(&s, 4);
    producer(&s);
    let held = r.attach(&ProcessIdentity::current(), || {}).unwrap();
    r.close_consumer(held);
    let e = r.try_acquire(1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ChannelClosed {
                role: "consumer",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn waits_time_out_with_what_they_waited_for() {
    let s = RingState::boxed();
    let r = ring(&s, 1);
    producer(&s);
    let e = r.recv(0, Duration::from_millis(30)).unwrap_err();
    assert!(e.to_string().contains("waiting for the producer"), "{e}");
    r.publish(1, 1).unwrap();
    let e = r.acquire(2, Duration::from_millis(30)).unwrap_err();
    assert!(e.to_string().contains("no consumer has attached"), "{e}");
    r.attach(&me(), || {}).unwrap();
    let e = r.acquire(2, Duration::from_millis(30)).unwrap_err();
    assert!(e.to_string().contains("release a slot"), "{e}");
    assert!(
        matches!(e, Error::Timeout { waiting_for: Some(pid), .. } if pid == me().pid()),
        "names the consumer: {e}"
    );
}

/// Forged state from a peer: counts beyond the ring, a length beyond the slot, releases
/// beyond the sends. Each is refused, never used as an index or a length.
#[test]
fn forged_counts_and_lengths_are_refused() {
    let s = RingState::boxed();
    let r = ring(&s, 2);
    producer(&s);
    let defect = |r: Result<_>| match r {
        Err(Error::Corrupt { defect, .. }) => defect,
        other => panic!("expected Corrupt, got {:?}", other.map(drop)),
    };
    s.sent.store(3, Ordering::Relaxed); // 3 sent, 0 released, 2 slots
    assert_eq!(
        defect(r.try_recv(0).map(drop)),
        StateDefect::OutOfRange {
            field: "items sent and not released",
            value: 3,
            min: 0,
            max: 2
        }
    );
    s.sent.store(1, Ordering::Relaxed);
    s.lens[0].store(101, Ordering::Relaxed);
    assert_eq!(
        defect(r.try_recv(0).map(drop)),
        StateDefect::OutOfRange {
            field: "item elements",
            value: 101,
            min: 0,
            max: 100
        }
    );
    s.consumer[0].released.store(5, Ordering::Relaxed);
    assert!(matches!(
        defect(r.try_acquire(2).map(drop)),
        StateDefect::OutOfRange {
            field: "items released",
            value: 5,
            max: 1,
            ..
        }
    ));
    s.consumer[0].released.store(0, Ordering::Relaxed);
    assert_eq!(
        defect(r.publish(5, 1)),
        StateDefect::Counter {
            field: "items sent",
            found: 1,
            expected: 4
        }
    );
    assert_eq!(
        defect(r.release(3)),
        StateDefect::Counter {
            field: "items released",
            found: 0,
            expected: 2
        }
    );
}

/// The doorbell wakes a consumer asleep on the futex (past the spin) promptly.
#[test]
fn a_sleeping_consumer_is_woken_by_the_publish() {
    let s = RingState::boxed();
    producer(&s);
    std::thread::scope(|scope| {
        let t = scope.spawn(|| {
            let r = ring(&s, 1);
            r.recv(0, Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(50));
        ring(&s, 1).publish(1, 7).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), 7);
    });
}
