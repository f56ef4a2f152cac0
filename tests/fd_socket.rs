//! Passing file descriptors between real processes over `FdListener` / `FdSocket`: a
//! descriptor and its contents across (both ways), a peer that never sends, a killed peer,
//! peers of another uid refused on both sides (connector, and a listener squatting a name),
//! path sockets (0600, unlinked), bad sends, and no descriptor leaked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{NOBODY, drop_privileges, fd_count, is_root, report, spawn, unique_name, watchdog};
use cuda_ipc::Error;
use cuda_ipc::error::ArgumentDefect;
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};

const MAX_FDS: usize = FdSocket::MAX_FDS;
const MAX_PAYLOAD: usize = FdSocket::MAX_PAYLOAD;

fn memfd_with(text: &str) -> std::fs::File {
    let name = std::ffi::CString::new("cuda-ipc-test").unwrap();
    // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh fd we own.
    let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn read_all(fd: OwnedFd) -> String {
    let mut file = std::fs::File::from(fd);
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    file.read_to_string(&mut s).unwrap();
    s
}

/// A fresh abstract socket name, and its text (what a child role is given).
fn abstract_name(what: &str) -> (SocketName, String) {
    let raw = unique_name(what);
    (SocketName::Abstract(raw.clone()), raw)
}

const T: Duration = Duration::from_secs(10);

/// Whether some process listens at the abstract name `raw` (`/proc/net/unix` lists it as
/// `@raw`).
fn abstract_bound(raw: &str) -> bool {
    let want = format!(" @{raw}");
    std::fs::read_to_string("/proc/net/unix")
        .is_ok_and(|table| table.lines().any(|l| l.ends_with(&want)))
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let name = SocketName::Abstract(args.first().cloned().unwrap_or_default());
        match role {
            "receive_fd" => {
                let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
                let msg = s.recv(T).unwrap();
                assert_eq!(msg.payload, b"a file for you");
                assert_eq!(msg.fds.len(), 1);
                let text = read_all(msg.fds.into_iter().next().unwrap());
                // And one back.
                let reply = memfd_with(&format!("child read: {text}"));
                s.send(b"and one for you", &[reply.as_fd()], T).unwrap();
                // Wait for the parent to close (so the reply is not lost with our exit).
                assert!(matches!(s.recv(T), Err(Error::PeerClosed { .. })));
                0
            }
            "connect_and_sleep" => {
                let _s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
                report("connected");
                std::thread::sleep(Duration::from_secs(30));
                0
            }
            "nobody_connects" => {
                drop_privileges();
                // The listener is root's: this side refuses it too.
                match FdSocket::connect(&name, &PeerPolicy::SameUid, T) {
                    Err(Error::PeerRefused { uid, .. }) => report(format!("refused uid {uid}")),
                    other => report(format!("unexpected {other:?}")),
                }
                0
            }
            "nobody_squats" => {
                drop_privileges();
                let listener = FdListener::bind(name, PeerPolicy::Anyone).unwrap();
                report("listening");
                // Accept the parent's connection attempt (it must refuse us), then leave.
                let _ = listener.accept(T);
                std::thread::sleep(Duration::from_millis(500));
                0
            }
            "listen_and_report_peer" => {
                // In a pid namespace of its own: the connecting parent's pid is not visible.
                let listener = FdListener::bind(name, PeerPolicy::SameUid).unwrap();
                let s = listener.accept(T).unwrap();
                report(format!("peer pid {}", s.peer().pid));
                let _ = s.recv(T); // until the parent closes
                0
            }
            "hold_memfd" => {
                let _file = memfd_with("taken, not sent");
                std::thread::sleep(Duration::from_secs(30));
                0
            }
            "nobody_takes" => {
                // args[0]: the (root) parent's pid, args[1]: one of its descriptors.
                let (pid, fd) = (args[0].parse().unwrap(), args[1].parse().unwrap());
                drop_privileges();
                match cuda_ipc::fd::take_fd_from_process(pid, fd) {
                    Err(Error::PtraceDenied { pid: p }) => report(format!("denied {p}")),
                    other => report(format!("unexpected {other:?}")),
                }
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// One exchange: a memfd to a child, which reads it and sends one back.
fn exchange(listener: &FdListener, raw: &str) {
    let child = spawn("receive_fd", &[raw]);
    let s = listener.accept(T).unwrap();
    assert_eq!(s.peer().pid, child.pid());
    let file = memfd_with("hello across processes");
    s.send(b"a file for you", &[file.as_fd()], T).unwrap();
    drop(file); // the child holds its own copy of the descriptor now
    let msg = s.recv(T).unwrap();
    assert_eq!(msg.payload, b"and one for you");
    let text = read_all(msg.fds.into_iter().next().unwrap());
    assert_eq!(text, "child read: hello across processes");
    drop(s);
    child.expect_success(T);
}

#[test]
fn a_descriptor_and_its_contents_cross_both_ways() {
    let _dog = watchdog("fd_cross", Duration::from_secs(60));
    let (name, raw) = abstract_name("fd-cross");
    let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    exchange(&listener, &raw);
    // No descriptor leaked per exchange (other tests of this binary run in parallel and hold
    // a few of their own, hence the margin; a leak would grow with the count).
    let before = fd_count();
    for _ in 0..20 {
        exchange(&listener, &raw);
    }
    let after = fd_count();
    assert!(
        after < before + 8,
        "descriptors leaked: {before} -> {after} over 20 exchanges"
    );
}

#[test]
fn a_peer_that_never_sends_is_a_bounded_timeout_and_a_killed_one_is_peer_closed() {
    let _dog = watchdog("fd_silent", Duration::from_secs(60));
    let (name, raw) = abstract_name("fd-silent");
    let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    let child = spawn("connect_and_sleep", &[&raw]);
    let s = listener.accept(T).unwrap();
    let t = Instant::now();
    assert!(matches!(
        s.recv(Duration::from_millis(200)),
        Err(Error::Timeout { .. })
    ));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let pid = child.pid();
    child.signal(libc::SIGKILL);
    let t = Instant::now();
    match s.recv(T) {
        Err(Error::PeerClosed { pid: p }) => assert_eq!(p, pid),
        other => panic!("expected PeerClosed, got {other:?}"),
    }
    eprintln!("fd socket: killed peer seen after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(matches!(
        s.send(b"anyone?", &[], T),
        Err(Error::PeerClosed { .. })
    ));
    let _ = child.wait(T);
    // Nobody connects: accept is bounded too.
    assert!(matches!(
        listener.accept(Duration::from_millis(100)),
        Err(Error::Timeout { .. })
    ));
}

#[test]
fn peers_of_another_uid_are_refused_on_both_sides() {
    if !is_root() {
        common::skip(
            "fd socket peers of another uid",
            "needs root to start a process of another uid",
        );
        return;
    }
    let _dog = watchdog("fd_other_uid", Duration::from_secs(60));
    // A connector of another uid: the listener refuses it, and it refuses the listener.
    let (name, raw) = abstract_name("fd-uid");
    let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    let child = spawn("nobody_connects", &[&raw]);
    match listener.accept(T) {
        Err(Error::PeerRefused { uid, pid, .. }) => {
            assert_eq!((uid, pid), (NOBODY, child.pid()));
        }
        other => panic!("expected PeerRefused, got {other:?}"),
    }
    assert_eq!(child.expect_success(T), ["refused uid 0".to_string()]);
    // The policy can name the uid.
    let allowed = PeerPolicy::Uids(vec![NOBODY]);
    assert_ne!(allowed, PeerPolicy::SameUid);

    // A name squatted by another uid: binding it fails clearly, and connecting refuses it.
    let (name, raw) = abstract_name("fd-squat");
    let squatter = spawn("nobody_squats", &[&raw]);
    // Watch for the name in /proc/net/unix (a probe by binding it could take the name first
    // and make the squatter's own bind fail: it did, once, on a loaded CI machine).
    common::wait_for("squatter listening", T, || abstract_bound(&raw));
    assert!(matches!(
        FdListener::bind(name.clone(), PeerPolicy::SameUid),
        Err(Error::AddressInUse { .. })
    ));
    match FdSocket::connect(&name, &PeerPolicy::SameUid, T) {
        Err(Error::PeerRefused { uid, .. }) => assert_eq!(uid, NOBODY),
        other => panic!("expected PeerRefused for the squatter, got {other:?}"),
    }
    squatter.expect_success(T);
}

#[test]
fn path_sockets_are_0600_and_unlinked_and_bad_sends_are_refused() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = std::env::temp_dir().join(format!("{}.sock", unique_name("fd-path")));
    let name = SocketName::Path(path.clone());
    let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(matches!(
        FdListener::bind(name.clone(), PeerPolicy::SameUid),
        Err(Error::AddressInUse { .. })
    ));
    let client = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
    let server = listener.accept(T).unwrap();
    assert_eq!(server.peer().pid, std::process::id());
    assert_eq!(client.peer().pid, std::process::id());
    // Bad sends: refused before the kernel is asked.
    assert!(matches!(
        client.send(b"", &[], T),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::OutOfRange {
                value: 0,
                min: 1,
                ..
            },
            ..
        })
    ));
    assert!(matches!(
        client.send(&vec![0; MAX_PAYLOAD + 1], &[], T),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::OutOfRange {
                what: "payload bytes",
                ..
            },
            ..
        })
    ));
    let f = memfd_with("x");
    let many: Vec<_> = (0..=MAX_FDS).map(|_| f.as_fd()).collect();
    assert!(matches!(
        client.send(b"too many", &many, T),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::OutOfRange {
                what: "descriptors",
                ..
            },
            ..
        })
    ));
    // The largest message and the most descriptors do cross.
    client
        .send(&vec![7; MAX_PAYLOAD], &many[..MAX_FDS], T)
        .unwrap();
    let msg = server.recv(T).unwrap();
    assert_eq!((msg.payload.len(), msg.fds.len()), (MAX_PAYLOAD, MAX_FDS));
    drop((client, server, msg));
    drop(listener);
    assert!(!path.exists(), "the socket file is unlinked on drop");
    // Nobody listens (the file is gone): connect waits for a listener, then says so.
    let start = Instant::now();
    let wait = Duration::from_millis(150);
    match FdSocket::connect(&name, &PeerPolicy::SameUid, wait) {
        Err(Error::Timeout { waited, .. }) => assert!(waited >= wait, "{waited:?}"),
        other => panic!("expected a timeout with nobody listening, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// A listener's drop removes the file it bound, not one put at its path since: a same-uid
/// process that unlinked the socket file and bound its own listener there keeps it.
#[test]
fn a_dropped_listener_leaves_a_file_put_at_its_path_since() {
    use std::os::unix::fs::FileTypeExt;
    let path = std::env::temp_dir().join(format!("{}.sock", unique_name("fd-replaced")));
    let name = SocketName::Path(path.clone());
    let first = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    std::fs::remove_file(&path).unwrap();
    let second = FdListener::bind(name.clone(), PeerPolicy::SameUid).unwrap();
    drop(first);
    assert!(
        std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()),
        "the first listener's drop unlinked the second's socket file"
    );
    let client = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
    let server = second.accept(T).unwrap();
    client.send(b"to the second", &[], T).unwrap();
    assert_eq!(server.recv(T).unwrap().payload, b"to the second");
    drop((client, server, second));
    assert!(!path.exists(), "the second listener unlinks its own file");
    // A regular file put there is left alone too.
    let third = FdListener::bind(name, PeerPolicy::SameUid).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"someone else's").unwrap();
    drop(third);
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_connect_made_before_the_listener_binds_waits_for_it() {
    for (label, name) in [
        ("abstract", abstract_name("fd-early").0),
        (
            "path",
            SocketName::Path(
                std::env::temp_dir().join(format!("{}.sock", unique_name("fd-early"))),
            ),
        ),
    ] {
        let bind_after = Duration::from_millis(300);
        let server = {
            let name = name.clone();
            std::thread::spawn(move || {
                std::thread::sleep(bind_after);
                let listener = FdListener::bind(name, PeerPolicy::SameUid).unwrap();
                let s = listener.accept(T).unwrap();
                s.send(b"late but here", &[], T).unwrap();
                // Until the client has read it.
                assert!(matches!(s.recv(T), Err(Error::PeerClosed { .. })));
            })
        };
        let start = Instant::now();
        let client = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
        assert!(
            start.elapsed() >= bind_after / 2,
            "{label}: connected before the bind?"
        );
        assert_eq!(client.peer().pid, std::process::id(), "{label}");
        assert_eq!(client.recv(T).unwrap().payload, b"late but here", "{label}");
        drop(client);
        server.join().unwrap();
        // A zero timeout tries once: nobody listens now.
        assert!(
            matches!(
                FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::ZERO),
                Err(Error::Timeout { .. })
            ),
            "{label}"
        );
    }
}

