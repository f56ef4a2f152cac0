//! A user's program: shares host state through cuda-ipc and asks for a GPU. Without a driver
//! library it must print cuda-ipc's "no driver" error and exit 0; anything else is a failure.

use std::process::ExitCode;

use std::sync::atomic::{AtomicU32, Ordering};

use cuda_ipc::{Error, GpuContext, ShmSafe};
use cuda_ipc::shm::{ShmCell, ShmOptions};

/// A user's shared layout, checked by cuda-ipc's derive (the consumer depends on no derive
/// crate of its own).
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    ready: AtomicU32,
    value: ShmCell<u64>,
}

#[cfg(any(feature = "cudarc", feature = "cudarc-13-linked"))]
fn takes_a_stream(_: &(impl cuda_ipc::AsStream + ?Sized)) {}

fn main() -> ExitCode {
    // The host side needs no driver.
    let name = format!("cuda-ipc-consumer-{}", std::process::id());
    let region = match ShmOptions::new(&name).create::<Shared>() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("consumer: shared memory failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    region.value.store(42);
    region.ready.store(1, Ordering::Release);
    println!("consumer: shared memory works ({})", region.value.load());

    // cudarc's stream is a stream cuda-ipc accepts (checked at compile time; not run, since
    // cudarc panics without a driver).
    #[cfg(any(feature = "cudarc", feature = "cudarc-13-linked"))]
    {
        let _accepts: fn(&std::sync::Arc<cudarc::driver::CudaStream>) = |s| takes_a_stream(s);
        println!("consumer: built with cudarc interop");
    }

    match GpuContext::new(0) {
        Ok(ctx) => {
            println!("consumer: GPU {} is here", ctx.ordinal());
            ExitCode::SUCCESS
        }
        Err(e @ Error::DriverNotFound { .. }) => {
            println!("consumer: {e}");
            ExitCode::SUCCESS
        }
        Err(e @ Error::NoDevice { .. }) => {
            println!("consumer: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("consumer: unexpected error: {e}");
            ExitCode::FAILURE
        }
    }
}
