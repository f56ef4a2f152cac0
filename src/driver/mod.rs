//! The CUDA driver layer: raw declarations ([`sys`]), and above them one function per
//! driver verb, grouped by concept (`ctx`, `device`, `mem`, `ipc`, `event`, `stream`, `vmm`,
//! `pool`; crate-private), each returning a `Result` that names the call and keeps the code.
//! The RAII types call those, never [`sys`]: every raw call, and the `unsafe` around it, is
//! in this module once.
//!
//! Users never need this module, but it is public so that they can reach the raw functions with
//! the same integer-return discipline.

/// An `unsafe fn` that only forwards one driver call, whose contract is the caller's (each
/// states it under `# Safety`): the arguments in the call's order, its code checked and named.
///
/// ```text
/// forward! {
///     /// Destroy a stream (`cuStreamDestroy`). # Safety: a live stream, destroyed once.
///     fn destroy(stream: sys::CUstream) => cuStreamDestroy_v2 as "cuStreamDestroy";
/// }
/// ```
macro_rules! forward {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $sym:ident as $call:literal;) => {
        $(#[$doc])*
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $crate::error::Result<()> {
            // SAFETY: the caller's duty (the function's `# Safety`), forwarded unchanged.
            super::check($call, unsafe { super::sys::$sym($($arg),*) })
        }
    };
}

pub(crate) mod ctx;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod ipc;
pub(crate) mod loader;
pub(crate) mod mem;
pub(crate) mod pool;
pub(crate) mod stream;
pub mod sys;
pub(crate) mod vmm;

pub use loader::{DEFAULT_LIBRARIES, LIBRARY_ENV, library_path};

use std::ffi::{CStr, c_int};
use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::{Error, Result, StateDefect};

/// The descriptor `call` wrote, owned: a negative one (what no working driver writes) is
/// [`Error::Corrupt`] naming the call.
///
/// # Safety
///
/// `fd` was just opened for the caller by `call` and nothing else owns it.
pub(crate) unsafe fn owned_fd(call: &'static str, fd: c_int) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(Error::Corrupt {
            what: "exported descriptor",
            defect: StateDefect::DriverAnswer {
                call,
                value: fd.into(),
            },
        });
    }
    // SAFETY: the caller's duty: a descriptor the driver opened for us, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The name of a `CUresult`: from a table of the codes this crate meets, else from the driver's
/// `cuGetErrorName`, else `CUDA_ERROR_<code>`. Never transmutes the code.
#[doc(alias = "cuGetErrorName")]
#[must_use]
pub fn error_name(code: i32) -> String {
    let known = match code {
        sys::NO_DRIVER => "no CUDA driver library (cuda-ipc)",
        sys::NO_ENTRY_POINT => "no such driver entry point (cuda-ipc)",
        sys::CUDA_SUCCESS => "CUDA_SUCCESS",
        sys::CUDA_ERROR_INVALID_VALUE => "CUDA_ERROR_INVALID_VALUE",
        sys::CUDA_ERROR_OUT_OF_MEMORY => "CUDA_ERROR_OUT_OF_MEMORY",
        sys::CUDA_ERROR_NOT_INITIALIZED => "CUDA_ERROR_NOT_INITIALIZED",
        sys::CUDA_ERROR_DEINITIALIZED => "CUDA_ERROR_DEINITIALIZED",
        sys::CUDA_ERROR_STUB_LIBRARY => "CUDA_ERROR_STUB_LIBRARY",
        sys::CUDA_ERROR_DEVICE_UNAVAILABLE => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        sys::CUDA_ERROR_NO_DEVICE => "CUDA_ERROR_NO_DEVICE",
        sys::CUDA_ERROR_INVALID_DEVICE => "CUDA_ERROR_INVALID_DEVICE",
        sys::CUDA_ERROR_INVALID_IMAGE => "CUDA_ERROR_INVALID_IMAGE",
        sys::CUDA_ERROR_INVALID_CONTEXT => "CUDA_ERROR_INVALID_CONTEXT",
        sys::CUDA_ERROR_ALREADY_MAPPED => "CUDA_ERROR_ALREADY_MAPPED",
        sys::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        sys::CUDA_ERROR_INVALID_HANDLE => "CUDA_ERROR_INVALID_HANDLE",
        sys::CUDA_ERROR_NOT_READY => "CUDA_ERROR_NOT_READY",
        sys::CUDA_ERROR_ILLEGAL_ADDRESS => "CUDA_ERROR_ILLEGAL_ADDRESS",
        sys::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        sys::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        sys::CUDA_ERROR_LAUNCH_FAILED => "CUDA_ERROR_LAUNCH_FAILED",
        sys::CUDA_ERROR_NOT_PERMITTED => "CUDA_ERROR_NOT_PERMITTED",
        sys::CUDA_ERROR_NOT_SUPPORTED => "CUDA_ERROR_NOT_SUPPORTED",
        sys::CUDA_ERROR_UNKNOWN => "CUDA_ERROR_UNKNOWN",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_owned();
    }
    let mut ptr = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string or fails; it
    // accepts any code value (unknown ones return CUDA_ERROR_INVALID_VALUE).
    let rc = unsafe { sys::cuGetErrorName(code, &mut ptr) };
    if rc == sys::CUDA_SUCCESS && !ptr.is_null() {
        // SAFETY: on success the pointer is a static C string owned by the driver.
        let name = unsafe { CStr::from_ptr(ptr) };
        return name.to_string_lossy().into_owned();
    }
    format!("CUDA_ERROR_{code}")
}

