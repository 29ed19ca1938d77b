/* counts.c - see counts.h. */
#include "dispatch/counts.h"
#include "dispatch/scheduler.h" /* ql__sched_hist_bucket */

static const uint32_t fmt_groups[4] = {32, 64, 128, 256};
static const char *const fmt_names[QL__FMT_SLOTS] = {
    "q4g32",  "q4g64",  "q4g128",  "q4g256",  "q8b32",
    "q8b64",  "q8b128", "q8b256",  "q8b32a",  "q8b64a",
    "q8b128a", "q8b256a", "q8c",   "f8r",     "other",
};
enum { FMT_Q8C = 12, FMT_F8R = 13, FMT_OTHER = 14 };

unsigned ql__fmt_slot(int format, uint32_t group_size, int asymmetric) {
  int g = -1;
  for (int i = 0; i < 4; i++)
    if (group_size == fmt_groups[i])
      g = i;
  switch (format) {
  case QL_FORMAT_Q4G:
    return g >= 0 ? (unsigned)g : FMT_OTHER;
  case QL_FORMAT_Q8B:
    return g >= 0 ? 4u + (asymmetric ? 4u : 0u) + (unsigned)g : FMT_OTHER;
  case QL_FORMAT_Q8C:
    return FMT_Q8C;
  case QL_FORMAT_F8R:
    return FMT_F8R;
  default:
    return FMT_OTHER;
  }
}

const char *ql__fmt_slot_name(unsigned slot) {
  return fmt_names[slot < QL__FMT_SLOTS ? slot : FMT_OTHER];
}

unsigned ql__fmt_slot_of(const ql__weight *w) {
  /* asymmetric as WeightInfo says it (query.c): q8b with zero points */
  return ql__fmt_slot(w->q->format, w->q->group_size,
                      w->q->format == QL_FORMAT_Q8B && w->q->zero != NULL);
}

void ql__hist_add(ql__hist *h, uint64_t ns) {
  h->bucket[ql__sched_hist_bucket(ns)]++;
  h->sum_ns += ns;
  h->count++;
}

void ql__counts_request(ql__metrics_counts *mc, const ql__weight *w,
                        unsigned dev, uint64_t rows) {
  struct ql__metrics_fmt *f = &mc->fmt[ql__fmt_slot_of(w)];
  mc->dev[dev].requests++;
  mc->dev[dev].rows += rows;
  f->requests++;
  f->rows += rows;
}
