//! [`ShmRegion`]: a named POSIX shared-memory region holding one [`ShmSafe`] value.
//!
//! This is where simpleIPC's `shm_open(..., 0777)` and raw struct become safe: the region is
//! created exclusively with mode `0600`, space is reserved up front, a header describes the
//! layout, and an opener checks the file and the header before it maps the payload.
//!
//! # Publish and open: what an opener sees when the creator stops
//!
//! | The creator is preempted or `SIGKILL`ed... | An opener sees |
//! |--------------------------------------------|----------------|
//! | before its exclusive `open` | `NotFound` |
//! | after `open`, before `fallocate` (empty file) | waits for the size within the open timeout, then `NotReady` (`creator_dead: false`: nothing names the creator yet) |
//! | after `fallocate`, before writing its identity | waits, then `NotReady` |
//! | after its identity, before publishing the header | waits; `NotReady { creator_dead: true }` at once if it is dead |
//! | after publishing | a complete, validated region (the payload was initialised before the header's release store) |
//!
//! Tested by `tests/region.rs` (an unpublished header with a live and a killed creator; an
//! empty file; 400 opens racing creates).
//!
//! # Example: a buffer's handle through a region
//!
//! A complete two-process program: it exports a buffer, re-executes itself as the importer, which
//! checks the contents, and frees the memory once the importer is done:
//!
//! ```rust,no_run
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};
//! use cuda_ipc::shm::{ShmCell, ShmOptions};
//!
//! #[derive(ShmSafe)]
//! #[repr(C)]
//! struct Shared {
//!     handle: ShmCell<IpcMemHandle<f32>>,
//!     checked: AtomicU32,
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = GpuContext::new(0)?;
//!     if let Some(name) = std::env::args().nth(1) {
//!         // The importer: open the region, then the buffer through its typed handle.
//!         let shared = ShmOptions::new(&name).open::<Shared>()?;
//!         let buf = ImportedBuffer::open(&ctx, &shared.handle.load())?;
//!         let mut host = vec![0.0f32; buf.len()];
//!         buf.copy_to_host(&mut host)?;
//!         assert!(host.iter().all(|&x| x == 1.5));
//!         shared.checked.store(1, Ordering::Release);
//!         return Ok(()); // the mapping and the lease end here
//!     }
//!     // The exporter: a buffer, its handle in shared memory, and the importer process.
//!     let buf = IpcBuffer::<f32>::new(&ctx, 1 << 20)?;
//!     buf.copy_from_host(&vec![1.5; 1 << 20])?;
//!     let shared = ShmOptions::new("my-app").random_suffix(true).create::<Shared>()?;
//!     shared.handle.store(buf.handle()?);
//!     let status = std::process::Command::new(std::env::current_exe()?)
//!         .arg(shared.name())
//!         .status()?;
//!     assert!(status.success() && shared.checked.load(Ordering::Acquire) == 1);
//!     Ok(()) // `buf` is freed; `shared` is unlinked
//! }
//! ```

mod header;

pub use crate::shm_safe::{ShmCell, ShmSafe};
use std::fs::File;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

pub(crate) use header::HEADER_LEN;
pub use header::HeaderFields;
use header::{Expected, MAGIC, RawHeader, VERSION};

use crate::error::{ArgumentDefect, CloseError, Error, NameDefect, Result};
use crate::os::{self, FileInfo};
use crate::poll::Backoff;
use crate::process::ProcessIdentity;

/// Length of the random suffix [`ShmOptions::random_suffix`] appends: `.` and 16 hex digits.
const SUFFIX_LEN: usize = 17;

/// The largest payload alignment supported (a page: the mapping's own alignment).
const MAX_ALIGN: usize = 4096;

/// Default for [`ShmOptions::open_timeout`].
pub(crate) const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// Check a shared-memory name and return it without its optional leading `/`.
///
/// A name is one path component under `/dev/shm`: not empty, no `/` after the optional leading
/// one, no NUL byte, not `.` or `..`, at most 255 bytes.
///
/// # Errors
///
/// [`Error::InvalidName`] saying which rule the name broke.
///
/// # Examples
///
/// ```
/// assert_eq!(cuda_ipc::shm::validate_name("/simple_ipc").unwrap(), "simple_ipc");
/// assert!(cuda_ipc::shm::validate_name("a/b").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<&str> {
    validate_name_within(name, os::NAME_MAX)
}

