//! Device checks: without a GPU the driver's "no device" is a clear error; with GPUs, the
//! selection reports each device and enables peer access among the chosen ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use cuda_ipc::device::PeerGroup;
use cuda_ipc::error::ArgumentDefect;
use cuda_ipc::{Error, GpuContext};

/// Runs everywhere: on a machine without a GPU (CI) every entry point reports `NoDevice`
/// naming the driver's code; where a GPU is required (`CUDA_IPC_REQUIRE_GPU=1`), finding
/// none fails the test.
#[test]
fn without_a_gpu_every_entry_point_says_no_device() {
    match cuda_ipc::device::device_count() {
        Ok(n) => eprintln!("{n} GPU(s) present: the no-device path is not exercised here"),
        Err(Error::NoDevice { code, name }) => {
            assert!(
                std::env::var_os("CUDA_IPC_REQUIRE_GPU").is_none(),
                "a GPU is required here but cuInit said {name} ({code})"
            );
            assert!(matches!(GpuContext::new(0), Err(Error::NoDevice { .. })));
            assert!(matches!(PeerGroup::select(8), Err(Error::NoDevice { .. })));
            let msg = GpuContext::new(0).unwrap_err().to_string();
            assert!(
                msg.contains("no CUDA device") && msg.contains(&name),
                "{msg}"
            );
        }
        Err(Error::DriverNotFound { tried, .. }) => {
            assert!(
                std::env::var_os("CUDA_IPC_REQUIRE_GPU").is_none(),
                "a GPU is required here but no driver library loaded (tried {tried})"
            );
            assert!(matches!(
                GpuContext::new(0),
                Err(Error::DriverNotFound { .. })
            ));
        }
        Err(e) => panic!("unexpected error without a GPU: {e}"),
    }
}

/// Without a driver library (hidden here by naming one that does not exist), every GPU entry
/// point says which libraries it tried, and the host-side types work as before. Runs in a
/// child process: the library is loaded once per process.
#[test]
fn without_a_driver_library_every_entry_point_says_which_it_tried() {
    let lines = common::spawn_env(
        "no_driver",
        &[],
        &[(cuda_ipc::driver::LIBRARY_ENV, "/nonexistent/libcuda.so.1")],
    )
    .expect_success(std::time::Duration::from_secs(30));
    assert_eq!(lines.len(), 4, "{lines:?}");
    for line in &lines[..3] {
        assert!(
            line.contains("no CUDA driver library: tried /nonexistent/libcuda.so.1"),
            "{line}"
        );
    }
    assert_eq!(lines[3], "host side works");
}

/// A driver library without the entry points the crate needs (stood in for by the C math
/// library, which has none of them) is `DriverTooOld` naming the call — never a panic or a
/// failure at load time.
#[test]
fn a_library_without_the_entry_points_is_driver_too_old() {
    let lines = common::spawn_env(
        "no_entry_points",
        &[],
        &[(cuda_ipc::driver::LIBRARY_ENV, "libm.so.6")],
    )
    .expect_success(std::time::Duration::from_secs(30));
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], "loaded libm.so.6");
    for line in &lines[1..] {
        assert!(
            line.contains("has no entry point for cuInit; a newer driver is needed"),
            "{line}"
        );
    }
}

#[test]
fn child_process() {
    common::child_main(|role, _args| {
        if role == "retain_until_exit" {
            retain_until_exit_child();
            return 0;
        }
        if role == "no_entry_points" {
            common::report(format!(
                "loaded {}",
                cuda_ipc::driver::library_path().unwrap()
            ));
            for e in [
                cuda_ipc::driver::init().unwrap_err(),
                GpuContext::new(0).unwrap_err(),
            ] {
                assert!(
                    matches!(e, Error::DriverTooOld { call: "cuInit", .. }),
                    "{e:?}"
                );
                common::report(e);
            }
            return 0;
        }
        assert_eq!(role, "no_driver");
        let errors = [
            cuda_ipc::driver::init().unwrap_err(),
            GpuContext::new(0).unwrap_err(),
            cuda_ipc::device::device_count().unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, Error::DriverNotFound { .. }), "{e:?}");
            common::report(e);
        }
        let region = cuda_ipc::shm::ShmOptions::new(common::unique_name("no-driver"))
            .create::<cuda_ipc::shm::ShmCell<u64>>()
            .unwrap();
        region.store(7);
        assert_eq!(region.load(), 7);
        common::report("host side works");
        0
    });
}

/// Whether device 0's primary context exists (`cuDevicePrimaryCtxGetState`).
fn primary_active() -> bool {
    use cuda_ipc::driver::sys;
    let (mut dev, mut flags, mut active) = (0, 0, 0);
    // SAFETY: out-pointers to locals; the driver is initialised (a GpuContext was made).
    unsafe {
        assert_eq!(sys::cuDeviceGet(&mut dev, 0), 0);
        assert_eq!(
            sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active),
            0
        );
    }
    active == 1
}

