/*
 * fp8_bound.h - an upper bound on the error of a dot product summed by FP8
 * tensor cores, under the accumulation model of kernels/cuda/emu_blaslt.h
 * (QL_EMU_FP8_ACC_BITS), for tests: tests/bench/fp8_probe.cpp checks
 * random rows against it, and it is the f8r AQ bound of the conformance
 * harness once the model's parameters are measured (DESIGN §4 draft).
 *
 * The model: K is cut into promotion intervals of `promote` products
 * (promote <= 0: one interval, as with fast accumulation), each into
 * blocks of `block` products. The tensor cores' partial sum c starts at 0
 * in each interval; a block adds its products to c with every addend (c
 * included) aligned to the largest one's exponent E and truncated to a
 * multiple of 2^(E+1-B), and c is then truncated to B significant bits;
 * at the end of an interval c is added to an f32 accumulator.
 *
 * Bound, with u = 2^(1-B): per block b of interval I with n_b products,
 *   u·((n_b + 1)·M_b + S_b)
 * (n_b + 1 addends each off by less than 2^(E+1-B) <= u·M_b, and the
 * truncation of the block's result, |c| <= S_b), M_b an upper bound on
 * the block's largest addend, max(max |p_k| in b, S_(b-1)·(1 + 4u)), S_b
 * the sum of |p_k| in I up to the end of b (times 1 + 4u, for the errors
 * c carries); plus the f32 sums of the interval results,
 * γ(intervals + 1)·Σ|p|, γ(n) = n·2^-24 / (1 - n·2^-24).
 *
 * bits <= 0 or >= 24 stands for plain f32 summation in any order:
 * γ(K)·Σ|p|.
 *
 * Header only (static inline), C and C++.
 */
#ifndef QL_TESTS_FP8_BOUND_H
#define QL_TESTS_FP8_BOUND_H

#include <math.h>
#include <stdint.h>

static inline double ql_fp8_gamma(double n) {
  const double u = 0x1p-24;
  return n * u / (1.0 - n * u);
}

/* The bound on |Σ computed - Σ p| for the k exact products p (in K
 * order), summed by the model with B = bits, the block and promotion
 * interval given. */
static inline double ql_fp8_acc_bound(const double *p, int64_t k, int bits,
                               int64_t block, int64_t promote) {
  double bound = 0.0, all = 0.0;
  int64_t i0, b0, j, intervals = 0;
  const int64_t P = promote > 0 ? promote : (k > 0 ? k : 1);
  const double u = ldexp(1.0, 1 - bits);
  if (bits <= 0 || bits >= 24 || block < 1) {
    for (j = 0; j < k; j++)
      all += fabs(p[j]);
    return ql_fp8_gamma((double)k) * all;
  }
  for (i0 = 0; i0 < k; i0 += P) {
    const int64_t i1 = i0 + P < k ? i0 + P : k;
    double s = 0.0;
    intervals++;
    for (b0 = i0; b0 < i1; b0 += block) {
      const int64_t b1 = b0 + block < i1 ? b0 + block : i1;
      double mx = s * (1.0 + 4.0 * u);
      for (j = b0; j < b1; j++) {
        if (fabs(p[j]) > mx)
          mx = fabs(p[j]);
        s += fabs(p[j]);
      }
      bound += u * ((double)(b1 - b0 + 1) * mx + s * (1.0 + 4.0 * u));
    }
    all += s;
  }
  return bound + ql_fp8_gamma((double)intervals + 1.0) * all;
}

#endif /* QL_TESTS_FP8_BOUND_H */
