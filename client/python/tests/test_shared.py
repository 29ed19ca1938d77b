"""Several Python processes sharing one weight: each loads the same name
and content, the daemon keeps one resident copy, every process gets the same
bytes, and the copy is freed when the last process is gone."""

import json
import os
import subprocess
import sys
import time

import qlinear

# One process: connect, load the weight (seeded, so every process makes the
# same bytes), say what the load returned, wait for the word, compute, say
# a digest of y, and exit (which ends its session).
CHILD = r"""
import hashlib, json, sys
import numpy as np
import qlinear
address, name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
w = rng.standard_normal((128, 256)).astype(np.float32)
b = rng.standard_normal(128).astype(np.float32)
c = qlinear.Client(address)
try:
    info = c.load(name, w, b, format="q4g128")
    print(json.dumps({"shared": info.shared, "digest": info.digest,
                      "bytes": info.bytes_resident}), flush=True)
except qlinear.QLinearError as e:
    print(json.dumps({"error": e.name}), flush=True)
    sys.exit(0)
sys.stdin.readline()
x = np.random.default_rng(7).standard_normal((4, 256)).astype(np.float32)
y = c.linear(name, x, path="wo")
print(json.dumps({"y": hashlib.sha256(y.tobytes()).hexdigest()}), flush=True)
c.close()
"""


def _spawn(daemon, name, seed):
    return subprocess.Popen([sys.executable, "-c", CHILD, daemon.address,
                             name, str(seed)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def _line(p):
    line = p.stdout.readline()
    assert line, "child exited early (status %s)" % p.wait()
    return json.loads(line)


def test_processes_share_one_weight(daemon, client):
    name = "py/shared/proj"
    procs = [_spawn(daemon, name, 99) for _ in range(4)]
    try:
        loads = [_line(p) for p in procs]
        # Exactly one process uploaded it first; the others share it.
        assert sorted(ld["shared"] for ld in loads) == [False, True, True,
                                                        True]
        assert len({ld["digest"] for ld in loads}) == 1
        # One resident copy: one listing entry, of one copy's size.
        entries = [i for i in client.list() if i.name == name]
        assert len(entries) == 1
        assert entries[0].digest == loads[0]["digest"]
        assert entries[0].bytes_resident == loads[0]["bytes"]
        ws = [s for s in client.stats().per_weight if s.weight == name]
        assert len(ws) == 1 and ws[0].bytes_resident == loads[0]["bytes"]
        # Other content under the name is refused while it is held.
        other = _spawn(daemon, name, 100)
        assert _line(other) == {"error": "QL_EEXIST"}
        assert other.wait(30) == 0
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        ys = [_line(p)["y"] for p in procs]
        assert len(set(ys)) == 1
        assert [p.wait(30) for p in procs] == [0] * 4
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    # The last hold is gone with the last process: the daemon unloads it.
    deadline = time.monotonic() + 10
    while any(i.name == name for i in client.list()):
        assert time.monotonic() < deadline, "weight still resident"
        time.sleep(0.05)


def test_fork_child_must_reconnect(client, daemon):
    """A fork child may not use its parent's client, nor connect."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                client.hello()
            except qlinear.QLinearError as e:
                if e.code == qlinear.QL_ESESSION:
                    code = 0
            # a new connection is refused at once, not left to hang
            try:
                qlinear.Client(daemon.address)
                code = 1
            except qlinear.QLinearError as e:
                if e.code != qlinear.QL_ENOTSUP:
                    code = 1
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x00"
    # The parent's client still works after the child is gone.
    assert client.hello().protocol_version == 1
