//! Any bytes as a `/dev/shm` file the inspector reads, under any of the crate's table names,
//! with and without a header sealed for that table's type: the decoder answers (a table, a
//! "not ours", or the reason the bytes do not decode), never a panic, a hang or a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cuda_ipc::__private::inspect_region(data);
});
