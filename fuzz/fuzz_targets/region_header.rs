//! Any bytes in a region's file (header and payload, any length): opening it gives an error or a
//! region whose header validated, never a panic, a hang or a crash.
#![no_main]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::AtomicU64;

use cuda_ipc::shm::{HeaderFields, ShmOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The pure decoder first: any 128 bytes decode, and re-encode to what decodes the same.
    if data.len() >= 128 {
        let mut arr = [0u8; 128];
        arr.copy_from_slice(&data[..128]);
        let f = HeaderFields::decode(&arr);
        assert_eq!(HeaderFields::decode(&f.encode()), f);
    }
    // Then the real opener on a file holding these bytes, and again with the header's checksum
    // recomputed so that the field checks behind it are reached.
    open_file(data);
    if data.len() >= 128 {
        let mut arr = [0u8; 128];
        arr.copy_from_slice(&data[..128]);
        let mut f = HeaderFields::decode(&arr);
        f.checksum = f.compute_checksum();
        let mut sealed = data.to_vec();
        sealed[..128].copy_from_slice(&f.encode());
        open_file(&sealed);
    }
});

fn open_file(data: &[u8]) {
    let name = format!("cuda-ipc-fuzz-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("create fuzz region file");
    file.write_all(data).expect("write");
    drop(file);
    let opts = ShmOptions::new(&name).open_timeout(std::time::Duration::ZERO);
    if let Ok(region) = opts.open::<[AtomicU64; 4]>() {
        let _ = region.header_fields();
    }
    let _ = opts.open::<AtomicU64>();
    let _ = std::fs::remove_file(&path);
}
