/* test_backend_vcache.c - the device expert cache's bookkeeping
 * (backend/vcache.c), which needs no GPU: hits and misses by expert identity,
 * LRU and LFU victims, slots used in the current epoch never evicted (a
 * bypass instead), the victim's epoch reported for the copy to wait on,
 * deletions that keep every other key findable, and the budget arithmetic
 * (slots that fit, out of VRAM with the numbers and --gpu-memory). */
#include "backend/backend.h"
#include "backend/vcache.h"
#include "deltafin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static uint64_t K(int l, int e, int p) { return df_expert_ident(l, e, p); }

static void test_ident(void) {
    CHECK(K(0, 0, 0) != 0, "identity of layer 0 expert 0 gate is not 0");
    CHECK(K(0, 1, 0) != K(1, 1, 0) && K(0, 1, 0) != K(0, 1, 1) && K(0, 1, 0) != K(0, 2, 0), "identities differ by layer, expert, part");
    CHECK(K(60, 383, 2) != K(61, 383, 2) && K(3, 65535, 2) != K(3, 65534, 2), "large layers and experts");
}

static void test_lru(void) {
    df_vcache c;
    CHECK(df_vc_init(&c, 3, DF_VC_LRU) == 0, "init");
    uint64_t ev;
    int64_t ve;
    CHECK(df_vc_lookup(&c, K(0, 1, 0)) == -1, "empty cache misses");
    int a = df_vc_insert(&c, K(0, 1, 0), &ev, &ve);
    CHECK(a >= 0 && ev == 0 && ve == -1, "first insert takes a free slot (%d %llu %lld)", a, (unsigned long long)ev, (long long)ve);
    int b = df_vc_insert(&c, K(0, 2, 0), &ev, &ve), d = df_vc_insert(&c, K(0, 3, 0), &ev, &ve);
    CHECK(b >= 0 && d >= 0 && a != b && b != d && a != d, "three distinct slots");
    /* all three used in epoch 0: a fourth is a bypass */
    CHECK(df_vc_insert(&c, K(0, 4, 0), &ev, &ve) == -1 && c.bypasses == 1, "no eviction of slots used in the current epoch");
    df_vc_fence(&c);
    CHECK(df_vc_lookup(&c, K(0, 1, 0)) == a && df_vc_lookup(&c, K(0, 3, 0)) == d, "hits find their slots");
    /* peek (the device-routed MoE's residency check) finds expert 2 and records nothing: no hit, no use (the
     * eviction below still takes it as last used in epoch 0) */
    const int64_t hits0 = c.hits;
    CHECK(df_vc_peek(&c, K(0, 2, 0)) == b && df_vc_peek(&c, K(0, 4, 0)) == -1 && df_vc_peek(&c, 0) == -1 && c.hits == hits0, "peek");
    df_vc_fence(&c); /* epoch 2 */
    int x = df_vc_insert(&c, K(1, 5, 2), &ev, &ve);
    CHECK(x == b && ev == K(0, 2, 0) && ve == 0, "LRU evicts the least recently used (expert 2, last used in epoch 0): slot %d key %llx epoch %lld", x,
          (unsigned long long)ev, (long long)ve);
    CHECK(df_vc_lookup(&c, K(0, 2, 0)) == -1 && df_vc_lookup(&c, K(1, 5, 2)) == b, "the evicted key is gone, the new one found");
    CHECK(df_vc_lookup(&c, K(0, 1, 0)) == a && df_vc_lookup(&c, K(0, 3, 0)) == d, "the others survive the deletion");
    CHECK(c.hits == 5 && c.misses == 5 && c.evictions == 1, "counters: hits %lld misses %lld evictions %lld", (long long)c.hits, (long long)c.misses,
          (long long)c.evictions);
    df_vc_clear(&c);
    CHECK(df_vc_lookup(&c, K(0, 1, 0)) == -1 && df_vc_insert(&c, K(0, 9, 0), &ev, &ve) >= 0 && ev == 0, "clear forgets every key");
    df_vc_free(&c);
}

