//! Any bytes offered as a foreign peer's raw handle (PyTorch's 66-byte form, a bare 64-byte
//! handle) or as a `RawExport` a C peer wrote: an error or a value consistent with the input,
//! never a panic.
#![no_main]

use cuda_ipc::raw::{RawExport, RawImport, RawMemHandle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match RawMemHandle::from_torch(data) {
        Ok(h) if data.len() == 64 => assert_eq!(h.as_bytes(), data),
        Ok(h) => {
            assert_eq!(data.len(), 66);
            assert!(matches!(data[0], 2 | 3) && data[1] == b'c');
            assert_eq!(h.as_bytes(), &data[2..]);
        }
        Err(_) => assert!(data.len() != 64),
    }
    if let Ok(h) = RawMemHandle::from_bytes(data) {
        assert_eq!(h.as_bytes(), data);
    }
    if data.len() >= std::mem::size_of::<RawExport>() {
        let export: RawExport =
            bytemuck::pod_read_unaligned(&data[..std::mem::size_of::<RawExport>()]);
        if let Ok(import) = RawImport::from_export::<u32>(&export) {
            assert_eq!(import.len as u64 * 4, export.bytes);
            assert_eq!(import.offset, export.offset);
        }
        let _ = RawImport::from_export::<[u8; 3]>(&export);
    }
});
