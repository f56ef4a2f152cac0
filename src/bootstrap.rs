//! Bootstrap across hosts: two processes that share a secret find and authenticate each other
//! over TCP and exchange small messages — what a channel across machines needs before any GPU
//! data moves (a communicator's unique id, ranks, the channel's shape). No service beyond the
//! address the user gives; the crate's Unix sockets ([`crate::fd`]) do the same on one host
//! with the kernel vouching for the peer's uid.
//!
//! # Protocol (version 1)
//!
//! `K` is the shared secret (16 to 4,096 bytes), `H(k, m)` HMAC-SHA256. The connecting side
//! (C) and the listening side (S) each draw 32 random bytes, `nc` and `ns`.
//!
//! 1. C → S: `"CIBS"`, version, `'C'`, `nc`.
//! 2. S → C: `"CIBS"`, version, `'S'`, `ns`, `H(K, "cuda-ipc bootstrap 1 server" ‖ nc ‖ ns)`.
//! 3. C checks S's tag (S knows `K`); C → S: `H(K, "cuda-ipc bootstrap 1 client" ‖ nc ‖ ns)`.
//! 4. S checks C's tag (C knows `K`). Both derive `k = H(K, "cuda-ipc bootstrap 1 session" ‖ nc
//!    ‖ ns)`.
//! 5. Messages, each way: length (u32, at most [`MAX_MESSAGE`]), bytes, `H(k, direction ‖
//!    sequence ‖ length ‖ bytes)`; the sequence counts from 0 in each direction.
//!
//! Fresh nonces on both sides bind every tag to one session (a recorded handshake or message
//! replayed into another is refused); the role labels stop a tag being reflected back to its
//! maker; the sequence stops reordering, dropping or replaying within a session. Tags are
//! compared in constant time. **Nothing is encrypted**: an eavesdropper reads the messages (a
//! communicator's unique id among them) but cannot forge, alter or replay one (SECURITY.md).
//!
//! # When the other side stops
//!
//! Every read and write has the caller's deadline: a peer that stalls anywhere — before its
//! hello, mid-message, or never answering — ends the call with [`Error::Timeout`]; one that
//! closes or is killed (the kernel closes its socket) ends it with [`Error::Os`] naming the
//! read (`UnexpectedEof`, `ConnectionReset`). A peer that is not a cuda-ipc bootstrap peer, has
//! another secret, or sends a message that fails its check is [`Error::BootstrapRefused`]; the
//! connection is then unusable (this side closes it). Nothing is allocated from a peer's word
//! beyond [`MAX_MESSAGE`] bytes.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_ipc::bootstrap::{BootstrapListener, Secret, connect};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! // Host A (listens):
//! let secret = Secret::new(std::env::var("CUDA_IPC_SECRET").unwrap_or_default())?;
//! let listener = BootstrapListener::bind("0.0.0.0:29500", secret)?;
//! let mut peer = listener.accept(Duration::from_secs(60))?;
//! peer.send(b"unique id and shape", Duration::from_secs(5))?;
//!
//! // Host B (connects):
//! let secret = Secret::new(std::env::var("CUDA_IPC_SECRET").unwrap_or_default())?;
//! let mut host_a = connect("host-a:29500", &secret, Duration::from_secs(60))?;
//! let hello = host_a.recv(Duration::from_secs(5))?;
//! # let _ = hello;
//! # Ok(()) }
//! ```
//!
//! # Across machines
//!
//! The channel across hosts (the `IpcSender`/`IpcReceiver` API carried by NCCL when the peer is
//! on another machine) is being built from the bottom. Here now: the bootstrap, and NCCL
//! communicators joined through it. Not yet: the remote end of the channel itself (below, the
//! design), and any test with two GPUs (NCCL refuses two ranks on one GPU).
//!
//! **The bootstrap.** `cuda_ipc::bootstrap`: two processes that were given the same secret find
//! each other at a TCP address and exchange small messages, each authenticated:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::bootstrap::{BootstrapListener, Secret, connect};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! let t = Duration::from_secs(30);
//! // host A
//! let listener = BootstrapListener::bind("0.0.0.0:29500", Secret::new(std::env::var("TOKEN").unwrap_or_default())?)?;
//! let mut b = listener.accept(t)?;                 // refuses a peer without the secret
//! b.send(b"what B needs to join", t)?;
//! // host B
//! let mut a = connect("host-a:29500", &Secret::new(std::env::var("TOKEN").unwrap_or_default())?, t)?;
//! let msg = a.recv(t)?;                            // forged, altered or replayed: BootstrapRefused
//! # let _ = msg;
//! # Ok(()) }
//! ```
//!
//! HMAC-SHA256 challenge-response with fresh nonces both ways, then a tag on every message;
//! nothing is encrypted (SECURITY.md, "Across hosts").
//!
//! **NCCL communicators.** `cuda_ipc::nccl::Communicator::pair(&ctx, &mut link, timeout)` joins
//! the two ends of a bootstrap link into a communicator of two ranks (the listener draws NCCL's
//! unique id and sends it over the link; `pair_local` does the same over a Unix socket on one
//! host); `send` / `recv` enqueue `ncclSend` / `ncclRecv` on your stream, `group` pairs them,
//! `wait` waits for queued work. NCCL is loaded at run time like the driver (`libnccl.so.2`, or
//! `CUDA_IPC_NCCL_LIBRARY`); every communicator is non-blocking, so joining and waiting end in the
//! caller's time-out — a peer that never joins, dies or hangs aborts the communicator
//! (`ncclCommAbort`) instead of hanging the process — and errors keep NCCL's own text
//! (`Error::Nccl`: the call, the `ncclResult_t`, `ncclGetLastError`). Tested on one H200: a
//! communicator of one rank sending 1 MiB and 64 MiB to itself byte for byte; a lonely rank ending
//! in its time-out; two processes pairing on one GPU, over TCP and over a Unix socket, each
//! getting NCCL's `ncclInvalidUsage` with its text in bounded time.
//!
//! **The remote end of the channel (design, not built).** A `RemoteSender` owns its slots (its
//! own device memory) and a communicator; `acquire` waits for a credit, `send(len, header)` makes
//! NCCL's stream wait for the caller's stream (an event) and enqueues `ncclSend` of the item,
//! while its length and header go to the receiver over the bootstrap link (host-readable, as the
//! local channel's are). The `RemoteReceiver` owns its slots too: `recv` reads the next length and
//! header from the link and enqueues `ncclRecv` into a free slot on NCCL's stream, which the
//! caller's stream then waits for (no host synchronise per item); `release` records the caller's
//! stream, and the next receive into that slot waits for it, so a credit can go back to the sender
//! at once. One line at construction chooses the end (`IpcSender::new` / `RemoteSender::pair`);
//! the slot, batch and header API is the channel's. A peer's death surfaces as NCCL's
//! asynchronous error or as the link's end, within `wait`'s bound, and aborts the communicator.
//!
//! **What cannot be tested here (on paper).**
//! - *Multi-node NVLink* (GB200 NVL72 and the like): memory is shared across nodes as *fabric*
//!   handles (`CU_MEM_HANDLE_TYPE_FABRIC`, 64 bytes instead of a descriptor) and importing needs an
//!   IMEX channel (`/dev/nvidia-caps-imex-channels/channelN`, granted by the IMEX daemon). The
//!   crate's VMM path would create with the fabric type requested, export the 64 bytes
//!   (`cuMemExportToShareableHandle`) and send them over the bootstrap link instead of a
//!   descriptor over a Unix socket; the importer maps them as it maps a descriptor today. The
//!   probe already tries it: it reads `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` and
//!   exports a fabric handle of a small allocation (key `fabric`), which fails where no IMEX
//!   channel is visible.
//!   Over NVLink, such memory would make the remote end zero-copy, like the local one.
//! - *RDMA NICs* (InfiniBand, RoCE): NCCL's net transport uses them by itself (its `libnccl-net`
//!   plugins, GPUDirect RDMA where `nvidia-peermem` or dma-buf allow); nothing in the crate
//!   changes. What NCCL needs: the NIC's drivers and rdma-core, `NCCL_IB_HCA` /
//!   `NCCL_SOCKET_IFNAME` where the defaults pick wrong, and for GPUDirect the device's
//!   `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{ArgumentDefect, Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// The most bytes one message carries.
pub const MAX_MESSAGE: usize = 1 << 20;
const MAGIC: &[u8; 4] = b"CIBS";
const VERSION: u16 = 1;
const NONCE: usize = 32;
const TAG: usize = 32;
/// magic, version, role, nonce.
const HELLO: usize = 4 + 2 + 1 + NONCE;
const SERVER_LABEL: &[u8] = b"cuda-ipc bootstrap 1 server";
const CLIENT_LABEL: &[u8] = b"cuda-ipc bootstrap 1 client";
const SESSION_LABEL: &[u8] = b"cuda-ipc bootstrap 1 session";

