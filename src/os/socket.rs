//! Unix-domain `SOCK_SEQPACKET` sockets that carry file descriptors (`SCM_RIGHTS`): the system
//! calls behind [`FdListener`](crate::fd::FdListener) and [`FdSocket`](crate::fd::FdSocket). Every
//! socket is non-blocking and close-on-exec; waits are `poll` with a deadline.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::time::Duration;

use crate::poll::{Backoff, Deadline};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// The most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 16;

/// Where a socket lives: an abstract name (Linux; no file, gone with the socket) or a path.
pub(crate) enum Address<'a> {
    Abstract(&'a [u8]),
    Path(&'a std::path::Path),
}

fn unix_addr(addr: &Address<'_>) -> Result<SocketAddrUnix, Errno> {
    match addr {
        Address::Abstract(name) => SocketAddrUnix::new_abstract_name(name),
        Address::Path(path) => SocketAddrUnix::new(*path),
    }
}

fn seqpacket() -> Result<OwnedFd, Errno> {
    unix(SocketType::SEQPACKET)
}

/// A Unix-domain socket of `kind`, non-blocking and close-on-exec.
pub(crate) fn unix(kind: SocketType) -> Result<OwnedFd, Errno> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        kind,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
}

/// A listening socket bound at `addr`; a path is made `0600` right after the bind, and its
/// file's identity ([`file_id`]) returned with the socket for the unlink at the end. A path
/// bound here is unlinked again if a later step fails.
pub(crate) fn listen(addr: &Address<'_>) -> Result<(OwnedFd, Option<(u64, u64)>), Errno> {
    let fd = seqpacket()?;
    rustix::net::bind(&fd, &unix_addr(addr)?)?;
    let Address::Path(path) = addr else {
        rustix::net::listen(&fd, 16)?;
        return Ok((fd, None));
    };
    let id = file_id(path);
    let made = id.and_then(|id| {
        rustix::fs::chmod(*path, rustix::fs::Mode::from_raw_mode(0o600))?;
        rustix::net::listen(&fd, 16)?;
        Ok(id)
    });
    match made {
        Ok(id) => Ok((fd, Some(id))),
        Err(e) => {
            if let Ok(id) = id {
                let _ = unlink_if_same(path, id);
            }
            Err(e)
        }
    }
}

/// Why [`connect`] gave up.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// Still refused at the deadline for a reason that passes by itself: nobody listening at
    /// the address yet (`ECONNREFUSED`; `ENOENT` for a path) or the listener's backlog full
    /// (`EAGAIN`). `errno` is the last try's, `waited` the time since the first.
    NotYet { errno: Errno, waited: Duration },
    /// Any other failure, at once.
    Failed(Errno),
}

/// Whether a `connect` that failed with `e` may succeed later without anyone acting on this
/// side: the listener is not up yet (two processes started together need not order their
/// starts), has not bound its path yet, or has not accepted enough to make room.
fn passes_by_itself(e: Errno) -> bool {
    matches!(e, Errno::CONNREFUSED | Errno::NOENT | Errno::AGAIN)
}

/// A connected socket to `addr`. The one retry of the crate's connects: a try that fails for
/// a reason that passes by itself ([`ConnectFailure::NotYet`]) is made again after 100 µs,
/// then twice as long each time up to 10 ms, until `timeout` (a zero `timeout` tries once).
pub(crate) fn connect(addr: &Address<'_>, timeout: Duration) -> Result<OwnedFd, ConnectFailure> {
    let target = unix_addr(addr).map_err(ConnectFailure::Failed)?;
    let mut again = Backoff::new(
        timeout,
        Duration::from_micros(100),
        Duration::from_millis(10),
    );
    loop {
        let fd = seqpacket().map_err(ConnectFailure::Failed)?;
        match rustix::net::connect(&fd, &target) {
            Ok(()) => return Ok(fd),
            Err(errno) if passes_by_itself(errno) => {
                if let Err(waited) = again.pause() {
                    return Err(ConnectFailure::NotYet { errno, waited });
                }
            }
            Err(errno) => return Err(ConnectFailure::Failed(errno)),
        }
    }
}

/// Wait until `fd` is ready for `flags` (or hung up), at most until `deadline`; `false` on
/// timeout.
pub(crate) fn wait(
    fd: BorrowedFd<'_>,
    flags: PollFlags,
    deadline: Deadline,
) -> Result<bool, Errno> {
    loop {
        let timeout = super::timespec(deadline.remaining());
        let mut fds = [PollFd::new(&fd, flags)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether the peer has closed its end (`POLLRDHUP`/`POLLHUP` now, without waiting). A
/// `SOCK_SEQPACKET` read of 0 bytes means either that or an empty record: this tells them
/// apart. A failed `poll` says nothing: `false`.
pub(crate) fn peer_hung_up(fd: BorrowedFd<'_>) -> bool {
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::RDHUP)];
    match poll(&mut fds, Some(&zero)) {
        Ok(n) => {
            n > 0
                && fds[0]
                    .revents()
                    .intersects(PollFlags::RDHUP | PollFlags::HUP)
        }
        Err(_) => false,
    }
}

/// The next connection on a listening socket (non-blocking, close-on-exec).
pub(crate) fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    rustix::net::accept_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)
}

