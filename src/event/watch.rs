//! A host wait for an event's completion as a descriptor ([`EventWatch`], for a
//! [`WaitSet`](crate::wait::WaitSet) or any reactor) and as a future
//! ([`GpuEvent::synchronize_async`], feature `async`).

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::GpuEvent;
use crate::error::Result;
use crate::poll::Pacer;

/// The first pause between two looks of a watch, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_micros(10);
/// The longest pause between two looks (as [`GpuEvent::synchronize`]'s).
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// A host wait for an event's completion, as a descriptor that turns readable when it is time
/// to [`check`](Self::check) again: made by [`GpuEvent::watch`], attached to a
/// [`WaitSet`](crate::wait::WaitSet) (or any reactor: it is `AsFd`).
///
/// The driver tells the host of an event's completion only to a thread blocked in
/// `cuEventSynchronize` (no deadline, no notice of a dead exporter) or to a host callback
/// behind a stream of ours waiting on the event — which cannot be called off: when the
/// recorded work never ends (it waits on a signal nobody writes), that stream stays parked,
/// and every later `cuMemFree` of the process waits for it. So a watch looks, as
/// [`synchronize`](GpuEvent::synchronize) does (`cuEventQuery`, about a microsecond), with a
/// back-off of 10 µs doubling to 1 ms paced by a timer descriptor instead of a sleeping
/// thread: no thread and no CPU between looks. An opened event's exporter is checked every
/// 10 ms, as the blocking wait checks it.
///
/// A watch holds no state in the event: dropped at any point (a cancelled future), it leaves
/// nothing for the next wait. Like [`synchronize`](GpuEvent::synchronize), it waits for the
/// last record *at each look*: a record made while a watch is pending is waited for too.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::wait::WaitSet;
/// use cuda_ipc::{GpuContext, ImportedEvent, IpcEventHandle};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// # let handle: IpcEventHandle = todo!();
/// let ctx = GpuContext::new(0)?;
/// let done = ImportedEvent::open(&ctx, &handle)?;
/// let mut watch = done.watch()?;
/// let mut set = WaitSet::new()?;
/// let key = set.attach(&watch)?;
/// while !(set.wait(Some(Duration::from_secs(1)))?.contains(&key) && watch.check()?) {}
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EventWatch<'a> {
    event: &'a GpuEvent,
    pacer: Pacer,
    last_check: Instant,
}

impl GpuEvent {
    /// A watch of the event's completion, as a descriptor: readable at once, then each time
    /// [`EventWatch::check`] should look again.
    ///
    /// # Errors
    ///
    /// [`Error::Os`](crate::Error::Os) if no timer descriptor can be made.
    pub fn watch(&self) -> Result<EventWatch<'_>> {
        Ok(EventWatch {
            event: self,
            pacer: Pacer::new("IPC event watch", FIRST_PAUSE, MAX_PAUSE)?,
            last_check: Instant::now(),
        })
    }

    /// Await the completion of the work before the event's last record, as
    /// [`synchronize`](Self::synchronize) waits for it: the task, not a thread, waits between
    /// looks (feature `async`; any runtime). No time limit of its own: compose one with the
    /// runtime's (`tokio::time::timeout`).
    ///
    /// **Cancel-safe:** dropped at any point, it leaves nothing behind.
    ///
    /// # Errors
    ///
    /// As [`synchronize`](Self::synchronize), without [`Error::Timeout`](crate::Error::Timeout);
    /// [`Error::Os`](crate::Error::Os) if the reactor cannot start or watch the timer.
    #[cfg(feature = "async")]
    pub async fn synchronize_async(&self) -> Result<()> {
        let mut watch = self.watch()?;
        while !watch.check()? {
            crate::reactor::Readable::new(watch.as_fd()).await?;
        }
        Ok(())
    }
}

impl EventWatch<'_> {
    /// Look once: whether the work before the event's last record has completed; if not, the
    /// descriptor turns readable again after the next pause.
    ///
    /// # Errors
    ///
    /// As [`GpuEvent::synchronize`], without [`Error::Timeout`](crate::Error::Timeout) (a
    /// watch has no deadline: attach one to the [`WaitSet`](crate::wait::WaitSet));
    /// [`Error::Os`](crate::Error::Os) naming `timerfd_settime`.
    pub fn check(&mut self) -> Result<bool> {
        let done = self.event.look(&mut self.last_check)?;
        if !done {
            self.pacer.later()?;
        }
        Ok(done)
    }
}

impl AsFd for EventWatch<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pacer.as_fd()
    }
}
