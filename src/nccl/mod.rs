//! NCCL communicators, for GPU data between processes that share no memory — on other hosts,
//! or on this host where CUDA IPC is not an option — with NCCL's own transports (NVLink, PCIe,
//! InfiniBand/RoCE, sockets). The first part of the channel across hosts: a
//! [`Communicator`] whose unique id travels over what the crate has — an authenticated
//! [`Bootstrapped`](crate::bootstrap::Bootstrapped) TCP link ([`Communicator::pair`]) or a Unix
//! socket ([`Communicator::pair_local`]) — and stream-ordered point-to-point sends and receives,
//! every wait bounded.
//!
//! NCCL is loaded at run time (`libnccl.so.2`, or the path in `CUDA_IPC_NCCL_LIBRARY`), as the
//! driver is: nothing to build, and a machine without NCCL runs everything else. The crate
//! does not use cudarc's `nccl` module, which needs the application's choice of a cudarc CUDA
//! version and linking feature — a library must not make it (README, "Dependencies").
//!
//! # What is bounded, and how
//!
//! Every communicator is made **non-blocking** (`ncclConfig_t.blocking = 0`): its
//! initialisation returns at once and is polled (`ncclCommGetAsyncError`) until it completes,
//! fails, or the caller's time-out passes — then it is aborted (`ncclCommAbort`) and the call
//! is [`Error::Timeout`]. A peer that never joins, dies while joining, or is not reachable
//! therefore ends the call in the time given. [`Communicator::wait`] does the same for queued
//! work: it polls an event recorded after the work and the communicator's asynchronous error;
//! an error (a dead peer is usually `ncclRemoteError` or `ncclSystemError`) or the time-out
//! aborts the communicator, which NCCL then refuses for further work. Dropping a communicator
//! aborts it (`ncclCommAbort` never waits for a peer); queued work on it is cancelled, so wait
//! for what matters first.
//!
//! Errors keep NCCL's own text: [`Error::Nccl`] names the call, the `ncclResult_t`, and what
//! `ncclGetLastError` said.
//!
//! # Examples
//!
//! A communicator of one rank sends to itself (what one GPU allows; NCCL refuses two ranks on
//! one GPU):
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext, IpcBuffer, RawStream};
//! use cuda_ipc::nccl::{Communicator, UniqueId};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! let ctx = GpuContext::new(0)?;
//! let comm = Communicator::new(&ctx, &UniqueId::new()?, 1, 0, Duration::from_secs(30))?;
//! let (src, dst) = (IpcBuffer::<u8>::zeroed(&ctx, 1 << 20)?, IpcBuffer::<u8>::zeroed(&ctx, 1 << 20)?);
//! comm.group(|| {
//!     // SAFETY: both buffers outlive the work (waited for below) and nothing else uses them.
//!     unsafe {
//!         comm.send(src.as_raw_ptr(), src.len(), 0, &RawStream::LEGACY)?;
//!         comm.recv(dst.as_raw_ptr(), dst.len(), 0, &RawStream::LEGACY)
//!     }
//! })?;
//! comm.wait(&RawStream::LEGACY, Duration::from_secs(10))?;
//! # Ok(()) }
//! ```

mod sys;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::context::GpuContext;
use crate::driver;
use crate::error::{ArgumentDefect, Error, Result};
use crate::poll::Backoff;
use crate::stream::AsStream;

pub use sys::{DEFAULT_LIBRARIES, LIBRARY_ENV};

/// The loaded library's table, or [`Error::NcclNotFound`].
fn api() -> Result<&'static sys::Api> {
    sys::library()
        .map(|l| &l.api)
        .map_err(|f| Error::NcclNotFound {
            tried: f.tried,
            reason: f.reason,
        })
}

/// The path of the NCCL library this process loaded (loading it if it is not yet).
///
/// # Errors
///
/// [`Error::NcclNotFound`] when no library could be loaded.
pub fn library_path() -> Result<&'static str> {
    sys::library()
        .map(|l| l.path.as_str())
        .map_err(|f| Error::NcclNotFound {
            tried: f.tried,
            reason: f.reason,
        })
}

