//! The crate's `Send` and `Sync` promises, checked at compile time.
//!
//! The crate docs ([Threading](crate#threading)) say which types may move to and be shared
//! between threads; this module makes each statement a compile-time assertion, so a field that
//! would take a promise away fails the build instead of silently changing the API. What does
//! **not** hold is pinned by `compile_fail` examples:
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! fn main() {
//!     shared::<cuda_ipc::channel::IpcSender<u8>>(); // a sender is `Send`, not `Sync`
//! }
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! fn main() {
//!     shared::<cuda_ipc::channel::IpcReceiver<u8>>(); // a receiver is `Send`, not `Sync`
//! }
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! fn main() {
//!     shared::<cuda_ipc::channel::SendSlot<'static, u8>>(); // a slot borrows a sender: not `Sync` either
//! }
//! ```

use crate::*;
use crate::{arena::*, barrier::*, channel::*, fd::*, pool::*, shm::*};

// Used only in the `const` item below, which Rust before 1.89 (the MSRV is 1.88) does not
// count as a use.
#[allow(dead_code)]
const fn send_and_sync<T: Send + Sync>() {}
#[allow(dead_code)]
const fn send<T: Send>() {}

const _: () = {
    send_and_sync::<ShmRegion<BarrierState>>();
    send_and_sync::<ShmOptions>();
    send_and_sync::<ProcessBarrier<'static>>();
    send_and_sync::<ProcessIdentity>();
    send_and_sync::<GpuContext>();
    send_and_sync::<GpuSlice<u8>>();
    send_and_sync::<IpcBuffer<u8>>();
    send_and_sync::<ImportedBuffer<u8>>();
    send_and_sync::<IpcEvent>();
    send_and_sync::<ImportedEvent>();
    send_and_sync::<IpcSignal>();
    send_and_sync::<ImportedSignal>();
    send_and_sync::<IpcArena>();
    send_and_sync::<ImportedArena>();
    send_and_sync::<ArenaBuffer<u8>>();
    send_and_sync::<ArenaView<u8>>();
    send_and_sync::<IpcPool>();
    send_and_sync::<ImportedPool>();
    send_and_sync::<PoolBuffer<u8>>();
    send_and_sync::<PoolView<u8>>();
    send_and_sync::<ReadOnlySlice<u8>>();
    send_and_sync::<ReadOnlyBuffer<u8>>();
    send_and_sync::<ReadOnlyArena>();
    send_and_sync::<ReadOnlyArenaView<u8>>();
    send_and_sync::<ReadOnlyPool>();
    send_and_sync::<ReadOnlyPoolView<u8>>();
    send_and_sync::<FdListener>();
    send_and_sync::<FdSocket>();
    send_and_sync::<Error>();
    send_and_sync::<crate::wait::WaitSet>();
    send::<IpcSender<u8>>();
    send::<IpcReceiver<u8>>();
    send::<crate::channel::Listening<IpcSender<u8>>>();
    send::<crate::channel::Listening<IpcReceiver<u8>>>();
};
