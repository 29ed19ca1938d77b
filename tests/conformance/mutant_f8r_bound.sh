#!/bin/sh
# Mutation test of the f8r AQ contract: the emulated CUDA backend's f8r AQ
# (cuBLASLt's FP8 GEMM, emulated with the FP8 tensor cores' accumulation
# that fp8-probe measured: QL_EMU_FP8_ACC_BITS, default 14) held to the
# bound of exact f32 summation (QL_CONFORMANCE_F8R_BOUND=f32) must fail, as
# the real GPU failed it: an expected failure (XFAIL_TESTS). The harness's
# own bound for those engines is what test_conformance_cuda checks.
QL_CONFORMANCE_F8R_BOUND=f32
export QL_CONFORMANCE_F8R_BOUND
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda" --filter "AQ f8r"
