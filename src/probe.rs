//! [`probe`]: what this machine allows for sharing GPU memory between processes — per device,
//! between devices, and on the host — found by trying where an attribute could mislead, with
//! what each "no" breaks and what to do about it.
//!
//! The report is a flat list of [`Check`]s, printed for people by `Display` and for programs
//! by [`Probe::to_json`]. `cargo run --example doctor` prints it (`-- --json` for the JSON).
//!
//! # Examples
//!
//! ```
//! use cuda_ipc::probe::Status;
//!
//! let report = cuda_ipc::probe::probe();
//! match report.get("device 0", "legacy_ipc").map(|c| c.status) {
//!     Some(Status::Yes) => println!("legacy IPC works on device 0"),
//!     Some(_) => println!("no legacy IPC on device 0:\n{report}"),
//!     None => println!("no device 0 (or no driver):\n{report}"),
//! }
//! ```

use std::fmt;

use crate::context::GpuContext;
use crate::device::{self, ComputeMode};
use crate::driver::{self, sys};
use crate::error::{Error, Result};
use crate::os;

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Available (tried where trying is possible).
    Yes,
    /// Not available; [`Check::breaks`] and [`Check::fix`] say what follows.
    No,
    /// A fact to know rather than a capability (a namespace, a container).
    Info,
    /// Could not be found out (a file that could not be read, no driver to ask).
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Yes => "yes",
            Status::No => "no",
            Status::Info => "info",
            Status::Unknown => "unknown",
        }
    }
}

/// One finding of [`probe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked: `"driver"`, `"device 0"`, `"devices 0 -> 1"` or `"host"`.
    pub subject: String,
    /// A stable key for programs, e.g. `"legacy_ipc"`, `"vmm_posix_fd"`, `"peer_access"`.
    pub key: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found, for people (values, the call that failed and its CUDA code).
    pub detail: String,
    /// For [`Status::No`]: what does not work here because of it (empty otherwise).
    pub breaks: &'static str,
    /// For [`Status::No`]: what to do (empty otherwise).
    pub fix: &'static str,
}

/// What [`probe`] found: every [`Check`], in the order they were made.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    checks: Vec<Check>,
}

impl Probe {
    /// Every check, in the order they were made.
    #[must_use]
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// The check `key` of `subject` (e.g. `("device 0", "legacy_ipc")`), if it was made.
    #[must_use]
    pub fn get(&self, subject: &str, key: &str) -> Option<&Check> {
        self.checks
            .iter()
            .find(|c| c.subject == subject && c.key == key)
    }

    /// The checks that came out [`Status::No`].
    pub fn problems(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::No)
    }

    /// The report as JSON: `{"checks": [{"subject", "key", "status", "detail", "breaks",
    /// "fix"}, ...]}`, one object per check, in order.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"checks\": [");
        for (i, c) in self.checks.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push('{');
            let fields = [
                ("subject", c.subject.as_str()),
                ("key", c.key),
                ("status", c.status.as_str()),
                ("detail", c.detail.as_str()),
                ("breaks", c.breaks),
                ("fix", c.fix),
            ];
            for (j, (name, value)) in fields.iter().enumerate() {
                if j > 0 {
                    out.push_str(", ");
                }
                out.push_str(&json_string(name));
                out.push_str(": ");
                out.push_str(&json_string(value));
            }
            out.push('}');
        }
        out.push_str("]}");
        out
    }

    fn push(&mut self, subject: &str, key: &'static str, finding: Finding) {
        let (status, detail, breaks, fix) = match finding {
            Finding::Yes(detail) => (Status::Yes, detail, "", ""),
            Finding::Info(detail) => (Status::Info, detail, "", ""),
            Finding::Unknown(detail) => (Status::Unknown, detail, "", ""),
            Finding::No(detail, breaks, fix) => (Status::No, detail, breaks, fix),
        };
        self.checks.push(Check {
            subject: subject.to_owned(),
            key,
            status,
            detail,
            breaks,
            fix,
        });
    }
}

