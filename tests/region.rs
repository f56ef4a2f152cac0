//! ShmRegion across processes, and every way an open must refuse a region: another uid's,
//! loose permissions, a symlink, a wrong size, each header field corrupted, an unpublished
//! header.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{report, shm_exists, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::error::NameDefect;
use cuda_ipc::shm::{HeaderFields, ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, ShmSafe};

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    ready: AtomicU32,
    echoed: AtomicU32,
    values: ShmCell<[u64; 4]>,
    reply: ShmCell<[u64; 4]>,
}

const HEADER_LEN: usize = 128;

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        "echo" => {
            let region = ShmOptions::new(&args[0]).open::<Shared>().expect("open");
            assert_eq!(region.ready.load(Ordering::Acquire), 1);
            let v = region.values.load();
            region.reply.store(v.map(|x| x * 2));
            region.echoed.store(1, Ordering::Release);
            0
        }
        "create_as_nobody" => {
            // SAFETY: plain setgid/setuid calls in a freshly exec'd single-purpose child.
            let ok = unsafe { libc::setgid(65534) == 0 && libc::setuid(65534) == 0 };
            assert!(ok, "drop to uid 65534");
            let mut region = ShmOptions::new(&args[0])
                .create::<Shared>()
                .expect("create as nobody");
            region.release_ownership(); // leave it behind, as a squatter would
            0
        }
        "create_with_umask" => {
            let mask = u32::from_str_radix(&args[1], 8).unwrap();
            rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask));
            let region = ShmOptions::new(&args[0])
                .create::<Shared>()
                .expect("create");
            let mode = std::fs::metadata(format!("/dev/shm/{}", region.name()))
                .unwrap()
                .permissions()
                .mode();
            report(format!("mode={:o}", mode & 0o7777));
            0
        }
        "create_and_hang" => {
            let _ = ShmOptions::new(&args[0]).create_with(|_: &Shared| {
                std::thread::sleep(Duration::from_secs(50));
                Ok(())
            });
            1
        }
        "create_named_and_leave" => {
            // A region under one of the crate's prefixes, left behind as a killed process leaves one.
            let mut region = ShmOptions::new(&args[0])
                .create::<AtomicU64>()
                .expect("create");
            region.release_ownership();
            0
        }
        "create_and_leave" => {
            let mut region = ShmOptions::new(&args[0])
                .create::<Shared>()
                .expect("create");
            region.release_ownership();
            0
        }
        other => panic!("unknown role {other}"),
    });
}

#[test]
fn round_trip_across_processes() {
    let _dog = watchdog("round_trip", Duration::from_secs(30));
    let region = ShmOptions::new(unique_name("rt"))
        .random_suffix(true)
        .create_with(|s: &Shared| {
            s.values.store([1, 2, 3, u64::MAX / 2]);
            s.ready.store(1, Ordering::Release);
            Ok(())
        })
        .unwrap();
    assert!(region.is_owner());
    assert_eq!(region.creator().pid(), std::process::id());
    spawn("echo", &[region.name()]).expect_success(Duration::from_secs(20));
    assert_eq!(region.echoed.load(Ordering::Acquire), 1);
    assert_eq!(region.reply.load(), [2, 4, 6, u64::MAX - 1]);
    let name = region.name().to_owned();
    assert!(shm_exists(&name));
    drop(region);
    assert!(!shm_exists(&name), "the owner unlinks on drop");
}

#[test]
fn random_suffix_names_differ_and_are_valid() {
    let a = ShmOptions::new("/rs")
        .random_suffix(true)
        .create::<AtomicU64>()
        .unwrap();
    let b = ShmOptions::new("/rs")
        .random_suffix(true)
        .create::<AtomicU64>()
        .unwrap();
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with("rs.") && a.name().len() == 3 + 16);
    let too_long = "x".repeat(255 - 16);
    assert!(matches!(
        ShmOptions::new(too_long)
            .random_suffix(true)
            .create::<AtomicU64>(),
        Err(Error::InvalidName {
            defect: NameDefect::TooLong { len: 239, max: 238 },
            ..
        })
    ));
}

#[test]
fn existing_name_is_never_reused() {
    let name = unique_name("exists");
    let _first = ShmRegion::<Shared>::create(&name).unwrap();
    assert!(matches!(
        ShmRegion::<Shared>::create(&name),
        Err(Error::AlreadyExists { .. })
    ));
}