fn validate_name_within(name: &str, max: usize) -> Result<&str> {
    let invalid = |defect| Error::InvalidName {
        name: name.to_owned(),
        defect,
    };
    let bare = name.strip_prefix('/').unwrap_or(name);
    if bare.is_empty() {
        return Err(invalid(NameDefect::Empty));
    }
    if bare.len() > max {
        return Err(invalid(NameDefect::TooLong {
            len: bare.len(),
            max,
        }));
    }
    if bare.contains('/') {
        return Err(invalid(NameDefect::Slash));
    }
    if bare.contains('\0') {
        return Err(invalid(NameDefect::Nul));
    }
    if bare == "." || bare == ".." {
        return Err(invalid(NameDefect::Dots));
    }
    Ok(bare)
}

/// Where the payload of a `T` starts and how long the file is.
fn layout_of<T>() -> Result<(usize, usize)> {
    let align = std::mem::align_of::<T>();
    ArgumentDefect::check_range(
        "ShmRegion",
        "payload alignment (up to the page size)",
        align as u64,
        1,
        MAX_ALIGN as u64,
    )?;
    let offset = HEADER_LEN.next_multiple_of(align);
    Ok((offset, offset + std::mem::size_of::<T>()))
}

/// How to create or open a [`ShmRegion`]: the name and the creation mode.
///
/// Creation is always exclusive: an existing name is never reused silently
/// ([`Error::AlreadyExists`]), unless [`reclaim_stale`](Self::reclaim_stale) is set and the
/// existing region's creator is dead.
///
/// # Examples
///
/// ```no_run
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use cuda_ipc::shm::ShmOptions;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let region = ShmOptions::new("counter").random_suffix(true).create::<AtomicU64>()?;
/// region.fetch_add(1, Ordering::Relaxed);
/// // Another process opens it by the full name:
/// let other = ShmOptions::new(region.name()).open::<AtomicU64>()?;
/// assert_eq!(other.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ShmOptions {
    name: String,
    random_suffix: bool,
    open_timeout: Duration,
    reclaim_stale: bool,
}

impl ShmOptions {
    /// How long [`open`](Self::open) waits for a region's creator to publish it, unless
    /// [`open_timeout`](Self::open_timeout) changes it.
    pub const DEFAULT_OPEN_TIMEOUT: Duration = DEFAULT_OPEN_TIMEOUT;

