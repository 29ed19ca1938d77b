/* bench_restart.h - `qlinear-bench restart` (bench_restart.c). */
#ifndef QL_BENCH_RESTART_H
#define QL_BENCH_RESTART_H

/* argv[0] is "restart"; returns the process exit status. */
int ql_bench_restart(int argc, char **argv);

#endif
