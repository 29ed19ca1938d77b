"""pip install of the package from a source tree after the in-tree build:
the installed package finds libqlinear with no environment variable
(setup.py records the build tree's library in qlinear/_paths.py)."""

import os
import shutil
import site
import subprocess
import sys

import qlinear._lib

PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_pip_install_finds_library(daemon, tmp_path):
    built = os.path.realpath(qlinear._lib.find_library())
    assert os.path.isabs(built) and os.path.exists(built)
    # A source tree laid out as deploy/run leaves it: <top>/client/python
    # and the in-tree build's <top>/.libs (here the build of this run).
    top = tmp_path / "top"
    shutil.copytree(PKG, str(top / "client" / "python"),
                    ignore=shutil.ignore_patterns("tests", "__pycache__",
                                                  "build", "*.egg-info",
                                                  "_paths.py"))
    os.symlink(os.path.dirname(built), str(top / ".libs"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    # The running interpreter's packages (pip, setuptools, NumPy): no
    # network is needed, and the base of a venv may lack them.
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig."
                              "get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "outer.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("QLINEAR_LIB", "PYTHONPATH", "QLINEAR_CUDA_LIB",
                        "QLINEAR_ADDRESS")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index",
                        str(top / "client" / "python")],
                       env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    script = ("import sys, qlinear, qlinear._lib as L\n"
              "c = qlinear.Client(sys.argv[1])\n"
              "print(qlinear.__file__); print(L.find_library())\n"
              "print(c.hello().protocol_version); c.close()\n")
    r = subprocess.run([py, "-c", script, daemon.address], env=env,
                       capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    where, lib, proto = r.stdout.split()
    assert where.startswith(str(venv)), where
    assert os.path.realpath(lib) == built
    assert int(proto) == qlinear._lib.QL_PROTOCOL_VERSION
