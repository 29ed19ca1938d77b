/* ql_source.c - see ql_source.h. */
#include "ql_source.h"

#include <string.h>

static uint8_t *put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    *p++ = (uint8_t)(v >> (8 * i));
  return p;
}

static uint8_t *put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    *p++ = (uint8_t)(v >> (8 * i));
  return p;
}

void ql_source_header(const ql_source_spec *s,
                      uint8_t out[QL_SOURCE_HEADER_BYTES]) {
  /* 16 bytes, versioned: another layout gets another magic. */
  static const char magic[16] = "qlinear-source1";
  uint8_t *p = out;
  memcpy(p, magic, 16);
  p += 16;
  p = put32(p, s->packed);
  p = put32(p, s->quantizer_version);
  p = put32(p, s->format);
  p = put32(p, s->group_size);
  p = put32(p, s->dtype);
  p = put32(p, s->has_bias);
  p = put32(p, s->policy);
  p = put32(p, s->scale_dtype);
  p = put32(p, s->asymmetric);
  p = put32(p, s->zero_kind);
  p = put64(p, s->n);
  p = put64(p, s->k);
  for (int i = 0; i < 4; i++) {
    const ql_source_array *a = &s->arrays[i];
    p = put32(p, a->present);
    p = put32(p, a->dtype);
    p = put32(p, a->ndim);
    p = put64(p, a->shape[0]);
    p = put64(p, a->shape[1]);
  }
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1; /* uppercase too: one spelling per digest */
}

int ql_source_name_digest(const char *name, uint8_t out[32]) {
  size_t tag = sizeof QL_SOURCE_NAME_TAG - 1, len = strlen(name);
  if (len < tag + 64)
    return 0;
  const char *h = name + len - 64;
  if (memcmp(h - tag, QL_SOURCE_NAME_TAG, tag) != 0)
    return 0;
  uint8_t d[32];
  for (int i = 0; i < 32; i++) {
    int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return 0;
    d[i] = (uint8_t)(hi << 4 | lo);
  }
  memcpy(out, d, 32);
  return 1;
}
