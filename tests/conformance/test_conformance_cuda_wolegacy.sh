#!/bin/sh
# The emulated CUDA backend through the conformance harness with linear_wo
# on the legacy kernel (QL_CUDA_WO_KERNEL=legacy: one block row per row of
# x), which stays selectable to be timed against the streaming one on a
# GPU, and so must stay correct.
QL_CUDA_WO_KERNEL=legacy
export QL_CUDA_WO_KERNEL
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda"
