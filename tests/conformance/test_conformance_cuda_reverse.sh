#!/bin/sh
# The emulated CUDA kernels through the conformance harness with the
# threads of each block run in reverse order (kernels/cuda/emu.h) and the
# runtime's copies from pageable memory landing late
# (kernels/cuda/emu_runtime.cpp): code that silently relies on the forward
# order (a missing barrier) or on a synchronous copy (a layout read before
# it lands) fails here.
QL_EMU_REVERSE=1
QL_EMU_CUDA_LATE_COPY=1
export QL_EMU_REVERSE QL_EMU_CUDA_LATE_COPY
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda"
