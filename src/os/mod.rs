//! The platform seam: every call the library makes into libc or rustix (system calls, `atexit`,
//! `pthread_atfork`) lives below this module; above it, only `std`'s own file and socket types
//! (`shm.rs` lists `/dev/shm` with `std::fs`).
//!
//! Only Linux is implemented (`linux.rs`): named shared memory under `/dev/shm`, shared futexes,
//! and `/proc` process identities. A new platform is one new file with the same functions.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub(crate) use linux::*;
#[cfg(target_os = "linux")]
pub(crate) mod datagram;
#[cfg(target_os = "linux")]
pub(crate) mod epoll;
#[cfg(target_os = "linux")]
pub(crate) mod socket;
#[cfg(target_os = "linux")]
pub(crate) mod timer;

#[cfg(not(target_os = "linux"))]
compile_error!("cuda-ipc supports Linux only (CUDA legacy IPC is Linux-only)");
