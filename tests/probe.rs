//! `probe()` on a GPU machine: every capability this crate relies on reported as available on
//! every device, each device pair checked, the tried exports leaving no descriptor or memory
//! behind.
//!
//! GPU tests are `#[ignore = "requires a CUDA device"]`: run them with `--include-ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use common::{fd_count, gpu, gpu_count};
use cuda_ipc::probe::Status;

#[test]
#[ignore = "requires a CUDA device"]
fn a_gpu_machine_reports_what_this_crate_needs() {
    let ctx = gpu(); // keeps device 0's context alive, so its free memory can be compared
    let n = gpu_count();
    let first = cuda_ipc::probe::probe();
    println!("{first}");
    let (fds, free) = (fd_count(), ctx.mem_info().unwrap().0);
    let p = cuda_ipc::probe::probe();
    assert_eq!(
        (fd_count(), ctx.mem_info().unwrap().0),
        (fds, free),
        "a probe left descriptors or device memory behind"
    );
    assert_eq!(
        p.get("driver", "driver").unwrap().status,
        Status::Yes,
        "{p}"
    );
    let devices = p.get("driver", "devices").unwrap();
    assert_eq!(devices.detail, format!("{n} visible"));
    for d in 0..n {
        let subject = format!("device {d}");
        for key in [
            "unified_addressing",
            "compute_mode",
            "stream_mem_ops_64",
            "legacy_ipc",
            "vmm_posix_fd",
            "pool_ipc",
        ] {
            let c = p
                .get(&subject, key)
                .unwrap_or_else(|| panic!("{subject} {key} missing:\n{p}"));
            assert_eq!(c.status, Status::Yes, "{subject} {key}: {}", c.detail);
        }
        // Tried, whichever way it went (an export needs an IMEX channel).
        let fabric = p.get(&subject, "fabric").expect("fabric checked");
        assert!(
            matches!(fabric.status, Status::Yes | Status::No),
            "{}",
            fabric.detail
        );
        println!("{subject} fabric: {:?}: {}", fabric.status, fabric.detail);
        for e in 0..n {
            if e != d {
                let pair = p.get(&format!("devices {d} -> {e}"), "peer_access");
                assert_eq!(pair.map(|c| c.status), Some(Status::Yes), "{p}");
            }
        }
    }
    assert_eq!(p.to_json().matches("\"subject\"").count(), p.checks().len());
}
