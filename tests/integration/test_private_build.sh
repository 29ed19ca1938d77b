#!/bin/sh
# test_private_build.sh - the second-user cases (a client of another uid,
# TD_OTHER_UID) from a copy of the build under a directory that user
# cannot enter, as a clone in root's 0700 home is: the client process must
# load its program and libraries as root and become the other user only
# after exec (td_spawn_self() / td_self_init() in harness.c), or it never
# starts. Needs root (only root can become another user); elsewhere it is
# skipped, and says so.
#
# The copy is the test program's own binary (not libtool's wrapper), the
# shared libraries of this build it loads (libqlinear), and the daemon it
# starts; the test checks first that the other user really cannot reach
# them, so it cannot pass by testing an open directory.
set -u
: "${QL_BUILDDIR:?run through make check}" "${QLINEARD_CUDAEMU:?}"

if [ "$(id -u)" != 0 ]; then
  echo "SKIP: not root: no other user to run the second-user cases as"
  exit 77
fi
other=65534 # TD_OTHER_UID

fail() {
  echo "FAIL: $*"
  exit 1
}

# libtool keeps the real program in .libs/ (lt-NAME once it has run).
prog=""
for p in "$QL_BUILDDIR/tests/integration/.libs/lt-test_cuda_daemon" \
  "$QL_BUILDDIR/tests/integration/.libs/test_cuda_daemon" \
  "$QL_BUILDDIR/tests/integration/test_cuda_daemon"; do
  if [ -f "$p" ] && head -c 4 "$p" | grep -q 'ELF'; then
    prog=$p
    break
  fi
done
[ -n "$prog" ] || fail "no test_cuda_daemon binary in $QL_BUILDDIR"
daemon=$QLINEARD_CUDAEMU
[ -f "$QL_BUILDDIR/tests/integration/.libs/qlineard-cudaemu" ] &&
  daemon=$QL_BUILDDIR/tests/integration/.libs/qlineard-cudaemu

priv=$(mktemp -d "${TMPDIR:-/tmp}/ql-private-XXXXXX") || fail "mktemp -d"
trap 'rm -rf "$priv"' EXIT INT TERM
chmod 0700 "$priv" || fail "chmod 0700 $priv"
mkdir -p "$priv/build/lib" || fail "mkdir"
cp "$prog" "$priv/build/test_cuda_daemon" || fail "copy the test program"
cp "$daemon" "$priv/build/qlineard-cudaemu" || fail "copy the daemon"
cp -P "$QL_BUILDDIR"/.libs/libqlinear.so* "$priv/build/lib/" ||
  fail "copy libqlinear"

# Its libraries come from the copy, not from the build tree.
export LD_LIBRARY_PATH="$priv/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd "$priv/build/test_cuda_daemon" | grep -q "libqlinear.so.* => $priv/" ||
  fail "the copy does not load its own libqlinear: $(ldd "$priv/build/test_cuda_daemon" | grep qlinear)"

# The other user cannot reach the copy: what makes this test worth running.
if setpriv --reuid="$other" --regid=0 --clear-groups \
  test -r "$priv/build/test_cuda_daemon" 2>/dev/null; then
  fail "uid $other can read $priv/build: the directory is not private"
fi
setpriv --reuid="$other" --regid=0 --clear-groups true ||
  fail "setpriv cannot become uid $other"

QLINEARD_CUDAEMU="$priv/build/qlineard-cudaemu"
CK_RUN_CASE=second_uid
export QLINEARD_CUDAEMU CK_RUN_CASE
out=$priv/out
"$priv/build/test_cuda_daemon" >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || fail "the second-user cases failed from $priv (rc $rc)"
# Check ran the case (an unknown case name runs nothing and passes).
grep -q '^100%: Checks: [1-9]' "$out" ||
  fail "check ran no second-user case"
echo "PASS: the second-user cases from a build under a 0700 directory"
