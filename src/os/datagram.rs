//! Unix-domain datagram sockets bound at a path: the *bells* that make a waiting process's
//! descriptor readable from another process (`channel/bell.rs`). Telling a bell is one byte
//! sent to its path, from a socket of this process's own, without waiting; a bell nobody
//! holds any more refuses (`ECONNREFUSED`), which is how a stale one is known.

use std::path::Path;
use std::sync::OnceLock;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags, SocketAddrUnix, SocketType};

fn datagram() -> Result<OwnedFd, Errno> {
    super::socket::unix(SocketType::DGRAM)
}

/// A datagram socket bound at `path` (made `0600` right after the bind), non-blocking, with
/// the identity of its file ([`file_id`](super::socket::file_id)) for the unlink at the end.
/// `EADDRINUSE` when a file is at `path` already (see [`is_stale`]).
pub(crate) fn bind(path: &Path) -> Result<(OwnedFd, (u64, u64)), Errno> {
    let fd = datagram()?;
    rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
    let id = super::socket::file_id(path)?;
    if let Err(e) = rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(0o600)) {
        let _ = super::socket::unlink_if_same(path, id);
        return Err(e);
    }
    Ok((fd, id))
}

/// Whether the socket file at `path` is held by no one: a datagram `connect` to it is
/// refused. (A file that is not a socket, or a socket of another user, is not stale: it is
/// left alone.)
pub(crate) fn is_stale(path: &Path) -> bool {
    let Ok(addr) = SocketAddrUnix::new(path) else {
        return false;
    };
    datagram().is_ok_and(|fd| rustix::net::connect(&fd, &addr) == Err(Errno::CONNREFUSED))
}

/// Tell the bell at `path`: one byte, sent without waiting. A full bell is readable already
/// (`EAGAIN` is success); a bell nobody holds refuses (`ECONNREFUSED`), and one never made is
/// `ENOENT`: both are errors the caller may ignore, since nobody waits there.
pub(crate) fn tell(path: &Path) -> Result<(), Errno> {
    static SENDER: OnceLock<Option<OwnedFd>> = OnceLock::new();
    let Some(sender) = SENDER.get_or_init(|| datagram().ok()) else {
        return Err(Errno::NOBUFS);
    };
    let addr = SocketAddrUnix::new(path)?;
    match rustix::net::sendto(
        sender,
        &[1],
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        &addr,
    ) {
        Ok(_) | Err(Errno::AGAIN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Read every byte waiting on a bell (until `EAGAIN`); returns how many tells it held.
pub(crate) fn drain(fd: BorrowedFd<'_>) -> usize {
    let mut buf = [0u8; 64];
    let mut told = 0;
    loop {
        match rustix::net::recv(fd, &mut buf, RecvFlags::DONTWAIT) {
            Ok(_) => told += 1,
            Err(Errno::INTR) => {}
            Err(_) => return told,
        }
    }
}
