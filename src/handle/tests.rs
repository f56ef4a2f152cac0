//! The envelope's and the typed handle's unit tests (each kind's handle, byte by byte).
use super::*;
use crate::{IpcEventHandle, IpcMemHandle, IpcSignalHandle};
use proptest::prelude::*;

fn sample() -> Envelope {
    Envelope {
        kind: KIND_MEM,
        elem_size: 4,
        elem_align: 4,
        type_tag: type_tag_of::<f32>(),
        len: 1024,
        generation: 3,
        exporter_pid: 42,
        exporter_start: 9,
        boot_id: [1; 16],
        device_uuid: [2; 16],
        token: [3; 16],
        cuda: [4; 64],
        ..Zeroable::zeroed()
    }
    .seal()
}

fn posix_fd_sample() -> Envelope {
    let mut cuda = [0u8; 64];
    cuda[..8].copy_from_slice(&(2u64 << 20).to_le_bytes());
    Envelope {
        handle_type: HandleType::PosixFd.code(),
        cuda,
        ..sample()
    }
    .seal()
}

#[test]
fn a_read_only_mark_survives_the_bytes_and_refuses_read_write_opens() {
    let plain = IpcMemHandle::<f32>::from_envelope(posix_fd_sample());
    assert!(!plain.is_read_only());
    assert!(plain.refuse_if_read_only().is_ok());
    let marked = plain.marked_read_only_if(true);
    let back = IpcMemHandle::<f32>::from_bytes(marked.as_bytes()).unwrap();
    assert!(back.is_read_only(), "the mark is sealed into the bytes");
    assert!(matches!(
        back.refuse_if_read_only(),
        Err(Error::HandleTypeMismatch {
            handle: HandleType::PosixFd,
            conflict: crate::error::TypeConflict::ReadOnly,
        })
    ));
    // Clearing the mark in transit breaks the checksum: a read-only export cannot be
    // turned read-write by editing its bytes (without resealing: see SECURITY.md).
    let mut bytes = marked.as_bytes().to_vec();
    bytes[std::mem::offset_of!(Envelope, flags)] = 0;
    assert!(matches!(
        IpcMemHandle::<f32>::from_bytes(&bytes),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Checksum { .. }
        })
    ));
}

#[test]
fn unknown_flags_and_a_read_only_legacy_or_event_handle_are_refused() {
    let mut env = posix_fd_sample();
    env.flags = 2;
    assert!(matches!(
        IpcMemHandle::<f32>::from_bytes(bytemuck::bytes_of(&env.seal())),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Reserved
        })
    ));
    let mut legacy = sample(); // a legacy handle
    legacy.flags = FLAG_READ_ONLY;
    assert!(matches!(
        IpcMemHandle::<f32>::from_bytes(bytemuck::bytes_of(&legacy.seal())),
        Err(Error::CorruptHandle {
            defect: HandleDefect::HandleType { .. }
        })
    ));
    let event = Envelope {
        kind: KIND_EVENT,
        elem_size: 0,
        elem_align: 0,
        type_tag: 0,
        len: 0,
        ..sample()
    };
    IpcEventHandle::from_bytes(bytemuck::bytes_of(&event.seal()))
        .expect("the unmarked event handle is well formed");
    let marked = Envelope {
        flags: FLAG_READ_ONLY,
        ..event
    };
    assert!(matches!(
        IpcEventHandle::from_bytes(bytemuck::bytes_of(&marked.seal())),
        Err(Error::CorruptHandle {
            defect: HandleDefect::HandleType { .. }
        })
    ));
}

#[test]
fn sealed_envelope_validates_and_round_trips() {
    let h = IpcMemHandle::<f32>::from_envelope(sample());
    let back = IpcMemHandle::<f32>::from_bytes(h.as_bytes()).unwrap();
    assert_eq!(back, h);
    assert_eq!(back.len(), 1024);
}

#[test]
fn debug_never_shows_the_cuda_bytes() {
    let mut env = sample();
    env.cuda = [0xAB; 64];
    let text = format!("{:?}", IpcMemHandle::<f32>::from_envelope(env.seal()));
    assert!(
        !text.contains("171") && !text.to_lowercase().contains("ab, "),
        "{text}"
    );
    assert!(!text.contains("cuda"), "{text}");
}

#[test]
fn wrong_kind_length_and_zeroes_are_rejected() {
    let h = IpcMemHandle::<f32>::from_envelope(sample());
    assert!(IpcEventHandle::from_bytes(h.as_bytes()).is_err());
    assert!(IpcMemHandle::<f32>::from_bytes(&h.as_bytes()[1..]).is_err());
    assert!(IpcMemHandle::<f32>::from_bytes(&[0u8; HANDLE_SIZE]).is_err());
}

