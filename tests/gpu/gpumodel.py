#!/usr/bin/env python3
"""gpumodel.py - a static performance model of qlinear's CUDA kernels.

No GPU is needed. For a kernel object (a cubin, or the fat object the
build makes with nvcc), it disassembles each kernel with cuobjdump, reads
its registers, local memory and shared memory (cuobjdump -res-usage),
finds the steady-state loop (the loop with the most 128-bit global loads
of its own: the weight stream), and counts the instructions of one
iteration of its hot path by class (global and shared loads by width,
cp.async, ldmatrix, bit ops and permutes, conversions, FP32/FP16
arithmetic, mma, integer and address arithmetic, branches, barriers,
shuffles), the extra cost of a tile's end (warp sums, stores), of the walk
over tiles, of the prologue, and per value of x staged in shared memory.
With the launch of each variant (grid, block, steps of K: a copy of
linear_wo.cu's and linear_aq.cu's launch rules, below) and a device's
published figures (devices.json) it predicts the time of a call as the
largest of three bounds:

  memory:  the device's in-run streaming read of the call's bytes
           (read_fix_us + bytes / read_bw, fitted to the streaming read
           the bench measured in the same runs: a measurement, not a
           parameter);
  issue:   read_fix_us + warp instructions of the busiest SM
           / (schedulers x clock x eta), eta = min(1, W / issue_cycles)
           with W warps per scheduler, + stages of x per block x
           stage_wait_ns;
  latency: read_fix_us + bytes of the busiest SM / (bytes in flight per SM
           / latency_ns): Little's law at the occupancy that registers and
           shared memory allow.

linear_aq adds one launch's fixed cost for quantize_rows. The three global
parameters (issue_cycles, stage_wait_ns, latency_ns) are fitted on the
H200 figures and checked unchanged on the H100 ones (calibration.json,
docs/gpu-model.md). It also reports, per hot path, a single warp's cycles
through it from register dependencies (schedule(); not used in the
prediction).

Modes:
  gpumodel.py table [wo=OBJ] [aq=OBJ] [--all]   predictions (--all: every
                                   device of devices.json; sm_80/sm_89 need
                                   objects with those archs)
  gpumodel.py gate [wo=OBJ] [aq=OBJ]   table + baseline and calibration
                                   checks (make check's test_gpumodel.sh)
  gpumodel.py baseline [wo=OBJ] [aq=OBJ]   rewrite baseline.json
  gpumodel.py calibrate [--fit]    rebuild the measured commits' sources
                                   (git archive + nvcc, sm_90; cache:
                                   $QL_GPUMODEL_CACHE), re-derive their
                                   counts and, with --fit, the parameters;
                                   writes calibration.json
Without wo=/aq= it reads kernels/cuda/gpu-linear_wo.o and gpu-linear_aq.o
(the build's nvcc objects), else compiles the sources for sm_90 (minutes).
Python standard library only.
"""

import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- tools


def find_cuobjdump():
    """$QL_CUOBJDUMP, else cuobjdump on PATH, else the PyPI wheel's
    (nvidia-cuda-cuobjdump) inside this interpreter's site-packages."""
    env = os.environ.get("QL_CUOBJDUMP")
    if env:
        return env if os.access(env, os.X_OK) else None
    p = shutil.which("cuobjdump")
    if p:
        return p
    roots = {sysconfig.get_paths().get("purelib", ""),
             sysconfig.get_paths().get("platlib", "")}
    for r in sorted(x for x in roots if x):
        for pat in ("nvidia/*/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump",
                    "nvidia/*/*/bin/cuobjdump"):
            for c in sorted(glob.glob(os.path.join(r, pat))):
                if os.access(c, os.X_OK):
                    return c
    return None


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (cmd[0], r.returncode,
                                                   r.stderr[-2000:]))
    return r.stdout


# ---------------------------------------------------------------- SASS

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"Function\s*:\s*(\S+)")


def disassemble(cuobjdump, obj, arch):
    """{mangled name: [(addr, pred, opcode, operands)]} for one SM arch."""
    out = run([cuobjdump, "-sass", "-arch", arch, obj])
    funcs, cur = {}, None
    for line in out.split("\n"):
        m = FUNC.search(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            text = m.group(2)
            pred = ""
            if text.startswith("@"):
                pred, text = text.split(None, 1)
            parts = text.split(None, 1)
            cur.append((int(m.group(1), 16), pred, parts[0],
                        parts[1] if len(parts) > 1 else ""))
    return funcs


RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def resources(cuobjdump, obj, arch):
    out = run([cuobjdump, "-res-usage", "-arch", arch, obj])
    res, cur = {}, None
    for line in out.split("\n"):
        m = re.search(r"Function\s+(\S+?):?\s*$", line)
        if m:
            cur = m.group(1)
            continue
        m = RES.search(line)
        if m and cur:
            res[cur] = {"regs": int(m.group(1)), "stack": int(m.group(2)),
                        "shared": int(m.group(3)), "local": int(m.group(4))}
    return res


def width(op):
    for suf, w in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2),
                   (".U8", 1), (".S8", 1)):
        if suf in op:
            return w
    return 4


def iclass(op):
    """The class of an opcode (the counts the docs and table print)."""
    base = op.split(".")[0]
    if base in ("LDG", "LD"):
        return "ldg%d" % width(op)
    if base in ("STG", "ST", "RED", "ATOM", "ATOMG"):
        return "stg"
    if base == "LDS":
        return "lds%d" % width(op)
    if base in ("STS",):
        return "sts"
    if base == "LDGSTS":
        return "cp.async"
    if base == "LDSM":
        return "ldmatrix"
    if base in ("HMMA", "IMMA", "HGMMA", "IGMMA", "QGMMA", "DMMA"):
        return "mma"
    if base in ("LOP3", "LOP", "PRMT", "SHF", "SHL", "SHR", "BFE", "BFI",
                "BMSK", "POPC", "FLO", "BREV"):
        return "bit"
    if base in ("I2F", "F2I", "F2F", "I2FP", "F2FP", "I2I", "F2IP", "FRND"):
        return "cvt"
    if base in ("FFMA", "FADD", "FMUL", "FMNMX", "HFMA2", "HADD2", "HMUL2",
                "HMNMX2", "FSEL", "FSET", "FSETP", "MUFU", "FCHK", "DFMA",
                "DADD", "DMUL", "FSWZADD"):
        return "fp"
    if base in ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY",
                "BSYNC", "WARPSYNC", "BREAK", "YIELD", "KILL"):
        return "branch"
    if base in ("BAR", "MEMBAR", "DEPBAR", "ARRIVES", "SYNCS", "ERRBAR",
                "CCTL"):
        return "barrier"
    if base == "SHFL":
        return "shfl"
    if base == "NOP":
        return "nop"
    return "int"  # IMAD, IADD3, LEA, ISETP, SEL, MOV, S2R, uniform ops, ...