#[test]
fn open_missing_region_is_not_found() {
    assert!(matches!(
        ShmRegion::<Shared>::open(&unique_name("missing")),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn region_of_another_uid_is_refused() {
    if rustix::process::geteuid().as_raw() != 0 {
        common::skip(
            "a region of another uid",
            "needs root to create a region as uid 65534 (CI runs as root)",
        );
        return;
    }
    let _dog = watchdog("other_uid", Duration::from_secs(30));
    let name = unique_name("squat");
    spawn("create_as_nobody", &[&name]).expect_success(Duration::from_secs(20));
    assert!(matches!(
        ShmRegion::<Shared>::open(&name),
        Err(Error::WrongOwner {
            found: 65534,
            expected: 0,
            ..
        })
    ));
    assert!(matches!(
        ShmRegion::<Shared>::create(&name),
        Err(Error::AlreadyExists { .. })
    ));
    // Not ours: reclaiming refuses too, whatever its creator's state.
    assert!(matches!(
        cuda_ipc::shm::reclaim_stale(&name),
        Err(Error::WrongOwner { .. })
    ));
    cuda_ipc::shm::unlink(&name).unwrap();
}

#[test]
fn loose_permissions_are_refused() {
    let region = ShmRegion::<Shared>::create(&unique_name("perm")).unwrap();
    let path = format!("/dev/shm/{}", region.name());
    for mode in [0o640, 0o604, 0o660, 0o666] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match ShmRegion::<Shared>::open(region.name()) {
            Err(Error::InsecurePermissions { mode: found, .. }) => assert_eq!(found, mode),
            other => panic!("mode {mode:o}: {other:?}"),
        }
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    ShmRegion::<Shared>::open(region.name()).unwrap();
}

#[test]
fn symlinks_are_never_followed() {
    let target = ShmRegion::<Shared>::create(&unique_name("target")).unwrap();
    let link = unique_name("link");
    std::os::unix::fs::symlink(
        format!("/dev/shm/{}", target.name()),
        format!("/dev/shm/{link}"),
    )
    .unwrap();
    assert!(matches!(
        ShmRegion::<Shared>::open(&link),
        Err(Error::Symlink { .. })
    ));
    assert!(matches!(
        ShmRegion::<Shared>::create(&link),
        Err(Error::AlreadyExists { .. })
    ));
    std::fs::remove_file(format!("/dev/shm/{link}")).unwrap();
}

#[test]
fn non_regular_file_is_refused() {
    let name = unique_name("dir");
    std::fs::create_dir(format!("/dev/shm/{name}")).unwrap();
    let r = ShmRegion::<Shared>::open(&name);
    std::fs::remove_dir(format!("/dev/shm/{name}")).unwrap();
    // open(O_RDWR) on a directory fails with EISDIR before fstat sees it.
    assert!(
        matches!(
            r,
            Err(Error::NotRegularFile { .. }) | Err(Error::Os { call: "open", .. })
        ),
        "{r:?}"
    );
}

#[test]
fn wrong_file_size_is_refused() {
    let region = ShmRegion::<Shared>::create(&unique_name("size")).unwrap();
    let path = format!("/dev/shm/{}", region.name());
    let len = std::fs::metadata(&path).unwrap().len();
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len + 4096).unwrap();
    match ShmRegion::<Shared>::open(region.name()) {
        Err(Error::SizeMismatch {
            expected, found, ..
        }) => {
            assert_eq!((expected, found), (len, len + 4096))
        }
        other => panic!("{other:?}"),
    }
    file.set_len(64).unwrap();
    assert!(matches!(
        ShmRegion::<Shared>::open(region.name()),
        Err(Error::SizeMismatch { found: 64, .. })
    ));
}

#[test]
fn opening_as_another_type_is_refused() {
    let region = ShmRegion::<Shared>::create(&unique_name("type")).unwrap();
    match ShmRegion::<AtomicU64>::open(region.name()) {
        Err(Error::HeaderMismatch { field, .. }) => assert_eq!(field, "payload_size"),
        other => panic!("{other:?}"),
    }
    // Same size and alignment, different type: the tag tells them apart.
    #[derive(ShmSafe)]
    #[repr(C)]
    struct Twin {
        a: AtomicU32,
        b: AtomicU32,
        c: ShmCell<[u64; 4]>,
        d: ShmCell<[u64; 4]>,
    }
    match ShmRegion::<Twin>::open(region.name()) {
        Err(Error::HeaderMismatch { field, .. }) => assert_eq!(field, "type_tag"),
        other => panic!("{other:?}"),
    }
}

/// Overwrite the header in place, as a buggy or hostile peer could.
fn write_header(name: &str, bytes: &[u8; HEADER_LEN]) {
    let mut f = OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{name}"))
        .unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn each_corrupted_header_field_is_named() {
    type Corruption = fn(&mut HeaderFields);
    let region = ShmRegion::<Shared>::create(&unique_name("hdr")).unwrap();
    let good = region.header_fields();
    let cases: [(&str, Corruption); 10] = [
        ("magic", |f| f.magic = u64::from_le_bytes(*b"notmagic")),
        ("version", |f| f.version += 1),
        ("header_len", |f| f.header_len = 256),
        ("payload_offset", |f| f.payload_offset = 4096),
        ("payload_align", |f| f.payload_align = 4),
        ("payload_size", |f| f.payload_size += 8),
        ("type_tag", |f| f.type_tag ^= 0xff),
        ("total_len", |f| f.total_len += 1),
        ("reserved", |f| f.reserved = 1),
        ("checksum", |f| f.creator_pid ^= 1),
    ];
    for (field, corrupt) in cases {
        let mut f = good;
        corrupt(&mut f);
        if field != "checksum" {
            f.checksum = f.compute_checksum();
        }
        write_header(region.name(), &f.encode());
        let err = ShmRegion::<Shared>::open(region.name()).unwrap_err();
        let named = match &err {
            Error::HeaderMismatch { field, .. } => *field,
            Error::SizeMismatch { .. } => "total_len",
            other => panic!("{field}: {other:?}"),
        };
        assert_eq!(named, field, "{err}");
    }
    write_header(region.name(), &good.encode());
    ShmRegion::<Shared>::open(region.name()).unwrap();
}

#[test]
fn unpublished_header_gives_not_ready_and_a_dead_creator_is_noticed() {
    let _dog = watchdog("not_ready", Duration::from_secs(40));
    let name = unique_name("unpub");
    let creator = spawn("create_and_hang", &[&name]);
    wait_for("region file", Duration::from_secs(20), || shm_exists(&name));
    // Creator alive but not publishing: NotReady after the open timeout.
    let r = ShmOptions::new(&name)
        .open_timeout(Duration::from_millis(100))
        .open::<Shared>();
    match r {
        Err(Error::NotReady {
            creator_dead: false,
            waited,
            ..
        }) => {
            assert!(waited >= Duration::from_millis(100))
        }
        other => panic!("{other:?}"),
    }
    creator.signal(libc::SIGKILL);
    let _ = creator.wait(Duration::from_secs(10));
    // Creator dead: NotReady at once, whatever the timeout.
    let r = ShmOptions::new(&name)
        .open_timeout(Duration::from_secs(30))
        .open::<Shared>();
    match r {
        Err(Error::NotReady {
            creator_dead: true,
            waited,
            ..
        }) => {
            assert!(waited < Duration::from_secs(30))
        }
        other => panic!("{other:?}"),
    }
    // And the stale name can be reclaimed.
    assert!(cuda_ipc::shm::reclaim_stale(&name).unwrap());
    assert!(!shm_exists(&name));
}

/// Between the creator's exclusive `open` and its `fallocate` the file is
/// empty. Once an open in that window returned `SizeMismatch { found: 0 }` at once (81
/// of 400 racing opens); it must wait, within the open timeout, like an unpublished header.
#[test]
fn an_open_racing_a_create_waits_instead_of_failing() {
    let _dog = watchdog("open_races_create", Duration::from_secs(60));
    // The window itself, held open: an empty 0600 file is "not ready", not "wrong size".
    let name = unique_name("empty");
    let path = format!("/dev/shm/{name}");
    std::fs::File::create(&path).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = ShmOptions::new(&name)
        .open_timeout(Duration::from_millis(50))
        .open::<Shared>();
    assert!(
        matches!(
            r,
            Err(Error::NotReady {
                creator_dead: false,
                ..
            })
        ),
        "{r:?}"
    );
    std::fs::remove_file(&path).unwrap();
    // And the race: 400 opens, each started while a thread creates the region.
    for i in 0..400 {
        let name = unique_name("race");
        std::thread::scope(|s| {
            let creator = s.spawn(|| {
                if i % 2 == 0 {
                    std::thread::yield_now();
                }
                ShmOptions::new(&name).create::<Shared>().unwrap()
            });
            loop {
                match ShmOptions::new(&name).open::<Shared>() {
                    Ok(_) => break,
                    Err(Error::NotFound { .. }) => std::hint::spin_loop(),
                    Err(e) => panic!("open {i} racing a create: {e}"),
                }
            }
            drop(creator.join().unwrap());
        });
    }
}

#[test]
fn umask_never_changes_the_mode() {
    let _dog = watchdog("umask", Duration::from_secs(30));
    for mask in ["0", "077", "277"] {
        let name = unique_name("umask");
        let results =
            spawn("create_with_umask", &[&name, mask]).expect_success(Duration::from_secs(20));
        assert_eq!(results, vec!["mode=600"], "umask {mask}");
        assert!(!shm_exists(&name));
    }
}

#[test]
fn stale_region_of_a_dead_creator_is_reclaimed_on_request() {
    let _dog = watchdog("stale", Duration::from_secs(30));
    let name = unique_name("stale");
    spawn("create_and_leave", &[&name]).expect_success(Duration::from_secs(20));
    assert!(shm_exists(&name));
    assert!(matches!(
        ShmRegion::<Shared>::create(&name),
        Err(Error::AlreadyExists { .. })
    ));
    let region = ShmOptions::new(&name)
        .reclaim_stale(true)
        .create::<Shared>()
        .unwrap();
    assert_eq!(region.creator().pid(), std::process::id());
    // A live creator's region is never reclaimed.
    assert!(!cuda_ipc::shm::reclaim_stale(&name).unwrap());
    assert!(matches!(
        ShmOptions::new(&name)
            .reclaim_stale(true)
            .create::<Shared>(),
        Err(Error::AlreadyExists { .. })
    ));
}

#[test]
fn unlinked_region_keeps_working_and_new_opens_fail() {
    let mut owner = ShmRegion::<Shared>::create(&unique_name("unlinked")).unwrap();
    let user = ShmRegion::<Shared>::open(owner.name()).unwrap();
    owner.unlink().unwrap();
    assert!(!owner.is_owner());
    user.ready.store(7, Ordering::Release);
    assert_eq!(owner.ready.load(Ordering::Acquire), 7);
    assert!(matches!(
        ShmRegion::<Shared>::open(owner.name()),
        Err(Error::NotFound { .. })
    ));
    // A new region under the same name is not the old owner's to unlink.
    let mut owner = owner;
    owner.acquire_ownership();
    let newcomer = ShmRegion::<Shared>::create(owner.name()).unwrap();
    let name = owner.name().to_owned();
    drop(owner);
    assert!(
        shm_exists(&name),
        "drop must not unlink a stranger's region"
    );
    drop(newcomer);
    assert!(!shm_exists(&name));
}

#[test]
fn ownership_can_be_handed_over() {
    let mut creator = ShmRegion::<Shared>::create(&unique_name("handover")).unwrap();
    let mut heir = ShmRegion::<Shared>::open(creator.name()).unwrap();
    assert!(!heir.is_owner());
    assert!(creator.release_ownership());
    heir.acquire_ownership();
    let name = creator.name().to_owned();
    drop(creator);
    assert!(shm_exists(&name));
    heir.close().unwrap();
    assert!(!shm_exists(&name));
}

#[test]
fn invalid_names_fail_before_any_syscall() {
    let long = "n".repeat(300);
    for (bad, rule) in [
        ("", NameDefect::Empty),
        ("a/b", NameDefect::Slash),
        ("x\0y", NameDefect::Nul),
        ("..", NameDefect::Dots),
        (long.as_str(), NameDefect::TooLong { len: 300, max: 255 }),
    ] {
        for result in [
            ShmRegion::<Shared>::create(bad).map(drop),
            ShmRegion::<Shared>::open(bad).map(drop),
        ] {
            match result {
                Err(Error::InvalidName { defect, .. }) => assert_eq!(defect, rule, "{bad:?}"),
                other => panic!("{bad:?}: expected InvalidName, got {other:?}"),
            }
        }
    }
}

#[test]
fn regions_of_dead_processes_are_reclaimed() {
    let _dog = watchdog("reclaim regions", Duration::from_secs(30));
    // One of each kind the sweep covers: a lease table, a block table, a channel region.
    let dead: Vec<String> = ["cuda-ipc-lease.", "cuda-ipc-arena.", "cuda-ipc-chan."]
        .iter()
        .map(|prefix| format!("{prefix}{}", unique_name("dead")))
        .collect();
    for name in &dead {
        spawn("create_named_and_leave", &[name]).expect_success(Duration::from_secs(20));
        assert!(shm_exists(name));
    }
    // A live process's regions (ours) must survive.
    let live: Vec<ShmRegion<AtomicU64>> = ["cuda-ipc-lease.", "cuda-ipc-chan."]
        .iter()
        .map(|prefix| ShmRegion::create(&format!("{prefix}{}", unique_name("live"))).unwrap())
        .collect();
    let removed = cuda_ipc::shm::reclaim_stale_regions();
    assert!(removed >= 3, "removed {removed}");
    for name in &dead {
        assert!(!shm_exists(name), "a dead process's {name} is gone");
    }
    for region in &live {
        assert!(
            shm_exists(region.name()),
            "a live process's {} stays",
            region.name()
        );
    }
}
