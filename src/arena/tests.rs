use super::*;

#[test]
fn arena_and_pool_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<IpcArena>();
    send_sync::<ArenaBuffer<f32>>();
    send_sync::<ImportedArena>();
    send_sync::<ArenaView<f32>>();
    send_sync::<ArenaHandle<f32>>();
    send_sync::<crate::pool::IpcPool>();
    send_sync::<crate::pool::PoolBuffer<f32>>();
    send_sync::<crate::pool::ImportedPool>();
    send_sync::<crate::pool::PoolView<f32>>();
    send_sync::<crate::pool::PoolHandle<f32>>();
}

#[test]
fn arena_handles_round_trip_and_refuse_damage() {
    let raw = RawArenaHandle {
        elem_size: 4,
        elem_align: 4,
        type_tag: type_tag_of::<u32>(),
        token: [7; 16],
        index: 3,
        generation: 5,
        offset: 512,
        len: 100,
        ..Zeroable::zeroed()
    };
    let h = ArenaHandle::<u32>::from_raw(envelope::seal(raw));
    let back = ArenaHandle::<u32>::from_bytes(h.as_bytes()).unwrap();
    assert!(back == h);
    assert_eq!((back.len(), back.generation()), (100, 5));
    for i in 0..ArenaHandle::<u8>::SIZE {
        let mut bytes = h.as_bytes().to_vec();
        bytes[i] ^= 0x40;
        assert!(
            ArenaHandle::<u32>::from_bytes(&bytes).is_err(),
            "a flipped bit in byte {i} went unnoticed"
        );
    }
    assert!(ArenaHandle::<u32>::from_bytes(&h.as_bytes()[1..]).is_err());
}