def blocks_of(ins):
    """Basic blocks: [(start index, end index exclusive)], and successor
    lists (block indices)."""
    addr_ix = {a: i for i, (a, _, _, _) in enumerate(ins)}
    leaders = {0}
    for i, (a, pred, op, arg) in enumerate(ins):
        base = op.split(".")[0]
        if base in ("BRA", "EXIT", "RET", "BRX", "JMP", "JMX"):
            leaders.add(i + 1)
            m = re.search(r"0x([0-9a-f]+)", arg)
            if base == "BRA" and m and int(m.group(1), 16) in addr_ix:
                leaders.add(addr_ix[int(m.group(1), 16)])
    starts = sorted(x for x in leaders if x < len(ins))
    bounds = [(s, starts[j + 1] if j + 1 < len(starts) else len(ins))
              for j, s in enumerate(starts)]
    bix = {s: j for j, (s, _) in enumerate(bounds)}
    succ = []
    for j, (s, e) in enumerate(bounds):
        a, pred, op, arg = ins[e - 1]
        base = op.split(".")[0]
        out = []
        if base == "BRA":
            m = re.search(r"0x([0-9a-f]+)", arg)
            if m and int(m.group(1), 16) in addr_ix:
                out.append(bix[addr_ix[int(m.group(1), 16)]])
            if pred and j + 1 < len(bounds):
                out.append(j + 1)
        elif base in ("EXIT", "RET", "BRX", "JMP", "JMX"):
            if pred and j + 1 < len(bounds):
                out.append(j + 1)
        elif j + 1 < len(bounds):
            out.append(j + 1)
        succ.append(out)
    return bounds, succ


# Dependent-issue latencies (cycles) of sm_80..sm_90 classes, from
# published microbenchmarks: fixed-latency ALU and FMA ops 4, conversions
# and MUFU 8, shared loads and shuffles about 30, mma.sync about 24. A
# global load's is the memory latency (a parameter).
LATENCY = {"int": 4, "bit": 4, "fp": 4, "cvt": 8, "lds": 30, "shfl": 30,
           "mma": 24, "ldmatrix": 30, "sts": 0, "stg": 0, "branch": 0,
           "barrier": 0, "cp.async": 0, "nop": 0}
REG = re.compile(r"\b(U?R)(\d+)(?:\.(64|128))?|\b(U?P)(\d)\b")
NODEST = ("ST", "STS", "STG", "RED", "BRA", "BSSY", "BSYNC", "EXIT", "BAR",
          "WARPSYNC", "CALL", "RET", "NOP", "MEMBAR", "DEPBAR", "YIELD",
          "ISETP", "FSETP", "PSETP", "HSETP2", "DSETP")


def regs_of(text, op):
    """Registers an operand string names: a 64- or 128-bit access names
    its pair or quad (the data register of a wide load or store; an
    address in brackets by its own .64); RZ, PT and URZ are none."""
    out = []
    wide = 4 if ".128" in op else 2 if ".64" in op else 1
    if not op.startswith(("LDG", "LDS", "LD.", "STG", "STS", "ST.", "LDSM")):
        wide = 1
    depth = 0
    for piece in re.split(r"(\[|\])", text):
        if piece == "[":
            depth += 1
            continue
        if piece == "]":
            depth -= 1
            continue
        for m in REG.finditer(piece):
            if m.group(1):
                n = {"64": 2, "128": 4}.get(m.group(3), 1)
                if depth == 0:
                    n = max(n, wide)
                out += ["%s%d" % (m.group(1), int(m.group(2)) + i)
                        for i in range(n)]
            else:
                out.append("%s%s" % (m.group(4), m.group(5)))
    return out


def schedule(seq, ldg_cycles):
    """Cycles one warp takes to issue seq (instructions in order, one a
    cycle at best), each waiting for its operands: a single warp's time
    through the hot path, whose ratio to its length is the issue interval
    a scheduler must cover with other warps."""
    ready, t = {}, 0
    for pred, op, arg in seq:
        c = iclass(op)
        if c == "nop":
            continue
        base = op.split(".")[0]
        parts = [x.strip() for x in arg.split(",")]
        dest, srcs = [], parts
        if parts and not base.startswith(NODEST):
            dest, srcs = parts[:1], parts[1:]
        elif base in ("ISETP", "FSETP", "PSETP", "DSETP", "HSETP2"):
            dest, srcs = parts[:2], parts[2:]
        need = regs_of(" ".join(srcs) + " " + pred, op)
        start = max([t] + [ready.get(r, 0) for r in need])
        if c.startswith("ldg"):
            lat = ldg_cycles
        else:
            lat = LATENCY.get(c[:3] if c.startswith("lds") else c, 4)
        for r in regs_of(" ".join(dest), op):
            if r not in ("RZ", "PT", "URZ"):
                ready[r] = start + lat
        t = start + 1
    return t


