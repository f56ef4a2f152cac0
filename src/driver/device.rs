//! Devices: handles by ordinal, attributes, names, UUIDs and peer capability.

use std::ffi::{c_char, c_int};

use super::{answer, check, sys};
use crate::error::{ArgumentDefect, Error, Result};

/// The device with `ordinal`, the driver initialised first (`cuInit`, once per process).
pub(crate) fn get_initialized(ordinal: u32) -> Result<sys::CUdevice> {
    super::init()?;
    get(ordinal)
}

/// The device with `ordinal` (`cuDeviceGet`).
pub(crate) fn get(ordinal: u32) -> Result<sys::CUdevice> {
    let ord = c_int::try_from(ordinal).map_err(|_| Error::InvalidArgument {
        call: "cuDeviceGet",
        defect: ArgumentDefect::OutOfRange {
            what: "device ordinal",
            value: ordinal.into(),
            min: 0,
            max: c_int::MAX as u64,
        },
    })?;
    // SAFETY: writes one CUdevice; an invalid ordinal is an error code.
    answer("cuDeviceGet", 0, |dev| unsafe {
        sys::cuDeviceGet(dev, ord)
    })
}

/// The number of devices this process sees (`cuDeviceGetCount`).
pub(crate) fn count() -> Result<u32> {
    let mut n = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(u32::try_from(n).unwrap_or(0))
}

/// A device attribute (`cuDeviceGetAttribute`).
pub(crate) fn attribute(dev: sys::CUdevice, attr: c_int) -> Result<i32> {
    // SAFETY: writes one int; an invalid device or attribute is an error code.
    answer("cuDeviceGetAttribute", 0, |v| unsafe {
        sys::cuDeviceGetAttribute(v, attr, dev)
    })
}

/// The device's UUID (`cuDeviceGetUuid`).
pub(crate) fn uuid(dev: sys::CUdevice) -> Result<[u8; 16]> {
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes 16 bytes.
    check("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid(&mut u, dev)
    })?;
    Ok(u.bytes)
}

/// The device's name (`cuDeviceGetName`).
pub(crate) fn name(dev: sys::CUdevice) -> Result<String> {
    c_string("cuDeviceGetName", |p, len| {
        // SAFETY: the driver writes at most `len` bytes, NUL included, into the buffer at `p`.
        unsafe { sys::cuDeviceGetName(p, len, dev) }
    })
}

/// The device's PCI bus id, `domain:bus:device.function` (`cuDeviceGetPCIBusId`).
pub(crate) fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    c_string("cuDeviceGetPCIBusId", |p, len| {
        // SAFETY: as in `name`.
        unsafe { sys::cuDeviceGetPCIBusId(p, len, dev) }
    })
}

/// Whether `from` can access memory of `to` (`cuDeviceCanAccessPeer`).
pub(crate) fn can_access_peer(from: sys::CUdevice, to: sys::CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: writes one int for two devices; invalid ones are an error code.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, from, to)
    })?;
    Ok(can != 0)
}

/// A string the driver writes into a buffer of ours (at most 256 bytes, NUL-terminated).
fn c_string(
    call: &'static str,
    f: impl FnOnce(*mut c_char, c_int) -> sys::CUresult,
) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    check(call, f(buf.as_mut_ptr(), buf.len() as c_int))?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
