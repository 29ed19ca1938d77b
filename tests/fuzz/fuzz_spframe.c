/*
 * fuzz_spframe.c - libFuzzer target for the request sockets' SP-over-IPC
 * frame parser (daemon/wire/spframe.c), the first code that sees the bytes a
 * local process writes to qlineard.sock or admin.sock.
 *
 * Input: byte 0 picks the cap on a frame's payload (small caps make the
 * "too long" path reachable), byte 1 seeds the sizes of the pieces the
 * stream arrives in; the rest is the byte stream a peer sends, protocol
 * header first. The stream is parsed twice, the way the transport does it
 * (bytes appended as they arrive, the used ones dropped): once whole and
 * once in pieces. Both must give the same messages and end the same way,
 * and every answer must keep the parser's contract (spframe.h); a broken
 * one traps.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over
 * the seed corpus in tests/fuzz/corpus/spframe/ by 'make check'.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ql_defs.h"
#include "wire/spframe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

/* What a run saw: a digest of each message and how it ended. */
typedef struct run {
  unsigned n;
  uint64_t digest[MAX_MSGS];
  int end;        /* QL__SP_MORE or QL_EPROTO */
  size_t consumed; /* bytes used when it ended */
} run;

static uint64_t fnv(uint64_t h, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211u;
  return h;
}

/* The contract of one QL__SP_MSG answer on buf[0..len). */
static void check_msg(const ql__sp_msg *m, const uint8_t *buf, size_t len,
                      size_t used) {
  if (used == 0 || used > len)
    __builtin_trap();
  if (m->route_len != 4 && m->route_len != 8)
    __builtin_trap();
  if (m->route < buf || m->route + m->route_len != m->body ||
      m->body + m->body_len != buf + used)
    __builtin_trap();
  const uint8_t *last = m->route + m->route_len - 4;
  if (!(last[0] & 0x80))
    __builtin_trap();
  if (m->route_len == 8 && (m->route[0] & 0x80))
    __builtin_trap();
}

/*
 * Feeds stream[0..size) in pieces (piece sizes from seed; 0: all at once)
 * to a parser with cap max, as the transport does, and records the run.
 */
static void play(const uint8_t *stream, size_t size, uint64_t max,
                 unsigned seed, run *r) {
  ql__sp_parser p;
  ql__sp_parser_init(&p, QL__SP_PROTO_REQ, max);
  uint8_t *buf = malloc(size ? size : 1);
  if (buf == NULL)
    abort();
  size_t have = 0, fed = 0, dropped = 0;
  uint32_t x = seed * 2654435761u + 1;
  memset(r, 0, sizeof *r);
  r->end = QL__SP_MORE;
  while (fed < size || have > 0) {
    if (fed < size) {
      size_t piece = size - fed;
      if (seed != 0) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        piece = 1 + x % 37;
        if (piece > size - fed)
          piece = size - fed;
      }
      memcpy(buf + have, stream + fed, piece);
      have += piece;
      fed += piece;
    }
    for (;;) {
      ql__sp_msg m;
      size_t used = 99, need = 99;
      const char *why = NULL;
      int rc = ql__sp_parse(&p, buf, have, &m, &used, &need, &why);
      if (why == NULL)
        __builtin_trap();
      if (rc == QL_EPROTO) {
        if (why[0] == '\0')
          __builtin_trap();
        r->end = rc;
        r->consumed = dropped;
        free(buf);
        return;
      }
      if (rc == QL__SP_MORE) {
        if (used > have || need == 0 || need <= have - used ||
            need > QL__SP_FRAME_BYTES + max)
          __builtin_trap();
        memmove(buf, buf + used, have - used);
        have -= used;
        dropped += used;
        break;
      }
      if (rc != QL__SP_MSG)
        __builtin_trap();
      check_msg(&m, buf, have, used);
      if (r->n < MAX_MSGS) {
        uint64_t h = fnv(14695981039346656037u, m.route, m.route_len);
        r->digest[r->n] = fnv(h, m.body, m.body_len) ^ m.body_len;
      }
      r->n++;
      memmove(buf, buf + used, have - used);
      have -= used;
      dropped += used;
    }
    if (fed == size)
      break;
  }
  r->consumed = dropped;
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  /* Caps from 0 to a little past anything the input can hold, and the
   * daemon's largest. */
  static const uint64_t caps[] = {0,   3,   4,    5,    8,     9,
                                  16,  64,  1000, 4096, 65536, (1u << 30) + 64};
  uint64_t max = caps[data[0] % (sizeof caps / sizeof caps[0])];
  unsigned seed = data[1];
  run whole, pieces;
  play(data + 2, size - 2, max, 0, &whole);
  play(data + 2, size - 2, max, seed, &pieces);
  /* (Where a stream fails, the pieces may have dropped its protocol
   * header first: the bytes used count only when both wait for more.) */
  if (whole.n != pieces.n || whole.end != pieces.end ||
      (whole.end == QL__SP_MORE && whole.consumed != pieces.consumed))
    __builtin_trap();
  for (unsigned i = 0; i < whole.n && i < MAX_MSGS; i++)
    if (whole.digest[i] != pieces.digest[i])
      __builtin_trap();
  return 0;
}
