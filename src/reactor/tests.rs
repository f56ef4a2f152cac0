use super::*;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Wake;
use std::time::{Duration, Instant};

/// A waker that counts its wakes and unparks the test thread.
struct Counter(AtomicU32, std::thread::Thread);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        self.1.unpark();
    }
}

fn counter() -> (Arc<Counter>, Waker) {
    let c = Arc::new(Counter(AtomicU32::new(0), std::thread::current()));
    (c.clone(), Waker::from(c))
}

/// Park until `c` counts a wake, at most `limit`.
fn woken(c: &Counter, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while c.0.load(Ordering::SeqCst) == 0 {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::park_timeout(deadline - now);
    }
    true
}

/// Whether one poll of `f` finds its descriptor readable (else it is pending, registered).
/// An error fails the test.
fn ready(f: &mut Readable<'_>, cx: &mut Context<'_>) -> bool {
    match Pin::new(f).poll(cx) {
        Poll::Ready(r) => {
            r.unwrap();
            true
        }
        Poll::Pending => false,
    }
}

#[test]
fn a_pending_wait_is_woken_when_its_descriptor_turns_readable() {
    let (a, b) = UnixDatagram::pair().unwrap();
    let (c, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut f = Readable::new(a.as_fd());
    assert!(!ready(&mut f, &mut cx));
    assert!(
        !woken(&c, Duration::from_millis(20)),
        "nothing sent: no wake"
    );
    b.send(b"x").unwrap();
    assert!(woken(&c, Duration::from_secs(5)), "the reactor woke it");
    assert!(ready(&mut f, &mut cx));
}

#[test]
fn a_readable_descriptor_is_ready_at_once() {
    let (a, b) = UnixDatagram::pair().unwrap();
    b.send(b"x").unwrap();
    let (_, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut f = Readable::new(a.as_fd());
    assert!(ready(&mut f, &mut cx));
}

#[test]
fn a_dropped_wait_leaves_no_registration() {
    let (a, b) = UnixDatagram::pair().unwrap();
    let (c, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    {
        let mut f = Readable::new(a.as_fd());
        assert!(!ready(&mut f, &mut cx));
    }
    let r = reactor().unwrap();
    b.send(b"x").unwrap();
    assert!(
        !woken(&c, Duration::from_millis(50)),
        "a dropped wait is not woken"
    );
    // The descriptor can be waited for again (it was removed from the set, not left armed).
    let mut again = Readable::new(a.as_fd());
    assert!(ready(&mut again, &mut cx));
    drop(again);
    let mut buf = [0u8; 4];
    a.recv(&mut buf).unwrap();
    let mut third = Readable::new(a.as_fd());
    assert!(!ready(&mut third, &mut cx));
    let key = third.key.unwrap();
    assert!(r.wakers.lock().by_key.contains_key(&key));
    drop(third);
    assert!(
        !r.wakers.lock().by_key.contains_key(&key),
        "its waker is gone with it"
    );
}

#[test]
fn a_thousand_pending_waits_share_one_thread() {
    let pairs: Vec<_> = (0..1000).map(|_| UnixDatagram::pair().unwrap()).collect();
    let (c, waker) = counter();
    let mut cx = Context::from_waker(&waker);
    let mut futures: Vec<_> = pairs
        .iter()
        .map(|(a, _)| Readable::new(a.as_fd()))
        .collect();
    for f in &mut futures {
        assert!(Pin::new(f).poll(&mut cx).is_pending());
    }
    let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
    pairs[617].1.send(b"x").unwrap();
    assert!(woken(&c, Duration::from_secs(5)));
    let mut woke = Vec::new();
    for (i, f) in futures.iter_mut().enumerate() {
        if ready(f, &mut cx) {
            woke.push(i);
        }
    }
    assert_eq!(woke, vec![617]);
    assert_eq!(
        std::fs::read_dir("/proc/self/task").unwrap().count(),
        threads,
        "no thread per wait"
    );
}
