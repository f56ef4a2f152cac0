//! Deferred release: the GPU memory behind a tensor (another process's memory mapped here, an
//! arena's range, a channel end's slots) is given back only after the device has finished the
//! work queued before the tensor's last reference went.
//!
//! PyTorch, CuPy and JAX let a program drop a tensor while kernels that use it are still queued
//! (`y = t * 2; del t`): their allocators hand the memory out again in stream order, so that is
//! safe for their own memory. This package's memory is not theirs: dropping an import unmaps it
//! and dropping an arena tensor lets the arena reuse its range, so releasing on the spot would
//! let a queued kernel fault in this process's context (which then dies) or read the next
//! tensor's bytes. So the last reference hands what it held to one thread per process, which
//! synchronises the context — `cuCtxSynchronize`: every stream, whoever made it, which no event
//! of ours could cover — and only then drops it.
//!
//! - The caller never waits for the GPU, and the thread never takes the GIL. Everything handed
//!   over before a synchronisation began is released after it; a burst of drops costs one.
//! - A synchronisation that fails (a queued kernel faulted: the context is unusable) leaks what
//!   it was to release instead of unmapping under a context in an unknown state; one that does
//!   not return (a stream waiting on the GPU for a value nobody writes) holds back everything
//!   after it — memory kept, never a fault.
//! - A forked child drops on the spot: the crate's drops touch none of the parent's resources
//!   there, and a child has neither CUDA nor this thread.
//! - [`wait_released`] waits (bounded) until everything handed over so far is released: tests
//!   that count device memory or `/dev/shm` names call it. At interpreter exit (`atexit`,
//!   [`exiting`]) the package waits the same way, and from then on every release waits for
//!   itself (at most [`AT_EXIT`] each, until one runs out), so the tensors that globals held,
//!   dropped as the interpreter finalises, are still released and a normal exit removes what
//!   it made; a process whose GPU work never finishes exits without them, as if killed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// What a last reference held: dropped once its context has finished its queued work.
type Held = Box<dyn Send>;

struct Queue {
    pending: Vec<(cuda_ipc::GpuContext, Held)>,
    /// The thread is releasing a batch taken from `pending`.
    busy: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    pending: Vec::new(),
    busy: false,
});
/// Releases given up because their synchronisation failed, leaked (see the module docs): an
/// atomic, not a field of [`QUEUE`], so that reading it takes no lock (a forked child's copy of
/// the lock may be held by a thread the child does not have).
static LEAKED: AtomicU64 = AtomicU64::new(0);
/// Signalled when `pending` gains an item.
static MORE: Condvar = Condvar::new();
/// Signalled when the thread has nothing pending and nothing in hand.
static IDLE: Condvar = Condvar::new();

/// The thread, started at the first release.
struct Started {
    /// The process that started it (a forked child's copy of this has no thread).
    pid: u32,
    /// Whether it started; if not, releases synchronise on the caller's thread.
    running: bool,
}

static THREAD: OnceLock<Started> = OnceLock::new();

/// How long a release waits for itself once the interpreter exits.
pub(crate) const AT_EXIT: Duration = Duration::from_secs(5);
/// The interpreter is exiting: releases wait for themselves (see the module docs).
static EXITING: AtomicBool = AtomicBool::new(false);
/// A wait at exit ran out: later ones do not wait again.
static STUCK: AtomicBool = AtomicBool::new(false);

fn lock() -> MutexGuard<'static, Queue> {
    // A panic while holding it cannot leave the queue inconsistent (pushes and takes only).
    QUEUE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn thread() -> &'static Started {
    THREAD.get_or_init(|| Started {
        pid: std::process::id(),
        running: std::thread::Builder::new()
            .name("cuda-ipc-release".into())
            .spawn(run)
            .is_ok(),
    })
}

/// Whether this is a forked child of the process whose thread the queue has.
fn forked(started: &Started) -> bool {
    started.pid != std::process::id()
}

