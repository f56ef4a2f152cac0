//! Model check of the ring: a producer and a consumer thread over the shared counters,
//! with the slots' contents as relaxed atomics standing in for GPU memory.
use super::*;
use crate::barrier::loom_support;
use crate::channel::bell::Listeners;
use loom::sync::Arc;

use crate::sync::model;

const GEOMETRY: Geometry = Geometry {
    slots: 1,
    capacity: 8,
    consumers: 1,
};

const BROADCAST: Geometry = Geometry {
    slots: 1,
    capacity: 8,
    consumers: 2,
};

/// A ring whose producer (pid 1) has claimed it, a word standing for a slot's contents, and
/// the producer's held owner word.
#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn claimed() -> (Arc<RingState>, Arc<AtomicU64>, u64) {
    let s = Arc::new(*RingState::boxed());
    let held = s
        .producer
        .claim_pausing(&ProcessIdentity::from_parts(1, 1), || {})
        .unwrap();
    (s, Arc::new(AtomicU64::new(0)), held)
}

/// Run `f` on another thread (pid 2, to the model) with its own view of the ring and the
/// word standing for a slot's contents.
fn consumer<R: Send + 'static>(
    s: &Arc<RingState>,
    data: &Arc<AtomicU64>,
    geometry: Geometry,
    f: impl FnOnce(Ring<'_>, &AtomicU64) -> R + Send + 'static,
) -> loom::thread::JoinHandle<R> {
    let (s, data) = (s.clone(), data.clone());
    loom::thread::spawn(move || {
        loom_support::set_pid(2);
        f(Ring::new(&s, geometry), &data)
    })
}

/// Broadcast, the race behind a late attach: a consumer attaches while the producer
/// writes two items through one slot (nobody attached before), takes the next item if it
/// is there yet, and closes. Whatever it received is the item right after its start, and
/// the slot holds that item both when received and just before it is released: the
/// producer never overwrites a slot the late consumer may read, in any interleaving.
#[test]
fn a_late_consumer_never_sees_an_overwritten_slot() {
    model(|| {
        let (s, data, _) = claimed();
        let consumer = consumer(&s, &data, BROADCAST, move |r, data| {
            let a = r
                .attach_any(&ProcessIdentity::from_parts(2, 1), || {})
                .unwrap();
            let r = r.at_entry(a.index);
            let k = a.start + 1;
            if r.try_recv(a.start).unwrap().is_some() {
                assert_eq!(data.load(Ordering::Relaxed), k, "on receipt");
                assert_eq!(data.load(Ordering::Relaxed), k, "while held");
                r.release(k).unwrap();
            }
            r.close_consumer(a.held);
            a.start
        });
        let r = Ring::new(&s, BROADCAST);
        for k in 1..=2 {
            r.acquire(k, Duration::from_secs(3600)).unwrap();
            data.store(k, Ordering::Relaxed);
            r.publish(k, k).unwrap();
        }
        assert!(consumer.join().unwrap() <= 2);
    });
}

/// Three items through one slot: the consumer sees each item's contents (never a later
/// item's, never an earlier one's), then "closed" — never before the last item.
#[test]
fn items_arrive_whole_in_order_then_closed() {
    model(|| {
        let (s, data, held) = claimed();
        let consumer = consumer(&s, &data, GEOMETRY, move |r, data| {
            let mut got = Vec::new();
            let mut received = 0;
            loop {
                match r.recv(received, Duration::from_secs(3600)) {
                    Ok(len) => {
                        received += 1;
                        assert_eq!(data.load(Ordering::Relaxed), received);
                        let header = r.header(received).unwrap();
                        assert_eq!(header, [received as u8; 1], "item {received}");
                        got.push(len);
                        r.release(received).unwrap();
                    }
                    Err(Error::ChannelClosed { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            got
        });
        let r = Ring::new(&s, GEOMETRY);
        for k in 1..=3 {
            r.acquire(k, Duration::from_secs(3600)).unwrap();
            data.store(k, Ordering::Relaxed);
            r.publish_from(k, 1, [(k + 4, &[k as u8][..])]).unwrap();
        }
        r.close_producer(held);
        assert_eq!(consumer.join().unwrap(), vec![5, 6, 7]);
    });
}

/// A consumer that attaches, receives one item and closes: the producer's acquire of a
/// slot that will never come back ends with `ChannelClosed`, never hangs.
#[test]
fn a_closing_consumer_ends_the_producers_wait() {
    model(|| {
        let (s, data, _) = claimed();
        let consumer = consumer(&s, &data, GEOMETRY, move |r, _| {
            let held = r.attach(&ProcessIdentity::from_parts(2, 1), || {}).unwrap();
            r.recv(0, Duration::from_secs(3600)).unwrap();
            r.close_consumer(held);
        });
        let r = Ring::new(&s, GEOMETRY);
        r.acquire(1, Duration::from_secs(3600)).unwrap();
        r.publish(1, 1).unwrap();
        let e = r.acquire(2, Duration::from_secs(3600)).unwrap_err();
        assert!(matches!(e, Error::ChannelClosed { .. }), "{e}");
        consumer.join().unwrap();
    });
}

/// A listener arms after a failed check while the other side publishes and rings: either
/// the listener sees the ring (it checks again) or the ring takes its bit (it is told) —
/// never a listener that waits on its descriptor while nobody will tell it. A second ring
/// after the first takes nothing the first took.
#[test]
fn an_armed_listener_is_told_or_sees_the_ring() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let sent = Arc::new(AtomicU64::new(0));
        let producer = {
            let (bell, sent) = (bell.clone(), sent.clone());
            loom::thread::spawn(move || {
                sent.store(1, Ordering::Release);
                let first = bell.ring();
                let second = bell.ring();
                assert_eq!(first.0 & second.0, 0, "a bit is taken by one ring");
                Listeners(first.0 | second.0)
            })
        };
        let ticket = bell.ticket();
        let waits = sent.load(Ordering::Acquire) == 0 && bell.arm(1, ticket);
        let told = producer.join().unwrap();
        if waits {
            assert_eq!(told.0 & 1, 1, "the listener waits, so a ring must tell it");
        }
    });
}

/// Two listeners (two broadcast consumers) arm while the producer publishes and rings once:
/// each that waits is told by that ring, and the ring's clearing of the bits it took leaves a
/// bit armed after it in place.
#[test]
fn two_armed_listeners_are_each_told_or_see_the_ring() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let sent = Arc::new(AtomicU64::new(0));
        let listener = |bit: u32| {
            let (bell, sent) = (bell.clone(), sent.clone());
            loom::thread::spawn(move || {
                let ticket = bell.ticket();
                sent.load(Ordering::Acquire) == 0 && bell.arm(bit, ticket)
            })
        };
        let (a, b) = (listener(1), listener(2));
        sent.store(1, Ordering::Release);
        let told = bell.ring();
        let later = bell.ring();
        for (bit, waits) in [(1, a.join().unwrap()), (2, b.join().unwrap())] {
            if waits {
                assert_eq!(told.0 & bit, bit, "listener {bit} waits untold");
                assert_eq!(later.0 & bit, 0, "told once");
            }
        }
    });
}
