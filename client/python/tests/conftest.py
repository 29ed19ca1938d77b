"""Fixtures of the Python client's tests: one real qlineard for the whole
run, on a private socket directory, and a fresh client per test.

The daemon is $QLINEARD (set by make check), else the qlineard of the
source tree's in-place build. libqlinear is found as the package finds it
(QLINEAR_LIB, which tests/integration/test_python.sh sets to the build).
"""

import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest

import qlinear

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                   ".."))


def _daemon_env():
    """The environment for qlineard: test_python.sh's own, less what it
    set for this interpreter alone in a sanitizer build (the ASan runtime
    preloaded, leak reports off), which it saved as QL_DAEMON_*."""
    env = dict(os.environ)
    for var in ("LD_PRELOAD", "ASAN_OPTIONS"):
        saved = env.pop("QL_DAEMON_" + var, None)
        if saved is None:
            continue
        if saved:
            env[var] = saved
        else:
            env.pop(var, None)
    return env


def _die_with_parent():
    """In the daemon's child before exec: SIGTERM when the test process
    dies (a killed pytest left its daemon running)."""
    import ctypes
    import signal
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG,
                                            int(signal.SIGTERM), 0, 0, 0)


class Daemon:
    """A qlineard started for the tests; address is its request socket.
    args are further command-line arguments (the metrics tests' own
    daemons)."""

    def __init__(self, args=(), bin=None, env=None):
        """args: more daemon options; bin: the daemon (default
        $QLINEARD); env: variables added to its environment."""
        self.bin = bin or os.environ.get("QLINEARD") or \
            os.path.join(TOP, "qlineard")
        denv = _daemon_env()
        denv.update(env or {})
        self.dir = tempfile.mkdtemp(prefix="ql-py-")
        os.chmod(self.dir, 0o700)
        sock = os.path.join(self.dir, "sock")
        self.address = "ipc://%s/qlineard.sock" % sock
        self.admin_address = "ipc://%s/admin/admin.sock" % sock
        self.log = open(os.path.join(self.dir, "daemon.log"), "w+")
        # A fixed crossover: the daemon does not spend the tests' CPU
        # measuring one for every new weight shape.
        self.proc = subprocess.Popen(
            [self.bin, "--socket-dir", sock, "--state-dir",
             os.path.join(self.dir, "state"), "--crossover-rows", "16",
             "--log-level", "info"] + list(args),
            stdout=self.log, stderr=subprocess.STDOUT, env=denv,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        # admin.sock is bound after the request and session sockets
        paths = [os.path.join(sock, "qlineard.sock"),
                 os.path.join(sock, "admin", "admin.sock")]
        while not all(os.path.exists(p) for p in paths):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("qlineard did not start:\n" + self.text())
            time.sleep(0.02)

    def text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    alive = d.proc.poll() is None
    log = d.text()
    d.stop()
    # A crash of the daemon during the run fails the run, even if every
    # test passed before it.
    assert alive, "qlineard exited during the tests:\n" + log


@pytest.fixture
def client(daemon):
    c = qlinear.Client(daemon.address)
    yield c
    c.close()


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


def nmse(y, ref):
    """Normalised mean squared error of y against ref, in float64."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))


@pytest.fixture(params=["no_grad", "inference_mode"])
def grad_mode(request):
    """Each torch test runs under torch.no_grad() and again under
    torch.inference_mode(): the two ways inference is run, which differ
    (inference tensors have no version counter)."""
    import torch
    return torch.no_grad if request.param == "no_grad" \
        else torch.inference_mode
