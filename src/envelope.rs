//! The one sealed format of every handle the crate makes: plain data read from another process
//! with a magic number, a layout version, reserved fields that must be zero and a checksum of
//! every other byte in its last eight — written once here, for every kind.
//!
//! | Handle | Bytes | Magic | Kind-specific checks |
//! |--------|-------|-------|----------------------|
//! | [`Handle<K>`](crate::Handle): buffers, events, signals, arenas, pools | 184 | `CIPH` | `Envelope::validate` (`handle.rs`): kind, handle type, layout, read-only flag |
//! | [`IpcChannelHandle`](crate::channel::IpcChannelHandle) | 152 | `CICH` | `ChannelEnvelope::validate` (`channel.rs`): geometry, region name |
//! | [`ArenaHandle`](crate::arena::ArenaHandle) | 80 | `CIPA` | on open (`arena.rs`): this arena, bounds, generation |
//! | [`PoolHandle`](crate::pool::PoolHandle) | 136 | `CIPP` | on open (`pool.rs`): this pool, generation |
//! | a foreign export's head and continuations ([`foreign`](crate::foreign)) | any | `cuipcfm2`, `cuipcfc2` (8 bytes) | `foreign.rs`: kind, counts, sizes, then every descriptor |
//!
//! [`seal`] stamps a format's magic and version and the checksum; [`open`] reads bytes of
//! exactly the format's size and checks, in this order and each as its own
//! [`HandleDefect`]: the magic ([`check_identity`], with the version), then the checksum and
//! the reserved fields ([`check_integrity`]). A kind that checks more in between (the kind of a
//! `Handle<K>`, so that a handle of another kind says so rather than failing a later check)
//! calls the two steps itself. Messages of variable length (a foreign export's) are sealed
//! with [`seal_message`] — the magic first, a checksum of every byte in the last eight — and
//! read with [`open_message`]. Raw handles for foreign peers (`raw.rs`) are the other side's
//! formats, not sealed ones.
//!
//! The checksum is an integrity check against corruption and bugs, not a MAC: a handle is a
//! bearer token (see SECURITY.md).

use std::sync::atomic::AtomicU64;

use bytemuck::Pod;

use crate::error::{Error, HandleDefect, Result};
use crate::process::ProcessIdentity;

/// The generations of this process's exports that have no block of their own to draw one from
/// (an arena, a pool, an event), one each: with the export's token (or identity), an
/// envelope's generation names one export for ever. A buffer's or a signal's generation is its
/// block's, in this process's export registry (`ledger/registry.rs`).
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A sealed format's identity: its magic, its layout version, and its name in errors.
pub(crate) struct Format {
    pub(crate) magic: u32,
    pub(crate) version: u16,
    /// `[version]`, for errors.
    pub(crate) versions: &'static [u32],
    /// "a channel handle", for errors.
    pub(crate) what: &'static str,
}

/// A sealed handle's bytes: a `repr(C)` plain-data struct whose last field is the checksum.
pub(crate) trait Sealed: Pod {
    const FORMAT: Format;
    /// The magic, version and checksum fields, to stamp.
    fn seal_fields(&mut self) -> (&mut u32, &mut u16, &mut u64);
    /// The magic, version and stored checksum.
    fn header(&self) -> (u32, u16, u64);
    /// Whether every reserved field (and every unassigned flag bit) is zero.
    fn reserved_zero(&self) -> bool;
}

/// `impl Sealed` for a format whose header fields are named `magic`, `version` and `checksum`
/// (every format's are): the type, its [`Format`], and a `|raw| …` expression that is true when
/// every reserved field (and every unassigned flag bit) is zero.
///
/// ```text
/// sealed_format!(RawPoolHandle, Format { magic, version: 1, versions: &[1], what: "a pool handle" },
///     |h| h.reserved0 == 0 && h.reserved1 == 0);
/// ```
macro_rules! sealed_format {
    ($ty:ty, $format:expr, |$raw:ident| $reserved_zero:expr $(,)?) => {
        impl $crate::envelope::Sealed for $ty {
            const FORMAT: $crate::envelope::Format = $format;
            fn seal_fields(&mut self) -> (&mut u32, &mut u16, &mut u64) {
                (&mut self.magic, &mut self.version, &mut self.checksum)
            }
            fn header(&self) -> (u32, u16, u64) {
                (self.magic, self.version, self.checksum)
            }
            fn reserved_zero(&self) -> bool {
                let $raw = self;
                $reserved_zero
            }
        }
    };
}
pub(crate) use sealed_format;

