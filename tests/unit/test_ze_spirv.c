/*
 * test_ze_spirv.c - the ze kernels' SPIR-V modules as libqlkernels embeds
 * them (kernels/ze/ze_spirv.h): every .cl file in both variants, each a
 * well-formed SPIR-V 1.2 module whose instruction stream ends exactly at
 * its size, defining the kernels the host code will look up, each with
 * ContractionOff and the work-group size the kernels are written for, and
 * the sub-group size in the "sg" variant only. build_spirv.sh checked the
 * .spv files on disk; this reads what reached the library.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "ze/ql_ze.h"
#include "ze/ze_spirv.h"

/* SPIR-V 1.2 §3 (binary form), §3.6 (execution modes), §3.31 (capabilities),
 * §3.32 (opcodes). */
#define SPV_MAGIC 0x07230203u
#define OP_ENTRY_POINT 15u
#define OP_EXECUTION_MODE 16u
#define OP_CAPABILITY 17u
#define EM_LOCAL_SIZE 17u
#define EM_CONTRACTION_OFF 31u
#define EM_SUBGROUP_SIZE 35u
#define CAP_GROUPS 18u
#define CAP_SUBGROUP_DISPATCH 58u

static const struct {
  const char *name;
  const char *kernels[4];
} expect[] = {
    {"quantize_rows", {"ql_ze_quantize_rows", "ql_ze_check_finite"}},
    {"linear_wo",
     {"ql_ze_wo_q4g", "ql_ze_wo_q8b", "ql_ze_wo_q8c", "ql_ze_wo_f8r"}},
    {"linear_aq", {"ql_ze_aq_q8c", "ql_ze_aq_q4g"}},
};

#define MAX_EP 8

typedef struct module_info {
  int ok;        /* the stream parsed to its end */
  int n_ep;
  uint32_t ep_id[MAX_EP];
  char ep_name[MAX_EP][64];
  unsigned modes[MAX_EP]; /* bit 0 ContractionOff, 1 LocalSize 64, 2 SG 16 */
  int subgroup_caps;
} module_info;

static uint32_t word(const unsigned char *p, size_t i) {
  return (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
}

static void parse(const ql__ze_module *m, module_info *mi) {
  size_t nw = m->size / 4, i = 5; /* after the 5-word header */

  memset(mi, 0, sizeof *mi);
  while (i < nw) {
    uint32_t w0 = word(m->spirv, i), op = w0 & 0xFFFFu, len = w0 >> 16;
    if (len == 0 || i + len > nw)
      return;
    if (op == OP_ENTRY_POINT && len >= 4 && mi->n_ep < MAX_EP) {
      /* execution model, id, then the name as a nul-terminated string */
      const char *s = (const char *)m->spirv + 4 * (i + 3);
      size_t max = 4 * (len - 3);
      mi->ep_id[mi->n_ep] = word(m->spirv, i + 2);
      snprintf(mi->ep_name[mi->n_ep], sizeof mi->ep_name[0], "%.*s",
               (int)strnlen(s, max), s);
      mi->n_ep++;
    } else if (op == OP_EXECUTION_MODE && len >= 3) {
      uint32_t id = word(m->spirv, i + 1), mode = word(m->spirv, i + 2);
      for (int e = 0; e < mi->n_ep; e++)
        if (mi->ep_id[e] == id) {
          if (mode == EM_CONTRACTION_OFF)
            mi->modes[e] |= 1;
          if (mode == EM_LOCAL_SIZE && len >= 6 &&
              word(m->spirv, i + 3) == QL_ZE_WG &&
              word(m->spirv, i + 4) == 1 && word(m->spirv, i + 5) == 1)
            mi->modes[e] |= 2;
          if (mode == EM_SUBGROUP_SIZE && len >= 4 &&
              word(m->spirv, i + 3) == QL_ZE_LG)
            mi->modes[e] |= 4;
        }
    } else if (op == OP_CAPABILITY && len >= 2) {
      uint32_t cap = word(m->spirv, i + 1);
      mi->subgroup_caps += cap == CAP_GROUPS || cap == CAP_SUBGROUP_DISPATCH;
    }
    i += len;
  }
  mi->ok = i == nw;
}

START_TEST(test_table) {
  ck_assert_uint_eq(ql__ze_n_modules, 6);
  for (size_t e = 0; e < 3; e++)
    for (int v = 0; v < 2; v++) {
      const char *variant = v ? "lm" : "sg";
      int found = 0;
      for (size_t i = 0; i < ql__ze_n_modules; i++)
        found += strcmp(ql__ze_modules[i].name, expect[e].name) == 0 &&
                 strcmp(ql__ze_modules[i].variant, variant) == 0;
      ck_assert_msg(found == 1, "%s/%s: %d modules", expect[e].name, variant,
                    found);
    }
}
END_TEST

START_TEST(test_modules) {
  /* QL_ZE_QWG is the quantize_rows work-group: the same 64. */
  ck_assert_int_eq(QL_ZE_QWG, QL_ZE_WG);
  for (size_t i = 0; i < ql__ze_n_modules; i++) {
    const ql__ze_module *m = &ql__ze_modules[i];
    int sg = strcmp(m->variant, "sg") == 0;
    size_t e;
    module_info mi;

    ck_assert_msg(m->size >= 20 && m->size % 4 == 0, "%s: size %zu", m->name,
                  m->size);
    ck_assert_msg(((uintptr_t)m->spirv & 3) == 0, "%s: not word-aligned",
                  m->name);
    ck_assert_uint_eq(word(m->spirv, 0), SPV_MAGIC);
    ck_assert_msg(word(m->spirv, 1) <= 0x00010200u, "%s: version %#x",
                  m->name, word(m->spirv, 1));
    parse(m, &mi);
    ck_assert_msg(mi.ok, "%s/%s: the instruction stream does not end at the "
                  "module's size", m->name, m->variant);
    for (e = 0; strcmp(expect[e].name, m->name) != 0; e++)
      ;
    for (int k = 0; k < 4 && expect[e].kernels[k] != NULL; k++) {
      int j;
      for (j = 0; j < mi.n_ep; j++)
        if (strcmp(mi.ep_name[j], expect[e].kernels[k]) == 0)
          break;
      ck_assert_msg(j < mi.n_ep, "%s/%s: no kernel %s", m->name, m->variant,
                    expect[e].kernels[k]);
      ck_assert_msg((mi.modes[j] & 3) == 3,
                    "%s/%s: %s lacks ContractionOff or LocalSize 64",
                    m->name, m->variant, mi.ep_name[j]);
      ck_assert_msg(!!(mi.modes[j] & 4) == sg, "%s/%s: %s SubgroupSize",
                    m->name, m->variant, mi.ep_name[j]);
    }
    ck_assert_msg(sg ? mi.subgroup_caps > 0 : mi.subgroup_caps == 0,
                  "%s/%s: sub-group capabilities %d", m->name, m->variant,
                  mi.subgroup_caps);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("ze_spirv");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_table);
  tcase_add_test(tc, test_modules);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
