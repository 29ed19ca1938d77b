#!/bin/sh
# Mutation test of the ze kernels: the conformance harness for the ze
# backend's Level Zero host code (test_conformance_ze_l0, small shape
# matrix) on the test driver (tests/ze_driver/libze_qltest.so) with the
# validation layer on, with the kernels built with one injected bug each
# (QL_ZE_MUT_*, which the driver adds to its OpenCL build options from
# QL_ZE_TEST_BUILD_OPTIONS): lane groups sharing one slab of local memory
# in the combine, scales read in the canonical [G, N] order instead of the
# layout's [N, G], a work-group reduction that drops lanes. (A missing
# barrier at the end of a loop is no mutant here: PoCL runs the
# work-items of a work-group one after another between barriers and adds
# one of its own at a loop's back edge, so it cannot show that race.) Each
# must make the harness report failed cases; a mutant that passes, or one
# that fails only because the kernels did not build, fails this test.
set -u
b="${QL_BUILDDIR:-.}"
prog="$b/tests/conformance/test_conformance_ze_l0"
ZE_ENABLE_ALT_DRIVERS="${QL_ZE_TEST_DRIVER:-$b/tests/ze_driver/.libs/libze_qltest.so}"
ZE_ENABLE_VALIDATION_LAYER=1
ZE_ENABLE_PARAMETER_VALIDATION=1
ZE_ENABLE_HANDLE_LIFETIME=1
export ZE_ENABLE_ALT_DRIVERS ZE_ENABLE_VALIDATION_LAYER \
  ZE_ENABLE_PARAMETER_VALIDATION ZE_ENABLE_HANDLE_LIFETIME
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

for mut in SHARED_SLAB GROUP_INDEX TREE; do
  QL_ZE_TEST_BUILD_OPTIONS="-DQL_ZE_MUT_$mut" "$prog" >"$dir/out" 2>"$dir/err"
  st=$?
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/out" | tail -1)
  nfail=$(echo "$summary" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p')
  if grep -q 'zeModuleCreate: \(OpenCL build error\|cannot read\)' "$dir/err"; then
    echo "FAIL mutant $mut: the kernels did not build"
    cat "$dir/err"
    fails=$((fails + 1))
  elif [ "$st" -eq 0 ] || [ -z "$nfail" ] || [ "$nfail" -eq 0 ]; then
    echo "FAIL mutant $mut: not caught (status $st, $summary)"
    fails=$((fails + 1))
  else
    echo "ok   mutant $mut caught: $summary; first: $(grep -m1 '^FAIL' "$dir/out")"
  fi
done
[ "$fails" -eq 0 ] || exit 1
