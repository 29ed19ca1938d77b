#!/bin/sh
# The ze backend's Level Zero host code (kernels/ze/backend.c) through the
# conformance harness, small shape matrix: test_conformance_ze_l0 is the
# harness built for the backend "ze" of libqlkernels, here on the test
# driver (tests/ze_driver/libze_qltest.so, which runs the kernels on PoCL)
# with the loader's validation layer on: the kernels and the host code
# (the layout in device memory, staging, launches and waits). The full
# shape matrix is the same harness built without QL_CONFORMANCE_BACKEND,
# tests/conformance/test_conformance --backend ze, run by hand in this
# environment (README, "ze backend"). A call the layer
# refuses is a bug of the host code, which says so on stderr: that fails
# the test too.
set -u
b="${QL_BUILDDIR:-.}"
ZE_ENABLE_ALT_DRIVERS="${QL_ZE_TEST_DRIVER:-$b/tests/ze_driver/.libs/libze_qltest.so}"
ZE_ENABLE_VALIDATION_LAYER=1
ZE_ENABLE_PARAMETER_VALIDATION=1
ZE_ENABLE_HANDLE_LIFETIME=1
export ZE_ENABLE_ALT_DRIVERS ZE_ENABLE_VALIDATION_LAYER \
  ZE_ENABLE_PARAMETER_VALIDATION ZE_ENABLE_HANDLE_LIFETIME
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$b/tests/conformance/test_conformance_ze_l0" 2>"$err"
st=$?
cat "$err" >&2
if grep -q 'a Level Zero call refused' "$err"; then
  echo "FAIL the validation layer (or the driver) refused a call"
  exit 1
fi
exit $st
