//! The region header: the first 128 bytes of every [`ShmRegion`](crate::shm::ShmRegion).
//!
//! In shared memory the header is sixteen `AtomicU64` words. The creator writes its identity
//! first (so an opener can tell a dead creator from a slow one), then initialises the payload,
//! then the remaining words, and publishes last by storing the magic word with `Release`.
//! Openers read the magic with `Acquire`, copy the rest out and decode it here, as plain bytes:
//! nothing read from another process is trusted before [`HeaderFields::validate`] has passed.
//!
//! | word | contents |
//! | ---- | -------- |
//! | 0 | magic (`0` while unpublished) |
//! | 1 | layout version (low 32 bits), header length (high) |
//! | 2 | payload offset (low), payload alignment (high) |
//! | 3 | payload size |
//! | 4 | payload type tag |
//! | 5 | total length of the file |
//! | 6 | creator pid (low 32 bits) |
//! | 7 | creator start time |
//! | 8–9 | boot id of the creator's machine |
//! | 10 | FNV-1a checksum of words 1–9 |
//! | 11–15 | reserved, zero (as is the high half of word 6) |

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::shm_safe::fnv1a64;

/// Number of 64-bit words in the header.
pub(crate) const WORDS: usize = 16;
/// Header length in bytes.
pub(crate) const HEADER_LEN: usize = WORDS * 8;
/// Published magic: "cudaIPC" and a format byte.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"cudaIPC\x01");
/// Layout version of this header.
pub(crate) const VERSION: u32 = 1;

const W_MAGIC: usize = 0;
const W_CREATOR_PID: usize = 6;
const W_CREATOR_START: usize = 7;
const W_CHECKSUM: usize = 10;
const W_RESERVED: usize = 11;

/// The header as it sits in shared memory.
#[repr(C, align(64))]
pub(crate) struct RawHeader {
    words: [AtomicU64; WORDS],
}

/// The header's fields, decoded from a snapshot of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HeaderFields {
    /// Magic word: `b"cudaIPC\x01"` read as a little-endian `u64` once published, 0 before.
    pub magic: u64,
    /// Layout version.
    pub version: u32,
    /// Header length in bytes.
    pub header_len: u32,
    /// Offset of the payload from the start of the file.
    pub payload_offset: u32,
    /// Alignment of the payload type.
    pub payload_align: u32,
    /// Size of the payload type.
    pub payload_size: u64,
    /// Type tag of the payload type ([`ShmSafe::type_tag`](crate::ShmSafe::type_tag)).
    pub type_tag: u64,
    /// Length of the whole file.
    pub total_len: u64,
    /// The creator's pid.
    pub creator_pid: u32,
    /// The creator's start time (clock ticks after boot).
    pub creator_start: u64,
    /// The creator's boot id.
    pub boot_id: [u8; 16],
    /// Checksum of the fields above (all but the magic).
    pub checksum: u64,
    /// The bits the layout reserves (high half of word 6, words 11–15), OR-ed together: zero
    /// in a valid header.
    pub reserved: u64,
}

/// What an opener expects the header to say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expected {
    pub payload_offset: u32,
    pub payload_align: u32,
    pub payload_size: u64,
    pub type_tag: u64,
    pub total_len: u64,
}

impl HeaderFields {
    fn words(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        w[W_MAGIC] = self.magic;
        w[1] = u64::from(self.version) | (u64::from(self.header_len) << 32);
        w[2] = u64::from(self.payload_offset) | (u64::from(self.payload_align) << 32);
        w[3] = self.payload_size;
        w[4] = self.type_tag;
        w[5] = self.total_len;
        w[W_CREATOR_PID] = u64::from(self.creator_pid);
        w[W_CREATOR_START] = self.creator_start;
        let (lo, hi) = self.boot_id.split_at(8);
        w[8] = u64::from_le_bytes(lo.try_into().unwrap_or([0; 8]));
        w[9] = u64::from_le_bytes(hi.try_into().unwrap_or([0; 8]));
        w[W_CHECKSUM] = self.checksum;
        w[W_RESERVED] = self.reserved;
        w
    }

