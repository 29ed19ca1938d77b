#!/usr/bin/env python3
# make_session_ops_seeds.py - writes the seed corpus of fuzz_session_ops.c
# (tests/fuzz/corpus/session_ops/), one script per request kind, bound and
# failure, in the target's own format (its OP_* list and configuration
# bytes); run by hand when that format changes:
#
#   tests/fuzz/make_session_ops_seeds.py tests/fuzz/corpus/session_ops \
#     tests/fuzz/corpus/session
#
# The second directory, the session decoder's corpus, is replayed as raw
# packets.
import os, struct, glob, sys
out = sys.argv[1]; sess_corpus = sys.argv[2]
(CONNECT, RAW, OPEN, REGION, DESTROY, IMPORT, RELEASE, RING, MAP, HOLD, UNHOLD,
 UNLOAD, FAIL_SEND, CLOSE, END, EXPIRE, SUBMIT, RUN, POKE) = range(19)
def u16(v): return struct.pack('<H', v)
def u32(v): return struct.pack('<I', v)
def u64(v): return struct.pack('<Q', v)
def connect(who=0): return bytes([CONNECT, who])
def open_(c=0, v=1, name=b'seed', rid=1): return bytes([OPEN, c, v, len(name)]) + name + bytes([rid])
def region(c=0, kind=3, fdk=0, size=None):
    b = bytes([REGION, c, kind, fdk])
    if kind & 8: b += u16(size)
    return b
def destroy(c=0, which=1, rid=None):
    b = bytes([DESTROY, c, which])
    if rid is not None: b += u64(rid)
    return b
def imp(c=0, dev=1, fdk=1, hk=0, size=1 << 20): return bytes([IMPORT, c, dev, fdk, hk]) + u64(size)
def release(c=0, which=1, iid=None):
    b = bytes([RELEASE, c, which])
    if iid is not None: b += u64(iid)
    return b
def ring(c=0, kind=0, entries=None):
    b = bytes([RING, c, kind])
    if kind & 8: b += u32(entries)
    return b
def map_(c=0, w=0, dev=5): return bytes([MAP, c, w, dev])
def hold(c=0, n=0): return bytes([HOLD, c, n])
def unhold(c=0, n=0): return bytes([UNHOLD, c, n])
def unload(n=0, mask=3): return bytes([UNLOAD, n, mask])
def fail(c=0): return bytes([FAIL_SEND, c])
def close(c=0): return bytes([CLOSE, c])
def end(c=0): return bytes([END, c])
def expire(k=1): return bytes([EXPIRE, k])
def submit(c=0, tag=1, msg=b'\x08\x01'): return bytes([SUBMIT, c, tag]) + u16(len(msg)) + msg
def run(): return bytes([RUN])
def poke(c=0, off=0, v=0): return bytes([POKE, c]) + u16(off) + u32(v)
def raw(c=0, fdk=0, data=b''): return bytes([RAW, c, fdk]) + u16(len(data) - 1) + data

