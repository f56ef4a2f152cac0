//! The step programs of the structure-aware targets (`channel_ring`, `lease_table`): the input
//! read as 11-byte steps `[op, offset (2 bytes, LE), value (8 bytes, LE)]`.

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
