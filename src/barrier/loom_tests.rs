//! Model check of the wait/complete/withdraw protocol: threads stand in for processes,
//! the futex for `yield_now`, and loom explores their interleavings.
use super::*;
use crate::sync::model;
use loom::sync::Arc;

fn never() -> impl FnMut() -> bool {
    || false
}

#[test]
fn two_parties_two_generations() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let t = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let b = ProcessBarrier::join(&s).unwrap();
                let mut leads = 0;
                for g in 0..2 {
                    let r = b.wait_until(&mut never(), false).unwrap();
                    assert_eq!(r.generation(), g);
                    leads += u32::from(r.is_leader());
                }
                std::mem::forget(b);
                leads
            })
        };
        let b = ProcessBarrier::join(&s).unwrap();
        let mut leads = 0;
        for g in 0..2 {
            let r = b.wait_until(&mut never(), false).unwrap();
            assert_eq!(r.generation(), g);
            leads += u32::from(r.is_leader());
        }
        std::mem::forget(b);
        assert_eq!(leads + t.join().unwrap(), 2);
    });
}

/// Join and leave: a participant that joins and drops without waiting. The other's wait must
/// end with `PeerGone` with `BarrierParty { left: true, .. }` (never hang, never complete).
#[test]
fn a_participant_that_leaves_ends_the_others_wait() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let leaver = {
            let s = s.clone();
            loom::thread::spawn(move || {
                loom_support::set_pid(2);
                drop(ProcessBarrier::join(&s).unwrap());
            })
        };
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
        let victim = {
            let s = s.clone();
            loom::thread::spawn(move || {
                loom_support::set_pid(loom_support::DEAD_FROM);
                let me = current_identity();
                let _ = s.slots[..2]
                    .iter()
                    .find_map(|slot| slot.claim_and_stall(&me));
            })
        };
        let other = {
            let s = s.clone();
            loom::thread::spawn(move || {
                loom_support::set_pid(2);
                let b = ProcessBarrier::join(&s)?;
                let r = b.wait_until(&mut never(), true);
                std::mem::forget(b);
                r.map_err(|e| e.into_error(std::time::Duration::ZERO))
            })
        };
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

/// A waiter that gives up races the arrival that would complete the generation: either
/// both complete (the withdrawal lost) or the waiter times out and the count is exactly the
/// other's arrival, never a false completion or a lost arrival.
#[test]
fn withdrawal_races_completion() {
    model(|| {
        let s = Arc::new(BarrierState::new(2).unwrap());
        let impatient = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let b = ProcessBarrier::join(&s).unwrap();
                let mut patience = 2;
                let r = b.wait_until(
                    &mut || {
                        patience -= 1;
                        patience == 0
                    },
                    false,
                );
                std::mem::forget(b);
                r.is_ok()
            })
        };
        let b = ProcessBarrier::join(&s).unwrap();
        let mut patience = 3;
        let mine = b.wait_until(
            &mut || {
                patience -= 1;
                patience == 0
            },
            false,
        );
        std::mem::forget(b);
        let theirs = impatient.join().unwrap();
        // Both complete (the withdrawal lost the race) or both time out with every arrival
        // withdrawn: never one success beside a withdrawn partner, never a leftover count.
        assert_eq!(mine.is_ok(), theirs);
        let st = s.state.0.load(Ordering::SeqCst);
        assert_eq!(st, if theirs { pack(1, 0) } else { pack(0, 0) });
    });
}