impl fmt::Display for Probe {
    /// One line per check, `subject  key  status  detail`, each "no" followed by what it
    /// breaks and what to do.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut subject = "";
        for c in &self.checks {
            if c.subject != subject {
                subject = &c.subject;
                writeln!(f, "{subject}:")?;
            }
            let mark = match c.status {
                Status::Yes => "yes ",
                Status::No => "NO  ",
                Status::Info => "info",
                Status::Unknown => "??  ",
            };
            writeln!(f, "  {mark} {:<18} {}", c.key, c.detail)?;
            if c.status == Status::No {
                writeln!(f, "       breaks: {}", c.breaks)?;
                writeln!(f, "       do:     {}", c.fix)?;
            }
        }
        Ok(())
    }
}

/// A JSON string literal for `s`.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

enum Finding {
    Yes(String),
    No(String, &'static str, &'static str),
    Info(String),
    Unknown(String),
}

/// How a failed call reads in a report: the call and its CUDA code.
fn failed(e: &Error) -> String {
    match e {
        Error::Cuda { call, name, .. } => format!("{call} failed: {name}"),
        other => other.to_string(),
    }
}

/// Find out what this machine allows: the driver; for each device unified addressing, the
/// compute mode, legacy IPC of memory and events (tried: an allocation and an event exported),
/// 64-bit stream memory operations, virtual-memory allocations exported as POSIX file
/// descriptors (tried), stream-ordered pools that export (tried), fabric handles (tried: the
/// attribute alone says nothing about the IMEX channel an export needs); peer access for each
/// ordered pair of devices; and on the host `/dev/shm`'s size, Yama's `ptrace_scope` and
/// whether `pidfd_getfd` may take a descriptor from this process and from its parent, the pid
/// namespace, and signs of a container.
///
/// Never fails: what cannot be found out is a check with [`Status::Unknown`] (or, for a
/// missing driver, [`Status::No`] saying what was tried). Creates a context on every device
/// (a few hundred milliseconds each) and frees what it allocates before returning.
///
/// # Examples
///
/// ```
/// let report = cuda_ipc::probe::probe();
/// print!("{report}"); // or report.to_json()
/// for c in report.problems() {
///     eprintln!("{} {}: {} ({})", c.subject, c.key, c.breaks, c.fix);
/// }
/// ```
#[doc(alias = "doctor")]
#[must_use]
pub fn probe() -> Probe {
    let mut p = Probe::default();
    let host = os::host_facts();
    driver_checks(&mut p, host.nvidia_driver.as_deref());
    if p.get("driver", "driver").map(|c| c.status) == Some(Status::Yes) {
        gpu_checks(&mut p);
    }
    host_checks(&mut p, &host);
    p
}

fn driver_checks(p: &mut Probe, kernel_driver: Option<&str>) {
    let finding = match driver::init().and_then(|()| driver::driver_version()) {
        Ok(v) => Finding::Yes(format!(
            "CUDA {}.{} driver API{}",
            v / 1000,
            v % 1000 / 10,
            kernel_driver.map(|k| format!("; {k}")).unwrap_or_default()
        )),
        Err(e @ Error::DriverNotFound { .. }) => Finding::No(
            e.to_string(),
            "everything GPU-side: no buffer, event, signal or channel can be created",
            "install the NVIDIA driver (libcuda.so.1), or set CUDA_IPC_DRIVER_LIBRARY to its path",
        ),
        Err(e @ Error::NoDevice { .. }) => Finding::No(
            e.to_string(),
            "everything GPU-side: the driver sees no usable GPU",
            "check nvidia-smi; in a container, pass the GPUs in (--gpus all) and the device nodes",
        ),
        Err(e) => Finding::No(
            e.to_string(),
            "everything GPU-side",
            "check that nvidia-smi works for this user",
        ),
    };
    p.push("driver", "driver", finding);
}

