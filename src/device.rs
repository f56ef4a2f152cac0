//! Device capability queries and simpleIPC's device selection, as an API.

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{Error, Result};

/// Compute mode of a device (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of contexts (the mode IPC needs).
    Default,
    /// No contexts may be created.
    Prohibited,
    /// One context, from one process.
    ExclusiveProcess,
    /// A value this crate does not know.
    Other(i32),
}

/// What this crate needs to know about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal (as `cuDeviceGet` takes it).
    pub ordinal: u32,
    /// Marketing name (`cuDeviceGetName`).
    pub name: String,
    /// UUID (`cuDeviceGetUuid`).
    pub uuid: [u8; 16],
    /// PCI bus id, e.g. `0000:19:00.0` (`cuDeviceGetPCIBusId`).
    pub pci_bus_id: String,
    /// Unified virtual addressing (required by CUDA IPC).
    pub unified_addressing: bool,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// Number of multiprocessors.
    pub multiprocessors: u32,
    /// 64-bit stream memory operations (`cuStreamWriteValue64`/`cuStreamWaitValue64`), which
    /// [`IpcSignal`](crate::IpcSignal) needs; see [`can_use_stream_mem_ops`].
    pub stream_mem_ops: bool,
}

impl DeviceInfo {
    /// Why this device cannot take part in IPC, or `None` if it can.
    #[must_use]
    pub fn ipc_unsuitable_reason(&self) -> Option<String> {
        if !self.unified_addressing {
            return Some("no unified addressing".into());
        }
        if self.compute_mode != ComputeMode::Default {
            return Some(format!(
                "compute mode {:?} (IPC needs Default)",
                self.compute_mode
            ));
        }
        None
    }

    /// The UUID in the usual `GPU-xxxxxxxx-xxxx-...` form.
    #[must_use]
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }
}

/// Format a device UUID as `nvidia-smi` does.
#[must_use]
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The number of devices the driver shows this process (`cuDeviceGetCount`).
///
/// # Errors
///
/// [`Error::NoDevice`] without a usable driver or GPU.
#[doc(alias = "cuDeviceGetCount")]
pub fn device_count() -> Result<u32> {
    driver::init()?;
    driver::device::count()
}