    fn from_words(w: &[u64; WORDS]) -> Self {
        let mut boot_id = [0u8; 16];
        boot_id[..8].copy_from_slice(&w[8].to_le_bytes());
        boot_id[8..].copy_from_slice(&w[9].to_le_bytes());
        // Truncating casts split packed words back into their 32-bit halves.
        Self {
            magic: w[W_MAGIC],
            version: w[1] as u32,
            header_len: (w[1] >> 32) as u32,
            payload_offset: w[2] as u32,
            payload_align: (w[2] >> 32) as u32,
            payload_size: w[3],
            type_tag: w[4],
            total_len: w[5],
            creator_pid: w[W_CREATOR_PID] as u32,
            creator_start: w[W_CREATOR_START],
            boot_id,
            checksum: w[W_CHECKSUM],
            reserved: (w[W_CREATOR_PID] >> 32) | w[W_RESERVED..].iter().fold(0, |a, &b| a | b),
        }
    }

    /// The checksum the fields should carry: FNV-1a over words 1–9.
    #[must_use]
    pub fn compute_checksum(&self) -> u64 {
        let w = self.words();
        let mut bytes = [0u8; 9 * 8];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(&w[1..10]) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        fnv1a64(&bytes)
    }

    /// Encode to the header's byte form (little-endian words).
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.words()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Decode the header's byte form. Any 128 bytes decode; opening a region then validates
    /// every field against the expected layout.
    #[must_use]
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Self {
        let mut w = [0u64; WORDS];
        for (word, chunk) in w.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *word = u64::from_le_bytes(b);
        }
        Self::from_words(&w)
    }

    /// Check every field against what this process expects, in a fixed order, naming the first
    /// field that differs. The file size is checked by the caller.
    pub(crate) fn validate(&self, name: &str, expected: &Expected) -> Result<()> {
        let mismatch = |field, expected: u64, found: u64| {
            if expected == found {
                Ok(())
            } else {
                Err(Error::HeaderMismatch {
                    name: name.to_owned(),
                    field,
                    expected,
                    found,
                })
            }
        };
        mismatch("magic", MAGIC, self.magic)?;
        mismatch("version", VERSION.into(), self.version.into())?;
        mismatch("checksum", self.compute_checksum(), self.checksum)?;
        mismatch("reserved", 0, self.reserved)?;
        mismatch("header_len", HEADER_LEN as u64, self.header_len.into())?;
        mismatch("payload_size", expected.payload_size, self.payload_size)?;
        mismatch(
            "payload_align",
            expected.payload_align.into(),
            self.payload_align.into(),
        )?;
        mismatch(
            "payload_offset",
            expected.payload_offset.into(),
            self.payload_offset.into(),
        )?;
        mismatch("type_tag", expected.type_tag, self.type_tag)?;
        if self.total_len != expected.total_len {
            return Err(Error::SizeMismatch {
                name: name.to_owned(),
                expected: expected.total_len,
                found: self.total_len,
            });
        }
        Ok(())
    }
}

impl RawHeader {
    /// Record the creator before anything else, so openers can tell a dead creator.
    pub(crate) fn write_creator(&self, pid: u32, start: u64) {
        self.words[W_CREATOR_START].store(start, Ordering::Relaxed);
        self.words[W_CREATOR_PID].store(u64::from(pid), Ordering::Release);
    }

    /// The creator identity, readable before publication.
    pub(crate) fn creator(&self) -> (u32, u64) {
        let pid = self.words[W_CREATOR_PID].load(Ordering::Acquire) as u32;
        let start = self.words[W_CREATOR_START].load(Ordering::Relaxed);
        (pid, start)
    }

