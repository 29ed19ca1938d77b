#!/bin/sh
# test_gpumodel.sh - make check's gate on the static GPU performance model
# (tests/gpu/gpumodel.py, docs/gpu-model.md). No GPU: it disassembles the
# CUDA kernels of today's sources (the build's nvcc objects
# kernels/cuda/gpu-linear_wo.o and gpu-linear_aq.o, or the objects named in
# QL_GPUMODEL_OBJS="wo=PATH aq=PATH"; without them it compiles the sources
# for sm_90 into a temporary directory, which takes minutes), prints the
# predicted time and fraction of the in-run read of every kernel variant
# on the canonical shapes (H200), and fails when a fraction drops more
# than 10 % below tests/gpu/baseline.json, when a kernel uses local
# memory, or when a calibration case (tests/gpu/calibration.json: the
# measured H200 and H100 figures, recomputed from their commits' stored
# counts) leaves 25 % (a case the fit already misses fails if its error
# grows; QL_GPUMODEL_STRICT=1 fails every miss). cuobjdump comes from
# $QL_CUOBJDUMP, PATH, or the nvidia-cuda-cuobjdump wheel of the
# interpreter ($QL_PYTHON, else the venv of deploy/python-env, which
# installs the wheel); without it the gate fails.
set -u
srcdir=${srcdir:-.}
py=${QL_PYTHON:-}
if [ -z "$py" ]; then
  py=$("$srcdir/deploy/python-env" --find) || {
    echo "FAIL: no Python test environment for cuobjdump: run deploy/python-env (deploy/test does)"
    exit 1
  }
fi
# shellcheck disable=SC2086 # QL_GPUMODEL_OBJS is a list of op=path words
exec "$py" "$srcdir/tests/gpu/gpumodel.py" gate ${QL_GPUMODEL_OBJS:-}
