//! An export token — the 16 random bytes that name an export's tables — as the two tables
//! store and name it: below both the lease table (`lease.rs`) and the block table
//! (`table.rs`).

/// The `/dev/shm` name of a table of export `token`: `prefix` and the token in hex.
pub(crate) fn token_name(prefix: &str, token: &[u8; 16]) -> String {
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// An export token as the two words a table stores it in.
pub(crate) fn token_words(token: &[u8; 16]) -> [u64; 2] {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&token[..8]);
    hi.copy_from_slice(&token[8..]);
    [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
}
