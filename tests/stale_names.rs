//! Every name the crate creates in `/dev/shm` has a reaper: what a `SIGKILL` leaves there,
//! a later process's sweep removes. Here: channel regions — of a one-consumer producer killed
//! before any consumer attached, and of a broadcast producer killed with a consumer attached
//! (its consumers leave the name for later ones) — are removed by the next process that
//! creates a channel, and a live producer's region is left alone. (Lease and block tables:
//! `tests/region.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::{die, report, shm_exists, spawn, watchdog};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};

const T: Duration = Duration::from_secs(30);

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        // Create a channel region (`consumers` entries; with `attach`, a consumer attached
        // from a thread), say its name, and die by SIGKILL.
        "killed_producer" => {
            let consumers: usize = args[0].parse().unwrap();
            let producer = HostProducer::create_with(2, 16, consumers).unwrap();
            let consumer = (args[1] == "attach").then(|| {
                HostConsumer::attach_pausing(producer.name(), 2, 16, consumers, || {}).unwrap()
            });
            report(producer.name());
            std::mem::forget((producer, consumer));
            die()
        }
        // Create this process's first channel (the sweep runs before it), then close it.
        "next_producer" => {
            let producer = HostProducer::create_with(2, 16, 1).unwrap();
            report(producer.name());
            drop(producer);
            0
        }
        other => panic!("unknown role {other}"),
    });
}

/// The region name a killed producer reported.
fn killed_producer(consumers: &str, attach: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let (status, lines) = spawn("killed_producer", &[consumers, attach]).wait(T);
    // By its own SIGKILL, after it reported: a panic (exit 101), the child watchdog (97) or
    // any other signal is a failure of the child, not the death this test means.
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the producer was to die by SIGKILL: {status}"
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines[0].clone()
}

#[test]
fn a_killed_producers_channel_region_is_removed_by_the_next_process_that_makes_a_channel() {
    let _dog = watchdog("stale channel regions", Duration::from_secs(120));
    // A live producer's region (this process's) must survive every sweep.
    let live = HostProducer::create_with(2, 16, 3).unwrap();
    // Each producer's process sweeps before its first channel: the second removes the
    // first's region, the third the second's.
    let unattached = killed_producer("1", "none");
    assert!(
        shm_exists(&unattached),
        "the killed producer's region is there"
    );
    let broadcast = killed_producer("3", "attach");
    assert!(
        shm_exists(&broadcast),
        "the killed producer's region is there"
    );
    assert!(
        !shm_exists(&unattached),
        "a one-consumer producer killed before its consumer attached left {unattached}"
    );
    let made = spawn("next_producer", &[]).expect_success(T);
    assert_eq!(made.len(), 1);
    assert!(
        !shm_exists(&made[0]),
        "the next producer closed its own region"
    );
    assert!(
        !shm_exists(&broadcast),
        "a killed broadcast producer left {broadcast}"
    );
    assert!(
        shm_exists(live.name()),
        "the sweep removed a live producer's region"
    );
}
