/* spframe.c - see spframe.h. */
#include <string.h>

#include "ql_defs.h"
#include "wire/spframe.h"

static uint64_t get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | b[i];
  return v;
}

static uint32_t get32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 |
         b[3];
}

void ql__sp_parser_init(ql__sp_parser *p, uint16_t peer_proto,
                        uint64_t max_payload) {
  p->max_payload = max_payload;
  p->proto = peer_proto;
  p->greeted = 0;
}

void ql__sp_hello(uint8_t out[QL__SP_HELLO_BYTES], uint16_t proto) {
  out[0] = 0;
  out[1] = 'S';
  out[2] = 'P';
  out[3] = 0;
  out[4] = (uint8_t)(proto >> 8);
  out[5] = (uint8_t)proto;
  out[6] = 0;
  out[7] = 0;
}

void ql__sp_frame_header(uint8_t out[QL__SP_FRAME_BYTES], uint64_t len) {
  out[0] = QL__SP_MSG_NORMAL;
  for (int i = 0; i < 8; i++)
    out[1 + i] = (uint8_t)(len >> (56 - 8 * i));
}

/*
 * The backtrace at the start of a payload: words up to the first with its
 * top bit set. nanomsg's REP takes any number of words; the daemon sits
 * behind no device, so more than QL__SP_MAX_ROUTE bytes are refused, which
 * also bounds what every route in flight holds.
 */
static int split_route(const uint8_t *pl, uint64_t len, ql__sp_msg *m,
                       const char **why) {
  for (size_t at = 0;; at += 4) {
    if (at + 4 > len) {
      *why = "the payload ends inside its backtrace";
      return QL_EPROTO;
    }
    if (at + 4 > QL__SP_MAX_ROUTE) {
      *why = "backtrace longer than 8 bytes";
      return QL_EPROTO;
    }
    if (get32(pl + at) & 0x80000000u) {
      m->route = pl;
      m->route_len = at + 4;
      m->body = pl + at + 4;
      m->body_len = (size_t)len - (at + 4);
      return 0;
    }
  }
}

int ql__sp_parse(ql__sp_parser *p, const uint8_t *buf, size_t len,
                 ql__sp_msg *m, size_t *used, size_t *need,
                 const char **why) {
  size_t off = 0;
  *used = 0;
  *need = 0;
  *why = "";
  if (!p->greeted) {
    uint8_t want[QL__SP_HELLO_BYTES];
    ql__sp_hello(want, p->proto);
    size_t n = len < sizeof want ? len : sizeof want;
    if (memcmp(buf, want, n) != 0) {
      *why = "bad protocol header";
      return QL_EPROTO;
    }
    if (n < sizeof want) {
      *need = sizeof want;
      return QL__SP_MORE;
    }
    p->greeted = 1;
    off = sizeof want;
  }
  const uint8_t *f = buf + off;
  size_t have = len - off;
  if (have >= 1 && f[0] != QL__SP_MSG_NORMAL) {
    *why = "message type other than 1";
    return QL_EPROTO;
  }
  if (have < QL__SP_FRAME_BYTES) {
    *used = off;
    *need = QL__SP_FRAME_BYTES;
    return QL__SP_MORE;
  }
  uint64_t plen = get64(f + 1);
  if (plen > p->max_payload) {
    *why = "frame longer than the message cap";
    return QL_EPROTO;
  }
  if (plen < 4) {
    *why = "frame shorter than a backtrace";
    return QL_EPROTO;
  }
  if (have - QL__SP_FRAME_BYTES < plen) {
    *used = off;
    *need = QL__SP_FRAME_BYTES + (size_t)plen;
    return QL__SP_MORE;
  }
  int rc = split_route(f + QL__SP_FRAME_BYTES, plen, m, why);
  if (rc != 0)
    return rc;
  *used = off + QL__SP_FRAME_BYTES + (size_t)plen;
  return QL__SP_MSG;
}
