use super::*;

#[test]
fn slots_are_256_byte_aligned_where_the_size_allows() {
    let g = |slots, capacity| Geometry {
        slots,
        capacity,
        consumers: 1,
    };
    assert_eq!(layout(g(4, 1), 4), Some(64)); // 64 × 4 B = 256 B
    assert_eq!(layout(g(4, 65), 4), Some(128));
    assert_eq!(layout(g(4, 3), 12), Some(64)); // 64 × 12 = 768 = 3 × 256
    assert_eq!(layout(g(4, 5), 1024), Some(5));
    assert_eq!(layout(g(1, 0), 4), None);
    assert_eq!(layout(g(64, u64::MAX / 2), 4), None);
    assert_eq!(
        layout(g(1, ring::MAX_CAPACITY), 1),
        Some(ring::MAX_CAPACITY + 1)
    );
    assert_eq!(layout(g(1, ring::MAX_CAPACITY + 1), 1), None);
}

fn sealed() -> ChannelEnvelope {
    let mut name = [0u8; NAME_BYTES];
    let n = b"cuda-ipc-chan.0123456789abcdef";
    name[..n.len()].copy_from_slice(n);
    ChannelEnvelope {
        elem_size: 4,
        elem_align: 4,
        type_tag: type_tag_of::<f32>(),
        slots: 4,
        consumers: 1,
        capacity: 100,
        stride: 128,
        producer_pid: 1,
        name_len: n.len() as u32,
        name,
        ..Zeroable::zeroed()
    }
    .seal()
}

#[test]
fn a_sealed_handle_round_trips_through_bytes() {
    let h = IpcChannelHandle::<f32> {
        env: sealed(),
        _elem: PhantomData,
    };
    let back = IpcChannelHandle::<f32>::from_bytes(h.as_bytes()).unwrap();
    assert_eq!(back, h);
    assert_eq!((back.slots(), back.capacity()), (4, 100));
}

/// Forged handles: every field that shapes memory is checked before anything is mapped.
#[test]
fn forged_handles_are_refused() {
    type Forge = Box<dyn Fn(&mut ChannelEnvelope)>;
    type Want = fn(&HandleDefect) -> bool;
    let layout: Want = |d| matches!(d, HandleDefect::Layout { .. });
    let names: Want = |d| matches!(d, HandleDefect::Names { .. });
    let cases: Vec<(Want, Forge)> = vec![
        (
            |d| matches!(d, HandleDefect::Magic { found: 0, .. }),
            Box::new(|e| e.magic = 0),
        ),
        (
            |d| matches!(d, HandleDefect::Version { found: 9, .. }),
            Box::new(|e| e.version = 9),
        ),
        (layout, Box::new(|e| e.slots = 65)),
        (layout, Box::new(|e| e.slots = 0)),
        (layout, Box::new(|e| e.consumers = 9)),
        (layout, Box::new(|e| e.consumers = 0)),
        (layout, Box::new(|e| e.stride = 100)),
        (layout, Box::new(|e| e.capacity = 0)),
        (layout, Box::new(|e| e.elem_align = 3)),
        (names, Box::new(|e| e.name_len = 200)),
        (names, Box::new(|e| e.name[0] = b'x')),
        (
            |d| matches!(d, HandleDefect::Reserved),
            Box::new(|e| e.flags = 1),
        ),
    ];
    for (i, (want, forge)) in cases.into_iter().enumerate() {
        let mut env = sealed();
        forge(&mut env);
        // The magic and version are checked before the checksum: no reseal needed.
        let resealed = if i < 2 { env } else { env.seal() };
        match IpcChannelHandle::<f32>::from_bytes(bytemuck::bytes_of(&resealed)) {
            Err(Error::CorruptHandle { defect }) if want(&defect) => {}
            other => panic!("case {i}: {:?}", other.map(|_| ())),
        }
    }
    let mut flipped = sealed();
    flipped.capacity ^= 1;
    let e = IpcChannelHandle::<f32>::from_bytes(bytemuck::bytes_of(&flipped)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptHandle {
                defect: HandleDefect::Checksum { .. }
            }
        ),
        "{e}"
    );
    let e = IpcChannelHandle::<f32>::from_bytes(&[0u8; 10]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptHandle {
                defect: HandleDefect::Size { found: 10, .. }
            }
        ),
        "{e}"
    );
}