/// The opt-in `pidfd_getfd` path: with ptrace permission (root here) a child's descriptor is
/// taken without its help; without it (a child of another uid asking root's) it is a clear
/// `PtraceDenied`, and a descriptor number the process does not have is `InvalidArgument`.
#[test]
fn pidfd_getfd_takes_a_descriptor_only_with_ptrace_permission() {
    if !is_root() {
        common::skip(
            "pidfd_getfd_takes_a_descriptor_only_with_ptrace_permission",
            "needs root to show both sides",
        );
        return;
    }
    let _dog = watchdog("pidfd_getfd", Duration::from_secs(60));
    let holder = spawn("hold_memfd", &[]);
    // The child's descriptor number, from /proc (the child stays alive, holding it).
    let fd = {
        let deadline = Instant::now() + T;
        loop {
            let found = std::fs::read_dir(format!("/proc/{}/fd", holder.pid()))
                .into_iter()
                .flatten()
                .flatten()
                .find(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().contains("memfd:cuda-ipc-test"))
                });
            if let Some(e) = found {
                break e.file_name().to_string_lossy().parse::<i32>().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "the child never opened its memfd"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let taken = cuda_ipc::fd::take_fd_from_process(holder.pid(), fd).unwrap();
    assert_eq!(read_all(taken), "taken, not sent");
    assert!(matches!(
        cuda_ipc::fd::take_fd_from_process(holder.pid(), 9999),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::NoSuchDescriptor { fd: 9999, .. },
            ..
        })
    ));
    holder.signal(libc::SIGKILL);
    let _ = holder.wait(T);
    // Another uid asking for one of ours: refused.
    let mine = memfd_with("not yours");
    let raw = std::os::fd::AsRawFd::as_raw_fd(&mine).to_string();
    let out = spawn("nobody_takes", &[&std::process::id().to_string(), &raw]).expect_success(T);
    assert_eq!(out, [format!("denied {}", std::process::id())]);
}