fn fd_sample(bytes: u64) -> Envelope {
    let mut cuda = [0u8; 64];
    cuda[..8].copy_from_slice(&bytes.to_le_bytes());
    Envelope {
        cuda,
        handle_type: HandleType::PosixFd.code(),
        ..sample()
    }
    .seal()
}

#[test]
fn fd_handles_carry_their_size_and_type() {
    let h = IpcMemHandle::<f32>::from_bytes(
        IpcMemHandle::<f32>::from_envelope(fd_sample(2 << 20)).as_bytes(),
    )
    .unwrap();
    assert_eq!(h.handle_type(), HandleType::PosixFd);
    assert_eq!(h.env.vmm_bytes(), 2 << 20);
    assert_eq!(
        IpcMemHandle::<f32>::from_envelope(sample()).handle_type(),
        HandleType::Legacy
    );
    assert!(format!("{h:?}").contains("PosixFd"), "{h:?}");
}

#[test]
fn fd_handles_that_cannot_hold_their_length_are_rejected() {
    // 1024 × 4 bytes do not fit in 4095 mapped bytes; 0 bytes; a size past isize::MAX.
    for bytes in [4095, 0, u64::MAX] {
        let err = fd_sample(bytes).validate(KIND_MEM).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptHandle { defect: HandleDefect::Layout { detail } }
                if detail.contains("file-descriptor handle")),
            "{err}"
        );
    }
    assert!(fd_sample(4096).validate(KIND_MEM).is_ok());
    // Bytes after the size must be zero.
    let mut env = fd_sample(4096);
    env.cuda[9] = 1;
    assert!(env.seal().validate(KIND_MEM).is_err());
}

#[test]
fn unknown_handle_types_and_fd_events_or_signals_are_rejected() {
    let unknown = Envelope {
        handle_type: 7,
        ..sample()
    }
    .seal();
    let err = unknown.validate(KIND_MEM).unwrap_err();
    assert!(
        matches!(&err, Error::CorruptHandle { defect: HandleDefect::HandleType { detail } }
            if detail.contains("unknown handle type 7")),
        "{err}"
    );
    for kind in [KIND_EVENT, KIND_SIGNAL] {
        let env = Envelope {
            kind,
            handle_type: HandleType::PosixFd.code(),
            ..signal_sample()
        }
        .seal();
        let err = env.validate(kind).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::CorruptHandle {
                    defect: HandleDefect::HandleType { .. }
                }
            ),
            "{err}"
        );
    }
}

fn signal_sample() -> Envelope {
    let mut env = sample();
    (env.kind, env.len) = (KIND_SIGNAL, 1);
    (env.elem_size, env.elem_align, env.type_tag) = (8, 8, type_tag_of::<u64>());
    env.seal()
}

/// A valid sealed envelope of each kind, as its exporter would make it.
fn one_of_each() -> [(u16, Envelope); 5] {
    let mut arena = fd_sample(4 << 20);
    arena.kind = KIND_ARENA;
    (arena.elem_size, arena.elem_align, arena.len) = (1, 1, 4 << 20);
    arena.type_tag = type_tag_of::<u8>();
    let mut pool = fd_sample(0);
    pool.kind = KIND_POOL;
    (pool.elem_size, pool.elem_align, pool.len, pool.cuda) = (1, 1, 1, [0; 64]);
    pool.type_tag = type_tag_of::<u8>();
    let mut event = sample();
    event.kind = KIND_EVENT;
    (event.elem_size, event.elem_align, event.len, event.type_tag) = (0, 0, 0, 0);
    [
        (KIND_MEM, sample()),
        (KIND_EVENT, event.seal()),
        (KIND_SIGNAL, signal_sample()),
        (KIND_ARENA, arena.seal()),
        (KIND_POOL, pool.seal()),
    ]
}

/// `from_bytes` of kind `K` on each kind's bytes: which kinds it accepted.
fn accepted<K: HandleKind>() -> Vec<u16> {
    one_of_each()
        .iter()
        .filter(|(_, env)| Handle::<K>::from_bytes(bytemuck::bytes_of(env)).is_ok())
        .map(|(kind, _)| *kind)
        .collect()
}

#[test]
fn one_handle_type_accepts_its_own_kind_only() {
    assert_eq!(accepted::<crate::IpcBuffer<f32>>(), [KIND_MEM]);
    assert_eq!(accepted::<crate::IpcEvent>(), [KIND_EVENT]);
    assert_eq!(accepted::<crate::IpcSignal>(), [KIND_SIGNAL]);
    assert_eq!(accepted::<crate::arena::IpcArena>(), [KIND_ARENA]);
    assert_eq!(accepted::<crate::pool::IpcPool>(), [KIND_POOL]);
    // The element type is checked on open (admission), not by `from_bytes`.
    assert_eq!(accepted::<crate::IpcBuffer<u32>>(), [KIND_MEM]);
    let as_u32 = Handle::<crate::IpcBuffer<u32>>::from_envelope(sample());
    let err = as_u32.check_envelope(false).unwrap_err();
    assert!(matches!(err, Error::TypeMismatch { .. }), "{err}");
}

