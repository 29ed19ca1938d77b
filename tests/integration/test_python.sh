#!/bin/sh
# test_python.sh - the Python client's tests (client/python/tests, pytest)
# against a real qlineard, which their conftest.py starts on a private
# socket directory, with the libqlinear of this build.
#
# The interpreter is the python of the venv deploy/python-env makes, with
# the pinned PyTorch stack of deploy/requirements-test.txt (deploy/test
# makes it and passes it as QL_PYTHON), not whatever python3 comes first
# on PATH: QL_PYTHON overrides it. A missing venv or module fails the test
# rather than skipping it, so CI cannot go green without having run them.
set -u
: "${QLINEARD:?run through make check}" "${QL_SRCDIR:?}" "${QL_BUILDDIR:?}"
if [ -z "${QL_PYTHON:-}" ]; then
  QL_PYTHON=$("$QL_SRCDIR/deploy/python-env" --find) || {
    echo "FAIL: no Python test environment: run deploy/python-env (deploy/test does)"
    exit 1
  }
fi
py=$QL_PYTHON

if ! "$py" -c 'import numpy, pytest, torch' 2>"${TMPDIR:-/tmp}/ql-py-$$.err"; then
  echo "FAIL: $py lacks numpy, pytest or torch (deploy/python-env installs them):"
  cat "${TMPDIR:-/tmp}/ql-py-$$.err"
  rm -f "${TMPDIR:-/tmp}/ql-py-$$.err"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/ql-py-$$.err"
echo "python: $py, torch $("$py" -c 'import torch; print(torch.__version__)')"

QLINEAR_LIB="$QL_BUILDDIR/.libs/libqlinear.so.0"
# A sanitizer build's library needs the ASan runtime loaded before the
# interpreter: preload it; the interpreter's own allocations at exit are
# not ours to report (leak checking stays on for the daemon).
asan=$(ldd "$QLINEAR_LIB" 2>/dev/null | sed -n 's/.*\(libasan[^ ]*\) => \([^ ]*\).*/\2/p')
ubsan=$(ldd "$QLINEAR_LIB" 2>/dev/null | sed -n 's/.*\(libubsan[^ ]*\) => \([^ ]*\).*/\2/p')
if [ -n "$asan" ]; then
  # conftest.py gives the daemon these back (QL_DAEMON_*)
  QL_DAEMON_ASAN_OPTIONS=${ASAN_OPTIONS-}
  QL_DAEMON_LD_PRELOAD=${LD_PRELOAD-}
  export QL_DAEMON_ASAN_OPTIONS QL_DAEMON_LD_PRELOAD
  # libstdc++ with it: the interpreter does not link it, so without it
  # ASan's __cxa_throw interceptor finds no real one, and the first C++
  # exception torch throws (opcheck provokes some) stops the process.
  cxx=$(/sbin/ldconfig -p 2>/dev/null |
    sed -n 's/.*libstdc++\.so\.6 (libc6,x86-64) => \(.*\)/\1/p' | head -1)
  # And the UBSan runtime, which the C++ check libraries (the emulated
  # CUDA client, tests/integration/libqlinear-cudaemu) need but, linked by
  # libtool with -nostdlib, do not name.
  LD_PRELOAD="$asan${ubsan:+ $ubsan}${cxx:+ $cxx}${LD_PRELOAD:+ $LD_PRELOAD}"
  ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export LD_PRELOAD ASAN_OPTIONS
fi
PYTHONPATH="$QL_SRCDIR/client/python${PYTHONPATH:+:$PYTHONPATH}"
# The source tree may be read-only (make distcheck): no bytecode, no cache.
PYTHONDONTWRITEBYTECODE=1
export QLINEAR_LIB PYTHONPATH PYTHONDONTWRITEBYTECODE
# The tests start their own daemon; an address from the environment would
# only confuse default_address() checks.
unset QLINEAR_ADDRESS QLINEAR_ADMIN_ADDRESS
cd "$QL_BUILDDIR" || exit 1
exec "$py" -m pytest -q -p no:cacheprovider -rs "$QL_SRCDIR/client/python/tests"
