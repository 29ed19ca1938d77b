"""bench_model.py - `qlinear-bench model`: a whole causal LM through qlineard
against bf16 and TorchAO in one process (DESIGN §12, issue 46).

`qlinear-bench model [options]` execs this script with the venv's python
(deploy/python-env), PYTHONPATH at client/python, QLINEAR_LIB at the
build's libqlinear and QLINEARD at the build's daemon; it runs as well on
its own with those set. It lives with the bench, not in the client's
examples: it measures the package, and the smoke test in `make check`
(tests/integration/test_bench_model.sh) runs it from here.

The model is a transformers LlamaConfig causal LM (default: hidden 2048,
intermediate 8192, 16 heads, 8 KV heads, vocab 32000, 8 layers, bf16) with
seeded random weights. Each variant gets its own deep copy of that model
(every nn.Linear, lm_head included, is what the variant changes), and all
variants are timed in this process, interleaved round by round (the order
rotates each round), after one untimed warm-up round; every figure is the
median over the rounds, with [min-max].

- decode: the prompt (16 tokens) is run once, untimed, then --new (32)
  single-token forwards with the KV cache are timed; ms/token is their
  mean. Every variant is fed bf16's greedy tokens (teacher forcing), so
  "agree" (the fraction of steps where its argmax is bf16's) and the
  logits error compare like with like, step by step.
- prefill: one forward of --prefill (256) tokens on an empty cache.
- PSS: the process's PSS (/proc/self/smaps_rollup) sampled after every
  step, its peak; all variants live in this one process, so the per-variant
  figure is what its model holds here (its tensors' bytes, measured), and
  the daemon's PSS is read from /proc/<pid>/smaps_rollup when this script
  started it. `--procs` measures PSS per process, where it means one model.
- breakdown (qlinear variants, decode): daemon kernel and queue time from
  the daemon's per-weight Stats (measured by the daemon, the deltas over
  the timed steps); the client's round trips (time inside
  Client.linear_raw/linear_multi_raw, measured here) and its copies into
  and out of its scratch region (the memmoves those make, measured);
  transport = round trip - copies - kernel (derived: the messages or the
  ring, the daemon's own work around the launch, and the waits, queue
  included; the daemon's queue time is shown beside it, but per weight it
  runs from the request's arrival to the weight's first launch, so in a
  fused request it also holds the earlier members' kernel time); the op's own
  Python/torch work = time in QLinear.forward - round trips (derived); the
  non-linear work = step time - time in QLinear.forward (derived), beside
  the floor variant's ms/token (measured: every linear a free op).
  Activation quantization runs inside the daemon's launch (its kernel
  time, no counter of its own); the breakdown says how many launches were
  AQ.

--procs K,...: K client processes decoding at once (each --proc-threads
torch threads, default 1) on one daemon, against K independent in-process
TorchAO int4 processes; aggregate tokens/s and the PSS of all the
processes (clients + daemon).
"""

import argparse
import copy
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

VARIANTS = {
    # name: (kind, detail)
    "bf16": ("bf16", None),
    "ao_int8wo": ("torchao", "Int8WeightOnlyConfig"),
    "ao_int4": ("torchao", "PrototypeInt4WeightOnlyConfig"),
    "ao_int8dq": ("torchao", "Int8DynamicActivationInt8WeightConfig"),
    "floor": ("floor", None),
    "ql_q4_auto": ("qlinear", ("q4g128", "auto", False)),
    "ql_q4_wo": ("qlinear", ("q4g128", "wo", False)),
    "ql_q8_auto": ("qlinear", ("q8c", "auto", False)),
    "ql_q8_wo": ("qlinear", ("q8c", "wo", False)),
    "ql_q4_auto_compiled": ("qlinear", ("q4g128", "auto", True)),
    "ql_q8_auto_compiled": ("qlinear", ("q8c", "auto", True)),
}
# TorchAO's int8 variants take 0.5-1 s a token on a 2-core CPU: they decode
# --slow-new tokens.
SLOW = {"ao_int8wo", "ao_int8dq"}
DESCR = {
    "bf16": "bf16 eager",
    "ao_int8wo": "TorchAO Int8WeightOnlyConfig",
    "ao_int4": "TorchAO PrototypeInt4WeightOnlyConfig (CPU int4, g128)",
    "ao_int8dq": "TorchAO Int8DynamicActivationInt8WeightConfig",
    "floor": "floor: every linear a free op (zeros)",
    "ql_q4_auto": "qlinear q4g128, swap_linears, path auto",
    "ql_q4_wo": "qlinear q4g128, swap_linears, path wo",
    "ql_q8_auto": "qlinear q8c, swap_linears, path auto",
    "ql_q8_wo": "qlinear q8c, swap_linears, path wo",
    "ql_q4_auto_compiled": "qlinear q4g128, path auto, torch.compile",
    "ql_q8_auto_compiled": "qlinear q8c, path auto, torch.compile",
}


