// Kernels of examples/pipeline.rs. Regenerate pipeline.ptx from this file with
//
//     nvcc -ptx -arch=compute_75 -o kernels/pipeline.ptx kernels/pipeline.cu
//
// then lower the header to `.version 7.0` / `.target sm_52` (the code uses nothing newer).
//
// An item is n 32-bit words and a trailer word: word i holds seq * 2654435761 + i, and the
// trailer the sum of the n words (mod 2^32), computed on the GPU by the producer. The consumer
// sums the words again on its GPU and compares with the trailer.

#include <cstdint>

// Producer: write the n words of item `seq` and add their sum into words[n] (zeroed before).
extern "C" __global__ void fill_item(uint32_t *words, uint64_t n, uint32_t seq) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint32_t sum = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint32_t v = seq * 2654435761u + (uint32_t)i;
    words[i] = v;
    sum += v;
  }
  atomicAdd(&words[n], sum);
}

// Consumer: add the sum of the n words into *acc (zeroed before).
extern "C" __global__ void sum_item(const uint32_t *words, uint64_t n, uint32_t *acc) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint32_t sum = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    sum += words[i];
  }
  atomicAdd(acc, sum);
}

// Consumer, one thread: count a mismatch between *acc and the trailer words[n] (and the item
// number the first word implies), then zero *acc for the next item.
extern "C" __global__ void check_item(const uint32_t *words, uint64_t n, uint32_t seq,
                                      uint32_t *acc, uint32_t *errors) {
  if (*acc != words[n] || (n > 0 && words[0] != seq * 2654435761u)) {
    atomicAdd(errors, 1u);
  }
  *acc = 0;
}