    /// Write every field but the magic, then publish with a `Release` store of the magic.
    pub(crate) fn publish(&self, fields: &HeaderFields) {
        let w = fields.words();
        for (slot, &value) in self.words.iter().zip(&w).skip(1) {
            slot.store(value, Ordering::Relaxed);
        }
        self.words[W_MAGIC].store(w[W_MAGIC], Ordering::Release);
    }

    /// Whether the magic word is non-zero (published, or scribbled on).
    pub(crate) fn is_published(&self) -> bool {
        self.words[W_MAGIC].load(Ordering::Acquire) != 0
    }

    /// Copy the header out (magic first, with `Acquire`).
    pub(crate) fn snapshot(&self) -> HeaderFields {
        let mut w = [0u64; WORDS];
        w[W_MAGIC] = self.words[W_MAGIC].load(Ordering::Acquire);
        for (out, slot) in w.iter_mut().zip(&self.words).skip(1) {
            *out = slot.load(Ordering::Relaxed);
        }
        HeaderFields::from_words(&w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> HeaderFields {
        let mut f = HeaderFields {
            magic: MAGIC,
            version: VERSION,
            header_len: HEADER_LEN as u32,
            payload_offset: 128,
            payload_align: 8,
            payload_size: 24,
            type_tag: 0xdead_beef,
            total_len: 152,
            creator_pid: 42,
            creator_start: 7,
            boot_id: [3; 16],
            checksum: 0,
            reserved: 0,
        };
        f.checksum = f.compute_checksum();
        f
    }

    fn expected() -> Expected {
        Expected {
            payload_offset: 128,
            payload_align: 8,
            payload_size: 24,
            type_tag: 0xdead_beef,
            total_len: 152,
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let f = sample();
        assert_eq!(HeaderFields::decode(&f.encode()), f);
        f.validate("r", &expected()).unwrap();
    }

    #[test]
    fn each_corrupted_field_is_named() {
        type Corruption = fn(&mut HeaderFields);
        let cases: [(&str, Corruption); 9] = [
            ("magic", |f| f.magic ^= 1),
            ("version", |f| f.version = 99),
            ("header_len", |f| f.header_len = 64),
            ("payload_size", |f| f.payload_size = 25),
            ("payload_align", |f| f.payload_align = 16),
            ("payload_offset", |f| f.payload_offset = 192),
            ("type_tag", |f| f.type_tag = 1),
            ("total_len", |f| f.total_len = 4096),
            ("creator_pid", |f| f.creator_pid = 1),
        ];
        for (field, corrupt) in cases {
            let mut f = sample();
            corrupt(&mut f);
            // Fields other than magic and checksum: recompute the checksum so the field check
            // itself is what fires; creator_pid is only covered by the checksum.
            if field != "magic" && field != "creator_pid" {
                f.checksum = f.compute_checksum();
            }
            let err = f.validate("r", &expected()).unwrap_err();
            let named = match &err {
                Error::HeaderMismatch { field, .. } => *field,
                Error::SizeMismatch { .. } => "total_len",
                other => panic!("unexpected {other:?}"),
            };
            let want = if field == "creator_pid" {
                "checksum"
            } else {
                field
            };
            assert_eq!(named, want, "corrupting {field}");
        }
    }

    #[test]
    fn a_flipped_checksum_bit_is_caught() {
        let mut f = sample();
        f.checksum ^= 1 << 17;
        assert!(matches!(
            f.validate("r", &expected()),
            Err(Error::HeaderMismatch {
                field: "checksum",
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_and_rarely_validate(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut arr = [0u8; HEADER_LEN];
            arr.copy_from_slice(&bytes);
            let f = HeaderFields::decode(&arr);
            prop_assert_eq!(HeaderFields::decode(&f.encode()), f);
            prop_assert!(f.validate("r", &expected()).is_err());
        }

        #[test]
        fn any_single_bit_flip_is_rejected(bit in 0usize..(WORDS * 64)) {
            let mut bytes = sample().encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(HeaderFields::decode(&bytes).validate("r", &expected()).is_err());
        }
    }
}
