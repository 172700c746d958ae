/* vcache_replay.c - replays an expert trace (deltafin run --trace FILE:
 * one JSON line per token and MoE layer) through the VRAM expert cache's
 * own bookkeeping (src/backend/vcache.c) at several cache sizes, LRU
 * against LFU, and prints the hit rate of each: the measurement behind the
 * CUDA backend's default eviction policy (docs/PERFORMANCE.md). Each expert
 * is its three parts (gate, up, down) as the backend caches them; each
 * (token, layer) line is one acquire, closed by experts_done (an epoch).
 *
 * Build: cc -O2 -Isrc -Iinclude -o vcache_replay bench/cuda/vcache_replay.c src/backend/vcache.c src/util/util.c -lm -pthread
 * Usage: vcache_replay TRACE.jsonl SLOTS[,SLOTS...]   (slots in experts; x3 parts) */
#include "backend/backend.h"
#include "backend/vcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int layer, n, *ids; } req;

static int parse(const char *line, req *r) {
    const char *p = strstr(line, "\"layer\":");
    if (!p) return -1;
    r->layer = atoi(p + 8), r->n = 0;
    r->ids = NULL;
    int cap = 0;
    for (const char *q = line; (q = strstr(q, "\"id\":")); q += 5) {
        if (r->n == cap) r->ids = realloc(r->ids, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(int));
        r->ids[r->n++] = atoi(q + 5);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: vcache_replay TRACE.jsonl SLOTS[,SLOTS...]\n"); return 2; }
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 1; }
    req *rs = NULL;
    int nr = 0, cap = 0;
    char *line = NULL;
    size_t ll = 0;
    while (getline(&line, &ll, f) > 0) {
        if (nr == cap) rs = realloc(rs, (size_t)(cap = cap ? 2 * cap : 1024) * sizeof *rs);
        if (!parse(line, &rs[nr])) nr++;
    }
    fclose(f);
    free(line);
    printf("%s: %d acquires\n", argv[1], nr);
    for (char *s = strtok(argv[2], ","); s; s = strtok(NULL, ",")) {
        const int slots = atoi(s);
        printf("  %5d experts (%d parts):", slots, 3 * slots);
        for (int pol = 0; pol < 2; pol++) {
            df_vcache c;
            if (df_vc_init(&c, 3 * slots, pol ? DF_VC_LFU : DF_VC_LRU)) return 1;
            for (int i = 0; i < nr; i++) {
                for (int j = 0; j < rs[i].n; j++)
                    for (int part = 0; part < 3; part++) {
                        const uint64_t k = df_expert_ident(rs[i].layer, rs[i].ids[j], part);
                        uint64_t ev;
                        int64_t ve;
                        if (df_vc_lookup(&c, k) < 0) df_vc_insert(&c, k, &ev, &ve);
                    }
                df_vc_fence(&c);
            }
            const double tot = (double)(c.hits + c.misses);
            printf("  %s hit rate %.3f (%lld bypasses)", pol ? "LFU" : "LRU", tot ? c.hits / tot : 0, (long long)c.bypasses);
            df_vc_free(&c);
        }
        printf("\n");
    }
    return 0;
}