# c0: mapped (0 off, 1 owner, 2 any) | pinned<<2 | ze failed 0x10 | cuda
# failed 0x20 | export fails 0x40 (0xc0: ENOTSUP) | ipc fails 0x80 alone.
# c1: residency 2 bits per weight (1 ze, 2 cuda) | 0x40 no pinning |
# 0xc0 the listener cannot open.
ANY, OWNER, OFF = 2, 1, 0
def cfg(c0=ANY | 4, c1=0x15): return bytes([c0, c1])
O = connect() + open_()
seeds = {
 'connect': cfg() + connect(),
 'open': cfg() + O,
 'open_twice': cfg() + O + open_(rid=2),
 'open_version': cfg() + connect() + open_(v=2) + open_(v=0) + open_(v=1),
 'open_unprintable': cfg() + connect() + open_(name=bytes(range(1, 80, 1))[:79]),
 'not_open': cfg() + connect() + region() + destroy(which=0) + imp() + release(which=0) + ring() + map_(),
 'region': cfg() + O + region(kind=8, size=4096) + region(kind=3) + destroy(which=1) + destroy(which=3) + destroy(which=2, rid=12345),
 'region_bounds': cfg() + O + region(kind=5) + region(kind=6) + region(kind=7) + region(kind=0) + region(kind=5) + destroy(which=1) + region(kind=6),
 'region_count': cfg() + O + b''.join(region(kind=1) for _ in range(66)) + destroy(which=1) + region(kind=1) + region(kind=1),
 'region_pinned': cfg(ANY | 4) + O + region(kind=4) + region(kind=4) + region(kind=8, size=100) + destroy(which=1) + region(kind=4),
 'region_no_pin': cfg(ANY, 0x55) + O + region(kind=4) + destroy(which=1),
 'region_other_session': cfg() + O + connect(1) + open_(c=1) + region(c=0, kind=3) + destroy(c=1, which=0x01) + destroy(c=0, which=0x01),
 'region_fds': cfg() + O + region(kind=3, fdk=1) + region(kind=3, fdk=2) + region(kind=3, fdk=3),
 'import': cfg() + O + imp(dev=1) + imp(dev=2, size=0) + release(which=1) + release(which=1) + release(which=0) + release(which=2, iid=999),
 'import_bad': cfg() + O + imp(dev=0) + imp(dev=3) + imp(dev=4) + imp(dev=5) + imp(fdk=4) + imp(hk=0x30) + imp(hk=0xf0) + imp(hk=7) + imp(hk=15),
 'import_failed_device': cfg(ANY | 0x10) + O + imp(dev=1),
 'import_driver_fails': cfg(ANY | 0x80) + O + imp(dev=1) + imp(dev=2, fdk=2),
 'import_many': cfg() + O + b''.join(imp(dev=1, fdk=1, size=i + 1) for i in range(66)),
 'import_other_session': cfg() + O + connect(1) + open_(c=1) + imp(c=0) + release(c=1, which=0x01) + release(c=0, which=0x01),
 'ring': cfg() + O + ring() + ring() + submit() + submit(msg=b'garbage!') + run() + submit(msg=b'') + run(),
 'ring_entries': cfg() + O + ring(kind=1) + ring(kind=4) + ring(kind=6) + ring(kind=7) + ring(kind=8, entries=128) + ring(kind=3),
 'ring_fd': cfg() + O + ring(kind=0x12) + ring(kind=0x35),
 'ring_violation': cfg() + O + ring(kind=3) + submit() + poke(off=64, v=0x7fffffff) + run() + connect() + open_() + ring(),
 'ring_poke': cfg() + O + ring(kind=2) + poke(off=68, v=1) + poke(off=72, v=5) + poke(off=128, v=3) + submit() + run(),
 'ring_budget': cfg() + O + region(kind=5) + ring() + destroy(which=1) + ring(),
 'map': cfg(ANY, 0x05) + O + hold(n=0) + map_(w=0, dev=5) + map_(w=0, dev=1) + unhold(n=0) + map_(w=0, dev=3) + map_(w=1) + map_(w=0x80) + map_(w=0, dev=4) + close(),
 'map_cuda': cfg(ANY, 0x2a) + O + hold(n=1) + hold(n=2) + map_(w=1, dev=3) + map_(w=2, dev=5) + unhold(n=1) + unhold(n=2),
 'map_owner': cfg(OWNER, 0x05) + connect(1) + open_() + hold() + map_() + connect(0) + open_(c=1) + hold(c=1) + map_(c=1) + connect(2) + open_(c=2) + hold(c=2) + map_(c=2),
 'map_off': cfg(OFF, 0x05) + O + hold() + map_(),
 'map_export_fails': cfg(ANY | 0x40, 0x05) + O + hold() + map_() + unhold(),
 'map_export_notsup': cfg(ANY | 0xc0, 0x05) + O + hold() + map_(),
 'map_generic_layout': cfg(ANY, 0x00) + O + unload(n=2, mask=0x85) + hold(n=2) + map_(w=2, dev=3) + map_(w=2) + map_(w=1),
 'map_failed_device': cfg(ANY | 0x30, 0x0f) + O + hold(n=0) + hold(n=1) + map_(w=0) + map_(w=1, dev=1) + map_(w=1, dev=3),
 'map_after_unload': cfg(ANY, 0x05) + O + hold(n=1) + map_(w=1) + unload(n=1, mask=3) + hold(n=1) + map_(w=1) + unhold(n=1) + unhold(n=1) + unhold(n=1) + end(),
 'hold_unload': cfg() + O + hold(n=1) + unload(n=1) + hold(n=1) + unhold(n=1) + unhold(n=1) + unhold(n=1) + hold(n=2) + hold(n=2) + unhold(n=2) + connect(1) + hold(c=1, n=0) + close(),
 'send_fail_region': cfg() + O + fail() + region(kind=3) + connect() + open_() + region(kind=3),
 'send_fail_ring': cfg() + O + fail() + ring(),
 'send_fail_import': cfg() + O + fail() + imp(dev=1),
 'send_fail_map': cfg(ANY, 0x05) + O + hold() + fail() + map_(),
 'send_fail_open': cfg() + connect() + fail() + open_(),
 'send_fail_garbage': cfg() + O + fail() + raw(data=b'\xff\xff\xff'),
 'close': cfg(ANY, 0x05) + O + region(kind=3) + ring() + imp(dev=1) + hold() + map_() + close() + close(),
 'end': cfg(ANY, 0x05) + O + region(kind=3) + ring() + imp(dev=1) + hold() + map_() + end() + end(),
 'lease': cfg() + O + connect(1) + region(c=0, kind=3) + expire(0) + expire(2) + run() + expire(1) + run() + connect() + open_(),
 'many_connections': cfg() + connect() + connect(1) + connect(2) + connect(3) + connect(4) + close(1) + connect(5) + open_(c=1) + end(2) + connect(6) + run(),
 'listener_fails': cfg(ANY, 0xc0) + O,
 'garbage': cfg() + O + raw(data=b'\x00') + raw(fdk=1, data=b'\x0a\x0b\x0c') + raw(fdk=2, data=bytes(range(256)) * 4) + raw(fdk=3, data=b'\xff' * 4096),
}
# The session decoder's corpus as raw packets, on an open session and on
# one that is not, each with a descriptor now and then.
files = sorted(glob.glob(os.path.join(sess_corpus, '*.bin')))
pk = b''.join(raw(fdk=i % 4, data=open(f, 'rb').read()[:4096] or b'\x00') for i, f in enumerate(files))
seeds['raw_session_corpus'] = cfg(ANY, 0x05) + O + hold() + pk
seeds['raw_session_corpus_closed'] = cfg() + connect() + pk
os.makedirs(out, exist_ok=True)
for k, v in seeds.items():
    open(os.path.join(out, k + '.bin'), 'wb').write(v)
print(len(seeds), 'seeds')
