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
/// defect `tests/pool_import.rs` shows its memory check would catch.
pub fn leak_refused_imports(on: bool) {
    import::LEAK_REFUSED.store(on, std::sync::atomic::Ordering::Relaxed);
}