/// Call `f` with a place holding `init` for the driver to write its answer in, and return
/// the answer if `f`'s code is success (`call` names the call in the error).
pub(crate) fn answer<T>(
    call: &'static str,
    init: T,
    f: impl FnOnce(&mut T) -> sys::CUresult,
) -> Result<T> {
    let mut out = init;
    check(call, f(&mut out))?;
    Ok(out)
}

/// `Ok` for `CUDA_SUCCESS`, else [`Error::Cuda`] naming `call`.
///
/// # Errors
///
/// [`Error::Cuda`] with `call`, the code and its name, for any code but `CUDA_SUCCESS`;
/// [`Error::DriverNotFound`] for [`sys::NO_DRIVER`] and [`Error::DriverTooOld`] for
/// [`sys::NO_ENTRY_POINT`] (what [`sys`]'s functions return without a driver library, or when
/// the library lacks the entry point).
///
/// # Examples
///
/// ```
/// use cuda_ipc::driver::check;
///
/// assert!(check("cuFoo", 0).is_ok());
/// let e = check("cuFoo", 2).unwrap_err();
/// assert_eq!(e.to_string(), "cuFoo failed: CUDA_ERROR_OUT_OF_MEMORY (2)");
/// ```
pub fn check(call: &'static str, code: sys::CUresult) -> Result<()> {
    match code {
        sys::CUDA_SUCCESS => Ok(()),
        sys::NO_DRIVER => Err(no_driver()),
        sys::NO_ENTRY_POINT => Err(Error::DriverTooOld {
            call,
            driver_version: raw_driver_version(),
        }),
        _ => Err(Error::Cuda {
            call,
            code,
            name: error_name(code),
        }),
    }
}

/// `cuDriverGetVersion`, 0 when it fails (not through `check`, which calls this).
fn raw_driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int.
    let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
    if rc == sys::CUDA_SUCCESS { v } else { 0 }
}

/// The error for "no driver library": each library tried and why it did not load.
fn no_driver() -> Error {
    match loader::failure() {
        Some(f) => f.into(),
        // Loaded after all (a sentinel from elsewhere): say so rather than invent a reason.
        None => Error::DriverNotFound {
            tried: DEFAULT_LIBRARIES.join(", "),
            reason: "the driver reported no library".into(),
        },
    }
}

/// `cuInit(0)`, once per process (the result is remembered).
///
/// # Errors
///
/// [`Error::DriverNotFound`] when no driver library could be loaded (it names each library
/// tried), [`Error::NoDevice`] when the driver reports no usable GPU (no device, a stub
/// library, no device node), [`Error::Cuda`] for other failures.
///
/// # Examples
///
/// ```
/// match cuda_ipc::driver::init() {
///     Ok(()) => println!("CUDA is up"),
///     Err(cuda_ipc::Error::NoDevice { name, .. }) => println!("no GPU here: {name}"),
///     Err(cuda_ipc::Error::DriverNotFound { tried, .. }) => println!("no driver: tried {tried}"),
///     Err(e) => panic!("{e}"),
/// }
/// ```
#[doc(alias = "cuInit")]
pub fn init() -> Result<()> {
    static INIT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    // SAFETY: cuInit takes a flags word (must be 0) and is safe to call from any thread.
    let code = *INIT.get_or_init(|| unsafe { sys::cuInit(0) });
    match code {
        sys::CUDA_SUCCESS => Ok(()),
        sys::NO_DRIVER => Err(no_driver()),
        // No device, no driver behind the library (a stub), or no device node.
        sys::CUDA_ERROR_NO_DEVICE
        | sys::CUDA_ERROR_STUB_LIBRARY
        | sys::CUDA_ERROR_UNKNOWN
        | sys::CUDA_ERROR_NOT_INITIALIZED => Err(Error::NoDevice {
            code,
            name: error_name(code),
        }),
        _ => check("cuInit", code),
    }
}

/// The driver's CUDA version (`cuDriverGetVersion`), e.g. 13000 for 13.0.
///
/// # Errors
///
/// [`Error::Cuda`] naming `cuDriverGetVersion`.
#[doc(alias = "cuDriverGetVersion")]
pub fn driver_version() -> Result<i32> {
    // SAFETY: writes one int.
    answer("cuDriverGetVersion", 0, |v| unsafe {
        sys::cuDriverGetVersion(v)
    })
}

/// Free and total memory of the current context's device (`cuMemGetInfo`); prefer
/// [`GpuContext::mem_info`](crate::GpuContext::mem_info), which makes its context current.
///
/// # Errors
///
/// [`Error::Cuda`] naming `cuMemGetInfo` (`CUDA_ERROR_INVALID_CONTEXT` without a current one).
#[doc(alias = "cuMemGetInfo")]
pub fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes two usizes; fails cleanly without a current context.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loaders_sentinels_become_their_own_errors() {
        let e = check("cuStreamWriteValue64", sys::NO_ENTRY_POINT).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DriverTooOld {
                    call: "cuStreamWriteValue64",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("has no entry point for cuStreamWriteValue64")
        );
        // Either there is a driver library here (then NO_DRIVER cannot come from it, and the
        // error says so) or there is none (then it names what was tried).
        let e = check("cuInit", sys::NO_DRIVER).unwrap_err();
        assert!(matches!(e, Error::DriverNotFound { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("no CUDA driver library: tried "),
            "{e}"
        );
        assert!(error_name(sys::NO_DRIVER).contains("no CUDA driver library"));
        assert!(check("cuInit", sys::CUDA_SUCCESS).is_ok());
    }
}