    /// Options for the region called `name` (with or without a leading `/`).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            random_suffix: false,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            reclaim_stale: false,
        }
    }

    /// On create, append `.` and 16 random hex digits to the name so that it cannot collide;
    /// read the full name back with [`ShmRegion::name`]. Ignored by open.
    #[must_use]
    pub fn random_suffix(mut self, yes: bool) -> Self {
        self.random_suffix = yes;
        self
    }

    /// How long open waits for a creator to publish the header before [`Error::NotReady`] (default
    /// [`DEFAULT_OPEN_TIMEOUT`](Self::DEFAULT_OPEN_TIMEOUT)). Open returns at once if the creator
    /// is known dead.
    #[must_use]
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// On create, if the name exists, is ours (our uid, mode `0600`, a regular file) and its
    /// creator process is dead, unlink it and create afresh. Use this only where the creator is
    /// the region's only owner (the default; see [`ShmRegion::release_ownership`]).
    #[must_use]
    pub fn reclaim_stale(mut self, yes: bool) -> Self {
        self.reclaim_stale = yes;
        self
    }

    /// Create the region with a zeroed payload.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::AlreadyExists`], [`Error::NoSpace`],
    /// [`Error::PermissionDenied`], [`Error::InvalidArgument`] (alignment over a page), or
    /// [`Error::Os`] naming the failed call.
    #[doc(alias = "shm_open")]
    #[doc(alias = "mmap")]
    pub fn create<T: ShmSafe>(&self) -> Result<ShmRegion<T>> {
        self.create_with(|_: &T| Ok(()))
    }

    /// Create the region and run `init` on the payload before the header is published, so no
    /// opener can see the payload before `init` returns.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create), and whatever `init` returns (the region is then unlinked).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::barrier::BarrierState;
    /// use cuda_ipc::shm::ShmOptions;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let region = ShmOptions::new("sync")
    ///     .random_suffix(true)
    ///     .create_with(|b: &BarrierState| b.init(4))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "shm_open")]
    #[doc(alias = "mmap")]
    pub fn create_with<T: ShmSafe>(
        &self,
        init: impl FnOnce(&T) -> Result<()>,
    ) -> Result<ShmRegion<T>> {
        let limit = if self.random_suffix {
            os::NAME_MAX - SUFFIX_LEN
        } else {
            os::NAME_MAX
        };
        let base = validate_name_within(&self.name, limit)?;
        let name = if self.random_suffix {
            format!("{base}.{:016x}", os::random_u64()?)
        } else {
            base.to_owned()
        };
        let (offset, total) = layout_of::<T>()?;
        let (file, info) = match os::shm_create(&name, total as u64) {
            Err(Error::AlreadyExists { .. }) if self.reclaim_stale && reclaim(&name)? => {
                os::shm_create(&name, total as u64)?
            }
            other => other?,
        };
        let map = map(&file, total, &name).inspect_err(|_| {
            let _ = os::shm_unlink_if_same(&name, info.dev, info.ino);
        })?;
        let region = ShmRegion::<T> {
            map,
            name,
            owner: true,
            home: crate::process::Home::here(),
            dev: info.dev,
            ino: info.ino,
            payload_offset: offset,
            _payload: PhantomData,
        };
        let me = ProcessIdentity::current();
        region.header().write_creator(me.pid(), me.start_time());
        // On error the region drops here, and as owner it unlinks the name.
        init(region.get())?;
        let fields = header_of::<T>(offset, total, (me.pid(), me.start_time()), os::boot_id());
        region.header().publish(&fields);
        Ok(region)
    }

    /// Open an existing region, checking before the payload is mapped that it is a regular
    /// file owned by our euid with no group/other permission bits, and that its published
    /// header matches `T` (magic, version, checksum, size, alignment, type tag) and the file
    /// size.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::NotFound`], [`Error::Symlink`],
    /// [`Error::NotRegularFile`], [`Error::WrongOwner`], [`Error::InsecurePermissions`],
    /// [`Error::SizeMismatch`], [`Error::NotReady`] (header not published within the open
    /// timeout, or its creator died first), [`Error::HeaderMismatch`] naming the field.
    #[doc(alias = "shm_open")]
    #[doc(alias = "mmap")]
    pub fn open<T: ShmSafe>(&self) -> Result<ShmRegion<T>> {
        let name = validate_name(&self.name)?.to_owned();
        let start = Instant::now();
        let (file, info) = os::shm_open(&name)?;
        check_file(&name, &info)?;
        let info = wait_sized(&file, info, &name, start, self.open_timeout)?;
        let (offset, total) = layout_of::<T>()?;
        if info.size < HEADER_LEN as u64 {
            return Err(Error::SizeMismatch {
                name,
                expected: total as u64,
                found: info.size,
            });
        }
        // Map the header alone, wait for publication, validate; only then map the payload.
        let head = map(&file, HEADER_LEN, &name)?;
        let fields = wait_published(raw_header(&head), &name, start, self.open_timeout)?;
        fields.validate(&name, &expected_of::<T>(offset, total))?;
        if info.size != total as u64 {
            return Err(Error::SizeMismatch {
                name,
                expected: total as u64,
                found: info.size,
            });
        }
        drop(head);
        let map = map(&file, total, &name)?;
        Ok(ShmRegion {
            map,
            name,
            owner: false,
            home: crate::process::Home::here(),
            dev: info.dev,
            ino: info.ino,
            payload_offset: offset,
            _payload: PhantomData,
        })
    }
}