/// HMAC-SHA256's key block: a key of up to 64 bytes zero-padded, a longer one hashed first
/// (RFC 2104's own key processing, so a tag is HMAC-SHA256 keyed with the original bytes).
type KeyBlock = [u8; 64];

fn key_block(key: &[u8]) -> KeyBlock {
    let mut block = [0u8; 64];
    if key.len() <= 64 {
        block[..key.len()].copy_from_slice(key);
    } else {
        block[..32].copy_from_slice(&Sha256::digest(key));
    }
    block
}

/// A secret both sides were given (16 to 4,096 bytes: a random token, not a password): it
/// proves each peer to the other and keys every message's tag. Zeroed when dropped.
pub struct Secret(KeyBlock);

impl Secret {
    /// Wrap `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless it is 16 to 4,096 bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::bootstrap::Secret;
    ///
    /// assert!(Secret::new("too short").is_err());
    /// let s = Secret::new("a 32-byte random token, in hex..")?;
    /// # let _ = s;
    /// # Ok::<(), cuda_ipc::Error>(())
    /// ```
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let mut bytes = bytes.into();
        ArgumentDefect::check_range(
            "Secret::new",
            "secret bytes (16 to 4,096)",
            bytes.len() as u64,
            16,
            4096,
        )?;
        let block = key_block(&bytes);
        zero(&mut bytes);
        Ok(Self(block))
    }

    fn tag(&self, label: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
        tag_with(&self.0, label, parts)
    }
}

