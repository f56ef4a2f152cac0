//! What arena and pool handles share: plain-data bytes with a magic, a version, reserved words
//! that must be zero and a checksum over the rest, read from untrusted bytes.

use bytemuck::Pod;

use crate::error::{Error, HandleDefect, Result};
use crate::handle::checksum;

/// A handle's fixed identity: its magic, its layout version, and what it is called in errors.
pub(crate) struct Format {
    pub(crate) magic: u32,
    pub(crate) version: u16,
    /// `[version]`, for errors.
    pub(crate) versions: &'static [u32],
    pub(crate) what: &'static str,
}

/// The words every sealed handle has, read by [`check`].
pub(crate) struct Header {
    pub(crate) magic: u32,
    pub(crate) version: u16,
    pub(crate) reserved_zero: bool,
    pub(crate) checksum: u64,
}

/// A `R` from exactly `size_of::<R>()` bytes of another process.
pub(crate) fn read<R: Pod>(bytes: &[u8], format: &Format) -> Result<R> {
    bytemuck::try_pod_read_unaligned(bytes).map_err(|_| {
        Error::corrupt_handle(HandleDefect::Size {
            what: format.what,
            expected: std::mem::size_of::<R>(),
            found: bytes.len(),
        })
    })
}

/// The checksum of `raw`: over every byte but its last eight, where the checksum sits.
pub(crate) fn sum<R: Pod>(raw: &R) -> u64 {
    let bytes = bytemuck::bytes_of(raw);
    checksum(&bytes[..bytes.len() - 8])
}

/// Magic, version, checksum (of `raw`) and reserved words, each its own error.
pub(crate) fn check<R: Pod>(raw: &R, header: Header, format: &Format) -> Result<()> {
    let bad = |defect| Err(Error::corrupt_handle(defect));
    if header.magic != format.magic {
        return bad(HandleDefect::Magic {
            what: format.what,
            found: u64::from(header.magic),
        });
    }
    if header.version != format.version {
        return bad(HandleDefect::Version {
            what: format.what,
            found: u32::from(header.version),
            supported: format.versions,
        });
    }
    let computed = sum(raw);
    if computed != header.checksum {
        return bad(HandleDefect::Checksum {
            stored: header.checksum,
            computed,
        });
    }
    if !header.reserved_zero {
        return bad(HandleDefect::Reserved);
    }
    Ok(())
}
