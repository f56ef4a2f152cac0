// Kernels of cuda-ipc's examples and tests. The committed simple_ipc.ptx is what they load;
// regenerate it from this file with (PTX ISA 7.0, sm_52: loads on any driver from CUDA 11.0 on,
// JIT-compiled for the GPU at hand):
//
//     nvcc -ptx -arch=compute_52 -o kernels/simple_ipc.ptx kernels/simple_ipc.cu
//
// The committed PTX is hand-written to the same contract (each kernel's body below), so it
// stays short and readable; a GPU test loads it and checks every kernel's effect.

#include <cstdint>

// NVIDIA simpleIPC's simpleKernel: set every byte of ptr[0..sz) to val, grid-stride.
extern "C" __global__ void simple_kernel(char *ptr, int sz, unsigned int val) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  for (; idx < sz; idx += gridDim.x * blockDim.x) {
    ptr[idx] = (char)val;
  }
}

// Spin until `delay_ns` nanoseconds have passed (per block, by %globaltimer), then set every
// byte of ptr[0..n) to val: a deliberately slow writer for event-ordering tests.
extern "C" __global__ void delay_fill(char *ptr, uint64_t n, unsigned int val, uint64_t delay_ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  uint64_t now = start;
  while (now - start < delay_ns) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    ptr[i] = (char)val;
  }
}
