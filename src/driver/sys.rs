//! Raw declarations of the CUDA driver functions this crate calls directly.
//!
//! Every function returns the raw `CUresult` as a plain `c_int`, never a Rust enum: `cust_raw`'s
//! `CUresult` is an enum generated from CUDA 11.4's header, and a newer driver can return codes
//! it does not list, which would be undefined behaviour at the FFI boundary. The symbols are the
//! versioned names `cuda.h` maps its macros to (`cuMemAlloc` → `cuMemAlloc_v2`, ...).
//!
//! Nothing is linked: the driver library is loaded at run time (see
//! [`library_path`](super::library_path)), once, and each function here calls through the entry
//! point resolved from it. Without a driver library every function returns [`NO_DRIVER`]; when the
//! library lacks an entry point (a driver older than the call), that function returns
//! [`NO_ENTRY_POINT`]. Neither is a CUDA code: [`check`](super::check) turns them into
//! [`Error::DriverNotFound`] and [`Error::DriverTooOld`].
//!
//! [`Error::DriverNotFound`]: crate::Error::DriverNotFound
//! [`Error::DriverTooOld`]: crate::Error::DriverTooOld
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcHandle {
    pub reserved: [u8; 64],
}

impl std::fmt::Debug for CUipcHandle {
    /// Never the bytes: they are a capability to map the memory.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CUipcHandle { .. }")
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

pub const CUDA_SUCCESS: CUresult = 0;
/// Not a CUDA code: returned by every function here when no driver library could be loaded.
pub const NO_DRIVER: CUresult = -0x4355_0001;
/// Not a CUDA code: returned when the loaded driver library has no such entry point.
pub const NO_ENTRY_POINT: CUresult = -0x4355_0002;
// The CUDA codes this crate names or reacts to (`cuda.h`'s `CUresult` values).
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_STUB_LIBRARY: CUresult = 34;
pub const CUDA_ERROR_DEVICE_UNAVAILABLE: CUresult = 46;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_ALREADY_MAPPED: CUresult = 208;
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: c_int = 20;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
/// Before CUDA 12 this number named 64-bit support of the (removed) v1 stream memory operations.
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: c_int = 93;
/// CUDA 12+: 64-bit `cuStreamWriteValue64`/`cuStreamWaitValue64` (the `_v2` entry points).
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: c_int = 122;

/// Virtual memory management (`cuMemCreate`, `cuMemMap`, ...).
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
/// `cuMemCreate` can request a POSIX file descriptor handle.
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
/// Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemPoolCreate`).
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;
/// A bit mask of `CUmemAllocationHandleType`s a memory pool can export.
pub const CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: c_int = 119;
/// Interprocess events (`cuIpcGetEventHandle`).
pub const CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: c_int = 125;
/// `cuMemCreate` can request a fabric handle (multi-node NVLink, needs IMEX).
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: c_int = 128;

/// `CUmemAllocationType`: memory pinned to a location.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CUmemLocationType`: a device, by ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CUmemAllocationHandleType`: a POSIX file descriptor (`int`).
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 1;
/// `CUmemAllocationHandleType`: a 64-byte fabric handle (`CUmemFabricHandle`).
pub const CU_MEM_HANDLE_TYPE_FABRIC: c_uint = 8;
/// `CUmemAllocationGranularity_flags`: the minimum granularity.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
/// `CUmemAccess_flags`: read access only to a mapped range.
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 1;
/// `CUmemAccess_flags`: read and write access to a mapped range.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;

pub type CUmemGenericAllocationHandle = u64;
pub type CUmemoryPool = *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub kind: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes: type, requested handle types, location, a Windows pointer,
/// 8 bytes of flags).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub kind: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);

/// `CUmemAccessDesc`: who may access a mapped range, and how (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<CUmemAccessDesc>() == 12);

/// `CUmemPoolProps` (88 bytes; CUDA 12.6 named two of the reserved bytes `usage`, older
/// drivers read them as reserved, zero either way).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<CUmemPoolProps>() == 88);

/// `CUmemPoolPtrExportData`: 64 opaque bytes naming one allocation of an exported pool.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolPtrExportData {
    pub reserved: [u8; 64],
}

pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `cuStreamWaitValue*`: wait until `(int64_t)(*addr - value) >= 0`.
pub const CU_STREAM_WAIT_VALUE_GEQ: c_uint = 0x0;
/// `cuStreamWriteValue*`: the write is preceded by a memory fence for the stream's prior work.
pub const CU_STREAM_WRITE_VALUE_DEFAULT: c_uint = 0x0;
/// `CUstreamBatchMemOpType`: a 64-bit wait (`cuStreamWaitValue64` in a batch).
pub const CU_STREAM_MEM_OP_WAIT_VALUE_64: c_uint = 4;
/// `CUstreamBatchMemOpType`: a 64-bit write (`cuStreamWriteValue64` in a batch).
pub const CU_STREAM_MEM_OP_WRITE_VALUE_64: c_uint = 5;

/// One operation of `cuStreamBatchMemOp`: the `waitValue` / `writeValue` members of
/// `CUstreamBatchMemOpParams` (they share this layout: operation, address, 64-bit value, flags,
/// an address the driver may use), padded to the union's 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUstreamMemOpValue64 {
    pub operation: c_uint,
    pub address: CUdeviceptr,
    pub value: u64,
    pub flags: c_uint,
    pub alias: CUdeviceptr,
    pub pad: u64,
}

const _: () = assert!(std::mem::size_of::<CUstreamMemOpValue64>() == 48);

pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_EVENT_INTERPROCESS: c_uint = 0x4;
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `cuPointerGetAttribute`: the ordinal of the device the memory is on (an `int`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `cuPointerGetAttribute`: the start of the allocation `ptr` lies in (a `CUdeviceptr`).
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
/// `cuPointerGetAttribute`: the size of the allocation `ptr` lies in (a `size_t`).
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
/// `cuPointerGetAttribute`: whether `cuIpcGetMemHandle` can share the memory (a `bool`).
pub const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
/// `cuPointerGetAttribute`: the shareable handle types of the memory's allocation (a bit mask).
pub const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: c_int = 14;
/// `cuPointerGetAttribute`: the stream-ordered pool the memory came from, or null (a handle).
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: c_int = 17;
/// `cuPointerGetAttribute`: the size of the `cuMemMap` mapping `ptr` lies in (a `size_t`).
pub const CU_POINTER_ATTRIBUTE_MAPPING_SIZE: c_int = 18;
/// `cuPointerGetAttribute`: the start of the `cuMemMap` mapping `ptr` lies in (a pointer).
pub const CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: c_int = 19;

super::loader::driver_api! {
    fn cuInit(flags: c_uint) -> CUresult;
    fn cuDriverGetVersion(version: *mut c_int) -> CUresult;
    fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult;

    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult;
    fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
    fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult;
    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult;

    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int)
        -> CUresult;
    fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
    fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
    fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
    fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult;
    fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
    fn cuCtxSynchronize() -> CUresult;
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult;

    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult;
    fn cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr,
        src: *const c_void,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult;
    fn cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    fn cuMemsetD8_v2(dptr: CUdeviceptr, value: u8, count: usize) -> CUresult;
    fn cuMemsetD8Async(
        dptr: CUdeviceptr,
        value: u8,
        count: usize,
        stream: CUstream,
    ) -> CUresult;

    fn cuMemGetAddressRange_v2(
        base: *mut CUdeviceptr,
        size: *mut usize,
        dptr: CUdeviceptr,
    ) -> CUresult;

    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult;
    fn cuPointerGetAttributes(
        count: c_uint,
        attributes: *mut c_int,
        data: *mut *mut c_void,
        ptr: CUdeviceptr,
    ) -> CUresult;

    fn cuIpcGetMemHandle(handle: *mut CUipcHandle, dptr: CUdeviceptr) -> CUresult;
    fn cuIpcOpenMemHandle_v2(
        dptr: *mut CUdeviceptr,
        handle: CUipcHandle,
        flags: c_uint,
    ) -> CUresult;
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult;
    fn cuIpcGetEventHandle(handle: *mut CUipcHandle, event: CUevent) -> CUresult;
    fn cuIpcOpenEventHandle(event: *mut CUevent, handle: CUipcHandle) -> CUresult;

    fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
    fn cuEventDestroy_v2(event: CUevent) -> CUresult;
    fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
    fn cuEventQuery(event: CUevent) -> CUresult;
    fn cuEventSynchronize(event: CUevent) -> CUresult;
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult;
    fn cuStreamSynchronize(stream: CUstream) -> CUresult;
    fn cuStreamQuery(stream: CUstream) -> CUresult;
    fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult;
    fn cuStreamDestroy_v2(stream: CUstream) -> CUresult;
    /// CUDA 12.0+: an id unique to the stream for the process's life (never reused, unlike
    /// the handle's address).
    fn cuStreamGetId(stream: CUstream, id: *mut u64) -> CUresult;

    /// The stream memory operations of CUDA 11.7+ (`cuda.h` maps `cuStreamWriteValue64` here
    /// from CUDA 12.0 on); the v1 entry points needed a driver module option on Linux.
    fn cuStreamWriteValue64_v2(
        stream: CUstream,
        addr: CUdeviceptr,
        value: u64,
        flags: c_uint,
    ) -> CUresult;
    fn cuStreamWaitValue64_v2(
        stream: CUstream,
        addr: CUdeviceptr,
        value: u64,
        flags: c_uint,
    ) -> CUresult;
    /// Several stream memory operations in one call, executed in order on `stream`.
    fn cuStreamBatchMemOp_v2(
        stream: CUstream,
        count: c_uint,
        ops: *mut CUstreamMemOpValue64,
        flags: c_uint,
    ) -> CUresult;

    fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CUmemAllocationProp,
        option: c_uint,
    ) -> CUresult;
    fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult;
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> CUresult;
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult;
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    fn cuMemSetAccess(
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult;
    /// For a POSIX file descriptor, `shareable` is the `int` itself cast to a pointer.
    fn cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle,
        shareable: *mut c_void,
        handle_type: c_uint,
    ) -> CUresult;
    fn cuMemRetainAllocationHandle(
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> CUresult;
    fn cuMemGetAllocationPropertiesFromHandle(
        prop: *mut CUmemAllocationProp,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult;
    fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: c_uint,
        flags: u64,
    ) -> CUresult;
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult;
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    /// For a POSIX file descriptor, `shareable` points to an `int` the driver fills.
    fn cuMemPoolExportToShareableHandle(
        shareable: *mut c_void,
        pool: CUmemoryPool,
        handle_type: c_uint,
        flags: u64,
    ) -> CUresult;
    /// For a POSIX file descriptor, `shareable` is the `int` itself cast to a pointer.
    fn cuMemPoolImportFromShareableHandle(
        pool: *mut CUmemoryPool,
        shareable: *mut c_void,
        handle_type: c_uint,
        flags: u64,
    ) -> CUresult;
    fn cuMemPoolSetAccess(
        pool: CUmemoryPool,
        map: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult;
    fn cuMemPoolGetAccess(
        flags: *mut c_uint,
        pool: CUmemoryPool,
        location: *mut CUmemLocation,
    ) -> CUresult;
    fn cuMemAllocFromPoolAsync(
        dptr: *mut CUdeviceptr,
        bytes: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) -> CUresult;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    fn cuMemPoolExportPointer(data: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr) -> CUresult;
    fn cuMemPoolImportPointer(
        ptr: *mut CUdeviceptr,
        pool: CUmemoryPool,
        data: *mut CUmemPoolPtrExportData,
    ) -> CUresult;

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult;
    fn cuMemFreeHost(p: *mut c_void) -> CUresult;
}