/// Overwrite `bytes` before they are freed (volatile: the compiler may not drop the stores).
fn zero(bytes: &mut [u8]) {
    for b in bytes {
        // SAFETY: `b` is a valid, aligned, exclusive reference into `bytes`; a volatile write
        // keeps the compiler from removing the zeroing of memory about to be freed.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zero(&mut self.0);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// HMAC-SHA256 under `key` over `label ‖ parts`, not yet finalised.
fn mac(key: &KeyBlock, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = <HmacSha256 as KeyInit>::new(key.into());
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

fn tag_with(key: &KeyBlock, label: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
    mac(key, label, parts).finalize().into_bytes().into()
}

/// Whether `tag` is `H(key, label ‖ parts)`, compared in constant time.
fn verify(key: &KeyBlock, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    mac(key, label, parts).verify_slice(tag).is_ok()
}

/// A listening TCP socket for bootstrap peers that know the secret.
#[derive(Debug)]
pub struct BootstrapListener {
    listener: TcpListener,
    secret: Secret,
}

impl BootstrapListener {
    /// Listen at `addr` (`"0.0.0.0:29500"`, `"[::]:0"` for any free port: see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    ///
    /// [`Error::Os`] naming `bind`.
    pub fn bind(addr: impl ToSocketAddrs, secret: Secret) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Os {
            call: "bind",
            name: "bootstrap listener".to_owned(),
            source,
        })?;
        Ok(Self { listener, secret })
    }

    /// The address it listens at.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] naming `getsockname`.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Os {
            call: "getsockname",
            name: "bootstrap listener".to_owned(),
            source,
        })
    }

    /// Wait (at most `timeout`, handshake included) for a peer that proves it has the secret.
    /// A connection that fails the handshake is closed and reported, not skipped: call again
    /// to wait for the next.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::BootstrapRefused`] for a peer without the secret or not a
    /// bootstrap peer; [`Error::Os`] naming the failed call.
    pub fn accept(&self, timeout: Duration) -> Result<Bootstrapped> {
        let deadline = Deadline::after(timeout);
        self.listener
            .set_nonblocking(true)
            .map_err(|e| os("accept", "bootstrap listener", e))?;
        let (stream, addr) = loop {
            match self.listener.accept() {
                Ok(got) => break got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if deadline.passed() {
                        return Err(timed_out("bootstrap accept (waiting for a peer)", timeout));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(os("accept", "bootstrap listener", e)),
            }
        };
        let mut stream = stream;
        let mut link = Link::fresh(&mut stream, addr, deadline, timeout)?;
        let hello = link.read_exact::<HELLO>("bootstrap hello")?;
        let nc = check_hello(&hello, b'C', &addr)?;
        let ns = nonce()?;
        let mut out = hello_of(b'S', &ns).to_vec();
        out.extend_from_slice(&self.secret.tag(SERVER_LABEL, &[&nc, &ns]));
        link.write_all(&out, "bootstrap hello")?;
        let tag = link.read_exact::<TAG>("bootstrap proof")?;
        if !verify(&self.secret.0, CLIENT_LABEL, &[&nc, &ns], &tag) {
            return Err(refused(&addr, "the peer does not have the secret"));
        }
        let key = self.secret.tag(SESSION_LABEL, &[&nc, &ns]);
        Ok(session(stream, addr, key, Side::Server))
    }
}