fn check_file(name: &str, info: &FileInfo) -> Result<()> {
    if !info.is_regular() {
        return Err(Error::NotRegularFile {
            name: name.to_owned(),
            file_type: info.file_type,
        });
    }
    let euid = os::euid();
    if info.uid != euid {
        return Err(Error::WrongOwner {
            name: name.to_owned(),
            expected: euid,
            found: info.uid,
        });
    }
    if info.mode & 0o077 != 0 {
        return Err(Error::InsecurePermissions {
            name: name.to_owned(),
            mode: info.mode,
        });
    }
    Ok(())
}

fn map(file: &File, len: usize, name: &str) -> Result<MmapRaw> {
    MmapOptions::new()
        .len(len)
        .map_raw(file)
        .map_err(|source| Error::Os {
            call: "mmap",
            name: name.to_owned(),
            source,
        })
}

fn raw_header(map: &MmapRaw) -> &RawHeader {
    // SAFETY: every mapping made here is at least HEADER_LEN bytes, page-aligned (so aligned
    // for RawHeader), lives as long as the borrow of `map`, and RawHeader is all atomics, valid
    // for any bytes another process may write.
    unsafe { &*map.as_ptr().cast::<RawHeader>() }
}

/// A region's file is empty from the creator's exclusive `open` until its `fallocate` (one
/// step from 0 to the full size): wait, within the open timeout, for the size to appear, so
/// that an open racing a create is "not ready yet", never "wrong size".
fn wait_sized(
    file: &File,
    mut info: FileInfo,
    name: &str,
    start: Instant,
    timeout: Duration,
) -> Result<FileInfo> {
    let mut wait = Backoff::for_creator(start, timeout);
    while info.size == 0 {
        if let Err(waited) = wait.pause() {
            return Err(Error::NotReady {
                name: name.to_owned(),
                waited,
                creator_dead: false,
            });
        }
        info = os::shm_fstat(file, name)?;
    }
    Ok(info)
}

/// Wait (bounded) for the creator's `Release` store of the magic; return the header copy.
fn wait_published(
    header: &RawHeader,
    name: &str,
    start: Instant,
    timeout: Duration,
) -> Result<HeaderFields> {
    let mut wait = Backoff::for_creator(start, timeout);
    loop {
        if header.is_published() {
            return Ok(header.snapshot());
        }
        let (pid, start_time) = header.creator();
        let creator_dead = pid != 0 && !ProcessIdentity::from_parts(pid, start_time).is_alive();
        let stopped = if creator_dead {
            Err(wait.waited())
        } else {
            wait.pause()
        };
        if let Err(waited) = stopped {
            // One last look: the creator may have published just before it exited.
            if header.is_published() {
                return Ok(header.snapshot());
            }
            return Err(Error::NotReady {
                name: name.to_owned(),
                waited,
                creator_dead,
            });
        }
    }
}

/// Unlink `name` if it is ours and its creator is dead; true if it was unlinked.
fn reclaim(name: &str) -> Result<bool> {
    let (file, info) = os::shm_open(name)?;
    check_file(name, &info)?;
    if info.size < HEADER_LEN as u64 {
        // Too short to hold even a creator record: not a region of ours.
        return Ok(false);
    }
    let head = map(&file, HEADER_LEN, name)?;
    let (pid, start) = raw_header(&head).creator();
    if pid == 0 || ProcessIdentity::from_parts(pid, start).is_alive() {
        return Ok(false);
    }
    os::shm_unlink_if_same(name, info.dev, info.ino)
}

