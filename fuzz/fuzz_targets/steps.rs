//! The step programs of the structure-aware targets (`channel_ring`, `lease_table`): the input
//! read as 11-byte steps `[op, offset (2 bytes, LE), value (8 bytes, LE)]`, and the shared state
//! they overwrite, reached through the region's file as a hostile process would.

use std::os::unix::fs::FileExt;

/// The shared state of `/dev/shm/<name>`: the last `bytes` bytes of its file (after the region
/// header), open for writing; `None` if the file is gone or too short. (`arena_table` keeps
/// its table in memory and does not use it.)
#[allow(dead_code)]
pub struct State {
    file: std::fs::File,
    base: u64,
}

#[allow(dead_code)]
impl State {
    pub fn open(name: &str, bytes: usize) -> Option<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/dev/shm/{name}"))
            .ok()?;
        let base = file.metadata().ok()?.len().checked_sub(bytes as u64)?;
        Some(Self { file, base })
    }

    /// Write `value` at byte `offset` of the state (errors ignored: the file may be gone).
    pub fn write(&self, offset: u64, value: u64) {
        let _ = self
            .file
            .write_all_at(&value.to_le_bytes(), self.base + offset);
    }
}

/// One step: `op`, the byte offset of an 8-byte word inside a state of `bytes` bytes, a value.
pub struct Step {
    pub op: u8,
    pub offset: u64,
    pub value: u64,
}

/// The steps of `data` over a shared state of `bytes` bytes (a trailing partial step is
/// ignored).
pub fn steps(data: &[u8], bytes: usize) -> impl Iterator<Item = Step> + '_ {
    let words = (bytes / 8).max(1) as u64;
    data.chunks_exact(11).map(move |s| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&s[3..11]);
        Step {
            op: s[0],
            offset: u64::from(u16::from_le_bytes([s[1], s[2]])) % words * 8,
            value: u64::from_le_bytes(v),
        }
    })
}
