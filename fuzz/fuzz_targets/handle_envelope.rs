//! Any bytes offered as a handle envelope: an error or a valid handle, never a panic; a handle
//! that passes has a consistent layout. Each input is tried as given and with its checksum
//! recomputed, so that the checks behind the checksum (magic, version, kind, reserved bytes,
//! element layout, length) are reached too.
#![no_main]

use cuda_ipc::arena::IpcArena;
use cuda_ipc::pool::IpcPool;
use cuda_ipc::{Handle, HandleKind, IpcEventHandle, IpcMemHandle, IpcSignalHandle};
use libfuzzer_sys::fuzz_target;

/// Accepted as kind `K`: the bytes round-trip and `Debug` works.
fn accepted<K: HandleKind>(data: &[u8]) -> bool {
    let Ok(h) = Handle::<K>::from_bytes(data) else {
        return false;
    };
    assert_eq!(h.as_bytes(), data);
    let _ = format!("{h:?}");
    true
}

fn check(data: &[u8]) {
    // One kind at most: the kinds never overlap.
    let kinds = [
        accepted::<cuda_ipc::IpcBuffer<u8>>(data),
        accepted::<cuda_ipc::IpcEvent>(data),
        accepted::<cuda_ipc::IpcSignal>(data),
        accepted::<IpcArena>(data),
        accepted::<IpcPool>(data),
    ];
    assert!(kinds.iter().filter(|&&k| k).count() <= 1);
    if let Ok(h) = IpcMemHandle::<u8>::from_bytes(data) {
        assert_eq!(h.as_bytes(), data);
        assert!(!h.is_empty());
        let _ = format!("{h:?}");
    }
    let _ = IpcMemHandle::<[f64; 3]>::from_bytes(data);
    if let Ok(h) = IpcEventHandle::from_bytes(data) {
        assert_eq!(h.as_bytes(), data);
        let _ = format!("{h:?}");
    }
    if let Ok(h) = IpcSignalHandle::from_bytes(data) {
        assert_eq!(h.as_bytes(), data);
        // A signal handle is never also a memory or an event handle.
        assert!(IpcMemHandle::<u64>::from_bytes(data).is_err());
        assert!(IpcEventHandle::from_bytes(data).is_err());
        let _ = format!("{h:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    cuda_ipc::__private::reseal(&mut sealed);
    check(&sealed);
});