/// The checksum of `body`: a word-at-a-time multiply-xorshift hash. Each step
/// `h = ((h ^ w) * P) ^ (that >> 29)` is a bijection of `h` for a fixed word `w`, so changing any
/// bits of one word changes the result: every single-bit flip is caught (tested below).
pub(crate) fn checksum(body: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ body.len() as u64;
    for chunk in body.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(P);
        h ^= h >> 29;
    }
    h
}

/// The checksum `raw` should store: over every byte but its last eight.
pub(crate) fn sum<R: Sealed>(raw: &R) -> u64 {
    let bytes = bytemuck::bytes_of(raw);
    checksum(&bytes[..bytes.len() - 8])
}

/// `raw` with its format's magic and version and its checksum stamped.
pub(crate) fn seal<R: Sealed>(mut raw: R) -> R {
    let (magic, version, _) = raw.seal_fields();
    (*magic, *version) = (R::FORMAT.magic, R::FORMAT.version);
    let sum = sum(&raw);
    *raw.seal_fields().2 = sum;
    raw
}

/// An `R` from exactly `size_of::<R>()` bytes of another process, unchecked.
///
/// # Errors
///
/// [`HandleDefect::Size`] for any other length.
pub(crate) fn read<R: Sealed>(bytes: &[u8]) -> Result<R> {
    bytemuck::try_pod_read_unaligned(bytes).map_err(|_| {
        Error::corrupt_handle(HandleDefect::Size {
            what: R::FORMAT.what,
            expected: std::mem::size_of::<R>(),
            found: bytes.len(),
        })
    })
}

/// The magic, then the version.
///
/// # Errors
///
/// [`HandleDefect::Magic`], [`HandleDefect::Version`].
pub(crate) fn check_identity<R: Sealed>(raw: &R) -> Result<()> {
    let (magic, version, _) = raw.header();
    let format = R::FORMAT;
    if magic != format.magic {
        return Err(Error::corrupt_handle(HandleDefect::Magic {
            what: format.what,
            found: u64::from(magic),
        }));
    }
    if version != format.version {
        return Err(Error::corrupt_handle(HandleDefect::Version {
            what: format.what,
            found: u32::from(version),
            supported: format.versions,
        }));
    }
    Ok(())
}

/// The checksum, then the reserved fields.
///
/// # Errors
///
/// [`HandleDefect::Checksum`], [`HandleDefect::Reserved`].
pub(crate) fn check_integrity<R: Sealed>(raw: &R) -> Result<()> {
    let (_, _, stored) = raw.header();
    let computed = sum(raw);
    if computed != stored {
        return Err(Error::corrupt_handle(HandleDefect::Checksum {
            stored,
            computed,
        }));
    }
    if !raw.reserved_zero() {
        return Err(Error::corrupt_handle(HandleDefect::Reserved));
    }
    Ok(())
}

/// [`read`], then [`check_identity`] and [`check_integrity`].
///
/// # Errors
///
/// [`Error::CorruptHandle`] with the first defect found.
pub(crate) fn open<R: Sealed>(bytes: &[u8]) -> Result<R> {
    let raw = read::<R>(bytes)?;
    check_identity(&raw)?;
    check_integrity(&raw)?;
    Ok(raw)
}

/// The checks on the exporter a handle names that need no system call: it ran since this boot
/// (`boot_id`, else it is gone: [`Error::PeerGone`]), and — unless `may_be_us` (a POSIX-fd
/// export maps anywhere, this process included) — it is not this process (CUDA refuses a
/// self-open of a legacy handle or an event; a channel's consumer is never its producer).
/// Every handle kind admits its exporter through here. Returns it.
///
/// # Errors
///
/// [`Error::PeerGone`] (the exporter), [`Error::SameProcess`].
pub(crate) fn admit_exporter(
    exporter: ProcessIdentity,
    boot_id: &[u8; 16],
    may_be_us: bool,
) -> Result<ProcessIdentity> {
    if *boot_id != crate::os::boot_id() {
        return Err(Error::exporter_gone(exporter.pid()));
    }
    let me = ProcessIdentity::current();
    if !may_be_us && exporter.is_same_process(&me) {
        return Err(Error::SameProcess { pid: me.pid() });
    }
    Ok(exporter)
}

/// Seal a peer message of variable length: `parts` (the first beginning with the format's
/// 8-byte magic, which names its version), then a checksum of every byte before it in the
/// last eight.
pub(crate) fn seal_message(parts: &[&[u8]]) -> Vec<u8> {
    let mut message = parts.concat();
    let sum = checksum(&message);
    message.extend_from_slice(&sum.to_le_bytes());
    message
}

