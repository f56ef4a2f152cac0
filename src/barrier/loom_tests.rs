//! Model check of the wait/complete/withdraw protocol: threads stand in for processes,
//! the futex for `yield_now`, and loom explores their interleavings.
use super::*;
use crate::sync::model;
use loom::sync::Arc;

fn never() -> impl FnMut() -> bool {
    || false
}

/// Run `f` on another thread (another process, to the model) over the same barrier state.
fn beside<R: Send + 'static>(
    s: &Arc<BarrierState>,
    f: impl FnOnce(&BarrierState) -> R + Send + 'static,
) -> loom::thread::JoinHandle<R> {
    let s = s.clone();
    loom::thread::spawn(move || f(&s))
}

/// Join, wait for two generations, and count the ones this participant led.
#[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
fn lead_two_generations(s: &BarrierState) -> u32 {
    let b = ProcessBarrier::join(s).unwrap();
    let mut leads = 0;
    for g in 0..2 {
        let r = b.wait_until(&mut never(), false).unwrap();
        assert_eq!(r.generation(), g);
        leads += u32::from(r.is_leader());
    }
    std::mem::forget(b);
    leads
}

#[test]
fn two_parties_two_generations() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let t = beside(&s, lead_two_generations);
        assert_eq!(lead_two_generations(&s) + t.join().unwrap(), 2);
    });
}

/// Join and leave: a participant that joins and drops without waiting. The other's wait must
/// end with `PeerGone` with `BarrierParty { left: true, .. }` (never hang, never complete).
#[test]
fn a_participant_that_leaves_ends_the_others_wait() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let leaver = beside(&s, move |s| {
            loom_support::set_pid(2);
            drop(ProcessBarrier::join(s).unwrap());
        });
        let b = ProcessBarrier::join(&s).unwrap();
        let r = b.wait_until(&mut never(), true);
        leaver.join().unwrap();
        assert!(
            matches!(
                r,
                Err(WaitError::Failed(Error::PeerGone {
                    role: PeerRole::BarrierParty { left: true, .. },
                    ..
                }))
            ),
            "{r:?}"
        );
    });
}

/// A joiner killed between taking its slot and finishing the join. Its slot names it from the
/// first step, so waiters see it die (`PeerGone` (barrier participant), never a timeout), and a
/// replacement can take its slot over while nobody has noticed yet. Both live participants
/// agree: both complete, or both fail.
#[test]
fn a_joiner_killed_mid_join_is_seen_dead_or_replaced() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let victim = beside(&s, move |s| {
            loom_support::set_pid(loom_support::DEAD_FROM);
            let me = current_identity();
            let _ = s.slots[..2]
                .iter()
                .find_map(|slot| slot.claim_and_stall(&me));
        });
        let other = beside(&s, move |s| {
            loom_support::set_pid(2);
            let b = ProcessBarrier::join(s)?;
            let r = b.wait_until(&mut never(), true);
            std::mem::forget(b);
            r.map_err(|e| e.into_error(std::time::Duration::ZERO))
        });
        loom_support::set_pid(3);
        let mine = ProcessBarrier::join(&s).map(|b| {
            let r = b.wait_until(&mut never(), true);
            std::mem::forget(b);
            r
        });
        victim.join().unwrap();
        let theirs = other.join().unwrap();
        let mine_ok = matches!(mine, Ok(Ok(_)));
        assert_eq!(mine_ok, theirs.is_ok(), "{mine:?} / {theirs:?}");
        if !mine_ok {
            assert!(s.is_poisoned());
        }
    });
}

/// A deadline that expires at its `polls`-th check.
fn expires_after(mut polls: u32) -> impl FnMut() -> bool {
    move || {
        polls -= 1;
        polls == 0
    }
}

/// A waiter that gives up races the arrival that would complete the generation: either
/// both complete (the withdrawal lost) or the waiter times out and the count is exactly the
/// other's arrival, never a false completion or a lost arrival.
#[test]
fn withdrawal_races_completion() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let impatient = beside(&s, move |s| {
            let b = ProcessBarrier::join(s).unwrap();
            let r = b.wait_until(&mut expires_after(2), false);
            std::mem::forget(b);
            r.is_ok()
        });
        let b = ProcessBarrier::join(&s).unwrap();
        let mine = b.wait_until(&mut expires_after(3), false);
        std::mem::forget(b);
        let theirs = impatient.join().unwrap();
        // Both complete (the withdrawal lost the race) or both time out with every arrival
        // withdrawn: never one success beside a withdrawn partner, never a leftover count.
        assert_eq!(mine.is_ok(), theirs);
        let st = s.state.0.load(Ordering::SeqCst);
        assert_eq!(st, if theirs { pack(1, 0) } else { pack(0, 0) });
    });
}
