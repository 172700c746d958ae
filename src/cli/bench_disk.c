/* bench_disk.c - `deltafin bench-disk FILE [--qd N] [--block SIZE] [--max SIZE]`:
 * the disk floor, O_DIRECT reads through io_uring as the expert cache does
 * them (default 4 MiB reads at queue depth 8). Prints one JSON object. */
#include "cli/args.h"
#include "cli/cli.h"
#include "store/diskbench.h"
#include "util/util.h"

#include <stdio.h>
#include <string.h>

int df_cmd_bench_disk(int argc, char **argv) {
    df_args a;
    df_args_init(&a, argc, argv);
    const char *file = NULL, *opt;
    long qd = 8;
    int64_t block = 4 << 20, max = 8LL << 30;
    if (argc >= 2 && strncmp(argv[1], "--", 2)) { file = argv[1]; a.i = 2; }
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help")) {
            printf("usage: deltafin bench-disk FILE [--qd 8] [--block 4M] [--max 8G]\n"
                   "  O_DIRECT read bandwidth of FILE through io_uring (the expert cache's reads).\n");
            return 0;
        }
        if (df_args_opt(&a, opt, "--qd", 1)) { if (df_parse_int(a.val, 1, 256, &qd)) df_args_fail(&a, "--qd: 1..256"); }
        else if (df_args_opt(&a, opt, "--block", 1)) { block = df_parse_size(a.val); if (block < 4096 || block % 4096) df_args_fail(&a, "--block: a multiple of 4K"); }
        else if (df_args_opt(&a, opt, "--max", 1)) { max = df_parse_size(a.val); if (max <= 0) df_args_fail(&a, "--max: a size"); }
        else if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    if (a.bad) return 2;
    if (!file) return df_args_fail(&a, "FILE is required");
    char err[512];
    double gbs = 0;
    int rc = df_disk_read_bw(file, (int)qd, (size_t)block, max, &gbs, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench-disk: %s\n", err); return df_exit_code(rc); }
    printf("{\"file\": \"%s\", \"qd\": %ld, \"block\": %lld, \"disk_read_gbs\": %.3f}\n", file, qd, (long long)block, gbs);
    return 0;
}