/// A named POSIX shared-memory region holding one `T`, mapped read-write in this process.
///
/// The payload is reached through [`get`](Self::get) (or `Deref`) as `&T`; [`ShmSafe`]
/// guarantees every byte of `T` is accessed atomically, so no `&`/`&mut` to bytes another
/// process can write is ever handed out. Plain data goes in [`ShmCell`]s,
/// copied in and out.
///
/// The process that created the region **owns the name** and unlinks it on drop; an opener does
/// not. Ownership can be handed over with [`release_ownership`](Self::release_ownership) and
/// [`acquire_ownership`](Self::acquire_ownership). Unlinking removes the name only: processes
/// that mapped the region keep using it until they drop it.
///
/// `ShmRegion<T>` is `Send` and `Sync`.
///
/// # Soundness
///
/// The safe API cannot stop another process of the **same uid** from shrinking the file
/// (`ftruncate`); touching a page past the new end raises `SIGBUS`. Processes of other uids
/// cannot: the region is `0600` and opens refuse anything else. Everything else a peer can do
/// (write any bytes) leaves this process sound: it sees only atomics and validated copies.
///
/// # Examples
///
/// ```no_run
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use cuda_ipc::{ShmSafe};
/// use cuda_ipc::shm::{ShmCell, ShmRegion};
///
/// #[derive(ShmSafe)]
/// #[repr(C)]
/// struct Shared {
///     ready: AtomicU32,
///     devices: ShmCell<[i32; 4]>,
/// }
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let region = ShmRegion::<Shared>::create("simple_ipc_demo")?;
/// region.devices.store([0, 1, -1, -1]);
/// region.ready.store(1, Ordering::Release);
/// # Ok(()) }
/// ```
pub struct ShmRegion<T: ShmSafe> {
    map: MmapRaw,
    name: String,
    owner: bool,
    /// The process that mapped it: a forked child never unlinks an inherited region.
    home: crate::process::Home,
    dev: u64,
    ino: u64,
    payload_offset: usize,
    _payload: PhantomData<fn() -> T>,
}

impl<T: ShmSafe> ShmRegion<T> {
    /// Create `name` exclusively with a zeroed payload: [`ShmOptions::create`] with defaults.
    ///
    /// # Errors
    ///
    /// See [`ShmOptions::create`].
    #[doc(alias = "shm_open")]
    pub fn create(name: &str) -> Result<Self> {
        ShmOptions::new(name).create()
    }

    /// Open `name`: [`ShmOptions::open`] with defaults.
    ///
    /// # Errors
    ///
    /// See [`ShmOptions::open`].
    #[doc(alias = "shm_open")]
    #[doc(alias = "mmap")]
    pub fn open(name: &str) -> Result<Self> {
        ShmOptions::new(name).open()
    }

    /// The payload.
    #[must_use]
    pub fn get(&self) -> &T {
        // SAFETY: the mapping is `payload_offset + size_of::<T>()` bytes (checked against the
        // file and header at create/open), page-aligned with `payload_offset` a multiple of
        // `align_of::<T>()`, lives as long as `self`, and `T: ShmSafe` is valid for any bytes
        // and accessed only atomically, so concurrent writers elsewhere cannot cause UB.
        unsafe { &*self.map.as_ptr().add(self.payload_offset).cast::<T>() }
    }

    fn header(&self) -> &RawHeader {
        raw_header(&self.map)
    }

    /// The full name, without a leading `/` (as created, suffix included).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A snapshot of the header, as published by the creator.
    #[must_use]
    pub fn header_fields(&self) -> HeaderFields {
        self.header().snapshot()
    }

    /// The process that created the region (from the header).
    #[must_use]
    pub fn creator(&self) -> ProcessIdentity {
        let (pid, start) = self.header().creator();
        ProcessIdentity::from_parts(pid, start)
    }

    /// Whether this handle unlinks the name on drop: it owns the name and this is the process
    /// that mapped it (in a child forked without `exec`, an inherited region unlinks nothing).
    #[must_use]
    pub fn is_owner(&self) -> bool {
        self.owner && self.home.is_here()
    }

    /// Whether this is the process that mapped the region (false in a forked child).
    pub(crate) fn is_home(&self) -> bool {
        self.home.is_here()
    }

    /// Stop owning the name: drop will not unlink it (another process takes over, or it is meant
    /// to outlive us). Returns whether this handle was the owner.
    pub fn release_ownership(&mut self) -> bool {
        std::mem::replace(&mut self.owner, false)
    }

    /// Take ownership of the name: drop will unlink it (if it still names this region).
    pub fn acquire_ownership(&mut self) {
        self.owner = true;
    }