/// Connect to a [`BootstrapListener`] at `addr` and prove each side to the other with
/// `secret`, within `timeout` (connect and handshake; a listener not up yet is retried until
/// then).
///
/// # Errors
///
/// [`Error::Timeout`]; [`Error::BootstrapRefused`] for a listener without the secret or not a
/// bootstrap listener; [`Error::Os`] naming the failed call (the name resolution, or a
/// `connect` refused for another reason than nobody listening yet).
pub fn connect(
    addr: impl ToSocketAddrs,
    secret: &Secret,
    timeout: Duration,
) -> Result<Bootstrapped> {
    let deadline = Deadline::after(timeout);
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| os("getaddrinfo", "bootstrap address", e))?
        .collect();
    let (stream, addr) = 'found: loop {
        let mut last = None;
        for a in &addrs {
            let left = deadline.left().max(Duration::from_millis(1));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => break 'found (s, *a),
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e) if e.kind() == io::ErrorKind::ConnectionRefused && !deadline.passed() => {
                std::thread::sleep(Duration::from_millis(10)); // not listening yet
            }
            Some(e) if e.kind() == io::ErrorKind::TimedOut || deadline.passed() => {
                return Err(timed_out("bootstrap connect", timeout));
            }
            Some(e) => return Err(os("connect", "bootstrap address", e)),
            None => {
                return Err(os(
                    "getaddrinfo",
                    "bootstrap address",
                    io::Error::new(io::ErrorKind::NotFound, "no address"),
                ));
            }
        }
    };
    let mut stream = stream;
    let mut link = Link::fresh(&mut stream, addr, deadline, timeout)?;
    let nc = nonce()?;
    link.write_all(&hello_of(b'C', &nc), "bootstrap hello")?;
    let reply = link.read_exact::<{ HELLO + TAG }>("bootstrap hello")?;
    let ns = check_hello(&reply[..HELLO], b'S', &addr)?;
    if !verify(&secret.0, SERVER_LABEL, &[&nc, &ns], &reply[HELLO..]) {
        return Err(refused(&addr, "the listener does not have the secret"));
    }
    link.write_all(&secret.tag(CLIENT_LABEL, &[&nc, &ns]), "bootstrap proof")?;
    let key = secret.tag(SESSION_LABEL, &[&nc, &ns]);
    Ok(session(stream, addr, key, Side::Client))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

