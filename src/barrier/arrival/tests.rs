use super::*;
use crate::Error;
use crate::barrier::BarrierState;
use crate::wait::WaitSet;

/// Check `arrival` whenever its descriptor says, at most `limit`: its result.
#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn check_until_done(arrival: &mut BarrierArrival<'_, '_>, limit: Duration) -> BarrierWaitResult {
    let mut set = WaitSet::new().unwrap();
    let key = set.attach(&*arrival).unwrap();
    let deadline = Instant::now() + limit;
    loop {
        assert!(Instant::now() < deadline, "no completion within {limit:?}");
        if set
            .wait(Some(Duration::from_secs(1)))
            .unwrap()
            .contains(&key)
            && let Some(done) = arrival.check().unwrap()
        {
            return done;
        }
    }
}

/// Both participants of a two-party barrier.
#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn two(state: &BarrierState) -> (ProcessBarrier<'_>, ProcessBarrier<'_>) {
    (
        ProcessBarrier::join(state).unwrap(),
        ProcessBarrier::join(state).unwrap(),
    )
}

#[test]
fn an_arrival_completes_beside_a_blocking_wait_and_keeps_its_result() {
    let state = BarrierState::new(2).unwrap();
    let (a, b) = two(&state);
    for generation in 0..3 {
        let mut arrival = a.arrive().unwrap();
        assert_eq!(arrival.generation(), generation);
        let (mine, theirs) = std::thread::scope(|s| {
            let t = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                b.wait().unwrap()
            });
            (
                check_until_done(&mut arrival, Duration::from_secs(10)),
                t.join().unwrap(),
            )
        });
        assert_eq!(
            (mine.generation(), theirs.generation()),
            (generation, generation)
        );
        assert!(mine.is_leader() != theirs.is_leader(), "one leader");
        assert_eq!(
            arrival.check().unwrap(),
            Some(mine),
            "the same result again"
        );
    }
    assert_eq!(state.arrived(), 0);
}

#[test]
fn the_last_arrival_completes_at_once() {
    let state = BarrierState::new(2).unwrap();
    let (a, b) = two(&state);
    std::thread::scope(|s| {
        let t = s.spawn(|| b.wait().unwrap());
        while state.arrived() != 1 {
            std::thread::yield_now();
        }
        let mut arrival = a.arrive().unwrap();
        // Complete at once: by this arrival, or by the waiter, which may see the full count
        // first (whoever sees it completes).
        let done = arrival.check().unwrap().expect("complete at once");
        assert!(
            done.is_leader() != t.join().unwrap().is_leader(),
            "one leader"
        );
    });
}

#[test]
fn a_dropped_arrival_is_withdrawn_and_the_barrier_stays_usable() {
    let state = BarrierState::new(2).unwrap();
    let (a, b) = two(&state);
    let mut arrival = a.arrive().unwrap();
    assert_eq!(arrival.check().unwrap(), None);
    assert_eq!(state.arrived(), 1);
    drop(arrival);
    assert_eq!(state.arrived(), 0, "withdrawn");
    assert!(!state.is_poisoned());
    // The next generation is the same one, counted afresh.
    std::thread::scope(|s| {
        let t = s.spawn(|| b.wait().unwrap());
        let mine = a.wait().unwrap();
        assert_eq!((mine.generation(), t.join().unwrap().generation()), (0, 0));
    });
}

#[test]
fn an_arrival_paces_its_looks() {
    let state = BarrierState::new(2).unwrap();
    let (a, _b) = two(&state);
    let mut arrival = a.arrive().unwrap();
    let mut set = WaitSet::new().unwrap();
    let key = set.attach(&arrival).unwrap();
    let t = Instant::now();
    let mut looks = 0;
    while t.elapsed() < Duration::from_millis(100) {
        if set
            .wait(Some(Duration::from_millis(10)))
            .unwrap()
            .contains(&key)
        {
            looks += 1;
            assert_eq!(arrival.check().unwrap(), None);
        }
    }
    // 10 µs doubling to 1 ms: about 7 looks to reach the cap, then one a millisecond.
    assert!((5..=150).contains(&looks), "{looks} looks in 100 ms");
}

#[test]
fn a_poisoned_barrier_ends_an_arrival_and_stays_poisoned() {
    let state = BarrierState::new(2).unwrap();
    let (a, b) = two(&state);
    let mut arrival = a.arrive().unwrap();
    assert_eq!(arrival.check().unwrap(), None);
    b.poison();
    assert!(matches!(arrival.check(), Err(Error::Poisoned { .. })));
    assert!(
        matches!(arrival.check(), Err(Error::Poisoned { .. })),
        "again"
    );
    drop(arrival);
    assert!(state.is_poisoned());
}

#[cfg(feature = "async")]
#[test]
fn an_awaited_wait_completes_and_a_cancelled_one_is_withdrawn() {
    let state = BarrierState::new(2).unwrap();
    let (a, b) = two(&state);
    // Cancelled at every poll count from 1 to 5: withdrawn each time.
    for polls in 1..=5 {
        let mut fut = std::pin::pin!(a.wait_async());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        for _ in 0..polls {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            std::thread::sleep(Duration::from_micros(300));
        }
        assert_eq!(state.arrived(), 1);
    }
    assert_eq!(state.arrived(), 0, "every cancelled arrival withdrawn");
    let ((mine, theirs), _) = std::thread::scope(|s| {
        let t = s.spawn(|| b.wait().unwrap());
        let mine = block_on(a.wait_async()).unwrap();
        ((mine, t.join().unwrap()), ())
    });
    assert_eq!((mine.generation(), theirs.generation()), (0, 0));
    assert!(mine.is_leader() != theirs.is_leader());
}

/// Run `f` to completion on this thread, parking between polls (the reactor unparks it).
#[cfg(feature = "async")]
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}
