"""The ctypes declarations of _lib.py against the C header itself.

A C program generated from those declarations prints the header's
sizeof/offsetof of every struct and field, and the value of every constant
and error code; each must equal what ctypes computes. A field added, moved
or retyped in qlinear.h without the same change in _lib.py fails here.
"""

import ctypes
import os
import subprocess

import pytest

from qlinear import _lib
from conftest import TOP


def _c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>",
             "#include <qlinear/qlinear.h>",
             "#include <qlinear/qlinear_ckpt.h>", "int main(void) {"]
    for st in _lib.STRUCTS:
        c = st.__name__
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (c, c))
        for field, _ in st._fields_:
            lines.append('printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), '
                         'sizeof(((%s *)0)->%s));'
                         % (c, field, c, field, c, field))
    for name in _lib.C_CONSTANTS + list(_lib.ERRORS):
        lines.append('printf("%s %%lld\\n", (long long)(%s));' % (name, name))
    for enum in ("ql_dtype", "ql_format", "ql_path", "ql_zero_kind"):
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (enum, enum))
    lines.append('printf("QL_ERRNO_MIN_ %d\\n", QL_ERRNO_MIN_);')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """What the C compiler says about the source tree's header, as
    {key: [numbers]}."""
    d = tmp_path_factory.mktemp("layout")
    src = d / "layout.c"
    src.write_text(_c_program())
    cc = os.environ.get("QL_CC") or "cc"
    # QL_CC may carry flags ("gcc -std=gnu11"): split it as make would.
    cmd = cc.split() + ["-std=c11", "-Wall", "-Werror",
                        "-I", os.path.join(TOP, "client", "include"),
                        "-I", os.path.join(TOP, "client", "include",
                                           "qlinear"),
                        "-I", os.path.join(TOP, "proto"),
                        "-o", str(d / "layout"), str(src)]
    subprocess.run(cmd, check=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True,
                         text=True).stdout
    table = {}
    for line in out.splitlines():
        key, *nums = line.split()
        table[key] = [int(v) for v in nums]
    return table


@pytest.mark.parametrize("st", _lib.STRUCTS, ids=lambda s: s.__name__)
def test_struct_layout(c_layout, st):
    name = st.__name__
    assert c_layout[name] == [ctypes.sizeof(st)], "sizeof(%s)" % name
    for field, ctype in st._fields_:
        off = getattr(st, field).offset
        assert c_layout["%s.%s" % (name, field)] == \
            [off, ctypes.sizeof(ctype)], "%s.%s" % (name, field)


def test_constants(c_layout):
    for name in _lib.C_CONSTANTS:
        assert c_layout[name] == [getattr(_lib, name)], name
    for name, code in _lib.ERRORS.items():
        assert c_layout[name] == [code], name
    # Every code of the C list is in ERRORS (codes run from -1 down).
    assert len(_lib.ERRORS) == -c_layout["QL_ERRNO_MIN_"][0] - 1
    for enum in ("ql_dtype", "ql_format", "ql_path", "ql_zero_kind"):
        assert c_layout[enum] == [ctypes.sizeof(_lib.c_enum)], enum


def test_find_library_order(tmp_path, monkeypatch):
    """An explicit path wins, then QLINEAR_LIB, then pkg-config's libdir."""
    built = _lib.find_library()  # what the test run uses (QLINEAR_LIB)
    assert _lib.find_library("/x/libqlinear.so.0") == "/x/libqlinear.so.0"
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libqlinear.so.0").symlink_to(os.path.abspath(built))
    pcdir = tmp_path / "pkgconfig"
    pcdir.mkdir()
    (pcdir / "qlinear.pc").write_text(
        "libdir=%s\nName: qlinear\nDescription: test\nVersion: 0\n"
        "Libs: -L${libdir} -lqlinear\n" % libdir)
    monkeypatch.delenv("QLINEAR_LIB")
    monkeypatch.setenv("PKG_CONFIG_PATH", str(pcdir))
    found = _lib.find_library()
    assert found == str(libdir / "libqlinear.so.0")
    assert _lib.load(found).ql_strerror(-3) == b"not found"