fn gpu_checks(p: &mut Probe) {
    let count = match device::device_count() {
        Ok(n) => n,
        Err(e) => {
            p.push("driver", "devices", Finding::Unknown(failed(&e)));
            return;
        }
    };
    p.push(
        "driver",
        "devices",
        Finding::Info(format!("{count} visible")),
    );
    for ordinal in 0..count {
        device_checks(p, ordinal);
    }
    for a in 0..count {
        for b in 0..count {
            if a != b {
                let subject = format!("devices {a} -> {b}");
                let finding = match device::can_access_peer(a, b) {
                    Ok(true) => Finding::Yes("peer access possible".into()),
                    Ok(false) => Finding::No(
                        "cuDeviceCanAccessPeer says no".into(),
                        "a process on the first device cannot map buffers of the second \
                         (ImportedBuffer::open fails across them)",
                        "keep sharing processes on devices that reach each other (nvidia-smi \
                         topo -m), or stage through host memory",
                    ),
                    Err(e) => Finding::Unknown(failed(&e)),
                };
                p.push(&subject, "peer_access", finding);
            }
        }
    }
}

fn device_checks(p: &mut Probe, ordinal: u32) {
    let subject = format!("device {ordinal}");
    let info = match device::device_info(ordinal) {
        Ok(info) => info,
        Err(e) => {
            p.push(&subject, "attributes", Finding::Unknown(failed(&e)));
            return;
        }
    };
    p.push(
        &subject,
        "name",
        Finding::Info(format!(
            "{} ({}, {})",
            info.name,
            info.pci_bus_id,
            info.uuid_string()
        )),
    );
    for (check, finding) in capability_findings(&info) {
        p.push(&subject, check, finding);
    }
    let ctx = match GpuContext::new(ordinal) {
        Ok(ctx) => ctx,
        Err(e) => {
            p.push(
                &subject,
                "context",
                Finding::No(
                    failed(&e),
                    "everything on this device",
                    "check nvidia-smi: the device may be in use exclusively or lost",
                ),
            );
            return;
        }
    };
    let dev = ctx.device();
    let tried = ctx.enter().map(|_g| {
        p.push(&subject, "legacy_ipc", try_legacy_ipc(dev));
        p.push(&subject, "vmm_posix_fd", try_vmm_fd(dev));
        p.push(&subject, "pool_ipc", try_pool(dev));
        p.push(&subject, "fabric", try_fabric(dev));
    });
    if let Err(e) = tried {
        p.push(&subject, "context", Finding::Unknown(failed(&e)));
    }
}

