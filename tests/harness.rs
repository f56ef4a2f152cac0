//! The multi-process harness judges children strictly: a stress test accepts exit 0 or death
//! by `SIGKILL`, and nothing else — a crash (`SIGSEGV`, `SIGBUS`, `SIGABRT`) or a panic (exit
//! 101) of a child reading hostile shared state must fail the test that started it. The
//! harness once accepted death by any signal and some stress tests threw the
//! statuses away.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::{Crew, exited_or_killed, spawn};

#[test]
fn child_process() {
    common::child_main(|role, _| match role {
        "exit0" => 0,
        "panic" => panic!("a child's panic"),
        "segv" => {
            // SAFETY: raise(3) on ourselves: the process dies of SIGSEGV, as a crash would.
            unsafe { libc::raise(libc::SIGSEGV) };
            3
        }
        "abort" => std::process::abort(),
        "sleep" => {
            std::thread::sleep(Duration::from_secs(30));
            0
        }
        other => panic!("unknown role {other}"),
    });
}

const T: Duration = Duration::from_secs(30);

#[test]
fn only_exit_zero_and_sigkill_count_as_an_expected_end() {
    for (role, expected) in [
        ("exit0", true),
        ("panic", false),
        ("segv", false),
        ("abort", false),
    ] {
        let (status, _) = spawn(role, &[]).wait(T);
        assert_eq!(exited_or_killed(status), expected, "{role}: {status}");
    }
    let sleeper = spawn("sleep", &[]);
    sleeper.signal(libc::SIGKILL);
    let (status, _) = sleeper.wait(T);
    assert!(exited_or_killed(status), "killed by our SIGKILL: {status}");
}

#[test]
fn a_crew_member_that_crashes_fails_the_test() {
    let crashed = std::panic::catch_unwind(|| {
        let crew = Crew::start(1, "a crashing member", |_| spawn("segv", &[]));
        crew.finish();
    });
    assert!(crashed.is_err(), "a SIGSEGV member passed");
    let fine = std::panic::catch_unwind(|| {
        let mut crew = Crew::start(1, "a member killed by the test", |_| spawn("sleep", &[]));
        crew.kill_and_replace(0);
        crew.kill_and_replace(0);
        assert_eq!(crew.kills, 2);
        // The replacement still sleeps: end it the way a test does.
        drop(crew);
    });
    assert!(fine.is_ok(), "our own SIGKILL counted as a failure");
}