def analyze(ins):
    """The steady-state loop of one kernel: counts by class on the hot path
    of one iteration, the epilogue's extra cost (warp sums, stores), the
    cost per staged value of x, and the global loads per iteration."""
    bounds, succ = blocks_of(ins)
    nb = len(bounds)

    def count(j, pred=lambda op: True):
        s, e = bounds[j]
        return sum(1 for k in range(s, e) if pred(ins[k][2]) and
                   iclass(ins[k][2]) != "nop")

    def has(j, f):
        s, e = bounds[j]
        return any(f(ins[k][2]) for k in range(s, e))

    back = [(j, t) for j in range(nb) for t in succ[j] if t <= j]
    if not back:
        return None
    w128 = [count(j, lambda op: op.startswith("LDG") and width(op) == 16)
            for j in range(nb)]

    def own(h, j):
        """128-bit loads of loop [h, j] outside the loops nested in it."""
        nested = set()
        for jj, tt in back:
            if h <= tt and jj <= j and (tt, jj) != (h, j) and \
                    (tt > h or jj < j):
                nested.update(range(tt, jj + 1))
        return sum(w128[b] for b in range(h, j + 1) if b not in nested)

    # The main loop: the most 128-bit global loads of its own (the weight
    # stream); ties go to the innermost.
    src, head = max(back, key=lambda b: (own(b[1], b[0]), b[1] - b[0]))
    body = set(range(head, src + 1))
    inner = set()
    for j, t in back:
        if (j, t) != (src, head) and head <= t and j <= src:
            inner.update(range(t, j + 1))
    bar = {j for j in body if has(j, lambda op: op.startswith("BAR"))}
    shfl = {j for j in body if has(j, lambda op: op.startswith("SHFL"))}

    def key(j, zero, want_shfl):
        """A block's score: a path is chosen first for the fewest warp
        shuffles (the hot path: no row tile ends) or the most (the path
        with the epilogue), then for the most global and shared loads
        (codes, scales, x: every chunk's work, as in the steady state),
        then for the fewest
        instructions (rare branches: fallbacks, other dtypes, tails, are
        the longer ones). Staging blocks (zero) count as empty."""
        if j in zero:
            return (0, 0, 0)
        s, e = bounds[j]
        work = sum(1 for k in range(s, e) if ins[k][2].startswith("LDS") or
                   ins[k][2].startswith("LDG"))
        sh = sum(1 for k in range(s, e) if ins[k][2].startswith("SHFL"))
        return (sh if want_shfl else -sh, work, -count(j))

    def best_path(excluded, zero, want_shfl):
        best = {head: (key(head, zero, want_shfl), [head])}
        for j in range(head, src + 1):
            if j not in best or j in excluded:
                continue
            for t in succ[j]:
                if t <= j or t not in body or t in excluded:
                    continue
                kt = key(t, zero, want_shfl)
                c = tuple(x + y for x, y in zip(best[j][0], kt))
                if t not in best or c > best[t][0]:
                    best[t] = (c, best[j][1] + [t])
        r = best.get(src)
        if r is None:
            return None
        return (sum(count(j) for j in r[1] if j not in zero), r[1])

    staging = bar | inner
    # Where staging cannot be skipped (x staged every step), the path goes
    # through it with its blocks counted apart (stage_per_value).
    hot = epi = None
    zero_set = frozenset()
    for out, zero in ((staging, frozenset()), (frozenset(), staging)):
        hot = best_path(out, zero, False)
        epi = best_path(out, zero, True)
        if hot is not None:
            zero_set = zero
            break
    if hot is None:
        return None
    seq = [ins[k][1:] for j in hot[1] if j not in zero_set
           for k in range(bounds[j][0], bounds[j][1])]
    t0, t1 = schedule(seq, 0), schedule(seq, 1000)
    classes = {}
    for j in hot[1]:
        if j in zero_set:
            continue
        s, e = bounds[j]
        for k in range(s, e):
            c = iclass(ins[k][2])
            if c != "nop":
                classes[c] = classes.get(c, 0) + 1
    gbytes = sum(int(c[3:]) * n for c, n in classes.items()
                 if c.startswith("ldg"))
    # A kernel that streams its weight with L1::no_allocate loads (.NA) and
    # reads x through L1 (the mma kernel): the bytes from memory are those
    # of the .NA loads and of the narrower ones (scales), not x's.
    hot_ops = [ins[k][2] for j in hot[1] if j not in zero_set
               for k in range(bounds[j][0], bounds[j][1])]
    stream = None
    if any(op.startswith("LDG") and ".NA" in op for op in hot_ops):
        stream = sum(width(op) for op in hot_ops if op.startswith("LDG") and
                     (".NA" in op or width(op) < 16))
    # Staging: instructions per value stored to shared memory, from the
    # inner loops (f32 form: the shortest per value).
    per_value = None
    loops = [(t, j) for j, t in back if (j, t) != (src, head) and
             head <= t and j <= src]
    for t, j in loops:
        n = sum(count(b) for b in range(t, j + 1))
        sts = sum(count(b, lambda op: op.startswith("STS")) for b in
                  range(t, j + 1))
        if sts:
            v = n / float(sts)
            per_value = v if per_value is None else min(per_value, v)
    # The loop around it, if any (a walk over tiles, the main loop being
    # the walk over K): its cost per iteration besides the main loop.
    outer = [(j, t) for j, t in back if t <= head and j >= src and
             (j, t) != (src, head)]
    tile = 0
    if outer:
        osrc, ohead = min(outer, key=lambda b: b[0] - b[1])
        onest = set(body) | inner
        for jj, tt in back:
            if ohead <= tt and jj <= osrc and (tt, jj) != (ohead, osrc):
                onest.update(range(tt, jj + 1))
        saved = (head, src, body)
        head, src, body = ohead, osrc, set(range(ohead, osrc + 1))
        r = best_path(frozenset(), frozenset(onest), False)
        head, src, body = saved
        tile = r[0] if r else 0
    # Once per block: entry to exit with every loop counted apart.
    loops_all = set()
    for jj, tt in back:
        loops_all.update(range(tt, jj + 1))
    saved = (head, src, body)
    exits = [j for j in range(nb) if not succ[j]]
    once = 0
    head, body = 0, set(range(nb))
    for x in exits:
        src = x
        r = best_path(frozenset(), frozenset(loops_all), False)
        if r and r[0] > once:
            once = r[0]
    head, src, body = saved
    return {"hot": hot[0], "epi": (epi[0] - hot[0]) if epi else 0,
            "tile": tile, "once": once, "warp_cycles0": t0,
            "staging_in_hot": bool(zero_set),
            "warp_cycles_per_ldg_cycle": (t1 - t0) / 1000.0,
            "classes": classes, "ldg_bytes": gbytes,
            "ldg128": classes.get("ldg16", 0),
            **({"stream_bytes": stream} if stream is not None else {}),
            "stage_per_value": per_value or 0.0,
            "loop_len": sum(bounds[j][1] - bounds[j][0] for j in body)}


# ---------------------------------------------------------------- launches

Q4G, Q8C, Q8B, F8R = 1, 2, 3, 4
FMT = {"q4g": Q4G, "q8c": Q8C, "q8b": Q8B, "q8bz": Q8B, "f8r": F8R}
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K)
MS = [1, 4, 16, 64]
KTILE, WARPS, THREADS = 1024, 8, 256
WO_FORMATS = ["q4g", "q8c", "q8b", "q8bz", "f8r"]  # q8bz: q8b with zeros
AQ_FORMATS = ["q4g", "q8c"]
MMA_FORMATS = ["q4g"]  # the tensor-core WO kernel (bf16 x), wo_mma_kernel


