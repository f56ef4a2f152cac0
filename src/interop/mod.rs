//! What the crate's types are to other CUDA crates, each behind its feature and in the file
//! named after the crate: `cust.rs` (feature `cust`) and `cudarc.rs` (feature
//! `cudarc`). The rest of the crate names neither; [`AsStream`](crate::AsStream) is the seam
//! every stream-taking method goes through.
//!
//! | | cust | cudarc |
//! |-|------|--------|
//! | a [`GpuContext`](crate::GpuContext) from theirs | `GpuContext::from_cust` | `GpuContext::from_cudarc` |
//! | their streams as [`AsStream`](crate::AsStream) | `cust::stream::Stream` | `cudarc::driver::CudaStream` |
//! | kernel arguments | [`GpuSlice::device_ptr`](crate::GpuSlice) (`DevicePointer<T>`) | `.arg(&x)` for `GpuSlice`, `ReadOnlySlice` (a `const T*`), `IpcBuffer`, `ImportedBuffer` |

#[cfg(feature = "cudarc")]
mod cudarc;
#[cfg(feature = "cust")]
mod cust;