    /// Unlink the name now (if it still names this region), keeping the mapping. Ownership ends.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] or [`Error::PermissionDenied`] from `lstat`/`unlink`.
    #[doc(alias = "shm_unlink")]
    pub fn unlink(&mut self) -> Result<()> {
        self.owner = false;
        os::shm_unlink_if_same(&self.name, self.dev, self.ino).map(drop)
    }

    /// Unlink the name (if it still names this region) through a shared reference, for a region
    /// whose last user knows its owner is gone.
    pub(crate) fn unlink_shared(&self) -> Result<bool> {
        os::shm_unlink_if_same(&self.name, self.dev, self.ino)
    }

    /// Unmap, and unlink the name if owned, reporting an unlink failure that drop would ignore.
    /// There is nothing to wait for, so unlike the GPU objects' `close` it takes no timeout;
    /// the error has the same shape as theirs.
    ///
    /// # Errors
    ///
    /// In a [`CloseError`] holding the region (still owning the name, for another `close`):
    /// [`Error::Os`] or [`Error::PermissionDenied`] from `lstat`/`unlink`.
    pub fn close(mut self) -> std::result::Result<(), CloseError<Self>> {
        if self.is_owner() {
            if let Err(e) = os::shm_unlink_if_same(&self.name, self.dev, self.ino) {
                return Err(CloseError::new(e, self));
            }
            self.owner = false;
        }
        Ok(())
    }
}

impl<T: ShmSafe> std::ops::Deref for ShmRegion<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.get()
    }
}

impl<T: ShmSafe> std::fmt::Debug for ShmRegion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRegion")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl<T: ShmSafe> Drop for ShmRegion<T> {
    fn drop(&mut self) {
        if self.is_owner() {
            // Drop cannot report: a failed unlink leaves the name for `reclaim_stale`; callers
            // who need to know use `close`.
            let _ = os::shm_unlink_if_same(&self.name, self.dev, self.ino);
        }
    }
}

/// A copy of a region's bytes (the inspector's read, `inspect.rs`), checked as a region of `T`
/// the way an open checks a mapping — its header published, valid and describing `T`, and long
/// enough — then its payload copied into a `T` of this process's own: a private value, read
/// through `T`'s own accessors and shared with no one.
pub(crate) fn copy_of<T: ShmSafe>(name: &str, bytes: &[u8]) -> Result<Box<T>> {
    let (offset, total) = layout_of::<T>()?;
    let short = || Error::SizeMismatch {
        name: name.to_owned(),
        expected: total as u64,
        found: bytes.len() as u64,
    };
    let fields = header_of_copy(bytes).ok_or_else(short)?;
    fields.validate(name, &expected_of::<T>(offset, total))?;
    let payload = bytes
        .get(offset..offset + std::mem::size_of::<T>())
        .ok_or_else(short)?;
    boxed_copy(payload).ok_or_else(short)
}

/// `payload` (exactly `size_of::<T>()` bytes) as a `T` on the heap; `None` under the model
/// checker, whose atomics are not plain words.
fn boxed_copy<T: ShmSafe>(payload: &[u8]) -> Option<Box<T>> {
    if cfg!(cuda_ipc_loom) || payload.len() != std::mem::size_of::<T>() {
        return None;
    }
    let mut value = Box::<T>::new_uninit();
    // SAFETY: the box holds `size_of::<T>()` bytes, all written here from `payload` (that
    // long, checked above; a distinct allocation). `T: ShmSafe` is `repr(C)` of integer
    // atomics and plain data, valid for any bits (the trait's contract; not under loom,
    // excluded above), so the written bytes are an initialised `T`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            payload.as_ptr(),
            value.as_mut_ptr().cast::<u8>(),
            payload.len(),
        );
        Some(value.assume_init())
    }
}

/// A zeroed `T` on the heap, every byte (padding included) written as a byte: a table a
/// test fills through its own methods, then reads back with [`bytes_of`].
#[cfg(all(test, not(cuda_ipc_loom)))]
pub(crate) fn zeroed<T: ShmSafe>() -> Option<Box<T>> {
    boxed_copy(&vec![0u8; std::mem::size_of::<T>()])
}