static void test_lfu(void) {
    df_vcache c;
    CHECK(df_vc_init(&c, 2, DF_VC_LFU) == 0, "init");
    uint64_t ev;
    int64_t ve;
    int a = df_vc_insert(&c, K(0, 1, 0), &ev, &ve);
    df_vc_insert(&c, K(0, 2, 0), &ev, &ve);
    df_vc_fence(&c);
    for (int i = 0; i < 3; i++) df_vc_lookup(&c, K(0, 1, 0));
    df_vc_fence(&c);
    df_vc_lookup(&c, K(0, 2, 0)); /* the most recent, but used twice against four times */
    df_vc_fence(&c);
    int x = df_vc_insert(&c, K(0, 3, 0), &ev, &ve);
    CHECK(x != a && ev == K(0, 2, 0) && ve == 2, "LFU evicts the less frequent expert although it is the more recent (%llx, epoch %lld)",
          (unsigned long long)ev, (long long)ve);
    df_vc_free(&c);
}

/* Many keys through a small table: every resident key stays findable
 * after many backward-shift deletions (checked against a plain array). */
static void test_churn(void) {
    enum { N = 37 };
    df_vcache c;
    CHECK(df_vc_init(&c, N, DF_VC_LRU) == 0, "init");
    uint64_t ref[N] = {0};
    unsigned r = 12345;
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        r = r * 1103515245u + 12345u;
        const uint64_t k = K((int)(r >> 8) % 7, (int)(r >> 12) % 40, (int)(r >> 20) % 3);
        int s = df_vc_lookup(&c, k);
        if (s >= 0) { bad += ref[s] != k; continue; }
        uint64_t ev;
        int64_t ve;
        s = df_vc_insert(&c, k, &ev, &ve);
        if (s < 0) { df_vc_fence(&c); continue; }
        bad += ev != ref[s];
        ref[s] = k;
        if (it % 5 == 0) df_vc_fence(&c);
    }
    for (int i = 0; i < N; i++)
        if (ref[i]) bad += df_vc_lookup(&c, ref[i]) != i;
    CHECK(!bad && c.evictions > 1000, "%d mismatches between the table and the slots (%lld evictions)", bad, (long long)c.evictions);
    df_vc_free(&c);
}

static void test_plan(void) {
    char err[512] = "";
    const int64_t MB = 1000000;
    CHECK(df_vc_plan(100 * MB, 30 * MB, 10 * MB, 6 * MB, 1, err, sizeof err) == 10, "60 MB left: 10 slots of 6 MB");
    err[0] = 0;
    int64_t n = df_vc_plan(100 * MB, 95 * MB, 10 * MB, 6 * MB, 1, err, sizeof err);
    CHECK(n == DF_ENOMEM && strstr(err, "out of VRAM") && strstr(err, "--gpu-memory") && strstr(err, "6.00 MB") && strstr(err, "100.00 MB") &&
              strstr(err, "95.00 MB") && !strchr(err, '\n'),
          "over budget: %lld %s", (long long)n, err);
    err[0] = 0;
    CHECK(df_vc_plan(100 * MB, 20 * MB, 10 * MB, 6 * MB, 12, err, sizeof err) == DF_ENOMEM && strstr(err, "at least 12 slots"), "min slots: %s", err);
    CHECK(df_vc_plan(100 * MB, 0, 0, 0, 1, err, sizeof err) == DF_ENOMEM, "a slot of 0 bytes is refused");
    df_vcache c;
    CHECK(df_vc_init(&c, 0, DF_VC_LRU) == DF_EINPUT, "0 slots refused");
}

int main(void) {
    test_ident();
    test_lru();
    test_lfu();
    test_churn();
    test_plan();
    printf("test_backend_vcache: %d failures\n", failures);
    return failures ? 1 : 0;
}
