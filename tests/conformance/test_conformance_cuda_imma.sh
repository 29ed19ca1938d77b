#!/bin/sh
# The emulated CUDA backend through the conformance harness with q8c AQ on
# cuBLASLt's IMMA (the reference cuBLASLt of kernels/cuda/emu_blaslt.h) for
# batches of 2 rows or more (QL_CUDA_IMMA_MIN_ROWS=2): a batch then runs on
# cuda.cublaslt.linear_aq and each row alone on our tensor-core kernel, so
# the harness's lone-row check compares the two byte for byte.
QL_CUDA_IMMA_MIN_ROWS=2
export QL_CUDA_IMMA_MIN_ROWS
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda"