/// Query one device.
///
/// # Errors
///
/// [`Error::NoDevice`], or [`Error::Cuda`] naming the failed query.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> cuda_ipc::Result<()> {
/// let info = cuda_ipc::device::device_info(0)?;
/// println!("{} {} {}", info.name, info.uuid_string(), info.pci_bus_id);
/// # Ok(()) }
/// ```
#[doc(alias = "cuDeviceGetName")]
#[doc(alias = "cuDeviceGetPCIBusId")]
pub fn device_info(ordinal: u32) -> Result<DeviceInfo> {
    let dev = driver::device::get_initialized(ordinal)?;
    let name = driver::device::name(dev)?;
    let pci_bus_id = driver::device::pci_bus_id(dev)?;
    let compute_mode = match driver::device::attribute(dev, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?
    {
        0 => ComputeMode::Default,
        2 => ComputeMode::Prohibited,
        3 => ComputeMode::ExclusiveProcess,
        other => ComputeMode::Other(other),
    };
    Ok(DeviceInfo {
        ordinal,
        name,
        uuid: driver::device::uuid(dev)?,
        pci_bus_id,
        unified_addressing: driver::device::attribute(
            dev,
            sys::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        )? != 0,
        compute_mode,
        multiprocessors: u32::try_from(driver::device::attribute(
            dev,
            sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?)
        .unwrap_or(0),
        stream_mem_ops: stream_mem_ops_64(dev)?,
    })
}

/// Whether `dev` can run 64-bit stream memory operations: CUDA 12's
/// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`, or on an older driver that does not
/// know it (`CUDA_ERROR_INVALID_VALUE`), the same number's CUDA 11 predecessor.
pub(crate) fn stream_mem_ops_64(dev: sys::CUdevice) -> Result<bool> {
    match driver::device::attribute(dev, sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) {
        Ok(v) => Ok(v != 0),
        Err(Error::Cuda {
            code: sys::CUDA_ERROR_INVALID_VALUE,
            ..
        }) => Ok(driver::device::attribute(
            dev,
            sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1,
        )? != 0),
        Err(e) => Err(e),
    }
}

/// Whether device `ordinal` can run the 64-bit stream memory operations
/// (`cuStreamWriteValue64`, `cuStreamWaitValue64`) that [`IpcSignal`](crate::IpcSignal) is
/// built on (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`).
///
/// # Errors
///
/// [`Error::NoDevice`], or [`Error::Cuda`] naming `cuDeviceGetAttribute`.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> cuda_ipc::Result<()> {
/// if !cuda_ipc::device::can_use_stream_mem_ops(0)? {
///     println!("device 0: use IpcEvent, IpcSignal is not available");
/// }
/// # Ok(()) }
/// ```
#[doc(alias = "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS")]
pub fn can_use_stream_mem_ops(ordinal: u32) -> Result<bool> {
    driver::init()?;
    stream_mem_ops_64(driver::device::get(ordinal)?)
}

/// Every device the driver shows this process.
///
/// # Errors
///
/// As [`device_info`].
pub fn devices() -> Result<Vec<DeviceInfo>> {
    (0..device_count()?).map(device_info).collect()
}

/// Whether device `from` can access memory on device `to` (`cuDeviceCanAccessPeer`); a device
/// can always access itself. The driver's answer for a pair is fixed for the life of a process,
/// so it is asked once per pair (every open of memory on another device checks it).
///
/// # Errors
///
/// [`Error::Cuda`] naming the failed call.
#[doc(alias = "cuDeviceCanAccessPeer")]
pub fn can_access_peer(from: u32, to: u32) -> Result<bool> {
    static ANSWERS: parking_lot::Mutex<std::collections::BTreeMap<(u32, u32), bool>> =
        parking_lot::const_mutex(std::collections::BTreeMap::new());
    if from == to {
        return Ok(true);
    }
    if let Some(&can) = ANSWERS.lock().get(&(from, to)) {
        return Ok(can);
    }
    driver::init()?;
    let (a, b) = (driver::device::get(from)?, driver::device::get(to)?);
    let can = driver::device::can_access_peer(a, b)?;
    // Two threads may have asked at once: the pair is kept once (the driver's answer is fixed).
    Ok(*ANSWERS.lock().entry((from, to)).or_insert(can))
}

/// Refuse, with [`Error::DeviceNotReachable`], a context on device `from` whose device cannot
/// access memory held by device `memory` (ordinals; a device reaches its own memory).
pub(crate) fn check_peer(from: u32, memory: u32) -> Result<()> {
    if can_access_peer(from, memory)? {
        return Ok(());
    }
    let uuid = driver::device::uuid(driver::device::get(memory)?)?;
    Err(Error::DeviceNotReachable {
        uuid: uuid_string(&uuid),
        from,
        peer: Some(memory),
    })
}

/// The ordinal of the visible device with this UUID. The driver's device list is fixed for the
/// life of a process, so it is read once.
pub(crate) fn ordinal_of_uuid(uuid: &[u8; 16]) -> Result<Option<u32>> {
    static UUIDS: std::sync::OnceLock<Vec<[u8; 16]>> = std::sync::OnceLock::new();
    let uuids = match UUIDS.get() {
        Some(u) => u,
        None => {
            let list = (0..device_count()?)
                .map(|o| driver::device::uuid(driver::device::get(o)?))
                .collect::<Result<Vec<_>>>()?;
            UUIDS.get_or_init(|| list)
        }
    };
    Ok(uuids
        .iter()
        .position(|u| u == uuid)
        .and_then(|i| u32::try_from(i).ok()))
}

/// A device left out of a [`PeerGroup`], and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedDevice {
    /// Its ordinal.
    pub ordinal: u32,
    /// Why it was skipped.
    pub reason: String,
}

/// The devices simpleIPC would use: each supports unified addressing, is in the default
/// compute mode, and can reach every other member both ways.
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::device::PeerGroup;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let group = PeerGroup::select(8)?; // at most 8 devices, as simpleIPC takes
/// for d in &group.devices {
///     println!("device {}: {} selected", d.ordinal, d.name);
/// }
/// for s in &group.skipped {
///     println!("device {} left out: {}", s.ordinal, s.reason);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PeerGroup {
    /// The chosen devices, in ordinal order.
    pub devices: Vec<DeviceInfo>,
    /// Devices left out, with the reason.
    pub skipped: Vec<SkippedDevice>,
}

