"""The binding against a real daemon: every call of the API, each dtype,
both paths of every format against the format's error model, regions,
linear_multi, and the errors the daemon and the library report."""

import ctypes
import os

import numpy as np
import pytest

import qlinear
from conftest import nmse
from quant import expected_nmse


def bf16(a):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def from_bf16(u):
    return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)


def test_hello(client):
    h = client.hello()
    assert h.protocol_version == 1
    assert h.quantizer_version == 2
    assert h.max_message_bytes > 0
    assert len(h.instance_id) == 16
    assert any(d.kind == "cpu" for d in h.devices)
    assert h == client.hello_info or h.instance_id == \
        client.hello_info.instance_id


def test_default_address(monkeypatch):
    monkeypatch.setenv("QLINEAR_ADDRESS", "ipc:///tmp/somewhere/q.sock")
    assert qlinear.default_address() == "ipc:///tmp/somewhere/q.sock"
    monkeypatch.delenv("QLINEAR_ADDRESS")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    assert qlinear.default_address() == \
        "ipc:///run/user/4242/qlinear/qlineard.sock"


def test_connect_refused(tmp_path):
    with pytest.raises(qlinear.QLinearError) as e:
        qlinear.Client("ipc://%s/none/qlineard.sock" % tmp_path)
    assert e.value.code == qlinear.QL_ECONNECT
    assert e.value.name == "QL_ECONNECT"


def test_errors_match_library():
    for name, code in qlinear.client._lib.ERRORS.items():
        assert qlinear.err_name(code) == name
        assert qlinear.strerror(code) != "unknown error"
    # One past the last code is unknown: the list here is complete.
    last = min(qlinear.client._lib.ERRORS.values())
    assert qlinear.err_name(last - 1) == "QL_EUNKNOWN"


def test_formats():
    assert qlinear.parse_format("q4g128") == (1, 128, False)
    assert qlinear.parse_format("q8c") == (2, 0, False)
    assert qlinear.parse_format("q8b64a") == (3, 64, True)
    assert qlinear.parse_format("f8r") == (4, 0, False)
    for bad in ("q4g100", "q4g128a", "q8", "int4", "", None):
        with pytest.raises(qlinear.QLinearError) as e:
            qlinear.parse_format(bad)
        assert e.value.code == qlinear.QL_EFORMAT
    for f in ("q4g32", "q8c", "q8b256", "q8b32a", "f8r"):
        assert qlinear.format_name(*qlinear.parse_format(f)) == f


