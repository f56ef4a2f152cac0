//! What may live in memory that another process can write: the [`ShmSafe`] contract and
//! [`ShmCell`], a plain-data slot read and written only by copy.
//!
//! Rust's aliasing rules assume nobody changes the bytes behind a `&T` (outside an `UnsafeCell`),
//! and its memory model makes a plain read racing a write undefined behaviour. Another process
//! can write shared memory at any moment, so this crate hands out references only to types whose
//! every byte is reached through atomic operations: integer atomics, [`ShmCell`] (which copies
//! its contents in and out with per-byte atomic accesses), and structures built of them.

use std::cell::UnsafeCell;
use std::mem::{MaybeUninit, size_of};
use std::sync::atomic::{
    AtomicI8, AtomicI16, AtomicI32, AtomicI64, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering,
    fence,
};

use bytemuck::Pod;

/// A type that may be placed in shared memory and accessed through `&Self` while other
/// processes read and write the same bytes.
///
/// # Safety
///
/// Implement this only for a type that:
/// - is `#[repr(C)]` or `#[repr(transparent)]`, so every process agrees on its layout;
/// - is valid for **every** bit pattern, all zeros included (the region starts zeroed, and a
///   buggy or hostile peer can write anything);
/// - reaches every byte only through atomic operations or [`ShmCell`]: no plain field that a
///   `&Self` could read while another process writes it, and no padding that matters;
/// - holds no pointers, references or file descriptors (they mean nothing in another process).
///
/// Integer atomics (not `AtomicBool`, whose invalid bit patterns are undefined behaviour),
/// [`ShmCell<T>`], [`BarrierState`](crate::barrier::BarrierState), and arrays of these qualify. A
/// struct of such fields qualifies when it is `#[repr(C)]`; derive the impl (the
/// [derive](macro@ShmSafe) checks both, with the crate's default `derive` feature) rather than
/// writing it:
///
/// ```
/// use std::sync::atomic::AtomicU32;
/// use cuda_ipc::{ShmSafe};
/// use cuda_ipc::barrier::BarrierState;
/// use cuda_ipc::shm::ShmCell;
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// struct Shared {
///     barrier: BarrierState,
///     ready: AtomicU32,
///     devices: ShmCell<[i32; 8]>,
/// }
/// ```
///
/// Written by hand, the impl is `unsafe` and nothing checks the fields:
///
/// ```
/// # use std::sync::atomic::AtomicU32;
/// # use cuda_ipc::ShmSafe;
/// #[repr(C)]
/// struct Flags {
///     ready: AtomicU32,
/// }
/// // SAFETY: repr(C), every field is ShmSafe.
/// unsafe impl ShmSafe for Flags {}
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` may not live in shared memory: it is not `ShmSafe`",
    label = "not `ShmSafe`: another process could write it under a plain read",
    note = "use an integer atomic, `ShmCell<T>` for plain data, or a `#[repr(C)]` struct with `#[derive(ShmSafe)]`"
)]
pub unsafe trait ShmSafe: Sync + Sized + 'static {
    /// A tag that names the layout, checked when a region is opened so that a process never
    /// views another program's region as its own type. The default hashes the type's path
    /// (`std::any::type_name`) with FNV-1a, which is stable for one build of a program; override
    /// it with a fixed constant when different programs (or compiler versions) share a region.
    #[must_use]
    fn type_tag() -> u64 {
        fnv1a64(std::any::type_name::<Self>().as_bytes())
    }
}

