//! Any bytes as a barrier's shared state (a peer that scribbled on it): joining and waiting give
//! an error or a bounded wait, never a panic, a hang or out-of-bounds access.
#![no_main]

use std::time::Duration;

use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::shm::ShmOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(region) = ShmOptions::new("cuda-ipc-fuzz-barrier")
        .random_suffix(true)
        .create::<BarrierState>()
    else {
        return;
    };
    // Overwrite the state with the input, as a hostile peer could (through the file).
    let path = format!("/dev/shm/{}", region.name());
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as usize;
    let offset = len - std::mem::size_of::<BarrierState>();
    let mut bytes = std::fs::read(&path).unwrap_or_default();
    for (i, b) in data.iter().take(bytes.len() - offset).enumerate() {
        bytes[offset + i] = *b;
    }
    let _ = std::fs::write(&path, &bytes);
    let _ = region.is_poisoned();
    let _ = region.arrived();
    if let Ok(barrier) = ProcessBarrier::join(&region) {
        let _ = barrier.wait_timeout(Duration::from_millis(1));
        let _ = barrier.wait_timeout(Duration::ZERO);
    }
});
