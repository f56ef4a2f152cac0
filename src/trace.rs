//! The crate's tracing points, behind the `tracing` feature (off by default). With it, each
//! point is a `tracing` span or event at `DEBUG` level, under the target of the module that
//! raises it (`cuda_ipc::ledger::owner`, ...): an application's subscriber shows them, and with
//! no subscriber each costs one check of the global level. Without the feature every point
//! compiles to nothing: its fields are not even evaluated. What each point says is listed in
//! the [`inspect`](crate::inspect) guide ("Tracing").

/// An event at `DEBUG` level: `event!("message", field = value, ...)` in `tracing`'s field
/// syntax (no comma after the last field). Without the feature it expands to `()`.
#[cfg(feature = "tracing")]
macro_rules! event {
    ($message:literal $(, $($field:tt)+)?) => {
        ::tracing::debug!($($($field)+ ,)? $message)
    };
}
#[cfg(not(feature = "tracing"))]
macro_rules! event {
    ($($anything:tt)*) => {
        ()
    };
}
pub(crate) use event;

/// A span at `DEBUG` level, entered until the returned [`Scope`] drops: `scope!("name", field =
/// value, ...)`. Events raised inside (an import-cache hit or miss) nest under it. Without the
/// feature it is a [`Scope`] of nothing.
#[cfg(feature = "tracing")]
macro_rules! scope {
    ($name:literal $(, $($field:tt)+)?) => {
        $crate::trace::Scope {
            // The level first: a span `tracing` builds disabled still costs its construction,
            // its enter and its exit (about 5 ns against 1 for the check).
            _entered: ::tracing::level_enabled!(::tracing::Level::DEBUG)
                .then(|| ::tracing::debug_span!($name $(, $($field)+)?).entered()),
        }
    };
}
#[cfg(not(feature = "tracing"))]
macro_rules! scope {
    ($($anything:tt)*) => {
        $crate::trace::Scope {}
    };
}
pub(crate) use scope;

/// An entered span (see [`scope!`]); nothing without the feature.
#[must_use = "the span ends when this drops"]
pub(crate) struct Scope {
    #[cfg(feature = "tracing")]
    pub(crate) _entered: Option<tracing::span::EnteredSpan>,
}

/// One wait, from its start to how it ended: a span `wait` with `what` it waits for, closed by
/// an event saying how long it took (`waited_us`) and how it `ended` (`done`, `timeout`,
/// `peer_gone`, `closed`, `error`; `cancelled` when dropped first — a future dropped while
/// pending). Not entered: an `async` wait keeps it across `.await`s. Without the feature it is
/// empty and takes no clock reading.
#[must_use = "a wait that is not ended says it was cancelled"]
pub(crate) struct Waiting {
    #[cfg(feature = "tracing")]
    span: Option<(tracing::Span, std::time::Instant)>,
}

impl Waiting {
    /// A wait for `what` begins.
    #[inline(always)]
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub(crate) fn start(what: &'static str) -> Self {
        #[cfg(feature = "tracing")]
        {
            // The level first, as in `scope!`.
            let span = tracing::level_enabled!(tracing::Level::DEBUG)
                .then(|| tracing::debug_span!("wait", what))
                .filter(|span| !span.is_disabled());
            Self {
                span: span.map(|span| (span, std::time::Instant::now())),
            }
        }
        #[cfg(not(feature = "tracing"))]
        Self {}
    }

    /// The wait ended with `result`; it is passed on.
    #[inline(always)]
    pub(crate) fn end<T, E: Ending>(self, result: Result<T, E>) -> Result<T, E> {
        #[cfg(feature = "tracing")]
        {
            let mut this = self;
            if let Some((span, start)) = this.span.take() {
                let ended = match &result {
                    Ok(_) => "done",
                    Err(e) => e.ending(),
                };
                waited(&span, start, ended);
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = self;
        result
    }
}

#[cfg(feature = "tracing")]
impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some((span, start)) = self.span.take() {
            waited(&span, start, "cancelled");
        }
    }
}

/// The event that closes a wait's span.
#[cfg(feature = "tracing")]
fn waited(span: &tracing::Span, start: std::time::Instant, ended: &'static str) {
    let waited_us = start.elapsed().as_micros() as u64;
    span.in_scope(|| tracing::debug!(waited_us, ended, "wait ended"));
}

/// An error a wait can end with, saying how in one word (`timeout`, `peer_gone`, `closed`,
/// `error`): implemented by the crate's error (`error.rs`), which this file does not name.
pub(crate) trait Ending {
    /// How the wait ended.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))] // read only by the trace
    fn ending(&self) -> &'static str;
}

#[cfg(all(feature = "tracing", any(test, fuzzing, cuda_ipc_test_hooks)))]
#[doc(hidden)]
pub mod catch;

#[cfg(all(test, feature = "tracing", not(cuda_ipc_loom)))]
mod tests;
