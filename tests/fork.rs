//! A child forked without `exec` never acts for its parent. The child inherits the memory of
//! every object — regions, lease tables and leases, the export registry (and its `atexit`
//! hook), barrier seats, channel ends, GPU buffers — and then ends by every path: dropping what
//! it inherited and exiting (`exit` runs the `atexit` hooks), `process::exit` with everything
//! still alive, or dropping and dying by `SIGKILL`. Afterwards the parent's objects must be
//! intact: the region still named, its lease still held, its registry tables still there, its
//! barrier seat still taken, its channel still open, its listener's socket file still there,
//! its export still opening in another process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use common::{gpu, pattern, report, shm_exists, spawn, unique_name, watchdog};
use cuda_ipc::__private::{channel, lease, registry};
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{HandleType, ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};

#[derive(ShmSafe)]
#[repr(C)]
struct Handoff {
    handle: ShmCell<IpcMemHandle<u32>>,
}

const LEN: usize = 4096;

#[test]
fn child_process() {
    common::child_main(|role, args| {
        assert_eq!(role, "open_and_read");
        let region = ShmOptions::new(&args[0]).open::<Handoff>().unwrap();
        let ctx = gpu();
        let buf = ImportedBuffer::open(&ctx, &region.handle.load()).unwrap();
        let mut host = vec![0u32; LEN];
        buf.copy_to_host(&mut host).unwrap();
        assert_eq!(host, pattern(LEN, 31), "the importer read wrong data");
        report("read");
        0
    });
}

/// How the forked child ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Drop everything inherited, then `exit(0)` (what returning from `main` does).
    DropThenExit,
    /// `std::process::exit(0)` with everything still alive (no drops; `atexit` hooks run).
    ExitHoldingAll,
    /// Drop everything inherited, then die by `SIGKILL` (no `atexit`).
    DropThenKill,
}

const ENDS: [End; 3] = [End::DropThenExit, End::ExitHoldingAll, End::DropThenKill];

/// Fork; in the child, run `drop_all` or not as `end` says, then end; in the parent, reap the
/// child and check that it ended as told.
fn fork_and_end(end: End, drop_all: impl FnOnce()) {
    // SAFETY: the child only drops objects (which, in a forked child, return at once without
    // a lock the parent's other threads could hold, but the allocator's, which glibc resets
    // across fork) and exits; it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        match end {
            End::DropThenExit => {
                drop_all();
                std::process::exit(0);
            }
            End::ExitHoldingAll => std::process::exit(0),
            End::DropThenKill => {
                drop_all();
                // SAFETY: kill(2) on ourselves; never returns.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                std::process::exit(3);
            }
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a valid out pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid");
    match end {
        End::DropThenKill => assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
            "{end:?}: child status {status:#x}"
        ),
        _ => assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{end:?}: child status {status:#x}"
        ),
    }
}

/// In the forked child: run `value`'s destructor on the child's copy, as the child dropping
/// what it inherited does. The child never touches `value` again (it exits next), and the
/// parent's copy is its own memory.
fn drop_inherited<T>(value: &T) {
    // SAFETY: see above: the child's copy is dropped once and never used after.
    unsafe { std::ptr::drop_in_place(std::ptr::from_ref(value).cast_mut()) };
}

#[derive(ShmSafe)]
#[repr(C)]
struct Seats {
    barrier: BarrierState,
}

/// Forks happen one at a time in this binary (each test forks while the others' threads run;
/// keep the windows apart).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn a_forked_child_leaves_the_parents_region_lease_table_and_lease_alone() {
    let _dog = watchdog("fork: region and lease", Duration::from_secs(60));
    let _one = one_at_a_time();
    for (k, end) in ENDS.into_iter().enumerate() {
        let name = unique_name("fork-region");
        let region = ShmOptions::new(&name).create::<AtomicU32>().unwrap();
        let mut token = [0u8; 16];
        token[..4].copy_from_slice(&std::process::id().to_le_bytes());
        token[4] = k as u8;
        token[5..].copy_from_slice(b"fork-leases");
        let export = lease::Export::create(&token).unwrap();
        let held = lease::Held::acquire(&token).unwrap();
        assert_eq!(export.holders(), vec![std::process::id()]);
        fork_and_end(end, || {
            drop_inherited(&held);
            drop_inherited(&export);
            drop_inherited(&region);
        });
        assert!(shm_exists(&name), "{end:?}: the child unlinked the region");
        assert!(
            shm_exists(&lease::table_name(&token)),
            "{end:?}: the child unlinked the lease table"
        );
        assert_eq!(
            export.holders(),
            vec![std::process::id()],
            "{end:?}: the child released the parent's lease"
        );
        drop(held);
        assert!(export.close_and_wait(Duration::from_secs(5)).is_empty());
        drop(export);
        drop(region);
        assert!(!shm_exists(&name), "the parent unlinks its own region");
    }
}