/// The bytes of a message sealed with [`seal_message`] (the magic included, the checksum
/// not), once its magic is `magic` and its checksum holds; `what` names it in errors.
///
/// # Errors
///
/// [`Error::CorruptHandle`]: [`HandleDefect::Size`] for a message too short to hold a magic
/// and a checksum, [`HandleDefect::Magic`], [`HandleDefect::Checksum`].
pub(crate) fn open_message<'a>(
    magic: [u8; 8],
    what: &'static str,
    message: &'a [u8],
) -> Result<&'a [u8]> {
    let Some(at) = message.len().checked_sub(8).filter(|&at| at >= 8) else {
        return Err(Error::corrupt_handle(HandleDefect::Size {
            what,
            expected: 16,
            found: message.len(),
        }));
    };
    let (body, sum) = message.split_at(at);
    if body[..8] != magic {
        let mut found = [0u8; 8];
        found.copy_from_slice(&body[..8]);
        return Err(Error::corrupt_handle(HandleDefect::Magic {
            what,
            found: u64::from_le_bytes(found),
        }));
    }
    let mut stored = [0u8; 8];
    stored.copy_from_slice(sum);
    let stored = u64::from_le_bytes(stored);
    let computed = checksum(body);
    if stored != computed {
        return Err(Error::corrupt_handle(HandleDefect::Checksum {
            stored,
            computed,
        }));
    }
    Ok(body)
}

/// Restamp a sealed message's checksum in place (fuzzing and test hooks: a mutated message
/// then reaches the checks behind the checksum); shorter than a checksum, left alone.
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(crate) fn reseal_message(message: &mut [u8]) {
    if let Some(at) = message.len().checked_sub(8) {
        let sum = checksum(&message[..at]);
        message[at..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Restamp the checksum of `bytes` in place when they are an `R`'s length (fuzzing and test
/// hooks: a mutated handle then reaches the checks behind the checksum).
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub(crate) fn reseal_bytes<R: Sealed>(bytes: &mut [u8]) {
    if bytes.len() == std::mem::size_of::<R>() {
        let at = bytes.len() - 8;
        let sum = checksum(&bytes[..at]);
        bytes[at..].copy_from_slice(&sum.to_le_bytes());
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
#[allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point
mod tests {
    use bytemuck::Zeroable;

    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, Zeroable, PartialEq, Eq, Debug)]
    struct Toy {
        magic: u32,
        version: u16,
        reserved: u16,
        payload: u64,
        checksum: u64,
    }

    sealed_format!(
        Toy,
        Format {
            magic: u32::from_le_bytes(*b"TOYS"),
            version: 3,
            versions: &[3],
            what: "a toy handle",
        },
        |raw| raw.reserved == 0
    );

    fn sealed() -> Toy {
        seal(Toy {
            payload: 0xfeed,
            ..Zeroable::zeroed()
        })
    }

    fn defect(bytes: &[u8]) -> HandleDefect {
        match open::<Toy>(bytes) {
            Err(Error::CorruptHandle { defect, .. }) => defect,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sealed_handle_opens_and_round_trips() {
        let t = sealed();
        assert_eq!(open::<Toy>(bytemuck::bytes_of(&t)).unwrap(), t);
    }

    #[test]
    fn each_defect_is_named_in_order() {
        let t = sealed();
        let bytes = bytemuck::bytes_of(&t).to_vec();
        assert!(matches!(
            defect(&bytes[..8]),
            HandleDefect::Size { found: 8, .. }
        ));
        let mut b = bytes.clone();
        b[0] ^= 1;
        assert!(matches!(defect(&b), HandleDefect::Magic { .. }));
        let mut b = bytes.clone();
        b[4] = 9; // version 9, checksum now wrong too: the version is named first
        assert!(matches!(defect(&b), HandleDefect::Version { found: 9, .. }));
        let mut b = bytes.clone();
        b[8] ^= 1;
        assert!(matches!(defect(&b), HandleDefect::Checksum { .. }));
        let mut b = bytes.clone();
        b[6] = 1;
        reseal_bytes::<Toy>(&mut b);
        assert!(matches!(defect(&b), HandleDefect::Reserved));
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let t = sealed();
        let bytes = bytemuck::bytes_of(&t).to_vec();
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(open::<Toy>(&b).is_err(), "bit {bit}");
        }
    }
}