def layout_bytes(fmt, n, k, group=128):
    """Bytes of the weight's layout a call reads: codes, f32 scales (and
    zeros), as qlinear-bench counts them (ql_cuda.h's cuda-1 layout)."""
    if fmt == "q4g":
        return n * ((k + 1) // 2) + 2 * 4 * n * (k // group)
    if fmt == "q8b":
        return n * k + 4 * n * (k // group)
    if fmt == "q8bz":
        return n * k + 2 * 4 * n * (k // group)
    return n * k + 4 * n


def call_bytes(kind, fmt, n, k, m, splits=1):
    """All a call must move: the layout, x (f32, or int8 codes with their
    scales and group sums for AQ), y (f32)."""
    if kind == "aq":
        x = m * k + 4 * m + (4 * m * (k // 128) if fmt == "q4g" else 0)
    elif kind == "mma":
        # bf16 x and y, and the splits' partial sums written and read
        return layout_bytes(fmt, n, k) + 2 * m * k + 2 * m * n + (
            8 * splits * m * n if splits > 1 else 0)
    else:
        x = 4 * m * k
    return layout_bytes(fmt, n, k) + x + 4 * m * n


# Launch rules that changed across the measured commits: q4g took 2048
# values of K a step up to 4 rows of x from 2fda2a8 on (before, four steps
# in flight up to 2 rows); the q8c AQ grid is persistent from b2fd5b5 on.
OLD_RULES = {"2cf3f54": {"q4g_step2": False, "aq_persistent": False,
                         "q4g_depth4": True},
             "6487ed0": {"aq_persistent": False}}
RULES = {}


def with_rules(commit):
    RULES.clear()
    RULES.update({"q4g_step2": True, "aq_persistent": True,
                  "q4g_depth4": False})
    RULES.update(OLD_RULES.get(commit, {}))


with_rules(None)


def wo_variant(fmt, m):
    """The streaming kernel's template arguments for m rows of x (the
    default kernel, linear_wo.cu's launch_stream)."""
    mt = 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8 if m <= 8 else 16
    d = 2 if mt <= 8 else 1                       # kDepth
    if fmt == "q4g" and mt <= 2 and RULES["q4g_depth4"]:
        d = 4
    b = 2 if mt <= 2 else 1                       # kMinBlocks
    return FMT[fmt], fmt in ("q4g", "q8bz"), mt, d, b


def aq_variant(fmt, m):
    """linear_aq_kernel<F, S, MT> for m rows (gs = 128 for q4g)."""
    return (Q4G, 128) if fmt == "q4g" else (Q8C, 64), 1 if m <= 4 else 2


def mma_variant(m):
    """(BF, NT) of wo_mma_kernel<BF, NT, RT> for m rows of bf16 x
    (linear_wo.cu's launch_mma): NT tiles of 8 rows of x; RT (tiles of 16
    rows of W a warp) is read from the kernel's name."""
    return 1, 1 if m <= 8 else 2 if m <= 16 else 4


MMA_NAME = re.compile(r"wo_mma_kernelILb(\d)ELi(\d)ELi(\d)EE")
WO_NAME = re.compile(r"wo_stream_kernelILi(\d)ELb(\d)ELi(\d+)E(?:Li(\d)ELi(\d)E)?E")
AQ_NAME = re.compile(r"linear_aq_kernelILi(\d)ELi(\d+)ELi(\d)EE")


def kernel_name(funcs, kind, fmt, m):
    if kind == "mma":
        want = mma_variant(m)
        for name in funcs:
            mm = MMA_NAME.search(name)
            if mm and tuple(int(x) for x in mm.groups()[:2]) == want:
                return name
        return None
    if kind == "aq":
        (f, s), mt = aq_variant(fmt, m)
        for name in funcs:
            mm = AQ_NAME.search(name)
            if mm and tuple(int(x) for x in mm.groups()) == (f, s, mt):
                return name
        return None
    f, z, mt, d, b = wo_variant(fmt, m)
    for name in funcs:
        mm = WO_NAME.search(name)
        if not mm:
            continue
        if (int(mm.group(1)), mm.group(2) == "1", int(mm.group(3))) != (f, z, mt):
            continue
        if mm.group(4) is None or (int(mm.group(4)), int(mm.group(5))) == (d, b):
            return name
    return None


def variant_key(kind, fmt, m):
    if kind == "mma":
        return "mma %s NT=%d" % (fmt, mma_variant(m)[1])
    mt = aq_variant(fmt, m)[1] if kind == "aq" else wo_variant(fmt, m)[2]
    return "%s %s MT=%d" % (kind, fmt, mt)


def splits_of(n, k):
    tiles = (k + KTILE - 1) // KTILE
    want = (1024 + n - 1) // n
    most = tiles // 2
    return 1 if most < 1 else min(min(want, 16), most)


def wo_launch(fmt, n, k, m, sms):
    """Grid and work of the streaming kernel (launch_stream_mt): blocks,
    row tiles and steps of the busiest block, stages of x, values of x a
    thread stages."""
    f, z, mt, d, b = wo_variant(fmt, m)
    chunk = 32 if f == Q4G else 16
    tk = 2 * KTILE if f == Q4G and mt <= 4 and RULES["q4g_step2"] else KTILE
    s_rows = min(mt, 8)
    xt = 8 * KTILE // s_rows
    rtiles = (n + 15) // 16
    s = splits_of(n, k)
    tiles = (k + KTILE - 1) // KTILE
    span = (tiles + s - 1) // s * KTILE
    slots = max(1, sms * b // s)
    per = (rtiles + slots - 1) // slots
    gx = (rtiles + per - 1) // per
    gy = (m + mt - 1) // mt
    kk = min(k, span)
    ktiles = max(1, (kk + tk - 1) // tk)
    keep_x = mt == s_rows and kk <= xt
    stages = 1 if keep_x else per * ((kk + xt - 1) // xt) * (mt // s_rows)
    return {"blocks": gx * gy * s, "tiles": per, "iters": per * ktiles / float(d),
            "epilogues": per, "stages": stages,
            "stage_values": stages * s_rows * xt // THREADS,
            "ldg128": d * 2 * (tk // chunk // 32), "passes": gy}


def mma_splits(n, k, sms):
    """linear_wo.cu's mma_splits(): one split where the 32-row tiles give
    two blocks an SM, else two where K holds a k-block of 128 values for
    each of both splits' 8 warps."""
    if (n + 31) // 32 >= 2 * sms:
        return 1
    return 2 if k >= 2 * WARPS * 128 else 1


def mma_launch(fmt, n, k, m, sms, rt):
    """Grid and work of wo_mma_kernel (launch_mma): blocks of 16·RT rows of
    W by 8·NT rows of x by splits of K; the busiest warp's k-blocks (one
    hot-loop iteration each); 2·RT 128-bit loads of codes and 4·NT of x an
    iteration."""
    _, nt = mma_variant(m)
    s = mma_splits(n, k, sms)
    nkb = k // 128
    per_split = (nkb + s - 1) // s
    passes = (m + 8 * nt - 1) // (8 * nt)
    blocks = (n + 16 * rt - 1) // (16 * rt) * passes * s
    return {"blocks": blocks, "tiles": 1,
            "iters": float((per_split + WARPS - 1) // WARPS),
            "epilogues": 0, "stages": 0, "stage_values": 0,
            "ldg128": 2 * rt + 4 * nt, "passes": passes,
            "splits": s, "launches": 2 if s > 1 else 1}


def aq_launch(fmt, n, k, m, sms, ldg128):
    """Grid and work of linear_aq_kernel (launch_aq): 16 channels a block,
    K split over its 8 warps, a ring of slabs per warp (ldg128 128-bit
    loads of codes an iteration, from the SASS), x staged per warp window
    of 512 / MT values."""
    (f, s), mt = aq_variant(fmt, m)
    ntiles = (n + 15) // 16
    persistent = f == Q8C and RULES["aq_persistent"]
    gx = min(ntiles, 2 * sms) if persistent else ntiles
    gy = (m + 8 * mt - 1) // (8 * mt)
    per = (ntiles + gx - 1) // gx
    epb = 2 if f == Q4G else 1
    lane_weights = 16 * (k // 8) // 32          # a lane's share of a tile
    iters = lane_weights / float(ldg128 * 16 * epb)
    kc = 512 // mt
    windows = (k // 8 + kc - 1) // kc
    stages = 1 if k // 8 <= kc else per * windows
    return {"blocks": gx * gy, "tiles": per, "iters": per * iters,
            "epilogues": 0, "stages": 0,  # warp-level: __syncwarp only
            "stage_values": stages * mt * kc // 32, "ldg128": ldg128,
            "passes": gy}


# ---------------------------------------------------------------- devices


def load_json(name):
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


def occupancy(dev, regs, shared, threads=THREADS):
    """Resident blocks per SM that registers, shared memory and threads
    allow (allocation granularities of sm_80..sm_90)."""
    per_warp = int(math.ceil(regs * 32 / 256.0)) * 256
    warps = threads // 32
    by_regs = dev["regs_per_sm"] // (per_warp * warps) if regs else 32
    by_smem = (dev["smem_per_sm"] // (shared + 1024)) if shared else 32
    by_thr = dev["threads_per_sm"] // threads
    return max(0, min(by_regs, by_smem, by_thr, 32))


def t_read(dev, nbytes):
    return dev["read_fix_us"] + nbytes / dev["read_bw"] * 1e6


def predict(dev, params, info, kind, fmt, n, k, m):
    """Predicted time (us) of one call and its three bounds. info: the
    kernel's counts (analyze()) with its registers and shared memory."""
    if kind == "aq":
        launch = aq_launch(fmt, n, k, m, dev["sms"], info["ldg128"])
    elif kind == "mma":
        launch = mma_launch(fmt, n, k, m, dev["sms"],
                            int(MMA_NAME.search(info["kernel"]).group(3)))
    else:
        launch = wo_launch(fmt, n, k, m, dev["sms"])
    if info["ldg128"] != launch["ldg128"]:
        raise RuntimeError("%s: %d 128-bit loads an iteration, the launch "
                           "model expects %d" % (info.get("kernel", kind),
                                                 info["ldg128"],
                                                 launch["ldg128"]))
    nbytes = layout_bytes(fmt, n, k)
    mem = t_read(dev, call_bytes(kind, fmt, n, k, m,
                                 launch.get("splits", 1)))
    per_thread = (launch["iters"] * info["hot"] +
                  launch["epilogues"] * info["epi"] / (info["hot_steps"]) +
                  launch["tiles"] * info["tile"] + info["once"] +
                  launch["stage_values"] * info["stage_per_value"])
    blocks = launch["blocks"]
    occ = occupancy(dev, info["regs"], info["shared"])
    per_sm = int(math.ceil(blocks / float(dev["sms"])))
    resident = max(1, min(occ, per_sm))
    # Issue. A scheduler issues at most one instruction a cycle, and a warp
    # one every issue_cycles (a parameter: the mean interval its
    # instructions' latencies allow), so with W warps a scheduler reaches
    # eta = min(1, W / issue_cycles) of its peak. Each stage of x outside
    # the hot path is a barrier behind loads from memory: the block's warps
    # wait stage_wait_ns there (a parameter).
    wsched = resident * WARPS / float(dev["schedulers"])
    eta = min(1.0, wsched / params["issue_cycles"])
    rest = (launch["epilogues"] * info["epi"] / info["hot_steps"] +
            launch["tiles"] * info["tile"] + info["once"] +
            launch["stage_values"] * info["stage_per_value"])
    per_thread = launch["iters"] * info["hot"] + rest
    waits = launch["stages"] * per_sm / float(resident)
    warp_insns = per_sm * WARPS * per_thread  # the busiest SM
    issue = (dev["read_fix_us"] + warp_insns / (
        dev["schedulers"] * dev["clock_ghz"] * 1e3 * eta) +
        waits * params["stage_wait_ns"] * 1e-3)
    # Little's law: the busiest SM's bytes over what its loads in flight
    # deliver (each thread keeps a ring iteration of loads out).
    # (The weight stream's bytes: for the mma kernel, the loads of codes and
    # scales, not those of x, which L1 serves.)
    inflight = resident * THREADS * info.get("stream_bytes",
                                             info["ldg_bytes"])
    sm_bytes = nbytes * launch["passes"] / float(blocks) * per_sm
    little = dev["read_fix_us"] + sm_bytes / (
        inflight / (params["latency_ns"] * 1e-3))
    t = max(mem, issue, little)
    extra = 0.0
    if kind == "aq" or launch.get("launches", 1) > 1:
        # quantize_rows runs before it (or, after the mma kernel's splits,
        # reduce_kernel): a second kernel of the call, at the fixed cost of
        # a launch (its bytes are a few KiB).
        extra = dev["read_fix_us"]
    return {"us": t + extra, "mem_us": mem, "issue_us": issue,
            "little_us": little,
            "bound": "memory" if t == mem else "issue" if t == issue
            else "latency",
            "frac": mem / (t + extra),
            "eta": eta,
            "warp_cycles_per_insn": info["warp_cycles0"] / float(info["hot"]),
            "warp_insns": per_thread * WARPS * blocks,
            "insn_per_weight": per_thread * THREADS * blocks /
            float(n * k * launch["passes"]),
            "occupancy": occ, "resident": resident}


def device(name, devs=None):
    """A device of devices.json with its in-run read line fitted."""
    devs = devs or load_json("devices.json")
    d = dict(devs[name])
    pts = d.get("read_points") or []
    if len(pts) >= 2 and not d.get("read_fix_from"):
        xs = [p[1] for p in pts]
        ys = [p[2] for p in pts]
        n = float(len(xs))
        mx, my = sum(xs) / n, sum(ys) / n
        slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
                 sum((x - mx) ** 2 for x in xs))
        d["read_fix_us"] = my - slope * mx
        d["read_bw"] = 1e6 / slope
    else:
        base = device(d["read_fix_from"], devs)
        d["read_fix_us"] = base["read_fix_us"]
        if pts:  # one size: the fixed part from the reference device
            d["read_bw"] = sum(p[1] / (p[2] - d["read_fix_us"]) * 1e6
                               for p in pts) / len(pts)
        else:
            d["read_bw"] = d["hbm_bw"] * d["read_nominal_fraction"]
    return d


# ---------------------------------------------------------------- kernels


def kernel_infos(funcs, res, kind):
    """Counts of every variant the canonical batches use: {key: info}."""
    out = {}
    kinds = [kind] + (["mma"] if kind == "wo" and any(
        MMA_NAME.search(f) for f in funcs) else [])
    for kd in kinds:
        fmts = {"aq": AQ_FORMATS, "mma": MMA_FORMATS}.get(kd, WO_FORMATS)
        for fmt in fmts:
            for m in MS:
                key = variant_key(kd, fmt, m)
                if key in out:
                    continue
                name = kernel_name(funcs, kd, fmt, m)
                if name is None:
                    raise RuntimeError("no %s kernel for %s M=%d" %
                                       (kd, fmt, m))
                a = analyze(funcs[name])
                if a is None:
                    raise RuntimeError("no steady-state loop in " + name)
                r = res.get(name, {})
                a.update(regs=r.get("regs", 0), shared=r.get("shared", 0),
                         local=r.get("local", 0), kernel=name,
                         hot_steps=wo_variant(fmt, m)[3] if kd == "wo"
                         else 1)
                out[key] = a
    return out


def object_infos(cuobjdump, obj, kind, arch="sm_90"):
    return kernel_infos(disassemble(cuobjdump, obj, arch),
                        resources(cuobjdump, obj, arch), kind)


def table(infos, dev, params):
    rows = []
    for kind, fmts in (("wo", WO_FORMATS), ("mma", MMA_FORMATS),
                       ("aq", AQ_FORMATS)):
        for fmt in fmts:
            for n, k in SHAPES:
                for m in MS:
                    key = variant_key(kind, fmt, m)
                    if key not in infos:
                        continue
                    p = predict(dev, params, infos[key], kind, fmt, n, k, m)
                    rows.append({"kernel": kind, "fmt": fmt,
                                 "shape": "%dx%d" % (n, k), "m": m,
                                 "us": round(p["us"], 2),
                                 "frac": round(p["frac"], 3),
                                 "bound": p["bound"],
                                 "insn_per_weight":
                                 round(p["insn_per_weight"], 2)})
    return rows


def row_key(r):
    return "%s %s %s M=%d" % (r["kernel"], r["fmt"], r["shape"], r["m"])


def print_table(rows, base=None, out=sys.stdout):
    out.write("%-4s %-5s %-11s %3s %9s %6s %8s %6s %s\n" % (
        "op", "fmt", "NxK", "M", "pred us", "frac", "baseline", "ipw",
        "bound"))
    for r in rows:
        b = base.get(row_key(r)) if base else None
        out.write("%-4s %-5s %-11s %3d %9.2f %6.3f %8s %6.2f %s\n" % (
            r["kernel"], r["fmt"], r["shape"], r["m"], r["us"], r["frac"],
            "%.3f" % b if b is not None else "-", r["insn_per_weight"],
            r["bound"]))


# ---------------------------------------------------------------- builds

NVCC_FLAGS = ["-std=c++17", "-O3", "--fmad=false", "-Werror",
              "all-warnings", "-Xptxas", "-v"]  # Makefile.am's NVCC_FLAGS


def nvcc_path():
    n = os.environ.get("NVCC") or shutil.which("nvcc")
    if not n and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        n = "/usr/local/cuda/bin/nvcc"
    return n


def build_cubin(src_dir, out, arch="sm_90", source="linear_wo.cu"):
    """nvcc SOURCE of src_dir (a kernels/cuda directory) into a cubin for
    one arch, with the build's flags; ptxas' report beside it."""
    nvcc = nvcc_path()
    if not nvcc:
        raise RuntimeError("no nvcc (set NVCC)")
    num = arch.split("_")[1]
    cmd = [nvcc] + NVCC_FLAGS + ["-gencode", "arch=compute_%s,code=%s" %
                                 (num, arch), "-cubin", "-o", out,
                                 os.path.join(src_dir, source)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, cwd=src_dir)
    with open(out + ".ptxas", "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        raise RuntimeError("nvcc failed:\n" + r.stdout[-3000:])
    if re.search(r"[1-9]\d* bytes spill stores", r.stdout):
        sys.stderr.write("gpumodel: %s: ptxas reports a spill\n" % out)
    return out


def commit_cubin(repo, commit, cache, arch="sm_90", source="linear_wo.cu"):
    """The cubin of SOURCE at a commit: its kernels/cuda/ from git archive
    into a scratch directory, compiled (cached by commit and arch)."""
    out = os.path.join(cache, "%s-%s-%s.cubin" % (source.split(".")[0],
                                                  commit, arch))
    if os.path.exists(out):
        return out
    tmp = tempfile.mkdtemp(prefix="gpumodel-src-")
    try:
        arch_p = subprocess.Popen(["git", "-C", repo, "archive", commit,
                                   "kernels/cuda"], stdout=subprocess.PIPE)
        subprocess.check_call(["tar", "-x", "-C", tmp], stdin=arch_p.stdout)
        if arch_p.wait() != 0:
            raise RuntimeError("git archive %s failed" % commit)
        build_cubin(os.path.join(tmp, "kernels", "cuda"), out + ".tmp", arch,
                    source)
        os.rename(out + ".tmp", out)
        os.rename(out + ".tmp.ptxas", out + ".ptxas")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------- calibration

# The measured figures (docs/performance.md: "GPU kernels against the memory's peak",
# the mapped-mode table, ncu's count quoted there), each with the commit
# whose kernels were measured: (device, op, format, N, K, M, commit, us).
# The H200 cases fit the parameters; the H100 cases only check them.
CASES = [
    # H200, 2026-11-26, deploy/gpu-check (the README table of 3c263a4:
    # linear_wo.cu and linear_aq.cu as of 6487ed0).
    ("H200", "wo", "q4g", 14336, 4096, 1, "6487ed0", 27.3),
    ("H200", "wo", "q8c", 14336, 4096, 1, "6487ed0", 31.2),
    ("H200", "wo", "q8b", 14336, 4096, 1, "6487ed0", 33.7),
    ("H200", "wo", "f8r", 14336, 4096, 1, "6487ed0", 52.4),
    ("H200", "wo", "q4g", 4096, 4096, 1, "6487ed0", 11.3),
    ("H200", "wo", "q8c", 4096, 4096, 1, "6487ed0", 12.4),
    ("H200", "wo", "q8b", 4096, 4096, 1, "6487ed0", 12.9),
    ("H200", "wo", "f8r", 4096, 4096, 1, "6487ed0", 18.0),
    ("H200", "wo", "q4g", 14336, 4096, 16, "6487ed0", 536.0),
    ("H200", "wo", "q8c", 14336, 4096, 16, "6487ed0", 553.0),
    ("H200", "wo", "q8b", 14336, 4096, 16, "6487ed0", 532.0),
    ("H200", "wo", "f8r", 14336, 4096, 16, "6487ed0", 641.0),
    ("H200", "aq", "q4g", 14336, 4096, 1, "6487ed0", 24.0),
    ("H200", "aq", "q8c", 14336, 4096, 1, "6487ed0", 28.0),
    ("H200", "aq", "q4g", 14336, 4096, 16, "6487ed0", 60.1),
    ("H200", "aq", "q8c", 14336, 4096, 16, "6487ed0", 51.6),
    # H100, 2026-11-27, q4g linear_wo with f32 scales (commit 1d26d31,
    # QL_CUDA_WIDE_SCALES=1; its wo_stream_kernel is 6487ed0's).
    ("H100", "wo", "q4g", 4096, 4096, 1, "1d26d31", 11.77),
    ("H100", "wo", "q4g", 14336, 4096, 1, "1d26d31", 28.59),
    ("H100", "wo", "q4g", 4096, 14336, 1, "1d26d31", 36.14),
    # H100, 2026-11-26, linear_aq with QL_CUDA_IMMA_MIN_ROWS=0: b2fd5b5's
    # kernel and the previous one (linear_aq.cu as of 6487ed0) in one run.
    ("H100", "aq", "q8c", 14336, 4096, 1, "b2fd5b5", 28.2),
    ("H100", "aq", "q8c", 14336, 4096, 2, "b2fd5b5", 28.9),
    ("H100", "aq", "q8c", 14336, 4096, 8, "b2fd5b5", 36.7),
    ("H100", "aq", "q8c", 14336, 4096, 16, "b2fd5b5", 51.0),
    ("H100", "aq", "q8c", 4096, 14336, 1, "b2fd5b5", 30.2),
    ("H100", "aq", "q8c", 4096, 14336, 16, "b2fd5b5", 64.6),
    ("H100", "aq", "q8c", 4096, 4096, 1, "b2fd5b5", 10.5),
    ("H100", "aq", "q8c", 4096, 4096, 16, "b2fd5b5", 15.4),
    ("H100", "aq", "q8c", 14336, 4096, 1, "6487ed0", 30.9),
    ("H100", "aq", "q8c", 14336, 4096, 2, "6487ed0", 32.8),
    ("H100", "aq", "q8c", 14336, 4096, 8, "6487ed0", 40.1),
    ("H100", "aq", "q8c", 14336, 4096, 16, "6487ed0", 52.6),
    ("H100", "aq", "q8c", 4096, 14336, 1, "6487ed0", 34.0),
    ("H100", "aq", "q8c", 4096, 14336, 16, "6487ed0", 70.7),
    ("H100", "aq", "q8c", 4096, 4096, 1, "6487ed0", 10.2),
    ("H100", "aq", "q8c", 4096, 4096, 16, "6487ed0", 17.0),
    ("H100", "aq", "q4g", 14336, 4096, 1, "6487ed0", 24.4),
]
# ncu on wo_stream_kernel, q4g, M = 1, 14336x4096 (H200): 14.9 million
# warp instructions after the division-free loop (docs/performance.md). Paired with
# 6487ed0, the build of the README's table; 2cf3f54 (division-free, before
# the 2048-value steps) beside it.
NCU_CASES = [("H200", "wo", "q4g", 14336, 4096, 1, "6487ed0", 14.9e6),
             ("H200", "wo", "q4g", 14336, 4096, 1, "2cf3f54", 14.9e6)]
FIT_DEVICE = "H200"
TOLERANCE = 0.25
SOURCES = {"wo": "linear_wo.cu", "aq": "linear_aq.cu"}


def case_key(c):
    return "%s %s %s %dx%d M=%d @%s" % c[:7]


def evaluate(cases, counts, params, devs):
    rows = []
    for c in cases:
        with_rules(c[6])
        dev = device(c[0], devs)
        info = counts[c[6]][variant_key(c[1], c[2], c[5])]
        p = predict(dev, params, info, c[1], c[2], c[3], c[4], c[5])
        rows.append({"case": case_key(c), "device": c[0], "op": c[1],
                     "fmt": c[2], "shape": "%dx%d" % (c[3], c[4]), "m": c[5],
                     "commit": c[6], "measured_us": c[7],
                     "predicted_us": round(p["us"], 2),
                     "error_pct": round(100.0 * (p["us"] / c[7] - 1), 1),
                     "bound": p["bound"], "fit": c[0] == FIT_DEVICE})
    with_rules(None)
    return rows


def evaluate_ncu(counts, params, devs):
    rows = []
    for c in NCU_CASES:
        with_rules(c[6])
        dev = device(c[0], devs)
        info = counts[c[6]][variant_key(c[1], c[2], c[5])]
        p = predict(dev, params, info, c[1], c[2], c[3], c[4], c[5])
        rows.append({"case": "ncu warp instructions " + case_key(c),
                     "commit": c[6], "measured": c[7],
                     "predicted": round(p["warp_insns"]),
                     "error_pct": round(100.0 * (p["warp_insns"] / c[7] - 1),
                                        1)})
    with_rules(None)
    return rows


def fit(cases, counts, devs):
    """The three parameters by grid search: the smallest worst error
    |log(predicted / measured)| over the fit device's cases (the target is
    every case within the tolerance), ties to the least squares."""
    best = None
    mine = [c for c in cases if c[0] == FIT_DEVICE]
    for ic in [x / 4.0 for x in range(8, 61)]:          # 2 .. 15 cycles
        for wait in range(0, 4001, 100):                # ns
            for lat in [float(x) for x in range(400, 2401, 200)]:
                params = {"issue_cycles": ic, "stage_wait_ns": float(wait),
                          "latency_ns": lat}
                rows = evaluate(mine, counts, params, devs)
                logs = [abs(math.log(1 + r["error_pct"] / 100.0))
                        for r in rows]
                err = (round(max(logs), 3), sum(x * x for x in logs))
                if best is None or err < best[0]:
                    best = (err, params)
    return best[1]


def calibrate(repo, cache, do_fit):
    devs = load_json("devices.json")
    counts = {}
    cuobjdump = need_cuobjdump()
    need = {}
    for c in CASES + NCU_CASES:
        need.setdefault(c[6], set()).add(c[1])
    for commit in sorted(need):
        with_rules(commit)
        counts[commit] = {}
        for kind in sorted(need[commit]):
            cub = commit_cubin(repo, commit, cache, source=SOURCES[kind])
            sys.stderr.write("gpumodel: analyzing %s\n" % cub)
            counts[commit].update(object_infos(cuobjdump, cub, kind))
    with_rules(None)
    old = {}
    if os.path.exists(os.path.join(HERE, "calibration.json")):
        old = load_json("calibration.json")
    params = fit(CASES, counts, devs) if do_fit or not old else old["params"]
    rows = evaluate(CASES, counts, params, devs)
    doc = {"_doc": "gpumodel.py calibrate --fit: the model's parameters "
           "(fitted on the %s cases, unchanged on the others), each measured "
           "case with the commit whose sm_90 cubin was analyzed, and the "
           "counts of those cubins, so that the gate rechecks the fit "
           "without rebuilding them." % FIT_DEVICE,
           "params": params, "tolerance": TOLERANCE, "cases": rows,
           "ncu": evaluate_ncu(counts, params, devs), "counts": counts}
    with open(os.path.join(HERE, "calibration.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return doc


def need_cuobjdump():
    c = find_cuobjdump()
    if not c:
        raise SystemExit("gpumodel: FAIL: no cuobjdump ($QL_CUOBJDUMP, PATH, "
                         "or the nvidia-cuda-cuobjdump wheel in %s)" %
                         sys.executable)
    return c


# ---------------------------------------------------------------- gate

DROP = 0.10  # a predicted fraction more than 10 % below its baseline fails
OBJECTS = {"wo": "kernels/cuda/gpu-linear_wo.o",
           "aq": "kernels/cuda/gpu-linear_aq.o"}


def today_objects(args, top):
    """{op: object}: OP=PATH arguments, else the build's nvcc objects
    (every arch), else cubins compiled here for sm_90 (minutes)."""
    objs = {}
    for a in args:
        if "=" in a:
            k, v = a.split("=", 1)
            objs[k] = v
    for kind, rel in OBJECTS.items():
        if kind in objs:
            continue
        for c in (os.path.join(os.getcwd(), rel), os.path.join(top, rel)):
            if os.path.exists(c):
                objs[kind] = c
                break
        else:
            tmp = tempfile.mkdtemp(prefix="gpumodel-")
            sys.stderr.write("gpumodel: no %s; compiling %s for sm_90 into "
                             "%s (minutes)\n" % (rel, SOURCES[kind], tmp))
            objs[kind] = build_cubin(os.path.join(top, "kernels", "cuda"),
                                     os.path.join(tmp, kind + ".cubin"),
                                     source=SOURCES[kind])
    return objs


def all_infos(objs, arch="sm_90"):
    cuobjdump = need_cuobjdump()
    infos = {}
    for kind, obj in sorted(objs.items()):
        infos.update(object_infos(cuobjdump, obj, kind, arch))
    return infos


def gate(objs, cal, base_doc, devs, out=sys.stdout):
    infos = all_infos(objs)
    dev = device(FIT_DEVICE, devs)
    params = cal["params"]
    rows = table(infos, dev, params)
    base = base_doc.get("frac", {})
    out.write("gpumodel: %s on %s (issue_cycles %.2f, stage_wait %.0f ns, "
              "latency %.0f ns); frac = in-run read time / predicted time\n"
              % (" ".join(sorted(objs.values())), FIT_DEVICE,
                 params["issue_cycles"], params["stage_wait_ns"],
                 params["latency_ns"]))
    print_table(rows, base, out)
    bad = 0
    for r in rows:
        key = row_key(r)
        if key not in base:
            out.write("gpumodel: FAIL: %s has no baseline (gpumodel.py "
                      "baseline)\n" % key)
            bad += 1
        elif r["frac"] < base[key] * (1 - DROP):
            out.write("gpumodel: FAIL: %s: predicted fraction %.3f, more "
                      "than %d %% below its baseline %.3f\n" %
                      (key, r["frac"], int(DROP * 100), base[key]))
            bad += 1
    for a in infos.values():
        if a.get("local"):
            out.write("gpumodel: FAIL: %s uses local memory\n" % a["kernel"])
            bad += 1
    # The calibration, recomputed from the stored counts of the measured
    # commits with this model and its parameters.
    out.write("calibration (every case within %d %%):\n" %
              int(TOLERANCE * 100))
    # A case the fit left outside the tolerance (calibration.json) is
    # printed as a known miss and fails only if its error grows;
    # QL_GPUMODEL_STRICT=1 fails every case outside the tolerance.
    strict = os.environ.get("QL_GPUMODEL_STRICT") == "1"
    fitted = {r["case"]: r["error_pct"] for r in cal["cases"]}
    misses = 0
    for r in evaluate(CASES, cal["counts"], params, devs):
        ok = abs(r["error_pct"]) <= TOLERANCE * 100
        was = fitted.get(r["case"])
        known = (not ok and not strict and was is not None and
                 abs(was) > TOLERANCE * 100 and
                 abs(r["error_pct"]) <= abs(was) + 1.0)
        misses += 0 if ok else 1
        out.write("  %-40s measured %7.2f predicted %7.2f us %+6.1f %% "
                  "%-5s %-7s%s\n" % (r["case"], r["measured_us"],
                                      r["predicted_us"], r["error_pct"],
                                      "fit" if r["fit"] else "check",
                                      r["bound"], "" if ok else
                                      "  known miss" if known else "  FAIL"))
        bad += 0 if ok or known else 1
    out.write("calibration: %d of %d cases within %d %%\n" % (
        len(CASES) - misses, len(CASES), int(TOLERANCE * 100)))
    for r in evaluate_ncu(cal["counts"], params, devs):
        ok = abs(r["error_pct"]) <= TOLERANCE * 100
        out.write("  %-56s measured %.4g predicted %.4g %+6.1f %%%s\n" %
                  (r["case"], r["measured"], r["predicted"], r["error_pct"],
                   "" if ok else "  FAIL"))
        bad += 0 if ok else 1
    return bad


def main(argv):
    top = os.path.dirname(os.path.dirname(HERE))
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0 if len(argv) >= 2 else 2
    mode, args = argv[1], argv[2:]
    devs = load_json("devices.json")
    if mode == "calibrate":
        cache = os.environ.get("QL_GPUMODEL_CACHE") or tempfile.mkdtemp(
            prefix="gpumodel-cache-")
        doc = calibrate(top, cache, "--fit" in args)
        for r in doc["cases"]:
            sys.stdout.write("%-40s %8.2f %8.2f %+6.1f%% %s\n" % (
                r["case"], r["measured_us"], r["predicted_us"],
                r["error_pct"], r["bound"]))
        for r in doc["ncu"]:
            sys.stdout.write("%s: %.4g / %.4g %+.1f%%\n" % (
                r["case"], r["measured"], r["predicted"], r["error_pct"]))
        sys.stdout.write("params: %s\n" % json.dumps(doc["params"]))
        return 0
    cal = load_json("calibration.json")
    if mode in ("table", "baseline"):
        objs = today_objects([a for a in args if "=" in a], top)
        names = [FIT_DEVICE]
        if "--all" in args:
            names = [d for d in devs if not d.startswith("_")]
        infos = {FIT_DEVICE: all_infos(objs)}
        for name in names:
            arch = devs[name]["arch"]
            if arch not in infos:
                infos[arch] = all_infos(objs, arch)
            inf = infos[FIT_DEVICE] if devs[name]["arch"] == "sm_90" \
                else infos[arch]
            rows = table(inf, device(name, devs), cal["params"])
            if mode == "baseline" and name == FIT_DEVICE:
                doc = {"_doc": "Predicted fraction of the in-run read (read "
                       "time / predicted time) of each kernel variant on the "
                       "canonical shapes on %s, written by gpumodel.py "
                       "baseline from today's kernels; the gate fails a drop "
                       "of more than %d %%." % (FIT_DEVICE, int(DROP * 100)),
                       "device": FIT_DEVICE, "params": cal["params"],
                       "frac": {row_key(r): r["frac"] for r in rows}}
                with open(os.path.join(HERE, "baseline.json"), "w") as f:
                    json.dump(doc, f, indent=1, sort_keys=True)
            sys.stdout.write("== %s (%s, read %.2f TB/s + %.2f us)\n" % (
                name, devs[name]["arch"], device(name, devs)["read_bw"] / 1e12,
                device(name, devs)["read_fix_us"]))
            print_table(rows, out=sys.stdout)
        return 0
    if mode == "gate":
        objs = today_objects([a for a in args if "=" in a], top)
        bad = gate(objs, cal, load_json("baseline.json"), devs)
        if bad:
            sys.stdout.write("gpumodel: FAIL (%d)\n" % bad)
            return 1
        sys.stdout.write("gpumodel: PASS\n")
        return 0
    sys.stderr.write("gpumodel: unknown mode %s\n" % mode)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
