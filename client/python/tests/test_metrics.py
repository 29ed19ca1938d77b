"""The daemon's /metrics (daemon/serve/metrics.c, docs/operations.md "Metrics"),
parsed whole by prometheus_client's own parser: the families and their
types, each path's latency histograms (cumulative buckets ending in +Inf,
the same bounds everywhere, counts that match the requests sent), no
weight label by default, and with metrics_weights a bounded count of
series, the weights with the most requests named.

These tests start a daemon of their own with metrics_listen on a free
loopback port and metrics_weights in a config file, which a SIGHUP
re-reads (the option is live).
"""

import os
import signal
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import qlinear
from conftest import Daemon

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
N_WEIGHTS = 32
PER_WEIGHT = ("qlinear_weight_requests", "qlinear_weight_rows",
              "qlinear_weight_batches", "qlinear_weight_kernel_seconds",
              "qlinear_weight_queue_seconds", "qlinear_weight_resident_bytes")

# Every family served with no weight named, and its type: a family added
# to the daemon must be added here (and to docs/operations.md).
FAMILIES = {
    "qlinear_build_info": "gauge",
    "qlinear_uptime_seconds": "gauge",
    "qlinear_requests": "counter",
    "qlinear_ring_requests": "counter",
    "qlinear_errors": "counter",
    "qlinear_received_bytes": "counter",
    "qlinear_sent_bytes": "counter",
    "qlinear_sessions": "gauge",
    "qlinear_regions": "gauge",
    "qlinear_region_bytes": "gauge",
    "qlinear_rings": "gauge",
    "qlinear_connections": "gauge",
    "qlinear_connections_accepted": "counter",
    "qlinear_connections_closed": "counter",
    "qlinear_uploads_in_progress": "gauge",
    "qlinear_weights": "gauge",
    "qlinear_resident_bytes": "gauge",
    "qlinear_persistent_weights": "gauge",
    "qlinear_linear_in_flight": "gauge",
    "qlinear_queued_bytes": "gauge",
    "qlinear_device_info": "gauge",
    "qlinear_device_up": "gauge",
    "qlinear_device_requests": "counter",
    "qlinear_device_rows": "counter",
    "qlinear_device_batches": "counter",
    "qlinear_device_kernel_seconds": "counter",
    "qlinear_device_queue_seconds": "counter",
    "qlinear_device_batches_pending": "gauge",
    "qlinear_device_weights": "gauge",
    "qlinear_device_weight_bytes": "gauge",
    "qlinear_device_budget_bytes": "gauge",
    "qlinear_format_weights": "gauge",
    "qlinear_format_weight_bytes": "gauge",
    "qlinear_format_requests": "counter",
    "qlinear_format_rows": "counter",
    "qlinear_request_duration_seconds": "histogram",
    "qlinear_queue_wait_seconds": "histogram",
    "qlinear_launch_duration_seconds": "histogram",
}
HISTOGRAMS = [f for f, t in FAMILIES.items() if t == "histogram"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MetricsDaemon:
    """A qlineard with metrics_listen on a free port and metrics_weights
    in its config file."""

    def __init__(self, tmp):
        self.conf = os.path.join(tmp, "qlineard.conf")
        self._write(0)
        for attempt in range(5):
            self.port = _free_port()
            try:
                self.d = Daemon(["--config", self.conf, "--metrics-listen",
                                 "127.0.0.1:%d" % self.port])
                return
            except RuntimeError as e:
                # another process took the port in between: try another
                if "in use" not in str(e) or attempt == 4:
                    raise

    def _write(self, n):
        with open(self.conf, "w") as f:
            f.write("[qlineard]\nmetrics_weights = %d\n" % n)

    def set_weights(self, n):
        """metrics_weights = n through the config file and SIGHUP; returns
        once the daemon says it applied it."""
        before = self.d.text().count("reload: ")
        self._write(n)
        os.kill(self.d.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while self.d.text().count("reload: ") == before:
            assert time.monotonic() < deadline, self.d.text()
            time.sleep(0.02)
        assert "metrics_weights = %d" % n in self.d.text().split(
            "reload: ")[-1], self.d.text()

    def get(self, path="/metrics", method="GET", data=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port,
                                                                path),
                                     method=method, data=data)
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def scrape(self):
        status, headers, text = self.get()
        assert status == 200
        assert headers["Content-Type"] == CONTENT_TYPE
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        return text, fams


@pytest.fixture(scope="module")
def md(tmp_path_factory):
    """The daemon, holding N_WEIGHTS weights that got different numbers of
    requests: weight i had i % 7 + 1 decode requests (weight-only) and,
    for every fourth, one of 32 rows (activation-quantized)."""
    m = MetricsDaemon(str(tmp_path_factory.mktemp("metrics")))
    c = qlinear.Client(m.d.address)
    rng = np.random.default_rng(42)
    names = ["metrics/w%02d" % i for i in range(N_WEIGHTS)]
    requests = {}
    sent = {"wo": 0, "aq": 0}
    for i, name in enumerate(names):
        w = rng.standard_normal((16, 64)).astype(np.float32)
        c.load(name, w, format="q8c" if i % 2 else "q4g64")
        x1 = rng.standard_normal((1, 64)).astype(np.float32)
        for _ in range(i % 7 + 1):
            c.linear(name, x1)
        sent["wo"] += i % 7 + 1
        requests[name] = i % 7 + 1
        if i % 4 == 0:
            c.linear(name, rng.standard_normal((32, 64)).astype(np.float32))
            sent["aq"] += 1
            requests[name] += 1
    with pytest.raises(qlinear.QLinearError):
        c.hold("metrics/none")
    yield m, names, requests, sent
    c.close()
    alive = m.d.proc.poll() is None
    log = m.d.text()
    m.d.stop()
    assert alive, "qlineard exited during the tests:\n" + log


def _samples(fams, prefix=None):
    return [s for f in fams.values() for s in f.samples
            if prefix is None or f.name.startswith(prefix)]


def test_http(md):
    m = md[0]
    status, headers, text = m.get()
    assert status == 200 and headers["Content-Type"] == CONTENT_TYPE
    status, headers, text = m.get(method="HEAD")
    assert status == 200 and text == ""
    status, _, text = m.get("/")
    assert status == 404 and "/metrics" in text
    status, headers, _ = m.get(method="POST", data=b"x=1")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_default_families(md, capsys):
    m, names, requests, sent = md
    text, fams = m.scrape()
    assert {n: f.type for n, f in fams.items()} == FAMILIES
    # No weight's name, in a label or anywhere.
    assert not any("weight" in s.labels for s in _samples(fams))
    assert not any(n in text for n in names)

    def value(family, sample=None, **labels):
        got = [s.value for s in fams[family].samples
               if s.name == (sample or family) and s.labels == labels]
        assert len(got) == 1, (family, labels)
        return got[0]

    total = sent["wo"] + sent["aq"]
    assert value("qlinear_weights") == N_WEIGHTS
    assert value("qlinear_device_requests", "qlinear_device_requests_total",
                 device="cpu") == total
    assert value("qlinear_device_weights", device="cpu") == N_WEIGHTS
    fmt = {s.labels["format"]: s.value
           for s in fams["qlinear_format_requests"].samples}
    assert sum(fmt.values()) == total and fmt["q8c"] > 0 and fmt["q4g64"] > 0
    assert value("qlinear_format_weights", format="q8c") == N_WEIGHTS // 2
    assert value("qlinear_errors", "qlinear_errors_total",
                 code="QL_ENOTFOUND") == 1
    assert value("qlinear_device_up", device="cpu") == 1

    # Each histogram, each path: cumulative buckets in order up to +Inf,
    # which is the count; the same bounds everywhere.
    bounds = None
    for h in HISTOGRAMS:
        for path in ("wo", "aq"):
            buckets = [(s.labels["le"], s.value) for s in fams[h].samples
                       if s.name == h + "_bucket" and
                       s.labels["path"] == path]
            les = [float(le) for le, _ in buckets]
            assert les == sorted(les) and les[-1] == float("inf")
            counts = [v for _, v in buckets]
            assert counts == sorted(counts)
            count = value(h, h + "_count", path=path)
            assert counts[-1] == count
            assert value(h, h + "_sum", path=path) >= 0
            if bounds is None:
                bounds = les
            assert les == bounds
    assert len(bounds) == 14
    for path in ("wo", "aq"):
        assert value("qlinear_request_duration_seconds",
                     "qlinear_request_duration_seconds_count",
                     path=path) == sent[path]
        assert value("qlinear_queue_wait_seconds",
                     "qlinear_queue_wait_seconds_count",
                     path=path) == sent[path]
        assert value("qlinear_device_batches", "qlinear_device_batches_total",
                     device="cpu", path=path) == value(
            "qlinear_launch_duration_seconds",
            "qlinear_launch_duration_seconds_count", path=path)
    with capsys.disabled():
        print("\nmetrics: %d series, no weight named (%d weights loaded, "
              "1 device)" % (len(_samples(fams)), N_WEIGHTS))


def test_weight_series_bounded(md, capsys):
    m, names, requests, sent = md
    _, base = m.scrape()
    n_base = len(_samples(base))
    try:
        m.set_weights(N_WEIGHTS)
        text, fams = m.scrape()
        for f in PER_WEIGHT:
            assert {s.labels["weight"] for s in fams[f].samples} == set(names)
            assert len(fams[f].samples) == N_WEIGHTS
        named = [s for s in _samples(fams) if "weight" in s.labels]
        assert len(named) == len(PER_WEIGHT) * N_WEIGHTS
        n_all = len(_samples(fams))
        assert n_all == n_base + len(PER_WEIGHT) * N_WEIGHTS
        reqs = {s.labels["weight"]: s.value
                for s in fams["qlinear_weight_requests"].samples}
        assert reqs == requests

        # Fewer than are loaded: those with the most requests (then by
        # name), and no other.
        m.set_weights(8)
        _, fams = m.scrape()
        want = sorted(names, key=lambda n: (-requests[n], n))[:8]
        for f in PER_WEIGHT:
            assert [s.labels["weight"] for s in fams[f].samples] == want
        assert len(_samples(fams)) == n_base + len(PER_WEIGHT) * 8
        with capsys.disabled():
            print("\nmetrics: %d series with metrics_weights = 0, %d with "
                  "%d weights named (%d each), %d with 8 named"
                  % (n_base, n_all, N_WEIGHTS, len(PER_WEIGHT),
                     len(_samples(fams))))
    finally:
        m.set_weights(0)
    _, fams = m.scrape()
    assert not any("weight" in s.labels for s in _samples(fams))