def test_load_list_lookup_unload(client, rng):
    w = rng.standard_normal((48, 96)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    progress = []
    info = client.load("py/lload", w, b, format="q4g32",
                       progress=lambda done, total: progress.append(
                           (done, total)))
    assert info.shared is False
    assert (info.name, info.format, info.n, info.k) == \
        ("py/lload", "q4g32", 48, 96)
    assert info.has_bias and info.devices == ["cpu"]
    assert len(info.digest) == 64 and info.bytes_resident > 0
    assert progress[0][0] == 0 and progress[-1][0] == progress[-1][1] > 0
    again = client.load("py/lload", w, b, format="q4g32")
    assert again.shared is True and again.digest == info.digest
    assert [i for i in client.list() if i.name == "py/lload"][0].digest == \
        info.digest
    assert client.lookup("py/lload").digest == info.digest
    with pytest.raises(qlinear.QLinearError) as e:
        client.load("py/lload", w + 1, b, format="q4g32")
    assert e.value.code == qlinear.QL_EEXIST and e.value.message
    client.unload("py/lload")
    with pytest.raises(qlinear.QLinearError) as e:
        client.lookup("py/lload")
    assert e.value.code == qlinear.QL_ENOTFOUND


def test_load_devices(client, rng):
    w = rng.standard_normal((16, 64)).astype(np.float32)
    info = client.load("py/placed", w, format="q8c", devices=["cpu"])
    assert info.devices == ["cpu"]
    again = client.load_packed("py/placed8", "q8c", 2, 4,
                               np.ones((2, 4), np.int8),
                               np.ones(2, np.float32), devices="cpu")
    assert again.devices == ["cpu"]
    for devices, code in ((["cuda:7"], qlinear.QL_ENOTFOUND),
                          (["cpu", "cpu"], qlinear.QL_EINVAL),
                          ("cpu,", qlinear.QL_EINVAL)):
        with pytest.raises(qlinear.QLinearError) as e:
            client.load("py/unplaced", w, format="q8c", devices=devices)
        assert e.value.code == code, devices
    assert "py/unplaced" not in [i.name for i in client.list()]
    client.unload("py/placed")
    client.unload("py/placed8")


@pytest.mark.parametrize("fmt,path", [
    ("q8c", "wo"), ("q8c", "aq"), ("q4g128", "wo"), ("q4g128", "aq"),
    ("q4g32", "aq"), ("f8r", "wo"), ("f8r", "aq"), ("q8b64", "wo"),
    ("q8b128a", "wo")])
def test_linear_accuracy(client, rng, fmt, path):
    """Each format and path against its error model (quant.py): the
    measured NMSE within 0.5-1.5x of what its quantization should add."""
    n, k, m = 96, 512, 24
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    name = "py/acc/%s" % fmt
    client.load(name, w, b, format=fmt)
    y, li = client.linear(name, x, path=path, info=True)
    assert li.path == path and li.impl
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    ratio = nmse(y, ref) / expected_nmse(x, w, fmt, path, b)
    assert 0.5 < ratio < 1.5, (fmt, path, ratio)


def test_dtypes(client, rng):
    """f16 and bf16 activations give the f32 result within their rounding."""
    n, k, m = 64, 256, 5
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    client.load("py/dt", w, format="q8c")
    y32 = client.linear("py/dt", x, path="wo")
    y16 = client.linear("py/dt", x.astype(np.float16), path="wo")
    assert y16.dtype == np.float16
    scale = np.abs(y32).max()
    x16err = np.abs(x.astype(np.float16).astype(np.float64) @ w.T -
                    x.astype(np.float64) @ w.T).max()
    assert np.abs(y16.astype(np.float32) - y32).max() < \
        x16err + 2e-3 * scale
    yb = client.linear("py/dt", bf16(x), dtype="bf16", path="wo")
    assert yb.dtype == np.uint16
    xberr = np.abs(from_bf16(bf16(x)).astype(np.float64) @ w.T -
                   x.astype(np.float64) @ w.T).max()
    assert np.abs(from_bf16(yb) - y32).max() < xberr + 1e-2 * scale
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear("py/dt", x.astype(np.float64))
    assert e.value.code == qlinear.QL_EDTYPE
    # A bf16 weight upload (uint16 bits): q8c keeps TorchAO's f32 scales,
    # q4g its bf16 ones.
    info = client.load("py/dt16", bf16(w), dtype="bf16", format="q8c")
    assert info.scale_dtype == "f32"
    info = client.load("py/dt16/q4g", bf16(w), dtype="bf16", format="q4g32")
    assert info.scale_dtype == "bf16"


def test_shapes(client, rng):
    w = rng.standard_normal((32, 64)).astype(np.float32)
    client.load("py/shape", w, format="q8c")
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = client.linear("py/shape", x, path="wo")
    assert y.shape == (2, 3, 32)
    np.testing.assert_array_equal(y[1, 2], client.linear("py/shape", x[1, 2],
                                                         path="wo"))
    # A strided x is made contiguous first.
    xt = np.asfortranarray(x[0])
    np.testing.assert_array_equal(client.linear("py/shape", xt, path="wo"),
                                  y[0])
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear("py/shape", x[..., :63])
    assert e.value.code == qlinear.QL_ESHAPE


def test_inline_and_region_agree(client, rng):
    """The same request through messages, the scratch region and the
    caller's own regions gives the same bytes."""
    n, k, m = 256, 384, 40
    w = rng.standard_normal((n, k)).astype(np.float32)
    client.load("py/via", w, format="q4g128")
    x = rng.standard_normal((m, k)).astype(np.float32)
    y_inline = client.linear("py/via", x, via="inline", path="aq")
    y_scratch = client.linear("py/via", x, via="region", path="aq")
    np.testing.assert_array_equal(y_inline, y_scratch)
    with client.region(1 << 20) as r:
        xr = r.ndarray((m, k), np.float32)
        xr[:] = x
        yr = r.ndarray((m, n), np.float32, offset=m * k * 4)
        out = client.linear("py/via", xr, out=yr, path="aq")
        assert out is yr
        np.testing.assert_array_equal(yr, y_inline)
        # x in a region, y not: y is staged.
        np.testing.assert_array_equal(client.linear("py/via", xr, path="aq"),
                                      y_inline)
        s = client.stats()
        assert s.regions >= 1 and s.region_bytes >= 1 << 20
    assert r.closed
    with pytest.raises(qlinear.QLinearError):
        r.ndarray((1,))


def test_region_limits(client):
    with client.region(4096) as r:
        assert r.size == 4096 and r.id != 0
        buf = r.buffer()
        assert len(bytes(buf)) == 4096 and bytes(buf) == bytes(4096)
        with pytest.raises(qlinear.QLinearError) as e:
            r.ndarray((1025,), np.float32)
        assert e.value.code == qlinear.QL_EINVAL
        with pytest.raises(qlinear.QLinearError):
            r.ndarray((2,), np.float32, offset=2)
    with pytest.raises(qlinear.QLinearError) as e:
        client.region(0)
    assert e.value.code == qlinear.QL_EINVAL


def test_large_tensor_beyond_message_cap(daemon, rng):
    """A result larger than a small message cap still works through
    regions (and is refused inline, locally, with QL_ETOOBIG)."""
    import qlinear.client as qc
    c = qlinear.Client(daemon.address)
    try:
        n, k = 64, 64
        w = rng.standard_normal((n, k)).astype(np.float32)
        c.load("py/big", w, format="q8c")
        m = (c.hello_info.max_message_bytes // (n * 4)) + 16
        x = np.ones((m, k), dtype=np.float32)
        with pytest.raises(qlinear.QLinearError) as e:
            c.linear("py/big", x, via="inline")
        assert e.value.code == qlinear.QL_ETOOBIG
        y = c.linear("py/big", x, via="region", path="wo")
        assert y.shape == (m, n)
        np.testing.assert_array_equal(y[0], y[-1])
        assert isinstance(c, qc.Client)
    finally:
        c.close()


def test_linear_multi(client, rng):
    k, m = 128, 6
    ws = [rng.standard_normal((n, k)).astype(np.float32)
          for n in (64, 32, 48)]
    names = ["py/multi/%d" % i for i in range(3)]
    for name, w in zip(names, ws):
        client.load(name, w, format="q4g64")
    x = rng.standard_normal((2, m // 2, k)).astype(np.float32)
    ys, infos = client.linear_multi(names, x, path="wo", info=True)
    assert [y.shape for y in ys] == [(2, 3, 64), (2, 3, 32), (2, 3, 48)]
    assert all(i.path == "wo" for i in infos)
    for name, y in zip(names, ys):
        np.testing.assert_array_equal(y, client.linear(name, x, path="wo"))
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear_multi(names + ["py/nothere"], x)
    assert e.value.code == qlinear.QL_ENOTFOUND


def test_load_packed_q8c_exact(client, rng):
    """A TorchAO-layout int8 weight imports unchanged: the weight-only
    result is the fp64 product with the dequantized weight, within float32
    accumulation error."""
    n, k, m = 40, 200, 7
    q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    s = (rng.random(n).astype(np.float32) + 0.5) / 100
    b = rng.standard_normal(n).astype(np.float32)
    info = client.load_packed("py/packed", "q8c", n, k, q, s, bias=b)
    assert info.format == "q8c" and info.scale_dtype == "f32"
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = client.linear("py/packed", x, path="wo")
    wd = q.astype(np.float64) * s[:, None].astype(np.float64)
    ref = x.astype(np.float64) @ wd.T + b
    bound = 2 * k * 2.0 ** -23 * (np.abs(x) @ np.abs(wd).T + np.abs(b))
    assert np.all(np.abs(y - ref) <= bound)
    with pytest.raises(qlinear.QLinearError) as e:
        client.load_packed("py/packed2", "q8c", n, k, q, s[:-1])
    assert e.value.code == qlinear.QL_ESHAPE and "scale" in e.value.message


def test_load_packed_f8r_and_q4g(client, rng):
    n, k = 16, 64
    qf = rng.integers(0, 0x7F, size=(n, k), dtype=np.uint8)  # positive e4m3
    client.load_packed("py/packed/f8r", "f8r", n, k, qf,
                       np.ones(n, np.float32))
    q4 = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    g = k // 32
    client.load_packed("py/packed/q4g", "q4g32", n, k, q4,
                       (bf16(np.full((g, n), 0.01, np.float32)), "bf16"),
                       (bf16(np.zeros((g, n), np.float32)), "bf16"))
    assert client.lookup("py/packed/q4g").scale_dtype == "bf16"
    y = client.linear("py/packed/f8r", np.ones((1, k), np.float32),
                      path="wo")
    assert np.all(y > 0)


def test_export_weight(client, daemon, rng):
    """export_weight() reads a weight back as load_packed() takes it: the
    same digest again, bf16 scales tagged, and only for a holder."""
    n, k = 24, 96
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    for fmt, scale_dtype in (("q4g32", "bf16"), ("q8c", None),
                             ("q8b32a", "f16"), ("f8r", None)):
        name = "py/export/" + fmt
        info = client.load(name, w, b, format=fmt, scale_dtype=scale_dtype)
        e = client.export_weight(name)
        assert e.info.digest == info.digest and e.format == fmt
        assert (e.n, e.k) == (n, k)
        assert e.qdata.shape == (n, k // 2 if fmt.startswith("q4g") else k)
        assert e.bias.dtype == np.float32 and np.array_equal(e.bias, b)
        assert (e.zero is not None) == (fmt in ("q4g32", "q8b32a"))
        again = client.load_packed(name + ".again", *e.load_args())
        assert again.digest == info.digest
        x = rng.standard_normal((3, k)).astype(np.float32)
        assert np.array_equal(client.linear(name, x, path="wo"),
                              client.linear(name + ".again", x, path="wo"))
    assert client.export_weight("py/export/q4g32").scale.dtype == np.uint16
    with qlinear.Client(daemon.address) as other:
        with pytest.raises(qlinear.QLinearError) as e:
            other.export_weight("py/export/q8c")
        assert e.value.code == qlinear.QL_EPERM
        with pytest.raises(qlinear.QLinearError) as e:
            other.export_weight("py/export/none")
        assert e.value.code == qlinear.QL_ENOTFOUND


def test_daemon_errors(client, rng):
    w = rng.standard_normal((8, 32)).astype(np.float32)
    for name, code in (("../x", qlinear.QL_ENAME), ("/abs", qlinear.QL_ENAME),
                       ("", qlinear.QL_ENAME)):
        with pytest.raises(qlinear.QLinearError) as e:
            client.load(name, w, format="q8c")
        assert e.value.code == code, name
    bad = w.copy()
    bad[3, 4] = np.nan
    with pytest.raises(qlinear.QLinearError) as e:
        client.load("py/nan", bad, format="q8c")
    assert e.value.code == qlinear.QL_ENONFINITE
    client.load("py/err", w, format="q8b32")
    x = np.ones((1, 32), np.float32)
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear("py/err", x, path="aq")
    assert e.value.code == qlinear.QL_ENOTSUP
    x[0, 1] = np.inf
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear("py/err", x)
    assert e.value.code == qlinear.QL_ENONFINITE
    with pytest.raises(qlinear.QLinearError) as e:
        client.unload("py/never")
    assert e.value.code == qlinear.QL_ENOTFOUND
    with pytest.raises(qlinear.QLinearError) as e:
        client.linear("py/err", np.ones((1, 32), np.float32), path="fast")
    assert e.value.code == qlinear.QL_EINVAL
    # An error leaves the client usable.
    assert client.linear("py/err", np.ones((1, 32), np.float32)).shape == \
        (1, 8)


def test_stats(client, rng):
    w = rng.standard_normal((16, 32)).astype(np.float32)
    client.load("py/stats", w, format="q8c")
    for _ in range(3):
        client.linear("py/stats", np.ones((2, 32), np.float32), path="wo")
    s = client.stats()
    assert s.weights >= 1 and s.sessions >= 1 and s.uptime_ns > 0
    ws = [p for p in s.per_weight if p.weight == "py/stats"]
    assert len(ws) == 1
    assert ws[0].device == "cpu" and ws[0].requests == 3 and ws[0].rows == 6
    assert ws[0].wo_batches >= 1 and ws[0].aq_batches == 0
    assert sum(ws[0].kernel_hist) == ws[0].batches
    assert s.devices[0].device == "cpu" and s.devices[0].bytes_resident > 0
    # this session's own uid, and only it, with nothing queued now
    assert [u.uid for u in s.users] == [os.getuid()]
    assert s.users[0].sessions >= 1 and s.users[0].queued_requests == 0


def test_session_end_frees(daemon, rng):
    """A weight lives while a session holds it; close() drops the hold."""
    w = rng.standard_normal((8, 32)).astype(np.float32)
    with qlinear.Client(daemon.address) as a:
        a.load("py/held", w, format="q8c")
        with qlinear.Client(daemon.address) as b:
            assert b.lookup("py/held").n == 8
            with pytest.raises(qlinear.QLinearError) as e:
                b.unload("py/held")  # only a's hold
            assert e.value.code == qlinear.QL_EPERM
    with qlinear.Client(daemon.address) as c:
        with pytest.raises(qlinear.QLinearError) as e:
            c.lookup("py/held")
        assert e.value.code == qlinear.QL_ENOTFOUND
    with pytest.raises(qlinear.QLinearError) as e:
        a.hello()
    assert e.value.code == qlinear.QL_EINVAL


def test_admin_client(daemon, rng):
    w = rng.standard_normal((8, 32)).astype(np.float32)
    with qlinear.Client(daemon.admin_address, admin=True) as adm:
        info = adm.load("py/stored", w, format="q8c", persistent=True)
        assert info.persistent
        with pytest.raises(qlinear.QLinearError) as e:
            adm.region(4096)
        assert e.value.code in (qlinear.QL_ESESSION, qlinear.QL_EPERM)
    with qlinear.Client(daemon.address) as c:
        assert c.lookup("py/stored").persistent
        with pytest.raises(qlinear.QLinearError) as e:
            c.load("py/other", w, format="q8c", persistent=True)
        assert e.value.code == qlinear.QL_EPERM
    with qlinear.Client(daemon.admin_address, admin=True) as adm:
        adm.unload("py/stored")


def test_raw_pointer_api(client, rng):
    w = rng.standard_normal((16, 32)).astype(np.float32)
    client.load("py/raw", w, format="q8c")
    x = rng.standard_normal((3, 32)).astype(np.float32)
    y = np.zeros((3, 16), np.float32)
    li = client.linear_raw("py/raw", "f32", 3, 32, x.ctypes.data, 16,
                           y.ctypes.data, path="wo")
    assert li.path == "wo"
    np.testing.assert_array_equal(y, client.linear("py/raw", x, path="wo"))
    assert ctypes.sizeof(ctypes.c_int) == 4


def test_threads_share_a_client(client, rng):
    """Calls from several threads at once on one client: each gets its own
    staging region, and its own correct result."""
    import threading
    n, k = 64, 256
    w = rng.standard_normal((n, k)).astype(np.float32)
    client.load("py/threads", w, format="q8c")
    xs = [rng.standard_normal((32 + i, k)).astype(np.float32)
          for i in range(6)]
    want = [client.linear("py/threads", x, path="wo", via="inline")
            for x in xs]
    got = [None] * len(xs)
    errors = []

    def work(i):
        try:
            for _ in range(5):
                got[i] = client.linear("py/threads", xs[i], path="wo",
                                       via="region")
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,))
               for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w_ in zip(got, want):
        np.testing.assert_array_equal(g, w_)
    assert 1 <= len(client._scratch_all) <= len(xs)
    # No rows: no request.
    assert client.linear("py/threads", np.empty((0, k), np.float32)).shape \
        == (0, n)


def test_packed_and_explicit_dtypes_checked(client, rng):
    """An array is never read as another element type: a pair (array,
    name) or an explicit dtype= must agree with the array (or, for the
    types NumPy lacks, be their integer carrier), else QL_EDTYPE, before
    the library reads shape x size-of-name bytes from it. Big-endian
    arrays are converted, not reinterpreted."""
    n, k = 8, 64
    q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    s = (rng.random(n).astype(np.float32) + 0.5) / 100
    for bad in ((np.zeros(n, np.uint8), "f32"),     # 8 bytes read as 32
                (s, "bf16"), (s.view(np.int32), "f32"), (q, "u8")):
        with pytest.raises(qlinear.QLinearError) as e:
            client.load_packed("py/dt/bad", "q8c", n, k, q, bad)
        assert e.value.code == qlinear.QL_EDTYPE, bad
    client.load_packed("py/dt/native", "q8c", n, k, q, s)
    client.load_packed("py/dt/swapped", "q8c", n, k, q, s.astype(">f4"))
    x = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_array_equal(client.linear("py/dt/native", x),
                                  client.linear("py/dt/swapped", x))
    x16 = x.astype(np.float16)
    for arr, dt in ((x16, "bf16"), (x16.view(np.uint16), "f16"),
                    (x.view(np.uint32), "f32"), (x.astype(">f4"), "f32")):
        with pytest.raises(qlinear.QLinearError) as e:
            client.linear("py/dt/native", arr, dtype=dt)
        assert e.value.code == qlinear.QL_EDTYPE, (arr.dtype, dt)
        with pytest.raises(qlinear.QLinearError) as e:
            client.load("py/dt/w", np.zeros((n, k), arr.dtype), dtype=dt)
        assert e.value.code == qlinear.QL_EDTYPE, (arr.dtype, dt)
    # bf16 bits in uint16 (or int16) stay accepted
    y = client.linear("py/dt/native", bf16(x), dtype="bf16")
    assert y.dtype == np.uint16
    y2 = client.linear("py/dt/native", bf16(x).view(np.int16), dtype="bf16")
    np.testing.assert_array_equal(y, y2.view(np.uint16))


def test_close_waits_for_calls_in_flight(daemon, rng):
    """close() on one thread while others are in calls (staged through the
    scratch region, which close unmaps): the calls end first, later ones
    raise QL_EINVAL, and nothing touches unmapped memory."""
    import threading
    c = qlinear.Client(daemon.address)
    n, k = 256, 1024
    c.load("py/closing", rng.standard_normal((n, k)).astype(np.float32),
           format="q8c")
    x = rng.standard_normal((64, k)).astype(np.float32)  # 256 KiB: staged
    ref = c.linear("py/closing", x)
    done, errors, bad = [0], [], []
    started = threading.Barrier(4)

    def work():
        started.wait()
        try:
            while True:
                y = c.linear("py/closing", x)
                if not np.array_equal(y, ref):
                    bad.append(1)
                done[0] += 1
        except qlinear.QLinearError as e:
            errors.append(e.code)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    started.wait()
    while done[0] < 20:
        threading.Event().wait(0.001)
    c.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert errors == [qlinear.QL_EINVAL] * 3 and not bad
    assert c.closed


def test_region_close_waits_for_its_users(client, rng):
    """Region.close() while another thread's call uses the region returns
    only after that call: the library's calls are slowed here so that the
    close surely starts during one."""
    import threading
    import time
    n, k, m = 64, 256, 16
    client.load("py/rclose", rng.standard_normal((n, k)).astype(np.float32),
                format="q8c")
    r = client.region(1 << 16)
    xr = r.ndarray((m, k))
    xr[:] = rng.standard_normal((m, k))
    ref = client.linear("py/rclose", np.array(xr))
    real, inside, ended = client._lib, threading.Event(), []

    class Slow:
        def __getattr__(self, name):
            return getattr(real, name)

        def ql_linear_region(self, *args):
            inside.set()
            time.sleep(0.3)
            rv = real.ql_linear_region(*args)
            ended.append(time.monotonic())
            return rv

    client._lib = Slow()
    try:
        out = []
        t = threading.Thread(
            target=lambda: out.append(client.linear("py/rclose", xr)))
        t.start()
        assert inside.wait(10)
        r.close()
        closed = time.monotonic()
        t.join(30)
        assert ended and ended[0] <= closed
        np.testing.assert_array_equal(out[0], ref)
        assert r.closed
    finally:
        client._lib = real


def test_dropped_regions_and_clients_are_freed(daemon, rng):
    """A region dropped without close() is destroyed when collected (a
    session holds at most 64); a client dropped after staging through its
    scratch region is collected, its session closed."""
    import gc
    import weakref
    c = qlinear.Client(daemon.address)
    for _ in range(100):
        r = c.region(1 << 16)
        del r
    assert c.stats().regions <= 2
    c.load("py/drop", rng.standard_normal((64, 1024)).astype(np.float32),
           format="q8c")
    c.linear("py/drop", np.ones((16, 1024), np.float32))  # staged: scratch
    ref = weakref.ref(c)
    del c
    assert ref() is None
    gc.collect()


def test_progress_exception_is_raised(client, rng):
    """An exception raised by a progress callback is raised by load() (the
    upload cannot be stopped midway), and the weight is not held."""
    w = rng.standard_normal((64, 256)).astype(np.float32)

    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop()

    with pytest.raises(Stop):
        client.load("py/progress", w, format="q8c", progress=progress)
    held = [i.name for i in client.list()]
    assert "py/progress" not in held
    calls = []
    client.load("py/progress", w, format="q8c",
                progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1]
