//! Hooks for the tests of arenas and pools (handles resealed as a forger would). Not API.
use super::ArenaHandle;
pub use crate::ledger::testing::*;

/// Recompute the checksum of an [`ArenaHandle`]'s bytes (80), as a forger would: for tests
/// that a handle with a valid checksum but a forged range or length is still refused.
pub fn reseal_arena_handle(bytes: &mut [u8]) {
    reseal(bytes, ArenaHandle::<u8>::SIZE);
}

/// Recompute the checksum of a [`PoolHandle`](crate::pool::PoolHandle)'s bytes (136).
pub fn reseal_pool_handle(bytes: &mut [u8]) {
    reseal(bytes, crate::pool::PoolHandle::<u8>::SIZE);
}

fn reseal(bytes: &mut [u8], size: usize) {
    if bytes.len() == size {
        let sum = crate::handle::checksum(&bytes[..size - 8]);
        bytes[size - 8..].copy_from_slice(&sum.to_le_bytes());
    }
}
