//! Atomics and parking for the barrier, swapped for loom's under `--cfg cuda_ipc_loom` so the
//! algorithm can be model-checked with threads standing in for processes.

#[cfg(not(cuda_ipc_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(cuda_ipc_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Sleep on the shared futex `word` while it equals `expected`, at most `timeout`.
#[cfg(not(cuda_ipc_loom))]
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    crate::os::futex_wait(word, expected, timeout);
}

/// Wake every sleeper on `word`.
#[cfg(not(cuda_ipc_loom))]
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    crate::os::futex_wake_all(word);
}

/// A CPU hint inside a spin loop.
#[cfg(not(cuda_ipc_loom))]
pub(crate) fn spin_hint() {
    std::hint::spin_loop();
}

/// Give the CPU to another thread or process.
#[cfg(not(cuda_ipc_loom))]
pub(crate) fn yield_now() {
    std::thread::yield_now();
}

// Under loom a park is a yield (loom explores the schedules in which the waker runs first),
// and a wake is nothing: the waiter re-checks the word after every yield.
#[cfg(cuda_ipc_loom)]
pub(crate) fn futex_wait(_word: &AtomicU32, _expected: u32, _timeout: std::time::Duration) {
    loom::thread::yield_now();
}
#[cfg(cuda_ipc_loom)]
pub(crate) fn futex_wake_all(_word: &AtomicU32) {}
#[cfg(cuda_ipc_loom)]
pub(crate) fn spin_hint() {
    loom::thread::yield_now();
}
#[cfg(cuda_ipc_loom)]
pub(crate) fn yield_now() {
    loom::thread::yield_now();
}

/// Run `f` under the model checker for every interleaving of its threads. Waiters poll in
/// loops (each poll is a few atomic operations), so paths are long: more branches than loom's
/// default are allowed, and preemptions are bounded (the usual loom practice).
#[cfg(all(test, cuda_ipc_loom))]
pub(crate) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}