impl PeerGroup {
    /// simpleIPC's selection loop: walk the devices in order, keep each one that is suitable
    /// and can access (both ways) every device already kept, up to `max` devices.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`], or a failed device query.
    pub fn select(max: usize) -> Result<Self> {
        let mut devices: Vec<DeviceInfo> = Vec::new();
        let mut skipped = Vec::new();
        for info in self::devices()? {
            if devices.len() >= max {
                skipped.push(SkippedDevice {
                    ordinal: info.ordinal,
                    reason: format!("device limit {max} reached"),
                });
                continue;
            }
            if let Some(reason) = info.ipc_unsuitable_reason() {
                skipped.push(SkippedDevice {
                    ordinal: info.ordinal,
                    reason,
                });
                continue;
            }
            let mut unreachable = None;
            for kept in &devices {
                if !(can_access_peer(info.ordinal, kept.ordinal)?
                    && can_access_peer(kept.ordinal, info.ordinal)?)
                {
                    unreachable = Some(kept.ordinal);
                    break;
                }
            }
            if let Some(other) = unreachable {
                skipped.push(SkippedDevice {
                    ordinal: info.ordinal,
                    reason: format!("no peer access to/from device {other}"),
                });
                continue;
            }
            devices.push(info);
        }
        Ok(Self { devices, skipped })
    }

    /// Retain each member's primary context and enable peer access between every pair
    /// (which reaches `cuMemAlloc` memory; virtual and pool memory is granted per object, see
    /// [`GpuContext::enable_peer_access`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuCtxEnablePeerAccess` or the context calls.
    pub fn enable_peer_access(&self) -> Result<Vec<GpuContext>> {
        let contexts: Vec<GpuContext> = self
            .devices
            .iter()
            .map(|d| GpuContext::new(d.ordinal))
            .collect::<Result<_>>()?;
        for a in &contexts {
            for b in &contexts {
                a.enable_peer_access(b)?;
            }
        }
        Ok(contexts)
    }

    /// A readable report: one line per chosen and per skipped device.
    #[must_use]
    pub fn report(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            out.push_str(&format!(
                "device {}: {} ({}, {}) selected\n",
                d.ordinal,
                d.name,
                d.pci_bus_id,
                d.uuid_string()
            ));
        }
        for s in &self.skipped {
            out.push_str(&format!("device {}: skipped: {}\n", s.ordinal, s.reason));
        }
        out
    }
}

/// Refuse memory on a device this process cannot see, or cannot reach from `ctx`'s device
/// (no peer access); the memory's device ordinal otherwise.
pub(crate) fn check_reachable(ctx: &GpuContext, uuid: &[u8; 16]) -> Result<u32> {
    match ordinal_of_uuid(uuid)? {
        None => Err(Error::DeviceNotReachable {
            uuid: uuid_string(uuid),
            from: ctx.ordinal(),
            peer: None,
        }),
        Some(o) => check_peer(ctx.ordinal(), o).map(|()| o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formats_like_nvidia_smi() {
        let u = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(uuid_string(&u), "GPU-01234567-89ab-cdef-0123-456789abcdef");
    }

    #[test]
    fn unsuitable_reasons() {
        let mut d = DeviceInfo {
            ordinal: 0,
            name: "x".into(),
            uuid: [0; 16],
            pci_bus_id: String::new(),
            unified_addressing: true,
            compute_mode: ComputeMode::Default,
            multiprocessors: 1,
            stream_mem_ops: true,
        };
        assert_eq!(d.ipc_unsuitable_reason(), None);
        d.compute_mode = ComputeMode::Prohibited;
        assert!(d.ipc_unsuitable_reason().unwrap().contains("compute mode"));
        d.unified_addressing = false;
        assert!(d.ipc_unsuitable_reason().unwrap().contains("unified"));
    }
}
