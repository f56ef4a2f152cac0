//! The NCCL library, loaded at run time: its name, its entry points (`nccl.h`, NCCL 2.x), and
//! its result codes. Like the driver (`driver/loader.rs`), nothing is linked: the library is
//! opened once per process, the first time a communicator is asked for — the path in
//! `CUDA_IPC_NCCL_LIBRARY` if set, else `libnccl.so.2`, then `libnccl.so` — and never unloaded.
//! A machine without NCCL builds and runs everything else.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// `ncclResult_t`.
pub(crate) type NcclResult = c_int;
/// `ncclComm_t`: an opaque pointer.
pub(crate) type NcclComm = *mut c_void;
/// `cudaStream_t`, which is a driver `CUstream`.
pub(crate) type Stream = crate::driver::sys::CUstream;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NcclUniqueId {
    pub(crate) internal: [u8; 128],
}

pub(crate) const NCCL_SUCCESS: NcclResult = 0;
/// `ncclInProgress`: a non-blocking call that has not finished.
pub(crate) const NCCL_IN_PROGRESS: NcclResult = 7;
/// `ncclUint8`: the one data type this crate moves (bytes).
pub(crate) const NCCL_UINT8: c_int = 1;

/// `ncclConfig_t` as NCCL 2.14 declared it (`ncclCommInitRankConfig` appeared there); later
/// versions read a config by its `size` and `version` fields, so an older layout stays valid.
#[repr(C)]
pub(crate) struct NcclConfig {
    pub(crate) size: usize,
    pub(crate) magic: u32,
    pub(crate) version: u32,
    pub(crate) blocking: c_int,
    pub(crate) cga_cluster_size: c_int,
    pub(crate) min_ctas: c_int,
    pub(crate) max_ctas: c_int,
    pub(crate) net_name: *const c_char,
}

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER` of 2.14, with `blocking` set: every attribute left to NCCL's
    /// default (`NCCL_CONFIG_UNDEF_INT`, a null name).
    pub(crate) fn new(blocking: bool) -> Self {
        Self {
            size: std::mem::size_of::<Self>(),
            magic: 0xcafe_beef,
            version: 2 * 10_000 + 14 * 100,
            blocking: c_int::from(blocking),
            cga_cluster_size: c_int::MIN,
            min_ctas: c_int::MIN,
            max_ctas: c_int::MIN,
            net_name: std::ptr::null(),
        }
    }
}

/// `ncclResult_t`'s names, by code (`nccl.h`).
pub(crate) fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "an ncclResult_t this build does not know",
    }
}

/// The names tried, in order, when `CUDA_IPC_NCCL_LIBRARY` is not set.
pub const DEFAULT_LIBRARIES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// The environment variable that names the NCCL library to load instead of the defaults.
pub const LIBRARY_ENV: &str = "CUDA_IPC_NCCL_LIBRARY";

macro_rules! nccl_api {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// NCCL's entry points, resolved once; one the library lacks stays `None`.
        #[allow(non_snake_case)]
        pub(crate) struct Api {
            $(pub(crate) $name: Option<unsafe extern "C" fn($($ty),*) -> $ret>,)*
        }

        impl Api {
            fn resolve(library: &libloading::Library) -> Self {
                Self {
                    $($name: {
                        // SAFETY: the symbol is NCCL's C function of that name, and its Rust
                        // type is the prototype `nccl.h` declares; the library stays loaded
                        // for the life of the process, so the pointer never dangles.
                        unsafe {
                            library
                                .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                    concat!(stringify!($name), "\0").as_bytes(),
                                )
                                .ok()
                                .map(|symbol| *symbol)
                        }
                    },)*
                }
            }
        }
    };
}

nccl_api! {
    fn ncclGetVersion(version: *mut c_int) -> NcclResult;
    fn ncclGetUniqueId(id: *mut NcclUniqueId) -> NcclResult;
    fn ncclCommInitRankConfig(comm: *mut NcclComm, nranks: c_int, id: NcclUniqueId, rank: c_int, config: *mut NcclConfig) -> NcclResult;
    fn ncclCommGetAsyncError(comm: NcclComm, error: *mut NcclResult) -> NcclResult;
    fn ncclCommAbort(comm: NcclComm) -> NcclResult;
    fn ncclSend(buf: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: Stream) -> NcclResult;
    fn ncclRecv(buf: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: Stream) -> NcclResult;
    fn ncclGroupStart() -> NcclResult;
    fn ncclGroupEnd() -> NcclResult;
    fn ncclGetErrorString(result: NcclResult) -> *const c_char;
    fn ncclGetLastError(comm: NcclComm) -> *const c_char;
}

/// What loading found: the library (kept open) and its table.
pub(crate) struct Loaded {
    _library: libloading::Library,
    pub(crate) api: Api,
    pub(crate) path: String,
}

/// Why NCCL could not be loaded: each name tried, and what `dlopen` said.
pub(crate) use crate::driver::loader::LoadFailure;

static NCCL: OnceLock<Result<Loaded, LoadFailure>> = OnceLock::new();

/// The loaded library, loading it on first use.
pub(crate) fn library() -> Result<&'static Loaded, LoadFailure> {
    NCCL.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Loaded, LoadFailure> {
    let (library, path) = crate::driver::loader::open_first(LIBRARY_ENV, &DEFAULT_LIBRARIES)?;
    let api = Api::resolve(&library);
    Ok(Loaded {
        _library: library,
        api,
        path,
    })
}

/// A C string NCCL returned (static storage, or the communicator's last-error buffer), copied;
/// empty for null.
///
/// # Safety
///
/// `text` is null or a NUL-terminated string that stays valid for this call.
pub(crate) unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: the caller's duty.
    unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}