/// A connected pair in this process (the peer check passes: same uid).
fn pair(what: &str) -> (FdSocket, FdSocket) {
    let (listener, raw) = common::fd_listener(what);
    let connector = std::thread::spawn(move || common::fd_connect(&raw));
    let accepted = listener.accept(T).unwrap();
    (accepted, connector.join().unwrap())
}

/// Once `accept`, `connect`, `send` and `recv` computed `Instant::now() + timeout`
/// and panicked on `Duration::MAX`; the crate's other waits accepted it.
#[test]
fn the_longest_timeout_is_a_wait_without_end_not_a_panic() {
    let _dog = watchdog("fd socket, Duration::MAX", Duration::from_secs(30));
    let (listener, raw) = common::fd_listener("max-timeout");
    let name = SocketName::Abstract(raw);
    let connector = std::thread::spawn(move || {
        FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::MAX).unwrap()
    });
    let a = listener.accept(Duration::MAX).unwrap();
    let b = connector.join().unwrap();
    a.send(b"ping", &[], Duration::MAX).unwrap();
    assert_eq!(b.recv(Duration::MAX).unwrap().payload, b"ping");
}

/// A 0-byte `SOCK_SEQPACKET` record while the connection is up: once `recv` said
/// `PeerClosed`, though the next `recv` worked. It is a record no sender of this crate makes
/// (every frame has its version byte): `Corrupt`, and the connection goes on.
#[test]
fn an_empty_record_is_corrupt_not_peer_closed_and_the_next_message_arrives() {
    let _dog = watchdog("fd socket, empty record", Duration::from_secs(30));
    let (a, b) = pair("empty-record");
    rustix::net::send(b.as_fd(), &[], rustix::net::SendFlags::empty()).unwrap();
    match a.recv(T) {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("an empty record read as {other:?}"),
    }
    b.send(b"after", &[], T).unwrap();
    assert_eq!(a.recv(T).unwrap().payload, b"after");
    drop(b);
    assert!(
        matches!(a.recv(T), Err(Error::PeerClosed { .. })),
        "a closed peer is still PeerClosed"
    );
}

/// `PeerCred::pid` is 0 for a peer in a pid namespace this process cannot see (documented):
/// the listener runs in a new pid namespace (`unshare --pid --fork`, as root)
/// and the connector, this process, is outside it. From outside, the listener's pid is seen.
#[test]
fn a_peer_outside_our_pid_namespace_has_pid_zero() {
    if !is_root() {
        common::skip(
            "a_peer_outside_our_pid_namespace_has_pid_zero",
            "needs root (unshare)",
        );
        return;
    }
    let _dog = watchdog("fd socket, pid namespace", Duration::from_secs(60));
    let raw = unique_name("pidns");
    let child = common::spawn_wrapped(
        &["unshare", "--pid", "--fork"],
        "listen_and_report_peer",
        &[&raw],
    );
    let name = SocketName::Abstract(raw);
    // (connect waits for the listener to come up)
    let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T)
        .unwrap_or_else(|e| panic!("the listener in its pid namespace never came up: {e}"));
    assert_ne!(
        s.peer().pid,
        0,
        "from outside, the listener's pid is visible"
    );
    drop(s);
    let lines = child.expect_success(T);
    assert_eq!(lines, ["peer pid 0"], "the peer outside the namespace");
}
