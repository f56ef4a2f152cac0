use super::*;

/// What a thread looking through the context's shared pools for room holds meanwhile: a
/// reference to each (as `alloc_shared` takes them, under the list's lock).
pub struct LookingForRoom(#[allow(dead_code)] Vec<Arc<Owner>>);

/// Take the references a thread allocating from the shared pools takes, and keep them
/// until the value drops.
pub fn look_for_room() -> LookingForRoom {
    LookingForRoom(
        super::buffer::SHARED
            .lock()
            .iter()
            .map(|(_, o)| o.clone())
            .collect(),
    )
}

/// Leave every pool import refused on its checks mapped (never freed) while `on`: the
/// defect `tests/pool_import.rs` shows its check would catch.
pub fn leak_refused_imports(on: bool) {
    import::LEAK_REFUSED.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The address of the last pool import refused on its checks since the last call, if any.
pub fn take_refused_import() -> Option<u64> {
    match import::LAST_REFUSED.swap(0, std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        ptr => Some(ptr),
    }
}

/// Whether the driver maps anything at `ptr` in this process (`cuPointerGetAttributes`, in
/// `ctx`): whether a freed import really left the address space.
#[must_use]
pub fn is_mapped(ctx: &GpuContext, ptr: u64) -> bool {
    ctx.enter()
        .is_ok_and(|_g| crate::driver::mem::address_range(ptr).is_ok())
}