/// Release `held` once `ctx` has finished the work queued on any of its streams so far.
pub(crate) fn after_queued_work(ctx: &cuda_ipc::GpuContext, held: impl Send + 'static) {
    let started = thread();
    if forked(started) {
        drop(held); // see the module docs
        return;
    }
    if !started.running {
        // No thread (the system refused one): synchronise here rather than release early.
        release(vec![(ctx.clone(), Box::new(held))]);
        return;
    }
    lock().pending.push((ctx.clone(), Box::new(held)));
    MORE.notify_one();
    if EXITING.load(Ordering::Acquire) {
        at_exit();
    }
}

/// Wait (at most `timeout`) until the device has finished everything queued in `ctx` so far, on
/// every stream, and everything handed over before is released: `false` if that took longer
/// (a kernel still running, a stream waiting on the GPU for a value nobody writes, or an earlier
/// synchronisation stuck so). A channel end's `close` calls it before unmapping its slots. In a
/// forked child it returns at once (nothing of the parent's is queued there).
pub(crate) fn synchronized(ctx: &cuda_ipc::GpuContext, timeout: Duration) -> bool {
    after_queued_work(ctx, ());
    wait(timeout)
}

/// Wait for the queue at exit, at most [`AT_EXIT`], unless a wait already ran out.
fn at_exit() {
    if !STUCK.load(Ordering::Acquire) && !wait(AT_EXIT) {
        STUCK.store(true, Ordering::Release);
    }
}

fn run() {
    loop {
        let batch = {
            let mut q = lock();
            q.busy = false;
            while q.pending.is_empty() {
                IDLE.notify_all();
                q = MORE.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
            q.busy = true;
            std::mem::take(&mut q.pending)
        };
        release(batch);
    }
}

/// Synchronise each context of `batch` once, then drop what it holds — or leak it, counted in
/// [`LEAKED`], where the synchronisation failed.
fn release(batch: Vec<(cuda_ipc::GpuContext, Held)>) {
    let mut settled: HashMap<usize, bool> = HashMap::new();
    for (ctx, held) in batch {
        let ok = *settled
            .entry(ctx.as_raw() as usize)
            .or_insert_with(|| ctx.synchronize().is_ok());
        if ok {
            drop(held);
        } else {
            std::mem::forget(held);
            LEAKED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Wait until everything handed over so far is released, at most `timeout`; whether it was.
fn wait(timeout: Duration) -> bool {
    match THREAD.get() {
        None => return true, // nothing was ever handed over
        Some(started) if forked(started) || !started.running => return true,
        Some(_) => {}
    }
    let deadline = Instant::now().checked_add(timeout);
    let mut q = lock();
    while q.busy || !q.pending.is_empty() {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(3600),
        };
        if left.is_zero() {
            return false;
        }
        q = IDLE
            .wait_timeout(q, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    true
}

/// Wait (at most `timeout` seconds, the GIL released) until the memory of every tensor and
/// channel end dropped so far has been given back — after the GPU finished the work queued on
/// it —; `True` if it was, `False` if the time ran out first (a stream still busy, or waiting
/// on the GPU for a peer). Dropping never waits: call this where the release must be seen
/// (device memory counted, a freed tensor's handle refused, names gone from `/dev/shm`).
#[pyfunction]
#[pyo3(signature = (timeout = 10.0))]
pub(crate) fn wait_released(py: Python<'_>, timeout: f64) -> PyResult<bool> {
    let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!("timeout {timeout} is not a duration"))
    })?;
    Ok(py.detach(|| wait(timeout)))
}

/// How many releases were given up because the device's synchronisation failed (a faulted
/// context): their memory is kept, not unmapped, until the process exits. Takes no lock (a
/// forked child may call it too: it reads the count its parent had at the fork).
#[pyfunction]
pub(crate) fn leaked_releases() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// The interpreter is exiting (the package's `atexit` hook): wait for what is queued, and have
/// every later release wait for itself (see the module docs).
#[pyfunction]
pub(crate) fn exiting(py: Python<'_>) {
    EXITING.store(true, Ordering::Release);
    py.detach(at_exit);
}