/// In a process of its own (no other test holds the context): dropping the last
/// `GpuContext` ends the primary context, unless `retain_until_exit` kept it.
fn retain_until_exit_child() {
    let ctx = common::gpu();
    assert!(primary_active());
    drop(ctx);
    common::report(format!("after the last drop: active {}", primary_active()));
    let ctx = common::gpu();
    ctx.retain_until_exit().unwrap();
    ctx.retain_until_exit().unwrap(); // once per device: the second changes nothing
    let raw = ctx.as_raw();
    drop(ctx);
    common::report(format!("kept, then dropped: active {}", primary_active()));
    let again = common::gpu();
    common::report(format!("found again: same {}", again.as_raw() == raw));
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_context_retained_until_exit_outlives_its_last_gpu_context() {
    let lines =
        common::spawn("retain_until_exit", &[]).expect_success(std::time::Duration::from_secs(60));
    assert_eq!(
        lines,
        [
            "after the last drop: active false",
            "kept, then dropped: active true",
            "found again: same true"
        ]
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn peer_group_selects_every_h200_and_enables_peer_access() {
    let n = common::gpu_count();
    let group = PeerGroup::select(usize::MAX).unwrap();
    eprint!("{}", group.report());
    for d in &group.devices {
        assert!(d.unified_addressing);
        assert_eq!(d.uuid.len(), 16);
        assert!(d.pci_bus_id.contains(':'), "{}", d.pci_bus_id);
        assert!(d.multiprocessors > 0);
    }
    // H200s of one host reach each other over NVLink: all are chosen.
    assert_eq!(group.devices.len() as u32, n, "{}", group.report());
    let contexts = group.enable_peer_access().unwrap();
    assert_eq!(contexts.len() as u32, n);
    // Enabling twice is fine.
    group.enable_peer_access().unwrap();
    let limited = PeerGroup::select(1).unwrap();
    assert_eq!(limited.devices.len(), 1);
    assert_eq!(limited.skipped.len() as u32, n - 1);
    eprintln!(
        "driver version {}",
        cuda_ipc::driver::driver_version().unwrap()
    );
}

/// An ordinal with no device is the driver's `CUDA_ERROR_INVALID_DEVICE` from `cuDeviceGet`;
/// one beyond the driver's `int` is refused before the call, naming it.
#[test]
#[ignore = "requires a CUDA device"]
fn a_context_of_a_device_that_does_not_exist_is_refused() {
    let n = common::gpu_count();
    match GpuContext::new(n) {
        Err(Error::Cuda { call, code, name }) => {
            assert_eq!(call, "cuDeviceGet");
            assert_eq!(
                code,
                cuda_ipc::driver::sys::CUDA_ERROR_INVALID_DEVICE,
                "{name}"
            );
            assert_eq!(name, "CUDA_ERROR_INVALID_DEVICE");
        }
        other => panic!("ordinal {n} of {n} devices: {other:?}"),
    }
    match GpuContext::new(u32::MAX) {
        Err(Error::InvalidArgument {
            call: "cuDeviceGet",
            defect:
                ArgumentDefect::OutOfRange {
                    what: "device ordinal",
                    value,
                    max,
                    ..
                },
        }) => {
            assert_eq!(value, u64::from(u32::MAX));
            assert_eq!(max, i32::MAX as u64);
        }
        other => panic!("ordinal u32::MAX: {other:?}"),
    }
    // The GPUs that exist still work afterwards.
    GpuContext::new(n - 1).unwrap();
}

/// `GpuContext::synchronize` waits for work on a stream it was never told of: sixteen 1 GiB
/// copies queued on a non-blocking stream of the context are still running right after they
/// were queued, and done when it returns.
#[test]
#[ignore = "requires a CUDA device"]
fn synchronize_waits_for_every_stream_of_the_context() {
    use cuda_ipc::driver::sys;
    const BYTES: usize = 1 << 30;
    let ctx = common::gpu();
    ctx.make_current().unwrap();
    let ok = |call: &str, rc: sys::CUresult| assert_eq!(rc, sys::CUDA_SUCCESS, "{call}");
    let (mut a, mut b, mut s) = (0, 0, std::ptr::null_mut());
    // SAFETY: two new allocations and a new stream of the current context; the copies stay
    // within both allocations, which are freed only after the synchronize.
    let (before, after) = unsafe {
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut a, BYTES));
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut b, BYTES));
        ok(
            "cuStreamCreate",
            sys::cuStreamCreate(&mut s, sys::CU_STREAM_NON_BLOCKING),
        );
        for _ in 0..16 {
            ok(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(b, a, BYTES, s),
            );
        }
        let before = sys::cuStreamQuery(s);
        ctx.synchronize().unwrap();
        let after = sys::cuStreamQuery(s);
        ok("cuStreamDestroy", sys::cuStreamDestroy_v2(s));
        ok("cuMemFree", sys::cuMemFree_v2(a));
        ok("cuMemFree", sys::cuMemFree_v2(b));
        (before, after)
    };
    assert_eq!(
        before,
        sys::CUDA_ERROR_NOT_READY,
        "the copies were still queued"
    );
    assert_eq!(
        after,
        sys::CUDA_SUCCESS,
        "and done once synchronize returned"
    );
}
