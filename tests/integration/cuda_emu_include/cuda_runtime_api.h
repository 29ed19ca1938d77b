/* cuda_runtime_api.h for test programs on the emulated CUDA runtime: code
 * written for the real runtime (client/include/qlinear/qlinear_cuda.h)
 * compiles here unchanged against kernels/cuda/emu_runtime.h. */
#include "emu_runtime.h"
