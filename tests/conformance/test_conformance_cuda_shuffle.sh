#!/bin/sh
# The emulated CUDA kernels through the conformance harness with blocks
# and threads in a random order (QL_EMU_SHUFFLE, kernels/cuda/emu.h; a
# fixed seed, so that a failure replays): code that relies on any order a
# GPU does not promise, forward or reverse, fails here.
QL_EMU_SHUFFLE=${QL_EMU_SHUFFLE:-20261126}
export QL_EMU_SHUFFLE
exec "${QL_BUILDDIR:-.}/tests/conformance/test_conformance_cuda"