/// Call NCCL's `$name` from the table: its result, or [`Error::NcclNotFound`] /
/// [`Error::Nccl`] for a library without it.
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?)) => {{
        let api = api()?;
        match api.$name {
            // SAFETY: the caller of the macro upholds the function's contract (see each use).
            Some(f) => unsafe { f($($arg),*) },
            None => {
                return Err(Error::Nccl {
                    call: stringify!($name),
                    code: -1,
                    name: "missing",
                    detail: "the loaded NCCL library has no such entry point (NCCL 2.14 or \
                             newer is needed)"
                        .into(),
                })
            }
        }
    }};
}

/// `Ok` for `ncclSuccess`, else [`Error::Nccl`] for `call` with NCCL's text (of `comm`'s last
/// error where there is a communicator).
fn check(call_name: &'static str, code: sys::NcclResult, comm: sys::NcclComm) -> Result<()> {
    if code == sys::NCCL_SUCCESS {
        return Ok(());
    }
    Err(nccl_error(call_name, code, comm))
}

fn nccl_error(call_name: &'static str, code: sys::NcclResult, comm: sys::NcclComm) -> Error {
    let detail = api().ok().map_or_else(String::new, |api| {
        let general = api.ncclGetErrorString.map_or_else(String::new, |f| {
            // SAFETY: returns a pointer to a static string for any code.
            unsafe { sys::text(f(code)) }
        });
        let last = api.ncclGetLastError.map_or_else(String::new, |f| {
            // SAFETY: null or a live communicator; returns its (or the thread's) last error
            // text, valid until the next NCCL call on this thread, copied at once.
            unsafe { sys::text(f(comm)) }
        });
        match (general.is_empty(), last.is_empty()) {
            (_, true) => general,
            (true, false) => last,
            (false, false) => format!("{general}: {last}"),
        }
    });
    Error::Nccl {
        call: call_name,
        code,
        name: sys::result_name(code),
        detail,
    }
}

/// NCCL's version as (major, minor, patch) (`ncclGetVersion`).
///
/// # Errors
///
/// [`Error::NcclNotFound`] without a library; [`Error::Nccl`].
pub fn version() -> Result<(u32, u32, u32)> {
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check(
        "ncclGetVersion",
        call!(ncclGetVersion(&mut v)),
        std::ptr::null_mut(),
    )?;
    let v = u32::try_from(v).unwrap_or(0);
    // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
    Ok((v / 10_000, (v / 100) % 100, v % 100))
}

/// The 128 bytes every rank of one communicator is made with: drawn by one rank
/// ([`UniqueId::new`]) and sent to the others. It names the drawing rank's bootstrap address
/// (NCCL's own, not this crate's): send it only to the processes meant to join.
#[derive(Clone, Copy)]
pub struct UniqueId(sys::NcclUniqueId);

impl UniqueId {
    /// Its size in bytes.
    pub const SIZE: usize = 128;

