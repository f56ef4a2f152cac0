/* What cuda-ipc's IpcBuffer::raw_export gives a C or C++ peer (Rust: cuda_ipc::RawExport,
 * #[repr(C)], 104 bytes, native-endian, no padding), and how to open it.
 *
 *   struct cuda_ipc_raw_export e;             // received from the Rust process as 104 bytes
 *   void *base;
 *   cudaIpcOpenMemHandle(&base, *(cudaIpcMemHandle_t *)e.handle,
 *                        cudaIpcMemLazyEnablePeerAccess);
 *   float *data = (float *)((char *)base + e.offset);   // e.bytes / sizeof(float) values
 *   ...
 *   cudaIpcCloseMemHandle(base);                         // then tell the Rust side you are done
 *
 * The Rust exporter frees the memory when its IpcBuffer drops: a raw handle takes no lease, so
 * agree on when you are done (a message, a barrier, your exit) before it drops.
 *
 * The reverse (a C peer exporting to Rust): fill the same struct from cudaIpcGetMemHandle, the
 * data's offset from the cudaMalloc base and its size, your pid; the Rust side opens it with
 * ImportedBuffer::<T>::open_raw(&ctx, &RawImport::from_export::<T>(&export)?).
 */
#ifndef CUDA_IPC_RAW_H
#define CUDA_IPC_RAW_H
#include <stdint.h>

struct cuda_ipc_raw_export {
    uint8_t  handle[64];      /* cudaIpcMemHandle_t / CUipcMemHandle */
    uint64_t offset;          /* bytes from the allocation's start to the data */
    uint64_t bytes;           /* bytes of data */
    uint8_t  device_uuid[16]; /* the device holding the memory (cuDeviceGetUuid) */
    uint32_t device_ordinal;  /* its ordinal in the exporter's numbering */
    uint32_t exporter_pid;    /* the exporting process */
};

#ifdef __cplusplus
static_assert(sizeof(cuda_ipc_raw_export) == 104, "layout of cuda_ipc::RawExport");
#else
_Static_assert(sizeof(struct cuda_ipc_raw_export) == 104, "layout of cuda_ipc::RawExport");
#endif
#endif
