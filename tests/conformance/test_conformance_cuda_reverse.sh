#!/bin/sh
# The emulated CUDA kernels through the conformance harness with the
# threads of each block run in reverse order (kernels/cuda/emu.h): code
# that silently relies on the forward order (a missing barrier) fails here.
QL_EMU_REVERSE=1
export QL_EMU_REVERSE
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda"
