//! Loading the CUDA driver library at run time.
//!
//! The crate links nothing CUDA: it builds on any Linux machine, with or without a driver or a
//! toolkit, and finds the driver when the process first needs it. The library is opened once
//! per process (`dlopen` through `libloading`): the path in `CUDA_IPC_DRIVER_LIBRARY` if that
//! variable is set, else `libcuda.so.1` (the name the driver installs), then `libcuda.so`. Every
//! entry point of [`sys`](super::sys) is resolved then, by its versioned name; one the library
//! lacks stays empty and only calls to it fail. The library is never unloaded.
//!
//! The cost per call is one load of the resolved table (an acquire load and a branch, after the
//! first call) on top of the driver's own indirect call; `benches/driver_call.rs` measures it.

use std::sync::OnceLock;

/// The names tried, in order, when `CUDA_IPC_DRIVER_LIBRARY` is not set.
pub const DEFAULT_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// The environment variable that names the driver library to load instead of the defaults.
pub const LIBRARY_ENV: &str = "CUDA_IPC_DRIVER_LIBRARY";

/// What loading found: the library (kept open for the life of the process) and its table.
struct Loaded {
    _library: libloading::Library,
    api: super::sys::Api,
    path: String,
}

/// Why no driver could be loaded: each library tried and what `dlopen` said.
#[derive(Debug, Clone)]
pub(crate) struct LoadFailure {
    pub(crate) tried: String,
    pub(crate) reason: String,
}

static DRIVER: OnceLock<Result<Loaded, LoadFailure>> = OnceLock::new();

fn load() -> Result<Loaded, LoadFailure> {
    let (library, path) = open_first(LIBRARY_ENV, &DEFAULT_LIBRARIES)?;
    let api = super::sys::Api::resolve(&library);
    Ok(Loaded {
        _library: library,
        api,
        path,
    })
}

/// Open a shared library the way this crate loads its run-time dependencies (the driver,
/// NCCL): the path in the environment variable `env` if it is set and not empty, else each of
/// `defaults` in turn; the first that opens, and its name, or every name tried with what
/// `dlopen` said. The caller keeps the library open for the life of the process.
pub(crate) fn open_first(
    env: &str,
    defaults: &[&str],
) -> Result<(libloading::Library, String), LoadFailure> {
    let names: Vec<String> = match std::env::var(env) {
        Ok(path) if !path.is_empty() => vec![path],
        _ => defaults.iter().map(|s| (*s).to_owned()).collect(),
    };
    let mut reasons = Vec::new();
    for name in names.iter() {
        // SAFETY: loading the CUDA driver or NCCL runs its initialisers, which have no
        // preconditions on the caller (they are what any program linking the library runs at
        // start-up); the caller never unloads it, so symbols resolved from it stay valid.
        match unsafe { libloading::Library::new(name.as_str()) } {
            Ok(library) => return Ok((library, name.clone())),
            Err(e) => {
                // libloading keeps dlerror's text as the source.
                let detail =
                    std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
                reasons.push(format!("{name}: {e}{detail}"));
            }
        }
    }
    Err(LoadFailure {
        tried: names.join(", "),
        reason: reasons.join("; "),
    })
}

/// The resolved table, loading the library on first use; `None` without a driver library.
#[inline]
pub(crate) fn api() -> Option<&'static super::sys::Api> {
    DRIVER.get_or_init(load).as_ref().ok().map(|l| &l.api)
}

/// Why the driver library could not be loaded, if it could not.
pub(crate) fn failure() -> Option<LoadFailure> {
    DRIVER.get_or_init(load).as_ref().err().cloned()
}

/// The path of the driver library this process loaded, loading it if needed.
///
/// # Errors
///
/// [`Error::DriverNotFound`](crate::Error::DriverNotFound) naming each library tried.
///
/// # Examples
///
/// ```
/// match cuda_ipc::driver::library_path() {
///     Ok(path) => println!("CUDA driver: {path}"),
///     Err(e) => println!("no CUDA driver: {e}"),
/// }
/// ```
pub fn library_path() -> crate::Result<&'static str> {
    match DRIVER.get_or_init(load) {
        Ok(l) => Ok(&l.path),
        Err(f) => Err(f.clone().into()),
    }
}

impl From<LoadFailure> for crate::Error {
    fn from(f: LoadFailure) -> Self {
        crate::Error::DriverNotFound {
            tried: f.tried,
            reason: f.reason,
        }
    }
}

/// Declares the driver's entry points: a table `Api` with one optional function pointer per
/// entry point, resolved from the library by name, and for each an `unsafe fn` of the same
/// name and signature that calls through the table (or returns `NO_DRIVER` /
/// `NO_ENTRY_POINT`).
macro_rules! driver_api {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> CUresult;
    )*) => {
        /// The driver's entry points, resolved once from the loaded library.
        pub(crate) struct Api {
            $($name: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,)*
        }

        impl Api {
            /// Resolve every entry point by its exact (versioned) name; a missing one stays
            /// `None`.
            pub(crate) fn resolve(library: &libloading::Library) -> Self {
                Self {
                    $($name: {
                        // SAFETY: the symbol is the driver's C function of that name, and its
                        // Rust type is the prototype `cuda.h` declares for it (the same
                        // obligation an `extern "C"` block carries). The library stays loaded
                        // for the life of the process, so the pointer never dangles.
                        unsafe {
                            library
                                .get::<unsafe extern "C" fn($($ty),*) -> CUresult>(
                                    concat!(stringify!($name), "\0").as_bytes(),
                                )
                                .ok()
                                .map(|symbol| *symbol)
                        }
                    },)*
                }
            }
        }

        $(
            $(#[$meta])*
            ///
            /// # Safety
            ///
            /// As the driver function of this name: the pointers must be valid for what it
            /// reads and writes, the handles live.
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> CUresult {
                match super::loader::api() {
                    Some(api) => match api.$name {
                        // SAFETY: the caller upholds the driver function's contract (forwarded).
                        Some(f) => unsafe { f($($arg),*) },
                        None => NO_ENTRY_POINT,
                    },
                    None => NO_DRIVER,
                }
            }
        )*
    };
}
pub(crate) use driver_api;
