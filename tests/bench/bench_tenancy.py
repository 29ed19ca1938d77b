"""qlinear-bench tenancy: one user's latency and answers while another
user attacks the daemon's shared budgets (docs/security.md, "Several
users").

Run as root (the attacker is a second uid, nobody's by default): it starts
its own qlineard on a private socket directory that the attacker reaches
through group 0, loads the victim's weight under a content-addressed name,
and measures the victim's 1-row requests (p50/p99 over --requests calls,
each answer compared byte for byte with the idle daemon's) first on an
idle daemon, then during each attack:

  queue     --procs processes of the other uid keep 8-row requests coming
            on the victim's own weight (--max-queue is the daemon's);
  uploads   the other uid begins 16 MiB uploads and keeps them in
            progress until it is refused (--max-upload-bytes 160M); the
            victim then loads a 48 MiB weight;
  buffered  the other uid holds 15 MiB frames half sent on 4 connections;
  squat     the other uid loads other content under the victim's names
            first (content-addressed and plain), the victim then loads.

The attacker's processes run at nice 19 under SCHED_IDLE, so that the
figures show the daemon's fairness rather than how the two cores are
shared. Prints one row per phase. Never run by make check (timings).

Usage: python3 bench_tenancy.py [--qlineard PATH] [--requests N]
       [--procs N] [--uid UID] [--uid-share PCT]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "client", "python"))

import qlinear  # noqa: E402

N, K = 4096, 4096


ATTACK = r'''
import os, socket, struct, sys, time
sys.path.insert(0, sys.argv[1])
import secrets, numpy as np, qlinear
np.random.default_rng(0)  # the modules numpy loads lazily, while still root
qlinear._lib.load()
# Then the other uid (its interpreter and libraries may live where it
# could not read them), at nice 19 under SCHED_IDLE.
uid = int(os.environ["QL_BENCH_UID"])
os.setgroups([]); os.setgid(0); os.setuid(uid); os.chdir("/")
os.nice(19)
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    pass
kind, addr = sys.argv[2], sys.argv[3]
if kind == "flood":
    c = qlinear.Client(addr)
    c.hold(sys.argv[4])
    x = np.ones((8, %(K)d), np.float32)
    end = time.time() + float(sys.argv[5])
    sys.stdout.write("ok\n"); sys.stdout.flush()
    while time.time() < end:
        try:
            c.linear(sys.argv[4], x, path="wo")
        except qlinear.QLinearError:
            pass
elif kind == "upload":
    c = qlinear.Client(addr)
    w = np.zeros((1024, 4096), np.float32)  # 16 MiB
    def hold(done, total):
        if done == 0:
            sys.stdout.write("ok\n"); sys.stdout.flush()
            sys.stdin.read()
            os._exit(0)
    try:
        c.load(sys.argv[4], w, format="q8c", progress=hold)
    except qlinear.QLinearError as e:
        sys.stdout.write("refused %%s\n" %% e); sys.stdout.flush()
elif kind == "halfsend":
    path = addr[len("ipc://"):]
    L = 15 << 20
    socks = []
    for i in range(4):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        try:
            s.sendall(bytes([0, 83, 80, 0, 0, 48, 0, 0, 1]) +
                      struct.pack(">Q", L))
            s.sendall(b"\x80" + bytes(L - 2))
            socks.append(s)
        except OSError:
            pass
    sys.stdout.write("ok %%d\n" %% len(socks)); sys.stdout.flush()
    sys.stdin.read()
elif kind == "squat":
    c = qlinear.Client(addr)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((%(N)d, %(K)d), np.float32) * 0.05
    out = []
    for name in sys.argv[4:]:
        try:
            c.load(name, w, format="q8c")
            out.append("loaded")
        except qlinear.QLinearError as e:
            out.append(qlinear.err_name(e.code))
    sys.stdout.write(" ".join(out) + "\n"); sys.stdout.flush()
    sys.stdin.read()
''' % {"N": N, "K": K}


class Daemon:
    def __init__(self, binary, args):
        self.dir = tempfile.mkdtemp(prefix="ql-bench-tenancy-")
        os.chmod(self.dir, 0o750)
        self.log = open(self.dir + ".log", "w")
        self.proc = subprocess.Popen(
            [binary, "--socket-dir", self.dir, "--log-level", "notice"] +
            args, stderr=self.log)
        self.address = "ipc://%s/qlineard.sock" % self.dir
        for _ in range(200):
            if os.path.exists(os.path.join(self.dir, "session.sock")):
                break
            time.sleep(0.05)
        time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def attacker(uid, kind, addr, *args):
    return subprocess.Popen(
        [sys.executable, "-c", ATTACK, os.path.join(TOP, "client", "python"),
         kind, addr] + [str(a) for a in args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, QL_BENCH_UID=str(uid)))


def measure(c, name, x, want, n):
    """p50, p99 (microseconds), answers equal to want, refusals."""
    t = []
    same = refused = 0
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            y = c.linear(name, x, path="wo")
        except qlinear.QLinearError:
            refused += 1
            continue
        t.append(time.perf_counter() - t0)
        same += bool(np.array_equal(y, want))
    t.sort()
    if not t:
        return float("nan"), float("nan"), 0, refused
    return (t[len(t) // 2] * 1e6, t[min(len(t) - 1, int(len(t) * 0.99))] * 1e6,
            same, refused)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qlineard", default=os.path.join(TOP, "qlineard"))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--uid", type=int, default=65534)
    ap.add_argument("--uid-share", type=int, default=50)
    o = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_tenancy: run as root (the attacker is another uid)")
    d = Daemon(o.qlineard, ["--uid-share", str(o.uid_share),
                            "--max-queue", "64",
                            "--max-buffered-bytes", "64M",
                            "--max-message-bytes", "16M",
                            "--max-upload-bytes", "160M"])
    rows = []
    try:
        c = qlinear.Client(d.address)
        qv = c.hello().quantizer_version
        rng = np.random.default_rng(1)
        w = (rng.standard_normal((N, K), np.float32) * 0.05)
        dg = qlinear.source_digest(w, format="q8c", quantizer_version=qv)
        name = "victim/l0/q8c.src-" + dg.hex()
        c.load(name, w, format="q8c")
        x = rng.standard_normal((1, K), np.float32)
        want = c.linear(name, x, path="wo")
        for _ in range(200):
            c.linear(name, x, path="wo")
        rows.append(("idle",) + measure(c, name, x, want, o.requests) +
                    ("",))

        ps = [attacker(o.uid, "flood", d.address, name, 600)
              for _ in range(o.procs)]
        for p in ps:
            p.stdout.readline()
        time.sleep(0.5)
        rows.append(("queue flood, %d procs" % o.procs,) +
                    measure(c, name, x, want, o.requests) + ("",))
        for p in ps:
            p.kill()
            p.wait()

        ups = []
        while len(ups) < 12:
            p = attacker(o.uid, "upload", d.address, "squat/up%d" % len(ups))
            line = p.stdout.readline().strip()
            ups.append(p)
            if line != "ok":
                break
        big = np.zeros((3072, 4096), np.float32)  # 48 MiB
        t0 = time.perf_counter()
        try:
            c.load("victim/big", big, format="q8c")
            note = "victim's 48 MiB load ok in %.1f ms; attacker kept %d x 16 MiB" % (
                (time.perf_counter() - t0) * 1e3, len(ups) - 1)
        except qlinear.QLinearError as e:
            note = "victim's load refused: %s" % e
        rows.append(("uploads held",) + measure(c, name, x, want,
                                                o.requests) + (note,))
        for p in ups:
            p.kill()
            p.wait()

        p = attacker(o.uid, "halfsend", d.address)
        kept = p.stdout.readline().strip()
        chunky = np.zeros((1024, 1024), np.float32)
        try:
            c.load("victim/chunky", chunky, format="q8c")
            note = "victim's 4 MiB chunk ok; attacker's frames %s" % kept
        except qlinear.QLinearError as e:
            note = "victim's chunk refused: %s" % e
        rows.append(("frames half sent",) + measure(c, name, x, want,
                                                    o.requests) + (note,))
        p.kill()
        p.wait()

        w2 = rng.standard_normal((N, K), np.float32) * 0.05
        dg2 = qlinear.source_digest(w2, format="q8c", quantizer_version=qv)
        cname = "victim/l1/q8c.src-" + dg2.hex()
        p = attacker(o.uid, "squat", d.address, cname, "victim/plain")
        got = p.stdout.readline().strip()
        c.load(cname, w2, format="q8c")
        y2 = c.linear(cname, x, path="wo")
        want2 = np.asarray(x, np.float64) @ np.asarray(w2, np.float64).T
        rel = float(np.abs(y2 - want2).max() / np.abs(want2).max())
        try:
            c.hold("victim/plain")
            plain = "held (squatted!)"
        except qlinear.QLinearError as e:
            plain = qlinear.err_name(e.code)
        rows.append(("squatting",) + measure(c, name, x, want, o.requests) +
                    ("attacker: %s; victim's content name loads, rel. error "
                     "%.4f vs float; hold of the squatted plain name: %s"
                     % (got, rel, plain),))
        p.kill()
        p.wait()
    finally:
        d.stop()
    print("machine: %s; weight q8c %dx%d, 1-row requests, %d each, "
          "uid_share %d%%" % (os.uname().machine, N, K, o.requests,
                              o.uid_share))
    print("| phase | p50 us | p99 us | answers byte-exact | refused | notes |")
    print("|---|---|---|---|---|---|")
    for ph, p50, p99, same, refused, note in rows:
        print("| %s | %.0f | %.0f | %d | %d | %s |" % (ph, p50, p99, same,
                                                      refused, note))


if __name__ == "__main__":
    main()
