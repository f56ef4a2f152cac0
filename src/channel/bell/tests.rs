use super::*;

fn channel(what: &str) -> String {
    crate::channel::bell::test_channel(&format!("bell-{what}"))
}

fn readable(bell: &Bell) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        bell,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).unwrap() > 0
}

#[test]
fn a_told_bell_is_readable_until_drained() {
    let ch = channel("told");
    let bell = Bell::bind(&ch, End::Consumer(3)).unwrap();
    assert!(!readable(&bell));
    tell_consumers(&ch, Listeners(1 << 2)); // another entry's bell: not ours
    assert!(!readable(&bell));
    tell_consumers(&ch, Listeners(1 << 3 | 1 << 2));
    tell_consumers(&ch, Listeners(1 << 3));
    assert!(readable(&bell));
    assert_eq!(bell.drain(), 2);
    assert!(!readable(&bell));
    tell_producer(&ch, Listeners::default()); // nobody armed: nothing sent
    let p = Bell::bind(&ch, End::Producer).unwrap();
    tell_producer(&ch, Listeners(1));
    assert!(readable(&p) && !readable(&bell));
}

#[test]
fn a_live_bell_is_not_taken_and_a_dead_ones_file_is() {
    let ch = channel("taken");
    let bell = Bell::bind(&ch, End::Producer).unwrap();
    assert!(matches!(
        Bell::bind(&ch, End::Producer),
        Err(Error::AddressInUse { .. })
    ));
    // A killed holder's file: the socket closed, the file left behind.
    let path = bell.path.clone();
    let fd = unsafe_leave_file(bell);
    drop(fd);
    assert!(path.exists());
    let again = Bell::bind(&ch, End::Producer).unwrap();
    tell_producer(&ch, Listeners(1));
    assert!(readable(&again));
    drop(again);
    assert!(!path.exists(), "a bell's file goes with it");
}

/// The bell's socket without its unlink (as a `SIGKILL` leaves it).
fn unsafe_leave_file(bell: Bell) -> OwnedFd {
    let bell = std::mem::ManuallyDrop::new(bell);
    // SAFETY: read out of a value that is never dropped or used again.
    let fd = unsafe { std::ptr::read(&bell.fd) };
    // SAFETY: as above.
    drop(unsafe { std::ptr::read(&bell.path) });
    fd
}

#[test]
fn telling_a_bell_nobody_holds_is_quiet() {
    let ch = channel("nobody");
    tell_consumers(&ch, Listeners(0xff));
    tell_producer(&ch, Listeners(1));
}
