//! Unix-domain `SOCK_SEQPACKET` sockets that carry file descriptors (`SCM_RIGHTS`): the system
//! calls behind [`FdListener`](crate::fd::FdListener) and [`FdSocket`](crate::fd::FdSocket). Every
//! socket is non-blocking and close-on-exec; waits are `poll` with a deadline.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::time::Duration;

use crate::poll::Deadline;

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
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
}

/// A listening socket bound at `addr`; a path is made `0600` right after the bind.
pub(crate) fn listen(addr: &Address<'_>) -> Result<OwnedFd, Errno> {
    let fd = seqpacket()?;
    rustix::net::bind(&fd, &unix_addr(addr)?)?;
    if let Address::Path(path) = addr {
        rustix::fs::chmod(*path, rustix::fs::Mode::from_raw_mode(0o600))?;
    }
    rustix::net::listen(&fd, 16)?;
    Ok(fd)
}

/// A connected socket to `addr`, retrying while the listener's backlog is full, until
/// `deadline`.
pub(crate) fn connect(addr: &Address<'_>, deadline: Deadline) -> Result<OwnedFd, Errno> {
    let target = unix_addr(addr)?;
    loop {
        let fd = seqpacket()?;
        match rustix::net::connect(&fd, &target) {
            Ok(()) => return Ok(fd),
            Err(Errno::AGAIN) if !deadline.has_passed() => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e),
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
        let left = deadline.remaining();
        let timeout = rustix::time::Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
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

/// Remove a socket file at `path`.
pub(crate) fn unlink(path: &std::path::Path) -> Result<(), Errno> {
    rustix::fs::unlink(path)
}