/// Derives [`ShmSafe`](trait@ShmSafe) for a struct, checking at compile time what the trait's
/// contract asks: a `#[repr(C)]` or `#[repr(transparent)]` layout (not `packed`), no lifetime
/// parameters, and every field's type `ShmSafe` itself. Generic structs get the impl where
/// their fields' types are `ShmSafe`.
///
/// Options, in `#[shm_safe(...)]`:
/// - `type_tag = <u64 expression>`: a fixed [`type_tag`](ShmSafe::type_tag), for regions that
///   different programs (or builds with different compilers) open as this type;
/// - `crate = "path"`: where cuda-ipc is, when it is renamed or re-exported.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicU32, AtomicU64};
/// use cuda_ipc::{ShmSafe};
/// use cuda_ipc::shm::ShmCell;
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// #[shm_safe(type_tag = 0x5348_4152_4544_0001)]
/// struct Shared<T: ShmSafe> {
///     ready: AtomicU32,
///     slots: [T; 4],
///     layout: ShmCell<[u32; 2]>,
/// }
///
/// fn region_payload<T: ShmSafe>() -> u64 {
///     T::type_tag()
/// }
/// assert_eq!(region_payload::<Shared<AtomicU64>>(), 0x5348_4152_4544_0001);
/// ```
///
/// A field that another process could write under a plain read is refused, at the field:
///
/// ```compile_fail,E0277
/// use std::sync::atomic::AtomicU32;
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// struct Shared {
///     ready: AtomicU32,
///     count: u64, // error: `u64` may not live in shared memory: it is not `ShmSafe`
/// }
/// ```
///
/// So is a field whose bit patterns are not all valid, and a generic field used where its
/// type is not `ShmSafe`:
///
/// ```compile_fail,E0277
/// use std::sync::atomic::AtomicBool;
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// struct Shared {
///     done: AtomicBool, // error: `AtomicBool` may not live in shared memory
/// }
/// ```
///
/// ```compile_fail,E0277
/// use cuda_ipc::{ShmSafe};
/// use cuda_ipc::shm::ShmRegion;
///
/// #[derive(ShmSafe)]
/// #[repr(transparent)]
/// struct Slot<T>(T);
///
/// fn open(region: ShmRegion<Slot<u32>>) {} // error: `u32` may not live in shared memory
/// ```
///
/// Without a fixed layout two programs may disagree on where each field lives:
///
/// ```compile_fail
/// use std::sync::atomic::AtomicU32;
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)] // error: #[derive(ShmSafe)] needs #[repr(C)] or #[repr(transparent)]
/// struct Shared {
///     ready: AtomicU32,
/// }
/// ```
///
/// A packed struct would misalign its atomics; an enum's discriminant can be written out of
/// range by a peer; memory another process maps cannot hold references:
///
/// ```compile_fail
/// use std::sync::atomic::AtomicU64;
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)]
/// #[repr(C, packed)] // error: ShmSafe cannot be derived for a repr(packed) struct
/// struct Shared {
///     tag: AtomicU64,
/// }
/// ```
///
/// ```compile_fail
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)]
/// #[repr(u32)]
/// enum State { // error: ShmSafe cannot be derived for an enum
///     Idle,
///     Busy,
/// }
/// ```
///
/// ```compile_fail
/// use std::sync::atomic::AtomicU32;
/// use cuda_ipc::ShmSafe;
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// struct Shared<'a> { // error: ShmSafe cannot be derived for a type with a lifetime parameter
///     ready: &'a AtomicU32,
/// }
/// ```
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use cuda_ipc_derive::ShmSafe;

macro_rules! shm_safe_atomics {
    ($($t:ty),*) => {$(
        // SAFETY: an integer atomic is valid for every bit pattern and only accessed atomically.
        unsafe impl ShmSafe for $t {}
    )*};
}
shm_safe_atomics!(
    AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicI8, AtomicI16, AtomicI32, AtomicI64
);

// Under `--cfg cuda_ipc_loom` the crate's protocol cores (leases, the barrier) run on loom's atomics so
// that loom can model-check them. Those builds only run the model checks, which keep the
// shared structures on the heap and never map a region; this impl lets the shared layouts
// (the lease table) compile there.
#[cfg(cuda_ipc_loom)]
shm_safe_atomics!(loom::sync::atomic::AtomicU32, loom::sync::atomic::AtomicU64);

// SAFETY: an array of ShmSafe elements has no padding between them and inherits their contract.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}