#[test]
fn debug_names_the_kind_and_never_the_cuda_bytes() {
    for (kind, env) in one_of_each() {
        let text = match kind {
            KIND_MEM => format!("{:?}", IpcMemHandle::<f32>::from_envelope(env)),
            KIND_EVENT => format!("{:?}", IpcEventHandle::from_envelope(env)),
            KIND_SIGNAL => format!("{:?}", IpcSignalHandle::from_envelope(env)),
            KIND_ARENA => format!("{:?}", Handle::<crate::arena::IpcArena>::from_envelope(env)),
            _ => format!("{:?}", Handle::<crate::pool::IpcPool>::from_envelope(env)),
        };
        let name = [
            "IpcMemHandle",
            "IpcEventHandle",
            "IpcSignalHandle",
            "IpcArenaHandle",
        ]
        .get(usize::from(kind) - 1)
        .copied()
        .unwrap_or("IpcPoolHandle");
        assert!(text.starts_with(name), "{text}");
        assert!(text.contains("02020202-0202"), "the device UUID: {text}");
        assert!(!text.contains("[4, 4"), "{text}");
    }
}

#[test]
fn arena_and_pool_envelopes_are_file_descriptors_and_nothing_else() {
    let accepts = |env: Envelope, kind| env.seal().validate(kind).is_ok();
    let mut arena = fd_sample(4 << 20);
    arena.kind = KIND_ARENA;
    (arena.elem_size, arena.elem_align, arena.len) = (1, 1, 4 << 20);
    assert!(accepts(arena, KIND_ARENA));
    assert!(!accepts(arena, KIND_MEM), "an arena is not a buffer");
    let legacy = Envelope {
        handle_type: HandleType::Legacy.code(),
        ..arena
    };
    assert!(!accepts(legacy, KIND_ARENA));
    let typed = Envelope {
        elem_size: 4,
        elem_align: 4,
        len: 1 << 20,
        ..arena
    };
    assert!(!accepts(typed, KIND_ARENA), "arenas count bytes");

    let pool = Envelope {
        kind: KIND_POOL,
        len: 1,
        cuda: [0; 64],
        ..arena
    };
    assert!(accepts(pool, KIND_POOL));
    let mut sized = pool;
    sized.cuda[0] = 1;
    assert!(!accepts(sized, KIND_POOL), "a pool carries no size");
    let legacy = Envelope {
        handle_type: HandleType::Legacy.code(),
        ..pool
    };
    assert!(!accepts(legacy, KIND_POOL));
}

#[test]
fn signal_handles_round_trip_and_are_not_buffers_or_events() {
    let h = IpcSignalHandle::from_envelope(signal_sample());
    assert_eq!(IpcSignalHandle::from_bytes(h.as_bytes()).unwrap(), h);
    let err = IpcMemHandle::<u64>::from_bytes(h.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::CorruptHandle {
                defect: HandleDefect::Kind {
                    expected: "a memory",
                    found: "a signal"
                }
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "corrupt IPC handle: a signal handle where a memory handle was expected"
    );
    assert!(IpcEventHandle::from_bytes(h.as_bytes()).is_err());
    let buffer = IpcMemHandle::<u64>::from_envelope(sample());
    assert!(IpcSignalHandle::from_bytes(buffer.as_bytes()).is_err());
}

#[test]
fn a_signal_envelope_must_describe_one_u64() {
    for (len, size, align, tag) in [
        (2, 8, 8, type_tag_of::<u64>()),
        (1, 4, 4, type_tag_of::<u32>()),
        (1, 8, 8, type_tag_of::<f64>()),
    ] {
        let mut e = signal_sample();
        (e.len, e.elem_size, e.elem_align, e.type_tag) = (len, size, align, tag);
        assert!(e.seal().validate(KIND_SIGNAL).is_err(), "{len} {size}");
    }
}

#[test]
fn bad_layouts_are_rejected_even_when_sealed() {
    for (size, align, len) in [(4, 3, 1), (3, 2, 1), (4, 4, 0), (8, 8, u64::MAX)] {
        let mut e = sample();
        e.elem_size = size;
        e.elem_align = align;
        e.len = len;
        assert!(e.seal().validate(KIND_MEM).is_err(), "{size} {align} {len}");
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = IpcMemHandle::<u8>::from_bytes(&bytes);
        let _ = IpcEventHandle::from_bytes(&bytes);
        let _ = IpcSignalHandle::from_bytes(&bytes);
    }

    #[test]
    fn every_single_bit_flip_is_rejected(bit in 0usize..(HANDLE_SIZE * 8)) {
        let env = sample();
        let mut bytes = bytemuck::bytes_of(&env).to_vec();
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(IpcMemHandle::<f32>::from_bytes(&bytes).is_err());
    }
}
