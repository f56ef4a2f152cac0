use super::*;
use crate::channel::bell::{Listeners, tell_consumers};
use std::time::Duration;

fn channel(what: &str) -> String {
    crate::channel::bell::test_channel(&format!("ready-{what}"))
}

/// Whether `fd` polls readable within `within`.
fn readable(fd: BorrowedFd<'_>, within: Duration) -> bool {
    let deadline = crate::poll::Deadline::after(within);
    os::socket::wait(fd, rustix::event::PollFlags::IN, deadline).unwrap()
}

#[test]
fn a_tell_makes_the_set_readable_until_drained() {
    let ch = channel("tell");
    let r = Readiness::new(&ch, End::Consumer(0)).unwrap();
    assert!(
        readable(r.as_fd(), Duration::ZERO),
        "readable to begin with"
    );
    r.drain();
    assert!(!readable(r.as_fd(), Duration::ZERO));
    tell_consumers(&ch, Listeners(1));
    assert!(readable(r.as_fd(), Duration::from_secs(5)));
    r.drain();
    assert!(!readable(r.as_fd(), Duration::ZERO), "drained: quiet again");
}

#[test]
fn the_watched_peers_death_makes_the_set_readable() {
    let ch = channel("death");
    let mut r = Readiness::new(&ch, End::Consumer(1)).unwrap();
    r.drain();
    let (mut child, id) = crate::process::sleeping_child();
    assert!(r.watch(&id));
    assert!(r.watch(&id), "watching it again changes nothing");
    assert!(!readable(r.as_fd(), Duration::from_millis(20)));
    child.kill().unwrap();
    assert!(
        readable(r.as_fd(), Duration::from_secs(5)),
        "the death woke it"
    );
    child.wait().unwrap();
}

#[test]
fn watching_a_dead_or_reused_pid_says_so() {
    let ch = channel("dead");
    let mut r = Readiness::new(&ch, End::Producer).unwrap();
    let (mut child, id) = crate::process::sleeping_child();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!r.watch(&id), "a reaped child");
    let me = ProcessIdentity::current();
    let reused = ProcessIdentity::from_parts(me.pid(), me.start_time() + 1);
    assert!(
        !r.watch(&reused),
        "this pid, another start: not this process"
    );
    assert!(r.watch(&me));
}