/// The bytes of `value`, a table made by [`zeroed`] (for [`image_of`]).
#[cfg(all(test, not(cuda_ipc_loom)))]
pub(crate) fn bytes_of<T: ShmSafe>(value: &T) -> &[u8] {
    // SAFETY: `value` is a live `T` of `size_of::<T>()` bytes, borrowed for the slice's
    // lifetime. Made by `zeroed` and changed since only through its atomics, every byte of it
    // is initialised (padding too: written as a byte, and never moved by a typed copy, the box
    // owning it in place); the caller's thread is the only one using it, so the reads race
    // with nothing.
    unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(value).cast::<u8>(),
            std::mem::size_of::<T>(),
        )
    }
}

/// What an open of a region of `T` expects its header to say, the payload at `offset` in a
/// file of `total` bytes.
fn expected_of<T: ShmSafe>(offset: usize, total: usize) -> Expected {
    Expected {
        payload_offset: offset as u32,
        payload_align: std::mem::align_of::<T>() as u32,
        payload_size: std::mem::size_of::<T>() as u64,
        type_tag: T::type_tag(),
        total_len: total as u64,
    }
}

/// The published header of a region of `T` whose payload starts at `offset` in a file of
/// `total` bytes, created by `creator` (pid, start time) on the machine `boot_id`.
fn header_of<T: ShmSafe>(
    offset: usize,
    total: usize,
    creator: (u32, u64),
    boot_id: [u8; 16],
) -> HeaderFields {
    let mut fields = HeaderFields {
        magic: MAGIC,
        version: VERSION,
        header_len: HEADER_LEN as u32,
        payload_offset: offset as u32,
        payload_align: std::mem::align_of::<T>() as u32,
        payload_size: std::mem::size_of::<T>() as u64,
        type_tag: T::type_tag(),
        total_len: total as u64,
        creator_pid: creator.0,
        creator_start: creator.1,
        boot_id,
        checksum: 0,
        reserved: 0,
    };
    fields.checksum = fields.compute_checksum();
    fields
}

/// The bytes of a published region of `T` whose payload is `payload` (cut or zero-padded to
/// `T`'s size), created by `creator`: a file image for the inspector's tests and fuzz target.
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(crate) fn image_of<T: ShmSafe>(payload: &[u8], creator: (u32, u64)) -> Vec<u8> {
    let Ok((offset, total)) = layout_of::<T>() else {
        return Vec::new();
    };
    let fields = header_of::<T>(offset, total, creator, [0; 16]);
    let mut bytes = fields.encode().to_vec();
    bytes.resize(offset, 0);
    bytes.extend_from_slice(&payload[..payload.len().min(total - offset)]);
    bytes.resize(total, 0);
    bytes
}

/// The header at the start of a copy of a region's bytes, decoded (not validated); `None` if
/// the copy is shorter than a header.
pub(crate) fn header_of_copy(bytes: &[u8]) -> Option<HeaderFields> {
    let head: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
    Some(HeaderFields::decode(head))
}

/// Whether `fields` is a header this crate published (its magic and checksum right): the
/// file is a region of this crate, of whatever type.
pub(crate) fn is_our_header(fields: &HeaderFields) -> bool {
    fields.magic == MAGIC
        && fields.version == VERSION
        && fields.checksum == fields.compute_checksum()
}

/// Remove `name` from `/dev/shm` if it is a region of ours whose creator has died. Returns
/// whether it was removed.
///
/// # Errors
///
/// [`Error::NotFound`], or the same file checks as [`ShmOptions::open`] (a region of another
/// uid or with loose permissions is never touched).
pub fn reclaim_stale(name: &str) -> Result<bool> {
    reclaim(validate_name(name)?)
}

/// The names of the regions the crate makes start with these, one prefix per kind: lease tables
/// (the export registries'), block tables (arenas', pools', the registries'), channels.
pub(crate) const LEASE_TABLES: &str = "cuda-ipc-lease.";
/// See [`LEASE_TABLES`]: `cuda-ipc-arena.<token>`, for arenas and pools alike.
pub(crate) const BLOCK_TABLES: &str = "cuda-ipc-arena.";
/// See [`LEASE_TABLES`].
pub(crate) const CHANNELS: &str = "cuda-ipc-chan";