/// What a device's attributes say of the capabilities IPC needs: unified addressing, a compute
/// mode that lets two processes in, 64-bit stream memory operations.
fn capability_findings(info: &device::DeviceInfo) -> [(&'static str, Finding); 3] {
    [
        (
            "unified_addressing",
            if info.unified_addressing {
                Finding::Yes("yes".into())
            } else {
                Finding::No(
                    "the device does not share one address space with the host".into(),
                    "every IPC handle type: CUDA IPC needs unified addressing",
                    "use a 64-bit Linux host and a device of compute capability 2.0 or later",
                )
            },
        ),
        (
            "compute_mode",
            match info.compute_mode {
                ComputeMode::Default => {
                    Finding::Yes("default (several processes may use the device)".into())
                }
                ComputeMode::Prohibited => Finding::No(
                    "prohibited: no process may create a context".into(),
                    "everything on this device",
                    "ask the administrator to set the default compute mode (nvidia-smi -c DEFAULT)",
                ),
                ComputeMode::ExclusiveProcess => Finding::No(
                    "exclusive-process: one process at a time".into(),
                    "two processes on this device (an exporter and an importer on one GPU)",
                    "put each process on its own GPU, use MPS, or ask for the default compute mode",
                ),
                ComputeMode::Other(m) => Finding::Unknown(format!("compute mode {m}")),
            },
        ),
        (
            "stream_mem_ops_64",
            if info.stream_mem_ops {
                Finding::Yes("64-bit cuStreamWaitValue64 / cuStreamWriteValue64".into())
            } else {
                Finding::No(
                    "64-bit stream memory operations unavailable".into(),
                    "IpcSignal's GPU-side waits and writes, and IpcSender / IpcReceiver",
                    "use IpcEvent for ordering (host-learned, slower on one GPU); a newer driver",
                )
            },
        ),
    ]
}

fn attr(dev: sys::CUdevice, attribute: i32) -> Result<i32> {
    crate::driver::device::attribute(dev, attribute)
}

/// `cuMemAlloc` + `cuIpcGetMemHandle`, and an interprocess event + `cuIpcGetEventHandle`.
fn try_legacy_ipc(dev: sys::CUdevice) -> Finding {
    let tried = (|| -> Result<()> {
        // In the current (entered) context.
        let ptr = driver::mem::alloc(2 << 20)?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation of this context.
        let exported = unsafe { driver::ipc::get_mem_handle(ptr) };
        // SAFETY: allocated above, freed once, nothing queued on it.
        let freed = unsafe { driver::mem::free(ptr) };
        exported.and(freed)?;
        let event =
            driver::event::create(sys::CU_EVENT_DISABLE_TIMING | sys::CU_EVENT_INTERPROCESS)?;
        // SAFETY: `event` is a live interprocess event of this context.
        let exported = unsafe { driver::ipc::get_event_handle(event) };
        // SAFETY: created above, destroyed once, never recorded.
        let destroyed = unsafe { driver::event::destroy(event) };
        exported.and(destroyed).map(drop)
    })();
    match tried {
        Ok(()) => {
            let events = attr(dev, sys::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED)
                .map_or(String::new(), |v| format!(" (IPC event attribute {v})"));
            Finding::Yes(format!(
                "exported a cuMemAlloc allocation and an interprocess event{events}"
            ))
        }
        Err(e) => Finding::No(
            failed(&e),
            "IpcBuffer, IpcEvent, IpcSignal and IpcSender / IpcReceiver (legacy handles)",
            "run on Linux outside WSL, with the default compute mode; check nvidia-smi",
        ),
    }
}

/// Create one granule of VMM memory asking for `handle_type`, export it into `shareable`
/// (`cuMemExportToShareableHandle`), release it. The caller closes what was exported.
fn try_vmm_export(
    dev: sys::CUdevice,
    handle_type: u32,
    shareable: *mut std::ffi::c_void,
) -> Result<()> {
    let prop = crate::vmm::pinned_prop(dev, handle_type);
    let granularity = crate::vmm::granularity(&prop)?;
    let handle = driver::vmm::create(granularity, &prop)?;
    // SAFETY: `handle` was created above with `handle_type` requested; `shareable` points to
    // storage of that type's size (the caller's int or 64-byte fabric handle).
    let exported = unsafe { driver::vmm::export_shareable(shareable, handle, handle_type) };
    // SAFETY: created above, never mapped, released once (an exported handle keeps the
    // memory alive until closed, which the caller does).
    let released = unsafe { driver::vmm::release(handle) };
    exported.and(released)
}

fn try_vmm_fd(dev: sys::CUdevice) -> Finding {
    let vmm = attr(
        dev,
        sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    );
    let fd_attr = attr(
        dev,
        sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    );
    let attrs = format!(
        "attributes: VMM {}, POSIX fd {}",
        vmm.as_ref().map_or("?".into(), i32::to_string),
        fd_attr.as_ref().map_or("?".into(), i32::to_string)
    );
    let mut fd: i32 = -1;
    let tried = try_vmm_export(
        dev,
        sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        (&raw mut fd).cast(),
    );
    if fd >= 0 {
        // SAFETY: the driver handed us this descriptor; we own it and close it once.
        drop(unsafe { <rustix::fd::OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) });
    }
    match tried {
        Ok(()) => Finding::Yes(format!(
            "exported a cuMemCreate allocation as a file descriptor ({attrs})"
        )),
        Err(e) => Finding::No(
            format!("{} ({attrs})", failed(&e)),
            "HandleType::PosixFd buffers: virtual memory shared as file descriptors (what \
             NCCL, UCX and cuda.core use; capabilities rather than bearer tokens)",
            "a driver with VMM support (CUDA 10.2+) on Linux; legacy handles still work",
        ),
    }
}