/// FNV-1a, 64-bit: a small stable hash for type tags.
pub(crate) const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// A plain-data value in shared memory, copied in and out and never borrowed.
///
/// [`load`](Self::load) copies the bytes out with atomic loads and [`store`](Self::store) copies
/// them in with atomic stores, so a concurrent writer in another process can give a torn value
/// (a mix of old and new bytes) but never undefined behaviour. Validate what you load (the
/// handle envelopes of this crate carry checksums for this reason), and order publication with
/// an atomic flag or the barrier: `store` ends with a release fence and `load` starts with an
/// acquire fence.
///
/// `ShmCell<T>` is `Sync` and [`ShmSafe`] when `T` is `Send` (every access is atomic, and a
/// value loaded on one thread may have been stored on another).
///
/// # Examples
///
/// A type that must stay on its thread cannot be shared through a cell (a value stored on one
/// thread would be loaded on another):
///
/// ```compile_fail,E0277
/// use std::marker::PhantomData;
/// use cuda_ipc::shm::ShmCell;
/// use cuda_ipc::bytemuck::{Pod, Zeroable};
///
/// #[derive(Clone, Copy, Zeroable, Pod)]
/// #[bytemuck(crate = "cuda_ipc::bytemuck")]
/// #[repr(transparent)]
/// struct ThisThreadOnly(u32, PhantomData<*const ()>);
///
/// fn shared<T: Sync>() {}
///
/// fn main() {
///     shared::<ShmCell<ThisThreadOnly>>(); // error: `*const ()` cannot be sent between threads
/// }
/// ```
///
/// ```
/// use cuda_ipc::shm::ShmCell;
///
/// let cell = ShmCell::new([1u32, 2, 3]);
/// cell.store([4, 5, 6]);
/// assert_eq!(cell.load(), [4, 5, 6]);
/// ```
#[repr(transparent)]
pub struct ShmCell<T: Pod> {
    value: UnsafeCell<T>,
}

// SAFETY: all access to the inner value goes through per-byte atomic operations (see `bytes`),
// and values only ever leave the cell as copies, handed to whichever thread calls `load`: that
// moves a `T` between threads, so `T` must be `Send` (a `Pod` type can still be `!Send`, e.g.
// one holding a `PhantomData<*const ()>` as a thread-affinity marker).
unsafe impl<T: Pod + Send> Sync for ShmCell<T> {}

// SAFETY: repr(transparent) over a Pod value (valid for all bit patterns, zero included, no
// pointers); every access is atomic; `T: Send` for `Sync` above.
unsafe impl<T: Pod + Send> ShmSafe for ShmCell<T> {}

impl<T: Pod> ShmCell<T> {
    /// A cell holding `value` (for use outside shared memory, or in tests).
    pub const fn new(value: T) -> Self {
        Self {
            value: UnsafeCell::new(value),
        }
    }

    fn bytes(&self) -> &[AtomicU8] {
        // SAFETY: AtomicU8 has the size and alignment of u8 and permits shared mutation; the
        // UnsafeCell makes the bytes legal to mutate through `&self`, and every access to them
        // (here and in every process using this layout) is atomic.
        unsafe { std::slice::from_raw_parts(self.value.get().cast::<AtomicU8>(), size_of::<T>()) }
    }

    /// Copy the value out.
    pub fn load(&self) -> T {
        fence(Ordering::Acquire);
        let mut out = MaybeUninit::<T>::uninit();
        let dst = out.as_mut_ptr().cast::<u8>();
        for (i, byte) in self.bytes().iter().enumerate() {
            // SAFETY: `i < size_of::<T>()`, so the write stays inside `out`.
            unsafe { dst.add(i).write(byte.load(Ordering::Relaxed)) };
        }
        // SAFETY: every byte was written above and T is Pod, so any bytes are a valid T.
        unsafe { out.assume_init() }
    }

    /// Copy `value` in.
    pub fn store(&self, value: T) {
        for (byte, &b) in self.bytes().iter().zip(bytemuck::bytes_of(&value)) {
            byte.store(b, Ordering::Relaxed);
        }
        fence(Ordering::Release);
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for ShmCell<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShmCell").field(&self.load()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn cell_round_trips_unaligned_sizes() {
        let c = ShmCell::new([0u8; 13]);
        c.store(*b"hello, world!");
        assert_eq!(&c.load(), b"hello, world!");
    }

    #[test]
    fn default_type_tags_differ_by_type() {
        assert_ne!(AtomicU32::type_tag(), AtomicU64::type_tag());
        assert_ne!(<[AtomicU32; 2]>::type_tag(), <[AtomicU32; 3]>::type_tag());
    }
}