#[test]
fn a_forked_child_leaves_the_parents_export_registry_alone() {
    let _dog = watchdog("fork: registry", Duration::from_secs(60));
    let _one = one_at_a_time();
    for end in ENDS {
        let record = registry::Export::publish().unwrap();
        let names = registry::names();
        assert_eq!(names.len(), 2, "the registry's two tables");
        fork_and_end(end, || drop_inherited(&record));
        for n in &names {
            assert!(
                shm_exists(n),
                "{end:?}: the child removed the registry's {n}"
            );
        }
        // The parent's export still admits an importer (a handle of a retired or unlinked
        // export would be refused as stale).
        let record = registry::Export::publish().unwrap();
        let me = cuda_ipc::ProcessIdentity::current();
        let held = registry::enter_pausing(&record.token(), record.generation(), me, || {});
        assert!(
            held.is_ok(),
            "{end:?}: the registry refused: {:?}",
            held.err()
        );
    }
}

#[test]
fn a_forked_child_neither_leaves_nor_arrives_at_the_parents_barrier_seat() {
    let _dog = watchdog("fork: barrier", Duration::from_secs(60));
    let _one = one_at_a_time();
    for end in ENDS {
        let seats = ShmOptions::new(unique_name("fork-barrier"))
            .create_with(|s: &Seats| s.barrier.init(2))
            .unwrap();
        let s = seats.get();
        let mine = ProcessBarrier::join(&s.barrier).unwrap();
        fork_and_end(end, || {
            let inherited = mine.wait_timeout(Duration::from_millis(10));
            if !matches!(inherited, Err(cuda_ipc::Error::InvalidState { .. })) {
                std::process::exit(4); // arrived for the parent
            }
            drop_inherited(&mine);
        });
        let r = std::thread::scope(|scope| {
            let other = scope.spawn(|| {
                let b = ProcessBarrier::join(&s.barrier).unwrap();
                b.wait_timeout(Duration::from_secs(10)).map(|_| ())
            });
            let mine = mine.wait_timeout(Duration::from_secs(10)).map(|_| ());
            (mine, other.join().unwrap())
        });
        assert!(
            r.0.is_ok() && r.1.is_ok(),
            "{end:?}: the child left the parent's seat: {r:?}"
        );
    }
}

#[test]
fn a_forked_child_leaves_the_parents_channel_ends_alone() {
    let _dog = watchdog("fork: channel", Duration::from_secs(60));
    let _one = one_at_a_time();
    for end in ENDS {
        let mut producer = channel::HostProducer::create(2, 16).unwrap();
        let mut consumer =
            channel::HostConsumer::open_pausing(producer.name(), 2, 16, || {}).unwrap();
        // Both ends listen: their bells are socket files the child must not remove.
        producer.listen().unwrap();
        consumer.listen().unwrap();
        let id = producer.name()["cuda-ipc-chan".len()..].to_owned();
        let bells = || {
            let mut b: Vec<String> = common::shm_entries("cuda-ipc-bell.")
                .into_iter()
                .filter(|n| n.contains(&id))
                .collect();
            b.sort();
            b
        };
        let before = bells();
        assert_eq!(before.len(), 2, "{before:?}");
        fork_and_end(end, || {
            drop_inherited(&consumer);
            drop_inherited(&producer);
        });
        assert_eq!(
            bells(),
            before,
            "{end:?}: the child removed its parent's bells"
        );
        producer.acquire(Duration::from_secs(5)).unwrap();
        producer.send(7).unwrap();
        let got = consumer.recv(Duration::from_secs(5));
        assert!(
            matches!(got, Ok((_, 7))),
            "{end:?}: the channel was closed by the child: {got:?}"
        );
        consumer.release().unwrap();
    }
}