/// Remove the regions that processes which died left in `/dev/shm`: lease tables and block
/// tables (`cuda-ipc-lease.*`, `cuda-ipc-arena.*`: export registries, arenas, pools) and
/// channel regions (`cuda-ipc-chan.*`: a producer killed before its consumer attached, or a
/// broadcast producer, whose name stays for later consumers). A `SIGKILL`ed process cannot
/// unlink its own, and unless a peer of it outlives it, nobody else would. Only regions of our
/// uid with mode `0600` whose creator is dead are touched (a peer that still maps one keeps
/// its mapping); returns how many were removed. Every process does this once per kind, before
/// its first export or channel; a long-lived process whose peers die calls it to clean up
/// after them sooner. (A killed listener's bell, a socket, is not a region: the next bind at
/// its name, or any process's first bell or channel, removes it.)
///
/// # Examples
///
/// ```
/// let removed = cuda_ipc::shm::reclaim_stale_regions();
/// println!("removed {removed} regions of dead processes");
/// ```
#[allow(
    clippy::must_use_candidate,
    reason = "it removes stale regions; the count is information"
)]
pub fn reclaim_stale_regions() -> usize {
    [LEASE_TABLES, BLOCK_TABLES, CHANNELS]
        .into_iter()
        .map(reclaim_stale_prefixed)
        .sum()
}

/// [`reclaim_stale`] for every `/dev/shm` entry whose name starts with `prefix` (one of the
/// kinds above); returns how many were removed.
fn reclaim_stale_prefixed(prefix: &str) -> usize {
    os::shm_names()
        .unwrap_or_default()
        .iter()
        .filter(|name| name.starts_with(prefix) && reclaim_stale(name).unwrap_or(false))
        .count()
}

/// [`reclaim_stale_prefixed`] once per process and prefix: what every process does before it
/// makes its first region of a kind (a `SIGKILL`ed creator cannot unlink its own, and unless
/// a peer of it outlives it, nobody else would). Only regions of this uid whose creator is
/// dead are touched.
pub(crate) fn reclaim_stale_once(prefix: &'static str) {
    static SWEPT: parking_lot::Mutex<Vec<&'static str>> = parking_lot::const_mutex(Vec::new());
    let mut swept = SWEPT.lock();
    if !swept.contains(&prefix) {
        swept.push(prefix);
        reclaim_stale_prefixed(prefix);
    }
}

/// Remove `name` from `/dev/shm` unconditionally (as `shm_unlink`), for cleaning up after a
/// region whose owner released it.
///
/// # Errors
///
/// [`Error::InvalidName`], [`Error::NotFound`], [`Error::PermissionDenied`].
#[doc(alias = "shm_unlink")]
pub fn unlink(name: &str) -> Result<()> {
    os::shm_unlink(validate_name(name)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(validate_name("/x").unwrap(), "x");
        assert_eq!(validate_name("x.y-z_1").unwrap(), "x.y-z_1");
        for bad in ["", "/", "a/b", "//a", "a\0b", ".", "..", "/.."] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"n".repeat(255)).is_ok());
        assert!(validate_name(&"n".repeat(256)).is_err());
    }

    #[test]
    fn layout_puts_the_payload_after_the_header_aligned() {
        #[repr(align(256))]
        struct Big(#[allow(dead_code)] u8);
        assert_eq!(layout_of::<u64>().unwrap(), (128, 136));
        assert_eq!(layout_of::<Big>().unwrap(), (256, 512));
    }

    proptest! {
        #[test]
        fn any_name_is_accepted_or_rejected_without_panic(name in ".{0,300}") {
            if let Ok(bare) = validate_name(&name) {
                prop_assert!(!bare.is_empty() && bare.len() <= 255);
                prop_assert!(!bare.contains('/') && !bare.contains('\0'));
            }
        }
    }
}
