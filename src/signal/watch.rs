//! A host wait for a signal's counter as a descriptor ([`SignalWatch`], for a
//! [`WaitSet`](crate::wait::WaitSet) or any reactor) and as a future
//! ([`GpuSignal::wait_host_async`], feature `async`).

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::{GpuSignal, check_value};
use crate::error::Result;
use crate::poll::Pacer;

/// The first pause between two looks of a watch, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_micros(10);
/// The longest pause between two looks (as [`GpuSignal::wait_host`]'s).
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// A host wait for a signal's counter to reach a value, as a descriptor that turns readable
/// when it is time to [`check`](Self::check) again: made by [`GpuSignal::watch`], attached to a
/// [`WaitSet`](crate::wait::WaitSet) (or any reactor: it is `AsFd`) beside channel ends and
/// sockets.
///
/// The counter is a word in GPU memory that streams of several processes write: nothing tells
/// the host when it changes. A GPU-side watch (a stream of ours waiting on the word, then a host
/// callback) would wake without looking, but cannot be called off: a stream parked on a value
/// nobody writes — the very case of a cancelled wait — stays parked, and every later
/// `cuMemFree` of the process waits for it. So a watch looks, as
/// [`wait_host`](GpuSignal::wait_host) does, with its back-off (10 µs doubling to 1 ms)
/// paced by a timer descriptor instead of a sleeping thread: between looks it costs no thread
/// and no CPU, and each look is one read of the counter (a copy on the signal's own stream).
/// The parties' liveness is checked every 10 ms, as the blocking wait checks it.
///
/// A watch holds no state in the signal: dropped at any point (a cancelled future), it leaves
/// nothing for the next wait.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::wait::WaitSet;
/// use cuda_ipc::{GpuContext, IpcSignal};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let signal = IpcSignal::new(&ctx)?; // another process signals 1 on its stream
/// let mut watch = signal.watch(1)?;
/// let mut set = WaitSet::new()?;
/// let key = set.attach(&watch)?;
/// loop {
///     if set.wait(Some(Duration::from_secs(1)))?.contains(&key) {
///         if let Some(value) = watch.check()? {
///             println!("signalled: {value}");
///             break;
///         }
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SignalWatch<'a> {
    signal: &'a GpuSignal,
    value: u64,
    pacer: Pacer,
    next_check: Instant,
}

impl GpuSignal {
    /// A watch of the counter reaching `value` (≥), as a descriptor: readable at once, then
    /// each time [`SignalWatch::check`] should look again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a value above
    /// [`MAX_VALUE`](Self::MAX_VALUE); [`Error::Os`](crate::Error::Os) if no timer descriptor
    /// can be made.
    pub fn watch(&self, value: u64) -> Result<SignalWatch<'_>> {
        check_value("IpcSignal::watch", value)?;
        Ok(SignalWatch {
            signal: self,
            value,
            pacer: Pacer::new("IPC signal watch", FIRST_PAUSE, MAX_PAUSE)?,
            next_check: Instant::now(),
        })
    }

    /// Await the counter's reaching `value` (≥), as [`wait_host`](Self::wait_host) waits for
    /// it, and return the value read: the task, not a thread, waits between looks (feature
    /// `async`; any runtime). No time limit of its own: compose one with the runtime's
    /// (`tokio::time::timeout`).
    ///
    /// **Cancel-safe:** dropped at any point, it leaves nothing behind.
    ///
    /// # Errors
    ///
    /// As [`wait_host`](Self::wait_host), without [`Error::Timeout`](crate::Error::Timeout);
    /// [`Error::Os`](crate::Error::Os) if the reactor cannot start or watch the timer.
    #[cfg(feature = "async")]
    pub async fn wait_host_async(&self, value: u64) -> Result<u64> {
        let mut watch = self.watch(value)?;
        loop {
            if let Some(found) = watch.check()? {
                return Ok(found);
            }
            crate::reactor::Readable::new(watch.as_fd()).await?;
        }
    }
}

impl SignalWatch<'_> {
    /// Look once: the counter's value if it reached the watched one; else `None`, and the
    /// descriptor turns readable again after the next pause.
    ///
    /// # Errors
    ///
    /// As [`GpuSignal::wait_host`], without [`Error::Timeout`](crate::Error::Timeout) (a
    /// watch has no deadline: attach one to the [`WaitSet`](crate::wait::WaitSet));
    /// [`Error::Os`](crate::Error::Os) naming `timerfd_settime`.
    pub fn check(&mut self) -> Result<Option<u64>> {
        let found = self.signal.look(self.value, &mut self.next_check)?;
        if found.is_none() {
            self.pacer.later()?;
        }
        Ok(found)
    }

    /// The value watched for.
    #[must_use]
    pub fn value(&self) -> u64 {
        self.value
    }
}

impl AsFd for SignalWatch<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pacer.as_fd()
    }
}