#[test]
fn a_forked_child_leaves_the_parents_socket_file_alone() {
    use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
    let _dog = watchdog("fork: listener", Duration::from_secs(60));
    let _one = one_at_a_time();
    let t = Duration::from_secs(10);
    for end in ENDS {
        let path = std::env::temp_dir().join(format!("{}.sock", unique_name("fork-listener")));
        let name = SocketName::Path(path.clone());
        let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
        fork_and_end(end, || drop_inherited(&listener));
        assert!(
            path.exists(),
            "{end:?}: the child unlinked the parent's socket file"
        );
        let client = FdSocket::connect(&name, &PeerPolicy::SameUid, t);
        assert!(client.is_ok(), "{end:?}: {client:?}");
        let server = listener.accept(t).unwrap();
        client.unwrap().send(b"still here", &[], t).unwrap();
        assert_eq!(server.recv(t).unwrap().payload, b"still here", "{end:?}");
        drop(listener);
        assert!(!path.exists(), "the parent unlinks its own socket file");
    }
}

/// The GPU half: a buffer exported (legacy and POSIX-fd), then a forked child that ends by each
/// path; a new importer in another process must still open the export and read its data. The
/// child's exit once ran the registry's `atexit` hook, which unlinked the parent's
/// registry: the open failed with `StaleHandle`.
#[test]
#[ignore = "requires a CUDA device"]
fn a_forked_child_leaves_the_parents_gpu_exports_openable() {
    let _dog = watchdog("fork: gpu exports", Duration::from_secs(120));
    let _one = one_at_a_time();
    let ctx = gpu();
    for kind in [HandleType::Legacy, HandleType::PosixFd] {
        for end in ENDS {
            let buf = IpcBuffer::<u32>::new_with(&ctx, LEN, kind).unwrap();
            buf.copy_from_host(&pattern(LEN, 31)).unwrap();
            let region = ShmOptions::new(unique_name("fork-gpu"))
                .create::<Handoff>()
                .unwrap();
            if kind == HandleType::Legacy {
                region.handle.store(buf.handle().unwrap());
            }
            fork_and_end(end, || drop_inherited(&buf));
            if kind == HandleType::PosixFd {
                // The registry is what a forked child's exit removed; a POSIX-fd export
                // travels with its descriptor, so check the registry through a new legacy
                // export of the same process instead.
                let legacy = IpcBuffer::<u32>::new(&ctx, LEN).unwrap();
                legacy.copy_from_host(&pattern(LEN, 31)).unwrap();
                region.handle.store(legacy.handle().unwrap());
                let got = spawn("open_and_read", &[region.name()])
                    .expect_success(Duration::from_secs(60));
                assert_eq!(got, vec!["read"], "{kind:?} {end:?}");
                continue;
            }
            let got =
                spawn("open_and_read", &[region.name()]).expect_success(Duration::from_secs(60));
            assert_eq!(got, vec!["read"], "{kind:?} {end:?}");
            let mut host = vec![0u32; LEN];
            buf.copy_to_host(&mut host).unwrap();
            assert_eq!(host, pattern(LEN, 31), "the parent's buffer changed");
        }
    }
}

#[test]
fn a_forked_child_is_its_own_process_identity_not_its_parents_cached_one() {
    let _dog = watchdog("fork: identity", Duration::from_secs(60));
    let _one = one_at_a_time();
    let parent = cuda_ipc::ProcessIdentity::current(); // warm the cache
    fork_and_end(End::DropThenExit, || {
        let me = cuda_ipc::ProcessIdentity::current();
        // SAFETY: getpid(2) has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        if me.pid() != pid || me.is_same_process(&parent) || !me.is_alive() {
            std::process::exit(1); // the parent's assertion on the status reports it
        }
    });
    assert_eq!(cuda_ipc::ProcessIdentity::current(), parent);
}