/// An authenticated connection to a bootstrap peer: messages of up to [`MAX_MESSAGE`] bytes,
/// each checked (sender, order, contents) before it is returned.
pub struct Bootstrapped {
    stream: TcpStream,
    peer: SocketAddr,
    key: KeyBlock,
    side: Side,
    sent: u64,
    received: u64,
    broken: bool,
}

impl Drop for Bootstrapped {
    fn drop(&mut self) {
        zero(&mut self.key);
    }
}

impl Bootstrapped {
    /// Whether this end is the listening side ([`BootstrapListener::accept`]).
    pub(crate) fn is_listener(&self) -> bool {
        matches!(self.side, Side::Server)
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Send one message (at most [`MAX_MESSAGE`] bytes), within `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a message over the bound; [`Error::Timeout`];
    /// [`Error::Os`] naming `send`; [`Error::BootstrapRefused`] on a connection an earlier
    /// error left unusable.
    pub fn send(&mut self, message: &[u8], timeout: Duration) -> Result<()> {
        self.check_usable()?;
        ArgumentDefect::check_range(
            "Bootstrapped::send",
            "message bytes (up to 1 MiB)",
            message.len() as u64,
            0,
            MAX_MESSAGE as u64,
        )?;
        let len = (message.len() as u32).to_le_bytes();
        let seq = self.sent.to_le_bytes();
        let dir = [self.side as u8];
        let tag = tag_with(&self.key, b"m", &[&dir, &seq, &len, message]);
        let mut frame = Vec::with_capacity(4 + message.len() + TAG);
        frame.extend_from_slice(&len);
        frame.extend_from_slice(message);
        frame.extend_from_slice(&tag);
        let mut link = self.link(timeout);
        let result = link.write_all(&frame, "bootstrap message");
        self.broken |= result.is_err();
        result?;
        self.sent += 1;
        Ok(())
    }

    /// Receive one message, within `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Os`] naming `recv` (`UnexpectedEof`: the peer closed or
    /// died); [`Error::BootstrapRefused`] for a message over the bound or failing its check
    /// (forged, altered, replayed, out of order). After any error the connection is unusable.
    pub fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>> {
        self.check_usable()?;
        let result = self.recv_checked(timeout);
        self.broken |= result.is_err();
        result
    }

    fn recv_checked(&mut self, timeout: Duration) -> Result<Vec<u8>> {
        let peer = self.peer;
        let mut link = self.link(timeout);
        let len_bytes = link.read_exact::<4>("bootstrap message")?;
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len > MAX_MESSAGE {
            return Err(refused(&peer, "a message over 1 MiB"));
        }
        let mut message = vec![0u8; len];
        link.read_into(&mut message, "bootstrap message")?;
        let tag = link.read_exact::<TAG>("bootstrap message")?;
        let seq = self.received.to_le_bytes();
        let dir = [match self.side {
            Side::Server => Side::Client as u8,
            Side::Client => Side::Server as u8,
        }];
        if !verify(&self.key, b"m", &[&dir, &seq, &len_bytes, &message], &tag) {
            return Err(refused(&peer, "a message that fails its check"));
        }
        self.received += 1;
        Ok(message)
    }

    fn check_usable(&self) -> Result<()> {
        if self.broken {
            return Err(refused(&self.peer, "the connection failed earlier"));
        }
        Ok(())
    }

    fn link(&mut self, timeout: Duration) -> Link<'_> {
        Link {
            stream: &mut self.stream,
            peer: self.peer,
            deadline: Deadline::after(timeout),
            timeout,
        }
    }
}

impl std::fmt::Debug for Bootstrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrapped")
            .field("peer", &self.peer)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// A stream with a deadline: every read and write waits at most what is left of it.
struct Link<'a> {
    stream: &'a mut TcpStream,
    peer: SocketAddr,
    deadline: Deadline,
    timeout: Duration,
}

fn session(stream: TcpStream, peer: SocketAddr, key: [u8; TAG], side: Side) -> Bootstrapped {
    Bootstrapped {
        stream,
        peer,
        key: key_block(&key),
        side,
        sent: 0,
        received: 0,
        broken: false,
    }
}

impl<'a> Link<'a> {
    /// A fresh connection's link for the handshake: no Nagle delay, blocking (every read and
    /// write bounded by what is left of `deadline`).
    fn fresh(
        stream: &'a mut TcpStream,
        peer: SocketAddr,
        deadline: Deadline,
        timeout: Duration,
    ) -> Result<Self> {
        stream
            .set_nodelay(true)
            .map_err(|e| os("setsockopt", &peer.to_string(), e))?;
        stream
            .set_nonblocking(false)
            .map_err(|e| os("fcntl", &peer.to_string(), e))?;
        Ok(Self {
            stream,
            peer,
            deadline,
            timeout,
        })
    }

    fn read_exact<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.read_into(&mut buf, what)?;
        Ok(buf)
    }

    fn read_into(&mut self, buf: &mut [u8], what: &'static str) -> Result<()> {
        let mut at = 0;
        while at < buf.len() {
            let left = self.left(what)?;
            let peer = self.peer;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| os("setsockopt", &peer.to_string(), e))?;
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => {
                    let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed");
                    return Err(os("recv", &peer.to_string(), eof));
                }
                Ok(n) => at += n,
                Err(e) if is_timeout(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(os("recv", &peer.to_string(), e)),
            }
        }
        Ok(())
    }

    fn write_all(&mut self, mut buf: &[u8], what: &'static str) -> Result<()> {
        while !buf.is_empty() {
            let left = self.left(what)?;
            let peer = self.peer;
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|e| os("setsockopt", &peer.to_string(), e))?;
            match self.stream.write(buf) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "the peer closed");
                    return Err(os("send", &peer.to_string(), e));
                }
                Ok(n) => buf = &buf[n..],
                Err(e) if is_timeout(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(os("send", &peer.to_string(), e)),
            }
        }
        Ok(())
    }

    /// What is left of the deadline, or the time-out.
    fn left(&self, what: &'static str) -> Result<Duration> {
        let left = self.deadline.left();
        if left.is_zero() {
            return Err(timed_out(what, self.timeout));
        }
        Ok(left)
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A point in time that a `Duration::MAX` time-out never reaches (no `Instant` overflow).
#[derive(Clone, Copy)]
struct Deadline(Option<Instant>);

impl Deadline {
    fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    fn left(&self) -> Duration {
        match self.0 {
            Some(at) => at.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(3600), // "forever", one hour of socket wait at a time
        }
    }

    fn passed(&self) -> bool {
        self.left().is_zero()
    }
}

fn hello_of(role: u8, nonce: &[u8; NONCE]) -> [u8; HELLO] {
    let mut h = [0u8; HELLO];
    h[..4].copy_from_slice(MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6] = role;
    h[7..].copy_from_slice(nonce);
    h
}

/// The peer's nonce from its hello, once magic, version and role are right.
fn check_hello(hello: &[u8], role: u8, peer: &SocketAddr) -> Result<[u8; NONCE]> {
    if &hello[..4] != MAGIC {
        return Err(refused(peer, "not a cuda-ipc bootstrap peer"));
    }
    if u16::from_le_bytes([hello[4], hello[5]]) != VERSION {
        return Err(refused(peer, "another bootstrap protocol version"));
    }
    if hello[6] != role {
        return Err(refused(peer, "the peer plays the wrong role"));
    }
    let mut n = [0u8; NONCE];
    n.copy_from_slice(&hello[7..HELLO]);
    Ok(n)
}

fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    for chunk in n.chunks_mut(8) {
        chunk.copy_from_slice(&crate::os::random_u64()?.to_le_bytes());
    }
    Ok(n)
}

fn os(call: &'static str, name: &str, source: io::Error) -> Error {
    Error::Os {
        call,
        name: name.to_owned(),
        source,
    }
}

fn refused(peer: &SocketAddr, reason: &'static str) -> Error {
    Error::BootstrapRefused {
        peer: peer.to_string(),
        reason,
    }
}

fn timed_out(what: &'static str, waited: Duration) -> Error {
    Error::Timeout {
        what,
        waited,
        waiting_for: None,
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;
    use std::net::TcpStream;
    use std::thread;

    const T: Duration = Duration::from_secs(10);

    #[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
    fn secret(s: &str) -> Secret {
        Secret::new(format!("{s:-<24}")).unwrap()
    }

    #[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
    fn listener(s: &str) -> (BootstrapListener, SocketAddr) {
        let l = BootstrapListener::bind("127.0.0.1:0", secret(s)).unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    #[test]
    fn peers_with_the_secret_exchange_messages_both_ways() {
        let (l, a) = listener("k");
        let server = thread::spawn(move || {
            let mut p = l.accept(T).unwrap();
            p.send(b"unique id", T).unwrap();
            let big = p.recv(T).unwrap();
            assert_eq!(big.len(), MAX_MESSAGE);
            assert!(big.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            p.send(b"", T).unwrap();
            p.recv(T).unwrap()
        });
        let mut c = connect(a, &secret("k"), T).unwrap();
        assert_eq!(c.recv(T).unwrap(), b"unique id");
        let big: Vec<u8> = (0..MAX_MESSAGE).map(|i| (i % 251) as u8).collect();
        c.send(&big, T).unwrap();
        assert_eq!(c.recv(T).unwrap(), b"");
        c.send(b"bye", T).unwrap();
        assert_eq!(server.join().unwrap(), b"bye");
        let e = c.send(&vec![0; MAX_MESSAGE + 1], T).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }

    #[test]
    fn a_wrong_secret_is_refused_on_both_sides() {
        let (l, a) = listener("right");
        let server = thread::spawn(move || l.accept(T).unwrap_err());
        let e = connect(a, &secret("wrong"), T).unwrap_err();
        assert!(matches!(e, Error::BootstrapRefused { .. }), "{e}");
        // The client stopped at the listener's proof; the listener sees it close.
        let e = server.join().unwrap();
        assert!(matches!(e, Error::Os { call: "recv", .. }), "{e}");
    }

    #[test]
    fn a_client_without_the_secret_is_refused_by_the_listener() {
        // A client that replays the listener's own proof (reflection) instead of its own.
        let (l, a) = listener("k");
        let server = thread::spawn(move || l.accept(T).unwrap_err());
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(&hello_of(b'C', &[7; NONCE])).unwrap();
        let mut reply = [0u8; HELLO + TAG];
        s.read_exact(&mut reply).unwrap();
        s.write_all(&reply[HELLO..]).unwrap(); // the server's tag, reflected
        let e = server.join().unwrap();
        assert!(
            matches!(e, Error::BootstrapRefused { reason, .. } if reason.contains("secret")),
            "{e}"
        );
    }

    #[test]
    fn strangers_and_stalled_peers_end_in_bounded_errors() {
        // Not a bootstrap peer.
        let (l, a) = listener("k");
        let server = thread::spawn(move || l.accept(T).unwrap_err());
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(&[b'G'; HELLO]).unwrap();
        let e = server.join().unwrap();
        assert!(matches!(e, Error::BootstrapRefused { .. }), "{e}");
        // A peer that connects and says nothing: the listener's time-out.
        let (l, a) = listener("k");
        let _s = TcpStream::connect(a).unwrap();
        let t = Instant::now();
        let e = l.accept(Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        // A listener that accepts and says nothing: the client's time-out.
        let quiet = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = quiet.local_addr().unwrap();
        let t = Instant::now();
        let e = connect(a, &secret("k"), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        // Nobody accepting: accept's own time-out.
        let (l, _) = listener("k");
        let e = l.accept(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }

    #[test]
    fn a_connect_before_the_listener_is_up_waits_for_it() {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let server = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            let l = BootstrapListener::bind(("127.0.0.1", port), secret("k")).unwrap();
            l.accept(T).unwrap().recv(T).unwrap()
        });
        let mut c = connect(("127.0.0.1", port), &secret("k"), T).unwrap();
        c.send(b"late", T).unwrap();
        assert_eq!(server.join().unwrap(), b"late");
    }

    /// A relay between the two peers that can change what passes: every altered, dropped,
    /// replayed or oversized message is refused, and the connection is unusable after.
    #[test]
    fn altered_replayed_or_oversized_messages_are_refused() {
        for attack in ["flip", "replay", "oversize", "reorder"] {
            let (l, a) = listener("k");
            let relay = TcpListener::bind("127.0.0.1:0").unwrap();
            let ra = relay.local_addr().unwrap();
            let server = thread::spawn(move || {
                let mut p = l.accept(T).unwrap();
                let first = p.recv(T);
                let again = p.recv(T);
                (first, again)
            });
            let mitm = thread::spawn(move || {
                let (mut from_c, _) = relay.accept().unwrap();
                let mut to_s = TcpStream::connect(a).unwrap();
                // Pass the handshake through: C hello, S hello + tag, C proof.
                let mut h = [0u8; HELLO];
                from_c.read_exact(&mut h).unwrap();
                to_s.write_all(&h).unwrap();
                let mut r = [0u8; HELLO + TAG];
                to_s.read_exact(&mut r).unwrap();
                from_c.write_all(&r).unwrap();
                let mut p = [0u8; TAG];
                from_c.read_exact(&mut p).unwrap();
                to_s.write_all(&p).unwrap();
                // Two messages of 5 bytes from C: 4 + 5 + 32 bytes each.
                let mut m1 = [0u8; 41];
                let mut m2 = [0u8; 41];
                from_c.read_exact(&mut m1).unwrap();
                from_c.read_exact(&mut m2).unwrap();
                let out: Vec<u8> = match attack {
                    "flip" => {
                        m1[6] ^= 1;
                        [m1, m2].concat()
                    }
                    "replay" => [m1, m1].concat(),
                    "reorder" => [m2, m1].concat(),
                    _ => u32::MAX.to_le_bytes().to_vec(),
                };
                to_s.write_all(&out).unwrap();
                thread::sleep(Duration::from_millis(100));
            });
            let mut c = connect(ra, &secret("k"), T).unwrap();
            c.send(b"first", T).unwrap();
            c.send(b"again", T).unwrap();
            let (first, again) = server.join().unwrap();
            mitm.join().unwrap();
            match attack {
                "replay" => {
                    assert_eq!(first.unwrap(), b"first");
                    let e = again.unwrap_err();
                    assert!(matches!(e, Error::BootstrapRefused { .. }), "{attack}: {e}");
                }
                _ => {
                    let e = first.unwrap_err();
                    assert!(matches!(e, Error::BootstrapRefused { .. }), "{attack}: {e}");
                    let e = again.unwrap_err();
                    assert!(
                        matches!(e, Error::BootstrapRefused { reason, .. } if reason.contains("earlier")),
                        "{attack}: unusable after: {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_secret_is_refused_and_debug_hides_it() {
        assert!(matches!(
            Secret::new(vec![0u8; 15]),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(Secret::new(vec![0u8; 4097]).is_err());
        let s = Secret::new("0123456789abcdef").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(..)");
        // Keys over HMAC's block are hashed first (RFC 2104), as a library HMAC does.
        let long = vec![9u8; 100];
        let want: [u8; TAG] = {
            let mut m = <HmacSha256 as Mac>::new_from_slice(&long).unwrap();
            m.update(b"label");
            m.finalize().into_bytes().into()
        };
        assert_eq!(Secret::new(long).unwrap().tag(b"label", &[]), want);
    }
}