def pss_kib(pid="self"):
    """Pss of a process in KiB (smaps_rollup), or None."""
    try:
        with open("/proc/%s/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Peak:
    """The peak of the process's PSS, sampled by sample()."""

    def __init__(self):
        self.kib = 0

    def sample(self):
        v = pss_kib()
        if v is not None and v > self.kib:
            self.kib = v


PEAK = Peak()


# ------------------------------------------------------------------ model
def build_model(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
        max_position_embeddings=max(4096, a.prefill + a.prompt + a.new + 8),
        tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(a.seed)
    with torch.device("cpu"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.eval()
    m.generation_config.pad_token_id = 0
    return m


def model_bytes(model):
    """Bytes of the tensors the model holds in this process (each storage
    once), torchao's packed subclasses included."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if t is None or t.device.type == "meta":
            return
        inner = getattr(t, "__tensor_flatten__", None)
        if inner is not None and type(t) not in (torch.Tensor, nn.Parameter):
            names, _ = t.__tensor_flatten__()
            for n in names:
                add(getattr(t, n))
            return
        try:
            st = t.untyped_storage()
        except Exception:
            return
        key = (st.data_ptr(), st.nbytes())
        if key not in seen:
            seen.add(key)
            total += st.nbytes()

    for p in model.parameters():
        add(p)
    for b in model.buffers():
        add(b)
    return total


class FreeLinear(nn.Module):
    """The floor: a linear layer that costs nothing but a zeroed output of
    the right shape (the memset is the only work)."""

    def __init__(self, lin):
        super().__init__()
        self.out_features = lin.out_features

    def forward(self, x):
        return x.new_zeros(x.shape[:-1] + (self.out_features,))


def make_floor(base):
    m = copy.deepcopy(base)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, nn.Linear):
            parent, _, child = name.rpartition(".")
            setattr(m.get_submodule(parent), child, FreeLinear(mod))
    return m


def make_torchao(base, cfgname):
    import torchao.quantization as tq
    if cfgname == "PrototypeInt4WeightOnlyConfig":
        from torchao.prototype.quantization.int4 import \
            PrototypeInt4WeightOnlyConfig
        cfg = PrototypeInt4WeightOnlyConfig(group_size=128)
    else:
        cfg = getattr(tq, cfgname)()
    m = copy.deepcopy(base)
    tq.quantize_(m, cfg)
    return m


def make_qlinear(base, client, fmt, path, compiled):
    import qlinear.torch as qt
    m = copy.deepcopy(base)
    qt.swap_linears(m, client, format=fmt, path=path)
    if compiled:
        m.forward = torch.compile(m.forward, dynamic=True)
    return m


# ----------------------------------------------------------------- timing
class Probe:
    """Client-side timing of the qlinear ops: time inside QLinear.forward
    (the module, the custom op, the round trip), inside the client's
    linear_raw/linear_multi_raw (the round trip with its copies), and in
    the memmoves of qlinear.client (the copies into and out of the
    scratch region). Installed once for the process; on() / off() switch
    the counting, so untimed work counts nothing."""

    def __init__(self):
        import qlinear.client as qc
        import qlinear.torch as qt
        self.active = False
        self.fwd_ns = self.rt_ns = self.copy_ns = 0
        self.calls = self.copies = 0
        self._depth = 0
        probe = self

        orig_fwd = qt.QLinear.forward

        def forward(mod, x):
            if not probe.active or probe._depth:
                return orig_fwd(mod, x)
            probe._depth += 1
            t = time.perf_counter_ns()
            try:
                return orig_fwd(mod, x)
            finally:
                probe.fwd_ns += time.perf_counter_ns() - t
                probe._depth -= 1
        qt.QLinear.forward = forward

        for meth in ("linear_raw", "linear_multi_raw"):
            orig = getattr(qc.Client, meth)

            def timed(self_, *args, __orig=orig, **kw):
                if not probe.active:
                    return __orig(self_, *args, **kw)
                t = time.perf_counter_ns()
                try:
                    return __orig(self_, *args, **kw)
                finally:
                    probe.rt_ns += time.perf_counter_ns() - t
                    probe.calls += 1
            setattr(qc.Client, meth, timed)

        # qlinear.client calls ctypes.memmove through its module global
        # 'ctypes': a proxy there times the copies, nothing else changes.
        real = qc.ctypes

        class _CtypesProxy:
            def __getattr__(self, name):
                return getattr(real, name)

            @staticmethod
            def memmove(dst, src, n):
                if not probe.active:
                    return real.memmove(dst, src, n)
                t = time.perf_counter_ns()
                r = real.memmove(dst, src, n)
                probe.copy_ns += time.perf_counter_ns() - t
                probe.copies += 1
                return r
        qc.ctypes = _CtypesProxy()

    def reset(self):
        self.fwd_ns = self.rt_ns = self.copy_ns = 0
        self.calls = self.copies = 0


def daemon_totals(client, names):
    """(kernel_ns, queue_ns, wo_batches, aq_batches) summed over the
    weights in names (the daemon's per-weight Stats)."""
    k = q = wo = aq = 0
    for w in client.stats().per_weight:
        if w.weight in names:
            k += w.kernel_ns
            q += w.queue_ns
            wo += w.wo_batches
            aq += w.aq_batches
    return k, q, wo, aq


def ql_names(model):
    import qlinear.torch as qt
    return {m.weight_name for m in model.modules()
            if isinstance(m, qt.QLinear)}


@torch.inference_mode()
def decode(model, prompt, feeds, n, on_start=None, on_end=None):
    """The prompt untimed, then n single-token steps timed. Step i is fed
    feeds[i] (None: the model's own greedy token, step 0 the prompt's).
    on_start() and on_end() are called just before and after the timed
    steps. Returns (seconds, the prompt's argmax, the n tokens chosen, their
    logits [n, vocab] as float32)."""
    from transformers import DynamicCache
    cache = DynamicCache()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1].argmax(-1).view(1)
    first = int(tok)
    tokens, logits = [], []
    PEAK.sample()
    if on_start is not None:
        on_start()
    t0 = time.perf_counter()
    for i in range(n):
        feed = tok if feeds is None else feeds[i:i + 1]
        out = model(input_ids=feed.view(1, 1), past_key_values=cache,
                    use_cache=True)
        lg = out.logits[0, -1]
        tok = lg.argmax(-1).view(1)
        tokens.append(int(tok))
        logits.append(lg.float())
    dt = time.perf_counter() - t0
    if on_end is not None:
        on_end()
    PEAK.sample()
    return dt, first, tokens, torch.stack(logits)


@torch.inference_mode()
def prefill(model, ids):
    from transformers import DynamicCache
    t0 = time.perf_counter()
    model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    dt = time.perf_counter() - t0
    PEAK.sample()
    return dt


def progress(msg):
    """Where the bench is, on stderr (a full run takes minutes)."""
    print("qlinear-bench model: " + msg, file=sys.stderr, flush=True)


def med(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


# ----------------------------------------------------------------- daemon
class Daemon:
    """A qlineard of our own on a private socket directory (as the tests
    start theirs), stopped by stop()."""

    def __init__(self, path, args):
        self.dir = tempfile.mkdtemp(prefix="ql-bench-model-")
        os.chmod(self.dir, 0o700)
        sock = os.path.join(self.dir, "sock")
        self.address = "ipc://%s/qlineard.sock" % sock
        self.log = open(os.path.join(self.dir, "daemon.log"), "w+")
        self.proc = subprocess.Popen(
            [path, "--socket-dir", sock, "--state-dir",
             os.path.join(self.dir, "state")] + list(args),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        want = [os.path.join(sock, "qlineard.sock"),
                os.path.join(sock, "admin", "admin.sock")]
        while not all(os.path.exists(p) for p in want):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("qlinear-bench model: qlineard did not "
                                 "start")
            time.sleep(0.02)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def find_daemon(a):
    if a.daemon:
        return a.daemon
    env = os.environ.get("QLINEARD")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "qlineard")


# ------------------------------------------------------------- in process
def run_inprocess(a, variants, client):
    base = build_model(a)
    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=gen)
    long_ids = torch.randint(0, a.vocab, (1, a.prefill), generator=gen)
    PEAK.sample()

    # bf16's own greedy tokens and logits: the reference. Every variant is
    # fed what bf16 was fed (its argmax after the prompt, then its tokens),
    # so each step compares the same context.
    _, first, ref_tok, ref_logits = decode(base, prompt, None, a.new)
    feeds = torch.tensor([first] + ref_tok[:-1])

    models, setup = {}, {}
    probe = Probe() if any(VARIANTS[v][0] == "qlinear" for v in variants) \
        else None
    for v in variants:
        kind, det = VARIANTS[v]
        t0 = time.perf_counter()
        try:
            if kind == "bf16":
                models[v] = base
            elif kind == "floor":
                models[v] = make_floor(base)
            elif kind == "torchao":
                models[v] = make_torchao(base, det)
            else:
                models[v] = make_qlinear(base, client, *det)
        except Exception as e:  # a config this torchao lacks: say so, go on
            print("qlinear-bench model: %s: %s: %s" % (v, type(e).__name__,
                                                       e), file=sys.stderr)
            continue
        gc.collect()
        setup[v] = time.perf_counter() - t0
        PEAK.sample()
        progress("%s ready (%.1f s)" % (v, setup[v]))

    live = [v for v in variants if v in models]
    res = {v: {"decode": [], "prefill": [], "agree": [], "err": [],
               "brk": []} for v in live}

    for r in range(a.rounds + 1):  # round 0: warm-up, untimed
        order = live[r % len(live):] + live[:r % len(live)]
        progress("round %d of %d%s" % (r, a.rounds,
                                      " (warm-up)" if r == 0 else ""))
        for v in order:
            kind = VARIANTS[v][0]
            n = a.slow_new if v in SLOW else a.new
            names = ql_names(models[v]) if kind == "qlinear" else None
            snap = []

            def start(names=names, snap=snap):
                if names:
                    snap.append(daemon_totals(client, names))
                    probe.reset()
                    probe.active = True

            def end(names=names, snap=snap):
                if names:
                    probe.active = False
                    snap.append(daemon_totals(client, names))
            t0 = time.perf_counter()
            dt, _, tok, lg = decode(models[v], prompt, feeds, n, start, end)
            pf = prefill(models[v], long_ids)
            if r == 0:
                res[v]["warmup_s"] = time.perf_counter() - t0
                continue
            res[v]["n"] = n
            res[v]["decode"].append(dt * 1e3 / n)
            res[v]["prefill"].append(pf * 1e3)
            res[v]["agree"].append(
                sum(int(x == y) for x, y in zip(tok, ref_tok)) / n)
            res[v]["err"].append(float((lg - ref_logits[:n]).abs().max()))
            if names:
                res[v]["brk"].append(breakdown(dt, n, probe, *snap))
    scale = float(ref_logits.abs().max())
    out = []
    for v in live:
        R = res[v]
        row = {"bench": "model", "variant": v, "tokens": R["n"],
               "decode_ms_per_token": med(R["decode"]),
               "prefill_ms": med(R["prefill"]),
               "agree": min(R["agree"]), "max_logits_err": max(R["err"]),
               "logits_scale": scale,
               "model_bytes_in_process": model_bytes(models[v]),
               "setup_s": setup[v]}
        row["warmup_s"] = R["warmup_s"]
        if R["brk"]:
            row["breakdown_ms_per_token"] = {
                k: statistics.median(b[k] for b in R["brk"])
                for k in R["brk"][0]}
        out.append(row)
    return out, base


def breakdown(dt, n, p, d0, d1):
    """Per token, ms: see the module's docstring for what is measured and
    what is derived."""
    kern = (d1[0] - d0[0]) / 1e6 / n
    queue = (d1[1] - d0[1]) / 1e6 / n
    rt = p.rt_ns / 1e6 / n
    cp = p.copy_ns / 1e6 / n
    fwd = p.fwd_ns / 1e6 / n
    step = dt * 1e3 / n
    return {"step": step, "in_qlinear_forward": fwd, "round_trips": rt,
            "calls_per_token": p.calls / n, "daemon_kernel": kern,
            "daemon_queue": queue, "client_copies": cp,
            "copies_per_token": p.copies / n,
            "transport_derived": rt - cp - kern,
            "op_python_torch_derived": fwd - rt,
            "non_linear_derived": step - fwd,
            "wo_launches_per_token": (d1[2] - d0[2]) / n,
            "aq_launches_per_token": (d1[3] - d0[3]) / n}


# --------------------------------------------------------- K processes
def make_variant_inplace(m, v, client):
    """The --procs worker's model: m itself changed, no copy."""
    import qlinear.torch as qt
    kind, det = VARIANTS[v]
    if kind == "torchao":
        import torchao.quantization as tq
        if det == "PrototypeInt4WeightOnlyConfig":
            from torchao.prototype.quantization.int4 import \
                PrototypeInt4WeightOnlyConfig
            cfg = PrototypeInt4WeightOnlyConfig(group_size=128)
        else:
            cfg = getattr(tq, det)()
        tq.quantize_(m, cfg)
    elif kind == "qlinear":
        fmt, path, compiled = det
        qt.swap_linears(m, client, format=fmt, path=path)
        if compiled:
            m.forward = torch.compile(m.forward, dynamic=True)
    elif kind != "bf16":
        raise SystemExit("qlinear-bench model: --procs runs bf16, torchao "
                         "or qlinear variants")
    gc.collect()
    return m


def worker(a):
    """One process of --procs: builds its model, says 'ready', waits for
    'go' on stdin, decodes a.new tokens greedily, prints one JSON line,
    then waits for 'exit' (its PSS is read while every worker lives)."""
    torch.set_num_threads(a.proc_threads)
    client = None
    if VARIANTS[a.worker][0] == "qlinear":
        import qlinear
        client = qlinear.Client(a.address)
    m = make_variant_inplace(build_model(a), a.worker, client)
    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=gen)
    decode(m, prompt, None, 2)  # warm-up
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.monotonic()
    dt, _, tok, _ = decode(m, prompt, None, a.new)
    t1 = time.monotonic()
    print(json.dumps({"start": t0, "end": t1, "tokens": a.new,
                      "decode_s": dt, "first_tokens": tok[:4]}), flush=True)
    sys.stdin.readline()
    if client is not None:
        client.close()
    return 0


def worker_args(a, variant):
    return [sys.executable, os.path.abspath(__file__), "--worker", variant,
            "--address", a.address or "", "--layers", str(a.layers),
            "--hidden", str(a.hidden), "--intermediate", str(a.intermediate),
            "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
            "--vocab", str(a.vocab), "--prompt", str(a.prompt),
            "--new", str(a.new), "--seed", str(a.seed),
            "--proc-threads", str(a.proc_threads)]


def run_procs(a, k, variant, daemon_pid):
    """K workers of variant: aggregate tokens/s from their own clocks
    (CLOCK_MONOTONIC, one for the machine: first start to last end) and
    the PSS of each, plus the daemon's for qlinear, read while all live."""
    procs = []
    try:
        for _ in range(k):  # one by one: later ones hold what is resident
            p = subprocess.Popen(worker_args(a, variant),
                                 stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("qlinear-bench model: a %s worker failed"
                                 % variant)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        pss = [pss_kib(p.pid) or 0 for p in procs]
        dpss = pss_kib(daemon_pid) if VARIANTS[variant][0] == "qlinear" and \
            daemon_pid else None
        for p in procs:
            p.stdin.write("exit\n")
            p.stdin.flush()
    finally:
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    toks = sum(o["tokens"] for o in outs)
    row = {"bench": "model_procs", "variant": variant, "procs": k,
           "torch_threads": a.proc_threads, "tokens": toks,
           "aggregate_tok_s": toks / span,
           "per_proc_ms_per_token": [o["decode_s"] * 1e3 / o["tokens"]
                                     for o in outs],
           "clients_pss_mib": sum(pss) / 1024.0,
           "daemon_pss_mib": dpss / 1024.0 if dpss is not None else None}
    row["total_pss_mib"] = row["clients_pss_mib"] + (row["daemon_pss_mib"]
                                                     or 0)
    return row


# ------------------------------------------------------------------ table
def fmt_med(m, f="%.1f"):
    return (f + " [" + f + "-" + f + "]") % (m["median"], m["min"], m["max"])


def print_table(rows, a, daemon_pss):
    print()
    print("| variant | decode ms/token | prefill %d tokens, ms | agree | "
          "max logits err | model MiB here |" % a.prefill)
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %s%s | %s | %s | %.3f | %.3g | %.1f |" % (
            DESCR[r["variant"]],
            " (%d tokens)" % r["tokens"] if r["tokens"] != a.new else "",
            fmt_med(r["decode_ms_per_token"]), fmt_med(r["prefill_ms"], "%.0f"),
            r["agree"], r["max_logits_err"],
            r["model_bytes_in_process"] / 1048576.0))
    print()
    print("agree: fraction of the teacher-forced steps whose argmax is "
          "bf16's (worst round); max logits err: max |logits - bf16's| over "
          "those steps (bf16's logits reach %.3g); model MiB here: the "
          "variant's tensors in this process" % rows[0]["logits_scale"])
    print("client peak PSS (this process, every variant in it): %.0f MiB%s"
          % (PEAK.kib / 1024.0,
             "; daemon PSS at the end: %.0f MiB" % (daemon_pss / 1024.0)
             if daemon_pss else ""))
    brk = [r for r in rows if "breakdown_ms_per_token" in r]
    if not brk:
        return
    print()
    print("breakdown of a decode step, ms per token (medians over the "
          "rounds):")
    print("| variant | step | in QLinear.forward | round trips (calls) | "
          "daemon kernel | daemon queue | client copies (count) | "
          "transport* | op Python/torch* | non-linear* | launches WO/AQ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in brk:
        b = r["breakdown_ms_per_token"]
        print("| %s | %.2f | %.2f | %.2f (%.0f) | %.2f | %.2f | %.2f (%.0f) "
              "| %.2f | %.2f | %.2f | %.0f/%.0f |" % (
                  r["variant"], b["step"], b["in_qlinear_forward"],
                  b["round_trips"], b["calls_per_token"], b["daemon_kernel"],
                  b["daemon_queue"], b["client_copies"],
                  b["copies_per_token"], b["transport_derived"],
                  b["op_python_torch_derived"], b["non_linear_derived"],
                  b["wo_launches_per_token"], b["aq_launches_per_token"]))
    floor = [r for r in rows if r["variant"] == "floor"]
    print("* derived: transport = round trips - copies - kernel (messages "
          "or ring, the daemon's work around the launch, waits); queue "
          "(measured by the daemon: arrival to a weight's first launch) "
          "overlaps the kernel column in fused requests; op "
          "Python/torch = in QLinear.forward - round trips; non-linear = "
          "step - in QLinear.forward%s. Activation quantization is inside "
          "the daemon's kernel time (AQ launches only; no counter of its "
          "own)." % ("; the floor measured %.2f ms/token" %
                     floor[0]["decode_ms_per_token"]["median"]
                     if floor else ""))


# ------------------------------------------------------------------- main
def parse(argv):
    p = argparse.ArgumentParser(
        prog="qlinear-bench model",
        description="A causal LM through qlineard against bf16 and TorchAO "
                    "(tests/bench/bench_model.py).")
    g = p.add_argument
    g("--layers", type=int, default=8)
    g("--hidden", type=int, default=2048)
    g("--intermediate", type=int, default=8192)
    g("--heads", type=int, default=16)
    g("--kv-heads", type=int, default=8)
    g("--vocab", type=int, default=32000)
    g("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    g("--new", type=int, default=32, help="decode steps timed (default 32)")
    g("--slow-new", type=int, default=8,
      help="decode steps of TorchAO's int8 variants (default 8)")
    g("--prefill", type=int, default=256)
    g("--rounds", type=int, default=3, help="timed rounds (>= 3)")
    g("--seed", type=int, default=0)
    g("--variants", default="bf16,ao_int8wo,ao_int4,ao_int8dq,floor,"
      "ql_q4_auto,ql_q4_wo,ql_q8_auto,ql_q8_wo,ql_q4_auto_compiled",
      help="comma-separated, of: " + ",".join(VARIANTS) + " (bf16, the "
      "reference, is always added; empty: none, for --procs alone)")
    g("--skip", default="", help="variants left out of --variants")
    g("--threads", type=int, default=0,
      help="torch threads of this process (default: torch's)")
    g("--daemon", help="qlineard to start (default $QLINEARD, else the "
      "build tree's)")
    g("--daemon-arg", action="append", default=[],
      help="one more argument for that qlineard (--daemon-arg=--opt for "
      "one that starts with -)")
    g("--address", help="use this daemon instead of starting one")
    g("--procs", default="", help="K,... : the multi-process mode")
    g("--proc-variants", default="ql_q4_auto,ao_int4")
    g("--proc-threads", type=int, default=1,
      help="torch threads of each --procs process (default 1)")
    g("--worker", help=argparse.SUPPRESS)
    g("--json", action="store_true", help="JSON lines only")
    a = p.parse_args(argv)
    if a.worker:
        return a
    if a.rounds < 3:
        p.error("--rounds: at least 3")
    skip = set(filter(None, a.skip.split(",")))
    a.variant_list = [v for v in a.variants.split(",") if v and v not in skip]
    for v in a.variant_list + a.proc_variants.split(","):
        if v not in VARIANTS:
            p.error("no variant %r (%s)" % (v, ",".join(VARIANTS)))
    if a.variant_list and "bf16" not in a.variant_list:
        a.variant_list.insert(0, "bf16")  # the reference
    a.proc_ks = [int(x) for x in a.procs.split(",") if x]
    return a


def main(argv):
    a = parse(argv)
    if a.worker:
        return worker(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    need_daemon = any(VARIANTS[v][0] == "qlinear"
                      for v in a.variant_list) or a.proc_ks
    daemon, client = None, None
    try:
        if need_daemon and not a.address:
            daemon = Daemon(find_daemon(a), a.daemon_arg)
            a.address = daemon.address
        if need_daemon:
            import qlinear
            client = qlinear.Client(a.address)
        dpid = daemon.pid if daemon else None
        if not a.json:
            import torchao
            import transformers
            print("qlinear-bench model: %d layers, hidden %d, intermediate "
                  "%d, %d heads, %d KV heads, vocab %d, bf16, seed %d; "
                  "torch %s (%d threads), transformers %s, torchao %s; "
                  "decode %d steps (TorchAO int8: %d) after a %d-token "
                  "prompt, prefill %d tokens; %d rounds + 1 warm-up; "
                  "load %s" % (
                      a.layers, a.hidden, a.intermediate, a.heads,
                      a.kv_heads, a.vocab, a.seed, torch.__version__,
                      torch.get_num_threads(), transformers.__version__,
                      torchao.__version__, a.new, a.slow_new, a.prompt,
                      a.prefill, a.rounds,
                      " ".join("%.2f" % x for x in os.getloadavg())),
                  flush=True)
            if daemon:
                print("qlineard: %s%s" % (
                    os.path.abspath(find_daemon(a)),
                    " " + " ".join(a.daemon_arg) if a.daemon_arg else ""))
        rows = []
        if a.variant_list:
            rows, base = run_inprocess(a, a.variant_list, client)
            del base
            gc.collect()
            dpss = pss_kib(dpid) if dpid else None
            for r in rows:
                print(json.dumps(r))
            if not a.json:
                print_table(rows, a, dpss)
        if a.proc_ks:
            prow = []
            for k in a.proc_ks:
                for v in a.proc_variants.split(","):
                    progress("%d x %s" % (k, v))
                    r = run_procs(a, k, v, dpid)
                    print(json.dumps(r), flush=True)
                    prow.append(r)
            if not a.json:
                print()
                print("%d processes at once, %d torch thread(s) each, %d "
                      "tokens each; PSS read while all live:" % (
                          max(a.proc_ks), a.proc_threads, a.new))
                print("| variant | K | aggregate tokens/s | clients PSS MiB "
                      "| daemon PSS MiB | total PSS MiB |")
                print("|---|---|---|---|---|---|")
                for r in prow:
                    print("| %s | %d | %.1f | %.0f | %s | %.0f |" % (
                        DESCR[r["variant"]], r["procs"], r["aggregate_tok_s"],
                        r["clients_pss_mib"],
                        "%.0f" % r["daemon_pss_mib"]
                        if r["daemon_pss_mib"] is not None else "-",
                        r["total_pss_mib"]))
    finally:
        if client is not None:
            client.close()
        if daemon is not None:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