fn try_pool(dev: sys::CUdevice) -> Finding {
    let pools = attr(dev, sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
    let types = attr(dev, sys::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES);
    let attrs = format!(
        "attributes: pools {}, pool handle types {}",
        pools.as_ref().map_or("?".into(), i32::to_string),
        types.as_ref().map_or("?".into(), |t| format!("{t:#x}"))
    );
    let props = crate::vmm::pool_props(dev);
    let tried = driver::pool::create(&props).and_then(|pool| {
        // SAFETY: created above, no allocation from it, destroyed once.
        unsafe { driver::pool::destroy(pool) }
    });
    match tried {
        Ok(()) => Finding::Yes(format!(
            "created a stream-ordered pool that exports file descriptors ({attrs})"
        )),
        Err(e) => Finding::No(
            format!("{} ({attrs})", failed(&e)),
            "sharing stream-ordered allocations (cuMemAllocAsync, cudarc's default): legacy \
             handles refuse them",
            "allocate memory to share with cuMemAlloc (IpcBuffer::new) instead",
        ),
    }
}

fn try_fabric(dev: sys::CUdevice) -> Finding {
    let attribute = attr(dev, sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
    let said = format!(
        "attribute says {}",
        attribute.as_ref().map_or("?".into(), |&v| if v != 0 {
            "supported".into()
        } else {
            "unsupported".to_string()
        })
    );
    let mut fabric = [0u8; 64];
    match try_vmm_export(
        dev,
        sys::CU_MEM_HANDLE_TYPE_FABRIC,
        fabric.as_mut_ptr().cast(),
    ) {
        Ok(()) => Finding::Yes(format!("exported a fabric handle ({said})")),
        Err(e) => Finding::No(
            format!("{} ({said})", failed(&e)),
            "multi-node NVLink sharing (fabric handles); sharing within this machine is \
             unaffected",
            "multi-node NVLink needs the IMEX daemon (nvidia-imex) and an IMEX channel \
             (/dev/nvidia-caps-imex-channels/channelN) visible to the process",
        ),
    }
}

/// How much room `/dev/shm` has (every region of the crate lives there).
fn shm_finding(host: &os::HostFacts) -> Finding {
    const MIB: u64 = 1 << 20;
    match host.shm_space {
        Some((total, avail)) if avail >= MIB => Finding::Yes(format!(
            "{:.1} MiB, {:.1} MiB free",
            total as f64 / MIB as f64,
            avail as f64 / MIB as f64
        )),
        Some((total, avail)) => Finding::No(
            format!("{total} bytes, {avail} free"),
            "shared regions, barriers, lease tables and channels (all live in /dev/shm)",
            "free space in /dev/shm, or give the container more (docker --shm-size)",
        ),
        None => Finding::No(
            "statvfs(/dev/shm) failed".into(),
            "shared regions, barriers, lease tables and channels (all live in /dev/shm)",
            "mount a tmpfs at /dev/shm",
        ),
    }
}

/// What Yama's `ptrace_scope` allows (the opt-in `pidfd_getfd` path needs ptrace permission).
fn ptrace_finding(host: &os::HostFacts) -> Finding {
    match host.ptrace_scope {
        Some(0) => Finding::Info("0: a process may ptrace any process of its uid".into()),
        Some(1) => {
            Finding::Info("1: only descendants (or those that allow it) may be ptraced".into())
        }
        Some(2) => Finding::Info("2: only with CAP_SYS_PTRACE".into()),
        Some(3) => Finding::Info("3: no ptrace at all".into()),
        Some(v) => Finding::Info(format!("{v}")),
        None => Finding::Info("no Yama (the kernel's own ptrace rules apply)".into()),
    }
}

fn host_checks(p: &mut Probe, host: &os::HostFacts) {
    p.push("host", "dev_shm", shm_finding(host));
    p.push("host", "ptrace_scope", ptrace_finding(host));
    let own = take_own_fd();
    let parent = take_parent_fd();
    let detail = format!("from this process: {own}; from its parent: {parent}");
    p.push(
        "host",
        "pidfd_getfd",
        if parent == "allowed" {
            Finding::Yes(detail)
        } else {
            Finding::No(
                detail,
                "take_fd_from_process (the opt-in pidfd_getfd path) for peers that are not \
                 descendants",
                "pass descriptors over a Unix socket (FdSocket), which needs no ptrace \
                 permission",
            )
        },
    );
    p.push(
        "host",
        "pid_namespace",
        match &host.ns_pids {
            Some(pids) if pids.len() > 1 => Finding::Info(format!(
                "nested: pid {} here, {} as seen from outside; peers must share this namespace \
                 for liveness checks to name them",
                pids.last().copied().unwrap_or(0),
                pids.first().copied().unwrap_or(0)
            )),
            Some(pids) => Finding::Info(format!(
                "pid {} (one level visible in /proc); processes that share GPU memory must \
                 see each other's pids",
                pids.first().copied().unwrap_or(0)
            )),
            None => Finding::Unknown("no NSpid line in /proc/self/status".into()),
        },
    );
    p.push(
        "host",
        "container",
        if host.container.is_empty() {
            Finding::Info("no sign of a container".into())
        } else {
            Finding::Info(format!(
                "{}; processes in different containers need one /dev/shm (--ipc=host or \
                 --ipc=container:NAME) and one pid namespace (--pid=host or \
                 --pid=container:NAME)",
                host.container.join(", ")
            ))
        },
    );
}

/// Whether `pidfd_getfd` may copy a descriptor of this very process (the system call itself,
/// seccomp).
fn take_own_fd() -> String {
    describe_take(os::pidfd_getfd(os::pid(), 0))
}

/// Whether `pidfd_getfd` may copy a descriptor of the parent process (ptrace permission over
/// a process that is not a descendant). `EBADF` (no descriptor 0 there) means the permission
/// check passed.
fn take_parent_fd() -> String {
    describe_take(os::pidfd_getfd(os::parent_pid(), 0))
}

fn describe_take(r: std::result::Result<rustix::fd::OwnedFd, rustix::io::Errno>) -> String {
    match r {
        Ok(_) => "allowed".into(),
        Err(e) if e == rustix::io::Errno::BADF => "allowed".into(),
        Err(e) if e == rustix::io::Errno::PERM => "refused (EPERM)".into(),
        Err(e) if e == rustix::io::Errno::NOSYS => "no such system call (kernel < 5.6)".into(),
        Err(e) => format!("failed ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn the_report_lists_every_no_with_what_it_breaks() {
        let mut p = Probe::default();
        p.push("host", "dev_shm", Finding::Yes("64 MiB".into()));
        p.push(
            "device 0",
            "fabric",
            Finding::No("x failed".into(), "multi-node", "imex"),
        );
        let text = p.to_string();
        assert!(text.contains("host:\n  yes  dev_shm"), "{text}");
        assert!(text.contains("NO   fabric"), "{text}");
        assert!(
            text.contains("breaks: multi-node") && text.contains("do:     imex"),
            "{text}"
        );
        assert_eq!(p.problems().count(), 1);
        assert_eq!(
            p.to_json(),
            "{\"checks\": [{\"subject\": \"host\", \"key\": \"dev_shm\", \"status\": \"yes\", \
             \"detail\": \"64 MiB\", \"breaks\": \"\", \"fix\": \"\"}, {\"subject\": \
             \"device 0\", \"key\": \"fabric\", \"status\": \"no\", \"detail\": \"x failed\", \
             \"breaks\": \"multi-node\", \"fix\": \"imex\"}]}"
        );
    }

    #[test]
    fn the_host_half_works_without_a_gpu() {
        let p = probe();
        for key in [
            "dev_shm",
            "ptrace_scope",
            "pidfd_getfd",
            "pid_namespace",
            "container",
        ] {
            assert!(p.get("host", key).is_some(), "host {key} missing:\n{p}");
        }
        let driver = p.get("driver", "driver").map(|c| c.status);
        assert!(driver.is_some(), "{p}");
        // The JSON form has one object per check.
        assert_eq!(p.to_json().matches("\"subject\"").count(), p.checks().len());
    }
}