    /// Draw a new id (`ncclGetUniqueId`; this process becomes the communicator's bootstrap
    /// root).
    ///
    /// # Errors
    ///
    /// [`Error::NcclNotFound`]; [`Error::Nccl`] (no usable network interface, for one).
    pub fn new() -> Result<Self> {
        let mut id = sys::NcclUniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`.
        check(
            "ncclGetUniqueId",
            call!(ncclGetUniqueId(&mut id)),
            std::ptr::null_mut(),
        )?;
        Ok(Self(id))
    }

    /// An id from the bytes another rank sent ([`as_bytes`](Self::as_bytes)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for any length but 128.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let internal: [u8; 128] = bytes.try_into().map_err(|_| Error::InvalidArgument {
            call: "UniqueId::from_bytes",
            defect: ArgumentDefect::LengthMismatch {
                what: "NCCL unique id bytes",
                expected: 128,
                found: bytes.len() as u64,
            },
        })?;
        Ok(Self(sys::NcclUniqueId { internal }))
    }

    /// The bytes, to send to the other ranks.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0.internal
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)") // it names a bootstrap address: not for logs
    }
}

/// One rank of an NCCL communicator on one context's device (see the [module docs](self)).
pub struct Communicator {
    comm: sys::NcclComm,
    ctx: GpuContext,
    rank: u32,
    size: u32,
    /// Set once an error or time-out aborted it: later calls are refused.
    aborted: AtomicBool,
    /// How many [`group`](Self::group)s are open: an abort then waits for the last
    /// `ncclGroupEnd` (NCCL would run the group's queued work against a freed communicator).
    groups_open: AtomicU32,
    /// An abort asked for inside a group, made once the group has ended.
    abort_after_group: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `&self`
// methods that call NCCL are the caller's to serialise (it is not `Sync`).
unsafe impl Send for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// Which way a point-to-point transfer goes.
#[derive(Clone, Copy)]
enum Transfer {
    Send,
    Recv,
}

impl Communicator {
    /// Join communicator `id` as `rank` of `ranks` on `ctx`'s device
    /// (`ncclCommInitRankConfig`, non-blocking, polled until it completes), within `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `rank` ≥ `ranks` or more ranks than an `int` holds;
    /// [`Error::NcclNotFound`]; [`Error::Nccl`] with NCCL's text (two ranks on one GPU are
    /// `ncclInvalidUsage`); [`Error::Timeout`] when the other ranks do not all join in
    /// `timeout` (the half-made communicator is aborted).
    pub fn new(
        ctx: &GpuContext,
        id: &UniqueId,
        ranks: u32,
        rank: u32,
        timeout: Duration,
    ) -> Result<Self> {
        let call_name = "Communicator::new";
        ArgumentDefect::check_range(call_name, "ranks", u64::from(ranks), 1, c_int::MAX as u64)?;
        ArgumentDefect::check_range(call_name, "rank", u64::from(rank), 0, u64::from(ranks) - 1)?;
        let _g = ctx.enter()?;
        let mut comm: sys::NcclComm = std::ptr::null_mut();
        let mut config = sys::NcclConfig::new(false);
        // SAFETY: writes one communicator handle; reads `config` (a valid 2.14 layout) and the
        // id by value; the device is the current context's.
        let rc = call!(ncclCommInitRankConfig(
            &mut comm,
            ranks as c_int,
            id.0,
            rank as c_int,
            &mut config
        ));
        if rc != sys::NCCL_SUCCESS && rc != sys::NCCL_IN_PROGRESS {
            if !comm.is_null() {
                // SAFETY: the handle NCCL returned, aborted once, not used after.
                let _ = call!(ncclCommAbort(comm));
            }
            return Err(nccl_error("ncclCommInitRankConfig", rc, comm));
        }
        let this = Self {
            comm,
            ctx: ctx.clone(),
            rank,
            size: ranks,
            aborted: AtomicBool::new(false),
            groups_open: AtomicU32::new(0),
            abort_after_group: AtomicBool::new(false),
        };
        this.settle(
            "ncclCommInitRankConfig",
            "NCCL communicator initialisation",
            timeout,
        )?;
        Ok(this)
    }

    /// Two processes over an authenticated bootstrap link: the listening side draws the id and
    /// is rank 0, the connecting side rank 1; the id travels as one message of the link.
    ///
    /// # Errors
    ///
    /// As [`Bootstrapped::send`](crate::bootstrap::Bootstrapped::send) /
    /// [`recv`](crate::bootstrap::Bootstrapped::recv), [`UniqueId::from_bytes`] and
    /// [`new`](Self::new).
    pub fn pair(
        ctx: &GpuContext,
        link: &mut crate::bootstrap::Bootstrapped,
        timeout: Duration,
    ) -> Result<Self> {
        let start = std::time::Instant::now();
        let left = || timeout.saturating_sub(start.elapsed());
        let (id, rank) = if link.is_listener() {
            let id = UniqueId::new()?;
            link.send(id.as_bytes(), left())?;
            (id, 0)
        } else {
            (UniqueId::from_bytes(&link.recv(left())?)?, 1)
        };
        Self::new(ctx, &id, 2, rank, left())
    }

    /// Two processes of one host over a Unix socket ([`crate::fd::FdSocket`]): `rank` 0 draws
    /// the id and sends it, `rank` 1 receives it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank other than 0 or 1; as
    /// [`FdSocket::send`](crate::fd::FdSocket::send) / [`recv`](crate::fd::FdSocket::recv),
    /// [`UniqueId::from_bytes`] and [`new`](Self::new).
    pub fn pair_local(
        ctx: &GpuContext,
        socket: &crate::fd::FdSocket,
        rank: u32,
        timeout: Duration,
    ) -> Result<Self> {
        ArgumentDefect::check_range("Communicator::pair_local", "rank", u64::from(rank), 0, 1)?;
        let start = std::time::Instant::now();
        let left = || timeout.saturating_sub(start.elapsed());
        let id = if rank == 0 {
            let id = UniqueId::new()?;
            socket.send(id.as_bytes(), &[], left())?;
            id
        } else {
            UniqueId::from_bytes(&socket.recv(left())?.payload)?
        };
        Self::new(ctx, &id, 2, rank, left())
    }

    /// This process's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    #[must_use]
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Enqueue a send of `bytes` bytes at device address `ptr` to rank `peer` on `stream`
    /// (`ncclSend`; inside [`group`](Self::group) to pair it with receives).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` is device memory of this communicator's device that stays allocated
    /// and unwritten until the send completes on `stream` ([`wait`](Self::wait)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a peer outside the communicator; [`Error::Nccl`]; an
    /// aborted communicator is refused ([`Error::Nccl`], `ncclInvalidUsage`);
    /// [`Error::Timeout`] when NCCL has not taken the work within
    /// [`ENQUEUE_TIMEOUT`](Self::ENQUEUE_TIMEOUT). An error or the time-out aborts the
    /// communicator (inside [`group`](Self::group): once the group has ended).
    pub unsafe fn send(
        &self,
        ptr: u64,
        bytes: usize,
        peer: u32,
        stream: &impl AsStream,
    ) -> Result<()> {
        // SAFETY: the buffer is the caller's duty (forwarded).
        unsafe { self.point_to_point(Transfer::Send, ptr, bytes, peer, stream) }
    }

    /// Enqueue a receive of `bytes` bytes into device address `ptr` from rank `peer` on
    /// `stream` (`ncclRecv`).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` is device memory of this communicator's device that stays allocated,
    /// and is neither read nor written by anything else, until the receive completes on
    /// `stream`.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub unsafe fn recv(
        &self,
        ptr: u64,
        bytes: usize,
        peer: u32,
        stream: &impl AsStream,
    ) -> Result<()> {
        // SAFETY: the buffer is the caller's duty (forwarded).
        unsafe { self.point_to_point(Transfer::Recv, ptr, bytes, peer, stream) }
    }

