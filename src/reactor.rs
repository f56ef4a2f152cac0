//! The crate's reactor, for its `async` methods (feature `async`): one thread per process
//! that waits (`epoll`) on the descriptors of the futures pending and wakes each future's task
//! when its descriptor turns readable — so a thousand pending awaits cost one thread, no timer
//! and no CPU while idle, in any runtime (tokio, smol, a hand-rolled executor: only `std`'s
//! `Future` and `Waker`).
//!
//! A channel wait first spins for a few microseconds, cooperatively ([`Spin`], [`yield_now`]:
//! the task re-polls itself, the runtime running its other tasks between polls), as a blocking
//! wait spins before it sleeps. Then a [`Readable`] future registers its descriptor once-only
//! (`EPOLLONESHOT`) with the waker of its last poll and is re-armed at each `Pending`; dropped,
//! it removes its descriptor, so a cancelled wait leaves nothing behind (the object it waited
//! for holds no state of the wait: a channel end's arm is a bit the next ring takes).
//!
//! The thread is started by the first `async` wait of a process. A forked child has no copy
//! of it: its waits start their own.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::os;

/// The process's reactor: its descriptor set and the waker of each registration.
struct Reactor {
    set: OwnedFd,
    wakers: Mutex<Wakers>,
    /// The process that started the thread (a forked child has none running).
    pid: u32,
}

#[derive(Default)]
struct Wakers {
    next: u64,
    by_key: HashMap<u64, Waker>,
}

/// The reactor of this process, started on first use.
fn reactor() -> Result<&'static Reactor> {
    static REACTORS: Mutex<Vec<&'static Reactor>> = parking_lot::const_mutex(Vec::new());
    let pid = os::pid();
    let mut all = REACTORS.lock();
    if let Some(r) = all.iter().find(|r| r.pid == pid) {
        return Ok(r);
    }
    let set = os::epoll::set().map_err(|e| Error::from_os("epoll_create1", "reactor", e))?;
    // Leaked on purpose: the thread serves for the life of the process (one per process).
    let r: &'static Reactor = Box::leak(Box::new(Reactor {
        set,
        wakers: Mutex::new(Wakers::default()),
        pid,
    }));
    std::thread::Builder::new()
        .name("cuda-ipc-reactor".into())
        .spawn(move || r.run())
        .map_err(|e| Error::Os {
            call: "pthread_create",
            name: "cuda-ipc-reactor".into(),
            source: e,
        })?;
    all.push(r);
    Ok(r)
}

impl Reactor {
    /// Wake the task of every registration whose descriptor turned readable, for ever.
    fn run(&self) {
        loop {
            let Ok(keys) = os::epoll::wait(self.set.as_fd(), None) else {
                continue;
            };
            let mut wakers = self.wakers.lock();
            let ready: Vec<Waker> = keys
                .into_iter()
                .filter_map(|k| wakers.by_key.remove(&k))
                .collect();
            drop(wakers);
            ready.into_iter().for_each(Waker::wake);
        }
    }
}

/// A future that is ready when a descriptor is readable (or hung up): see the module docs.
#[derive(Debug)]
pub(crate) struct Readable<'a> {
    fd: BorrowedFd<'a>,
    /// The registration's key, once registered.
    key: Option<u64>,
}

impl<'a> Readable<'a> {
    pub(crate) fn new(fd: BorrowedFd<'a>) -> Self {
        Self { fd, key: None }
    }
}

impl Future for Readable<'_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if os::epoll::readable_now(self.fd) {
            return Poll::Ready(Ok(()));
        }
        let r = match reactor() {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let key = {
            let mut wakers = r.wakers.lock();
            let key = *self.key.get_or_insert_with(|| {
                wakers.next += 1;
                wakers.next
            });
            wakers.by_key.insert(key, cx.waker().clone());
            key
        };
        // Armed after the waker is in place: a descriptor readable meanwhile is reported at
        // once (epoll judges it at the arm), and its wake finds the waker.
        if let Err(e) = os::epoll::watch_once(r.set.as_fd(), self.fd, key) {
            r.wakers.lock().by_key.remove(&key);
            return Poll::Ready(Err(Error::from_os("epoll_ctl", "reactor", e)));
        }
        Poll::Pending
    }
}

impl Drop for Readable<'_> {
    fn drop(&mut self) {
        if let (Some(key), Ok(r)) = (self.key, reactor()) {
            os::epoll::remove(r.set.as_fd(), self.fd);
            r.wakers.lock().by_key.remove(&key);
        }
    }
}

/// The first moments of an `async` wait, in which it looks again at once rather than park
/// its task on a descriptor — as a blocking wait spins before it sleeps, and for the same
/// reason: a hand-off between GPUs often completes within microseconds, sooner than a wake
/// through this reactor's thread and then the runtime's (two thread wake-ups).
#[derive(Debug)]
pub(crate) struct Spin(std::time::Instant);

impl Spin {
    /// A spin of `length` from now.
    pub(crate) fn new(length: std::time::Duration) -> Self {
        Self(std::time::Instant::now() + length)
    }

    /// Whether the spin is still on.
    pub(crate) fn on(&self) -> bool {
        std::time::Instant::now() < self.0
    }
}

/// Let the runtime run its other tasks once, then go on: a cooperative spin's pause (the task
/// wakes itself; no thread blocks).
pub(crate) async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// Call `attempt` until it finds something, awaiting `fd`'s turning readable between tries:
/// the loop of every `async` wait on a descriptor whose `try_` call never waits. Cancel-safe
/// when `attempt` takes its find whole or not at all.
pub(crate) async fn until<T>(
    fd: BorrowedFd<'_>,
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    loop {
        if let Some(found) = attempt()? {
            return Ok(found);
        }
        Readable::new(fd).await?;
    }
}

#[cfg(test)]
mod tests;
