//! What `examples/shared_weights.rs` and `benches/shared_weights.rs` share: the tensors'
//! shapes (word for word those of `examples/interop/torch_shared_weights.py` too), and how the
//! owner sends a reader many handles and the reader receives them.

use std::time::Duration;

use cuda_ipc::fd::FdSocket;

/// The words (u32) of each tensor: `n` tensors of a decoder-only transformer about `gib` GiB
/// in all — an embedding and an output head, then layers of q, k, v, o projections
/// (1 : ¼ : ¼ : 1), an MLP's gate, up and down (3 each) and two norms of 1,280 words (a
/// hidden size of 2,560 in bf16); tensors left over are norms. (The example stores one more
/// word per tensor, a trailer its kernels check.)
pub fn tensor_words(n: usize, gib: f64) -> Vec<usize> {
    const LAYER: [f64; 9] = [1.0, 0.25, 0.25, 1.0, 3.0, 3.0, 3.0, 0.0, 0.0];
    const NORM: usize = 1280;
    let layers = (n - 2) / LAYER.len();
    let norms = n - 2 - layers * 7;
    let units = 2.0 * 4.0 + layers as f64 * LAYER.iter().sum::<f64>();
    let total_words = gib * f64::from(1u32 << 30) / 4.0;
    let unit = ((total_words - (norms * NORM) as f64) / units).max(1.0);
    let mut words = vec![(4.0 * unit) as usize; 2];
    for _ in 0..layers {
        for share in LAYER {
            words.push(if share == 0.0 {
                NORM
            } else {
                (share * unit) as usize
            });
        }
    }
    words.resize(n, NORM);
    words
}

/// Send `bytes`, whole handles of `size` bytes each, in as few messages as a socket's payload
/// allows (no handle split between two).
pub fn send_handles(
    s: &FdSocket,
    bytes: &[u8],
    size: usize,
    timeout: Duration,
) -> cuda_ipc::Result<()> {
    for chunk in bytes.chunks(FdSocket::MAX_PAYLOAD / size * size) {
        s.send(chunk, &[], timeout)?;
    }
    Ok(())
}

/// Receive the bytes of `n` handles of `size` bytes each, sent by [`send_handles`].
pub fn recv_handles(
    s: &FdSocket,
    n: usize,
    size: usize,
    timeout: Duration,
) -> cuda_ipc::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(n * size);
    while bytes.len() < n * size {
        bytes.extend(s.recv(timeout)?.payload);
    }
    Ok(bytes)
}