    /// Run `f` between `ncclGroupStart` and `ncclGroupEnd`: its sends and receives are
    /// matched as one (a rank sending to itself needs both in one group). `ncclGroupEnd` runs
    /// whatever `f` returned; its failure is reported after `f`'s. An enqueue that fails
    /// inside `f` aborts the communicator only once `ncclGroupEnd` has run (aborting inside
    /// an open group would leave NCCL the group's queued work on a freed communicator).
    ///
    /// # Errors
    ///
    /// `f`'s error; [`Error::Nccl`] naming `ncclGroupStart` / `ncclGroupEnd`; [`Error::Timeout`]
    /// when NCCL has not taken the group's work within
    /// [`ENQUEUE_TIMEOUT`](Self::ENQUEUE_TIMEOUT).
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.check_live("ncclGroupStart")?;
        self.groups_open.fetch_add(1, Ordering::AcqRel);
        let ended = self.run_group(f);
        if self.groups_open.fetch_sub(1, Ordering::AcqRel) == 1
            && self.abort_after_group.swap(false, Ordering::AcqRel)
        {
            self.abort_now();
        }
        ended
    }

    fn run_group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let _g = self.ctx.enter()?;
        // SAFETY: no arguments; opens a group on this thread, closed below whatever happens.
        check("ncclGroupStart", call!(ncclGroupStart()), self.live_comm())?;
        let result = f();
        // SAFETY: closes the group opened above (the communicator is not aborted inside it:
        // see `abort_now`).
        let end = call!(ncclGroupEnd());
        let ended = self.enqueued("ncclGroupEnd", end);
        let r = result?;
        ended?;
        Ok(r)
    }

    /// Wait, at most `timeout`, until the work queued so far on `stream` has completed, watching
    /// the communicator's asynchronous error meanwhile. An error or the time-out aborts the
    /// communicator (NCCL's way to end work a dead peer would never complete).
    ///
    /// # Errors
    ///
    /// [`Error::Nccl`] with NCCL's text (`ncclCommGetAsyncError`); [`Error::Timeout`];
    /// [`Error::Cuda`] for the event calls.
    pub fn wait(&self, stream: &impl AsStream, timeout: Duration) -> Result<()> {
        let waiting = crate::trace::Waiting::start("NCCL work");
        waiting.end(self.wait_untraced(stream, timeout))
    }

    /// [`wait`](Self::wait) without its trace.
    fn wait_untraced(&self, stream: &impl AsStream, timeout: Duration) -> Result<()> {
        self.check_live("Communicator::wait")?;
        let _g = self.ctx.enter()?;
        let event = driver::event::create(driver::sys::CU_EVENT_DISABLE_TIMING)?;
        let done = Event(event);
        // SAFETY: a live event of the current context, recorded on the caller's stream.
        unsafe { driver::event::record(done.0, stream.as_cu_stream()) }?;
        let mut backoff = Backoff::new(timeout, Duration::from_micros(5), Duration::from_millis(1))
            .spinning_below(Duration::from_micros(50));
        loop {
            // SAFETY: the live event created above.
            if unsafe { driver::event::query(done.0) }? {
                return self.async_error().inspect_err(|_| self.abort_now());
            }
            self.async_error().inspect_err(|_| self.abort_now())?;
            if let Err(waited) = backoff.pause() {
                self.abort_now();
                return Err(Error::Timeout {
                    what: "NCCL work (the communicator was aborted)",
                    waited,
                    waiting_for: None,
                });
            }
        }
    }

    /// The communicator's asynchronous error (`ncclCommGetAsyncError`): `Ok` while none.
    ///
    /// # Errors
    ///
    /// [`Error::Nccl`] for an error NCCL reports, with its text.
    pub fn async_error(&self) -> Result<()> {
        self.check_live("ncclCommGetAsyncError")?;
        self.poll().map(drop)
    }

    /// `Ok(true)` once settled, `Ok(false)` while in progress, else the error.
    fn poll(&self) -> Result<bool> {
        let mut state: sys::NcclResult = sys::NCCL_SUCCESS;
        // SAFETY: a live communicator; writes one result.
        check(
            "ncclCommGetAsyncError",
            call!(ncclCommGetAsyncError(self.comm, &mut state)),
            self.live_comm(),
        )?;
        match state {
            sys::NCCL_SUCCESS => Ok(true),
            sys::NCCL_IN_PROGRESS => Ok(false),
            code => Err(nccl_error("ncclCommGetAsyncError", code, self.live_comm())),
        }
    }

    /// Poll a non-blocking call (`call_name`) until it settles, within `timeout`; on an error or
    /// the time-out the communicator is aborted.
    fn settle(&self, call_name: &'static str, what: &'static str, timeout: Duration) -> Result<()> {
        let mut backoff =
            Backoff::new(timeout, Duration::from_micros(20), Duration::from_millis(5));
        loop {
            match self.poll() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.abort_now();
                    return Err(match e {
                        Error::Nccl {
                            code, name, detail, ..
                        } => Error::Nccl {
                            call: call_name,
                            code,
                            name,
                            detail,
                        },
                        other => other,
                    });
                }
            }
            if let Err(waited) = backoff.pause() {
                self.abort_now();
                return Err(Error::Timeout {
                    what,
                    waited,
                    waiting_for: None,
                });
            }
        }
    }

    /// How long [`send`](Self::send), [`recv`](Self::recv) and [`group`](Self::group) wait
    /// for NCCL to take work it answered "in progress" (a non-blocking communicator's enqueue
    /// returns at once, and takes the work once its connections to the peer are up); past it,
    /// the call is [`Error::Timeout`] and the communicator is aborted.
    pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

    /// The result of an enqueueing call on a non-blocking communicator: in progress is waited
    /// out (it settles once NCCL has taken the work), an error aborts.
    fn enqueued(&self, call_name: &'static str, rc: sys::NcclResult) -> Result<()> {
        match rc {
            sys::NCCL_SUCCESS => Ok(()),
            sys::NCCL_IN_PROGRESS => self.settle(call_name, "NCCL enqueue", Self::ENQUEUE_TIMEOUT),
            code => {
                let e = nccl_error(call_name, code, self.live_comm());
                self.abort_now();
                Err(e)
            }
        }
    }

    /// What [`send`](Self::send) and [`recv`](Self::recv) share: the peer checked, the
    /// context current, `enqueue(peer, comm)` called (the one NCCL call), its result settled as
    /// [`enqueued`](Self::enqueued) does.
    /// [`send`](Self::send) or [`recv`](Self::recv), as `way` says.
    ///
    /// # Safety
    ///
    /// As theirs.
    unsafe fn point_to_point(
        &self,
        way: Transfer,
        ptr: u64,
        bytes: usize,
        peer: u32,
        stream: &impl AsStream,
    ) -> Result<()> {
        let (call_name, nccl_call) = match way {
            Transfer::Send => ("Communicator::send", "ncclSend"),
            Transfer::Recv => ("Communicator::recv", "ncclRecv"),
        };
        self.check_peer(call_name, peer)?;
        let _g = self.ctx.enter()?;
        let (buf, peer, stream) = (
            ptr as usize as *mut c_void,
            peer as c_int,
            stream.as_cu_stream(),
        );
        // The buffer is the caller's duty (forwarded); the communicator is live.
        let rc = match way {
            Transfer::Send => call!(ncclSend(
                buf.cast_const(),
                bytes,
                sys::NCCL_UINT8,
                peer,
                self.comm,
                stream
            )),
            Transfer::Recv => call!(ncclRecv(
                buf,
                bytes,
                sys::NCCL_UINT8,
                peer,
                self.comm,
                stream
            )),
        };
        self.enqueued(nccl_call, rc)
    }

    fn check_peer(&self, call_name: &'static str, peer: u32) -> Result<()> {
        self.check_live(call_name)?;
        ArgumentDefect::check_range(
            call_name,
            "peer rank",
            u64::from(peer),
            0,
            u64::from(self.size) - 1,
        )
    }

    fn check_live(&self, call_name: &'static str) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) || self.abort_after_group.load(Ordering::Acquire) {
            return Err(Error::Nccl {
                call: call_name,
                code: 5,
                name: sys::result_name(5),
                detail: "the communicator was aborted after an error or a time-out; make a new one"
                    .into(),
            });
        }
        Ok(())
    }

    /// The communicator for `ncclGetLastError`, null once aborted (NCCL then gives the
    /// thread's last error instead of reading a freed communicator).
    fn live_comm(&self) -> sys::NcclComm {
        if self.aborted.load(Ordering::Acquire) {
            std::ptr::null_mut()
        } else {
            self.comm
        }
    }

    /// Abort once (`ncclCommAbort`: cancels queued work, never waits for a peer). Inside a
    /// group, later calls are refused at once and the abort itself waits for the group's end.
    fn abort_now(&self) {
        if self.groups_open.load(Ordering::Acquire) > 0 {
            self.abort_after_group.store(true, Ordering::Release);
            return;
        }
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let (Ok(api), Ok(_g)) = (api(), self.ctx.enter())
            && let Some(abort) = api.ncclCommAbort
        {
            // SAFETY: the live communicator, aborted once (the flag above), not used after.
            let _ = unsafe { abort(self.comm) };
        }
    }

    /// Abort the communicator now (`ncclCommAbort`): queued work is cancelled.
    pub fn abort(self) {
        self.abort_now();
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.abort_now();
    }
}

