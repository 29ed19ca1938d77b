/* cuda.h for test programs on the emulated CUDA runtime: see
 * cuda_runtime_api.h beside it (emu_runtime.h also has the driver types
 * the host code reads). */
#include "emu_runtime.h"
