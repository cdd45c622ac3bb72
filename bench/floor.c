/* The kernel boundary's kernels and their launch (floor.h). */
#include "floor.h"

#include "rt.h"

const char floor_boundary_src[] =
    "extern \"C\" __global__ void kl_floor_empty() {\n"
    "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "  asm volatile(\"griddepcontrol.launch_dependents;\");\n"
    "}\n"
    /* The same with one 16-byte store per thread, to this GPU's memory or a
     * peer's: what the stores add to a step (a kernel is done only when its
     * stores are). */
    "extern \"C\" __global__ void kl_floor_store(uint4 *dst) {\n"
    "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "  asm volatile(\"griddepcontrol.launch_dependents;\");\n"
    "  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  dst[t] = make_uint4(t, t, t, t);\n"
    "}\n";

CUresult floor_launch(CUfunction f, void **args, CUstream s, int ctas, int threads, int pdl) {
  CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg = {.gridDimX = (unsigned)ctas, .gridDimY = 1, .gridDimZ = 1,
                        .blockDimX = (unsigned)threads, .blockDimY = 1, .blockDimZ = 1,
                        .hStream = s, .attrs = &attr, .numAttrs = pdl ? 1 : 0};
  return kl_cu_get(NULL)->cuLaunchKernelEx(&cfg, f, args, NULL);
}
