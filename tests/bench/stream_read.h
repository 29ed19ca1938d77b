// stream_read.h - the yardstick of `qlinear-bench --device`: a plain
// streaming read of device memory (stream_read.cu), so that each kernel's
// time is judged against what this GPU reads in the same run, not only
// against its nominal peak.
#ifndef QL_BENCH_STREAM_READ_H
#define QL_BENCH_STREAM_READ_H

#include <stddef.h>

// Reads the bytes (a multiple of 16) at p (device memory, 16-byte
// aligned) once, with 128-bit loads, on `sms` multiprocessors' worth of
// blocks; writes *sink (a device word) only for a value that no input
// gives in practice, so that the loads cannot be dropped. Enqueued on
// stream (a cudaStream_t).
void ql__bench_stream_read(const void* p, size_t bytes, int sms,
                           unsigned* sink, void* stream);

#endif  // QL_BENCH_STREAM_READ_H