/// A driver event, destroyed on drop.
struct Event(driver::sys::CUevent);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `driver::event::create`, destroyed once (its context is current
        // where it is dropped: inside `wait`).
        let _ = unsafe { driver::event::destroy(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_round_trips_and_other_lengths_are_refused() {
        let bytes = [7u8; 128];
        let id = UniqueId::from_bytes(&bytes).expect("128 bytes");
        assert_eq!(id.as_bytes(), &bytes);
        assert!(matches!(
            UniqueId::from_bytes(&bytes[..127]),
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(format!("{id:?}"), "UniqueId(..)");
    }

    #[test]
    fn results_have_their_names() {
        assert_eq!(sys::result_name(5), "ncclInvalidUsage");
        assert_eq!(sys::result_name(6), "ncclRemoteError");
        assert_eq!(
            sys::result_name(99),
            "an ncclResult_t this build does not know"
        );
    }

    #[test]
    fn the_config_is_the_2_14_layout() {
        let c = sys::NcclConfig::new(false);
        assert_eq!(c.size, 40);
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21_400, 0));
    }

    #[test]
    fn a_missing_library_is_nccl_not_found_naming_what_was_tried() {
        // Only where no NCCL is installed (this crate's CI machines): then every entry point
        // reports what the loader tried.
        if sys::library().is_ok() {
            return;
        }
        match version() {
            Err(Error::NcclNotFound { tried, .. }) => assert!(tried.contains("libnccl"), "{tried}"),
            other => panic!("expected NcclNotFound, got {other:?}"),
        }
    }
}
