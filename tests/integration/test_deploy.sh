#!/bin/sh
# test_deploy.sh - "Run it" builds what the machine can run: deploy/run
# installs only the packages running needs (no test-only ones), and
# configures the GPU backends only where the machine has such a GPU
# (QL_RUN_PLAN prints the plan; QL_RUN_ROOT stands in a fake /proc and
# /sys with or without an NVIDIA driver, an nvcc and an Intel render node).
set -u
: "${QL_SRCDIR:?run through make check}"
fails=0
bad() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

run_pkgs=$("$QL_SRCDIR/deploy/bootstrap" --run --list) || bad "bootstrap --run --list"
test_pkgs=$("$QL_SRCDIR/deploy/bootstrap" --list) || bad "bootstrap --list"
for p in build-essential libuv1-dev libnanomsg-dev libprotobuf-c-dev libmicrohttpd-dev \
  protobuf-c-compiler check libjansson-dev libssl-dev; do
  echo "$run_pkgs" | grep -qx "$p" || bad "running needs $p, not in --run"
done
# What only the tests (and the GPU kernels' builds) need.
for p in clang-14 libclang-rt-14-dev pocl-opencl-icd clinfo libze-dev \
  llvm-spirv-14 spirv-tools python3-venv python3-torch python3-pytest; do
  echo "$run_pkgs" | grep -qx "$p" && bad "--run installs the test-only $p"
done
for p in clang-14 pocl-opencl-icd libze-dev python3-venv; do
  echo "$test_pkgs" | grep -qx "$p" || bad "the tests need $p, not in the list"
done
ze_pkgs=$("$QL_SRCDIR/deploy/bootstrap" --run --ze-tools --list)
echo "$ze_pkgs" | grep -qx llvm-spirv-14 || bad "--ze-tools lacks llvm-spirv-14"
"$QL_SRCDIR/deploy/bootstrap" --bogus --list >/dev/null 2>&1 &&
  bad "bootstrap accepted --bogus"

fake=$(mktemp -d "${TMPDIR:-/tmp}/ql-deploy-XXXXXX") || exit 1
trap 'rm -rf "$fake"' EXIT INT TERM
plan() { # fake root -> the plan's lines
  QL_RUN_PLAN=1 QL_RUN_ROOT=$1 "$QL_SRCDIR/deploy/run" 2>/dev/null
}
expect() { # what, plan, line
  echo "$2" | grep -qxF "$3" || bad "$1: no line '$3' in: $(echo "$2" | tr '\n' '|')"
}
mkdir -p "$fake/none"
p=$(plan "$fake/none")
expect "no GPU" "$p" "configure: --without-cuda --without-ze"
expect "no GPU" "$p" "bootstrap: --run"
expect "no GPU" "$p" "make: quickstart"

mkdir -p "$fake/nv/proc/driver/nvidia/gpus/0000:01:00.0" \
  "$fake/nv/usr/local/cuda/bin"
printf '#!/bin/sh\n' >"$fake/nv/usr/local/cuda/bin/nvcc"
chmod +x "$fake/nv/usr/local/cuda/bin/nvcc"
p=$(plan "$fake/nv")
expect "NVIDIA GPU" "$p" "configure: --with-cuda --without-ze"
expect "NVIDIA GPU" "$p" "bootstrap: --run --cuda-tools"

mkdir -p "$fake/nvdrv/proc/driver/nvidia/gpus/0000:01:00.0"
p=$(plan "$fake/nvdrv")
expect "NVIDIA GPU, no toolkit" "$p" "configure: --without-cuda --without-ze"

mkdir -p "$fake/intel/sys/class/drm/renderD128/device" \
  "$fake/amd/sys/class/drm/renderD128/device"
echo 0x8086 >"$fake/intel/sys/class/drm/renderD128/device/vendor"
echo 0x1002 >"$fake/amd/sys/class/drm/renderD128/device/vendor"
p=$(plan "$fake/intel")
expect "Intel GPU" "$p" "configure: --without-cuda --with-ze"
expect "Intel GPU" "$p" "bootstrap: --run --ze-tools"
p=$(plan "$fake/amd")
expect "another vendor's GPU" "$p" "configure: --without-cuda --without-ze"

# The quickstart target names the installed programs and libraries only.
if [ -n "${QL_BUILDDIR:-}" ] && [ -f "$QL_BUILDDIR/Makefile" ]; then
  q=$(sed -n '/^quickstart:/,/^\.PHONY: quickstart/p' "$QL_BUILDDIR/Makefile")
  echo "$q" | grep -q 'bin_PROGRAMS' || bad "quickstart does not build bin_PROGRAMS"
  echo "$q" | grep -q 'noinst_PROGRAMS\|check_PROGRAMS' &&
    bad "quickstart builds test programs"
fi

if [ "$fails" -gt 0 ]; then
  echo "$fails failed"
  exit 1
fi
echo "PASS: deploy/run's plan and packages"
