//! Host waits on what the GPU writes — a signal's counter, an event's completion — as
//! descriptors ([`SignalWatch`], [`EventWatch`]) and as futures
//! ([`GpuSignal::wait_host_async`], [`GpuEvent::synchronize_async`], feature `async`); the
//! [`wait`](super) module's docs say why a watch looks.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::event::GpuEvent;
use crate::poll::Pacer;
use crate::signal::{GpuSignal, check_value};

/// The first pause between two looks, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_micros(10);
/// The longest pause between two looks (as the blocking waits').
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// The looks of one watch: their pacing, and when the next liveness check is due.
#[derive(Debug)]
struct Looks {
    pacer: Pacer,
    next_check: Instant,
}

impl Looks {
    fn new(what: &'static str, liveness_check: Duration) -> Result<Self> {
        Ok(Self {
            pacer: Pacer::new(what, FIRST_PAUSE, MAX_PAUSE)?,
            next_check: Instant::now() + liveness_check,
        })
    }

    /// One look (`look` given the next liveness check): what it found, or `None` and the
    /// descriptor readable again after the next pause.
    fn once<T>(
        &mut self,
        look: impl FnOnce(&mut Instant) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let found = look(&mut self.next_check)?;
        if found.is_none() {
            self.pacer.later()?;
        }
        Ok(found)
    }

    /// Look until `look` finds something, the task awaiting a pacer between looks: the first
    /// look before the pacer is made (a wait that needs no pause makes no timer).
    #[cfg(feature = "async")]
    async fn until<T>(
        what: &'static str,
        liveness_check: Duration,
        mut look: impl FnMut(&mut Instant) -> Result<Option<T>>,
    ) -> Result<T> {
        let waiting = crate::trace::Waiting::start(what);
        waiting.end(
            async move {
                let mut next_check = Instant::now() + liveness_check;
                if let Some(found) = look(&mut next_check)? {
                    return Ok(found);
                }
                let mut looks = Self::new(what, liveness_check)?;
                looks.next_check = next_check;
                loop {
                    if let Some(found) = looks.once(&mut look)? {
                        return Ok(found);
                    }
                    crate::reactor::Readable::new(looks.pacer.as_fd()).await?;
                }
            }
            .await,
        )
    }
}

/// A host wait for a signal's counter to reach a value, as a descriptor that turns readable
/// when it is time to [`check`](Self::check) again: made by [`GpuSignal::watch`], attached to a
/// [`WaitSet`](crate::wait::WaitSet) (or any reactor: it is `AsFd`) beside channel ends and
/// sockets. It looks rather than being told, paced (the [`wait`](crate::wait) module says why).
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
    looks: Looks,
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
            looks: Looks::new("IPC signal watch", Duration::ZERO)?,
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
        check_value("IpcSignal::wait_host_async", value)?;
        Looks::until("IPC signal wait", Duration::ZERO, |next| {
            self.look(value, next)
        })
        .await
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
        let (signal, value) = (self.signal, self.value);
        self.looks.once(|next| signal.look(value, next))
    }

    /// The value watched for.
    #[must_use]
    pub fn value(&self) -> u64 {
        self.value
    }
}

impl AsFd for SignalWatch<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.looks.pacer.as_fd()
    }
}

/// A host wait for an event's completion, as a descriptor that turns readable when it is time
/// to [`check`](Self::check) again: made by [`GpuEvent::watch`], attached to a
/// [`WaitSet`](crate::wait::WaitSet) (or any reactor: it is `AsFd`). It looks rather than
/// being told, paced (the [`wait`](crate::wait) module says why). Like
/// [`synchronize`](GpuEvent::synchronize), each look waits for the last record *then*: a
/// record made while a watch is pending is waited for too.
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
    looks: Looks,
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
            looks: Looks::new("IPC event watch", crate::event::LIVENESS_CHECK)?,
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
        Looks::until(
            "IPC event synchronize",
            crate::event::LIVENESS_CHECK,
            |next| self.look(next),
        )
        .await
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
        let event = self.event;
        Ok(self.looks.once(|next| event.look(next))?.is_some())
    }
}

impl AsFd for EventWatch<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.looks.pacer.as_fd()
    }
}