/// The peer's pid, uid and gid as the kernel recorded them at `connect`/`listen`. The pid is 0
/// when the peer's pid namespace is not visible from ours.
///
/// Read with `libc::getsockopt`, not rustix's `socket_peercred`: rustix's `UCred` holds its pid
/// as a non-zero integer, and the kernel writes 0 for a peer outside our pid namespace — a value
/// that type must never hold.
pub(crate) fn peer_cred(fd: BorrowedFd<'_>) -> Result<(u32, u32, u32), Errno> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred of `len` bytes (plain integers: any bytes are valid);
    // the descriptor is borrowed, so open for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::INVAL));
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(Errno::INVAL);
    }
    Ok((cred.pid.unsigned_abs(), cred.uid, cred.gid))
}

/// Send one message: `payload` (non-empty) and `fds` (at most [`MAX_FDS`]).
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::TOOBIG);
    }
    let sent = rustix::net::sendmsg(
        fd,
        &[IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent == payload.len() {
        Ok(())
    } else {
        Err(Errno::MSGSIZE)
    }
}

/// What [`recv`] read: the bytes (0 = the peer closed), the descriptors, and whether the
/// kernel had to cut bytes or descriptors off.
pub(crate) struct Received {
    pub(crate) bytes: usize,
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) truncated: bool,
}

/// Receive one message into `buf` (descriptors arrive close-on-exec).
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Received, Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        fd,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Take every descriptor that arrived (even from a message refused below): dropping them
    // closes them, so nothing leaks.
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    Ok(Received {
        bytes: msg.bytes,
        fds,
        truncated: msg
            .flags
            .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC),
    })
}

/// Which file is at `path` (device, inode), not following a link.
pub(crate) fn file_id(path: &std::path::Path) -> Result<(u64, u64), Errno> {
    let st = rustix::fs::lstat(path)?;
    Ok((st.st_dev, st.st_ino))
}

/// Remove the socket file at `path` if it is still the file `id` ([`file_id`] at the bind);
/// returns whether it did. A file someone put there since (after unlinking ours) is theirs.
/// (A window remains between the `lstat` and the `unlink`; only a process that can write the
/// directory can race it, and such a process can unlink the name anyway.)
pub(crate) fn unlink_if_same(path: &std::path::Path, id: (u64, u64)) -> Result<bool, Errno> {
    match file_id(path) {
        Ok(now) if now == id => rustix::fs::unlink(path).map(|()| true),
        Ok(_) | Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Instant;

    fn unique(what: &str) -> Vec<u8> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("cuda-ipc-test-connect-{what}-{}-{n}", std::process::id()).into_bytes()
    }

    #[test]
    fn nobody_listening_is_not_yet_until_the_timeout() {
        let name = unique("nobody");
        let start = Instant::now();
        match connect(&Address::Abstract(&name), Duration::from_millis(60)) {
            Err(ConnectFailure::NotYet { errno, waited }) => {
                assert_eq!(errno, Errno::CONNREFUSED);
                assert!(waited >= Duration::from_millis(60), "{waited:?}");
            }
            other => panic!("expected NotYet, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        let dir = std::env::temp_dir().join(String::from_utf8_lossy(&name).into_owned());
        match connect(&Address::Path(&dir), Duration::ZERO) {
            Err(ConnectFailure::NotYet { errno, .. }) => assert_eq!(errno, Errno::NOENT),
            other => panic!("expected NotYet, got {other:?}"),
        }
    }

    #[test]
    fn a_listener_that_comes_up_during_the_wait_is_reached() {
        let name = unique("later");
        let binder = {
            let name = name.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                listen(&Address::Abstract(&name))
            })
        };
        let fd = connect(&Address::Abstract(&name), Duration::from_secs(10));
        let (listener, _) = binder.join().expect("binder thread").expect("listen");
        assert!(fd.is_ok(), "{fd:?}");
        assert!(
            wait(
                listener.as_fd(),
                PollFlags::IN,
                Deadline::after(Duration::ZERO)
            )
            .unwrap()
        );
    }

    #[test]
    fn a_full_backlog_is_not_yet_and_room_made_in_it_is_taken() {
        let name = unique("backlog");
        let (listener, _) = listen(&Address::Abstract(&name)).expect("listen");
        // Fill the backlog (16, as `listen` asks; the kernel takes one more) without accepting.
        let mut pending = Vec::new();
        let full = loop {
            match connect(&Address::Abstract(&name), Duration::ZERO) {
                Ok(fd) => pending.push(fd),
                Err(failure) => break failure,
            }
            assert!(pending.len() < 1024, "the backlog never filled");
        };
        match full {
            ConnectFailure::NotYet { errno, .. } => assert_eq!(errno, Errno::AGAIN),
            ConnectFailure::Failed(e) => panic!("a full backlog failed with {e}"),
        }
        assert!(
            pending.len() >= 16,
            "{} connections before the backlog filled",
            pending.len()
        );
        // A connect that waits is let in once one pending connection is accepted.
        let accepter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            accept(listener.as_fd()).map(|fd| (fd, listener))
        });
        let fd = connect(&Address::Abstract(&name), Duration::from_secs(10));
        let accepted = accepter.join().expect("accepter thread");
        assert!(accepted.is_ok(), "{accepted:?}");
        assert!(fd.is_ok(), "{fd:?}");
    }

    #[test]
    fn other_failures_are_not_retried() {
        // An abstract name longer than `sun_path` fails at once, whatever the timeout.
        let long = vec![b'x'; 200];
        let start = Instant::now();
        assert!(matches!(
            connect(&Address::Abstract(&long), Duration::from_secs(10)),
            Err(ConnectFailure::Failed(_))
        ));
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
