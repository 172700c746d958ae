/* test_core_verify.c - a verify pass of speculative decoding equals plain
 * steps bit for bit (issue 15 item 1): after the same prompt, the logits of
 * every position of df_session_verify(ids, n) equal those of pushing ids one
 * at a time, over the tiny models of every family in tests/data (Llama BF16
 * and F32, Qwen3 dense F16 and MoE, DeepSeek-V3 BF16 and FP8 (MLA, shared
 * experts), Kimi K2 INT4, Kimi K3 MXFP4, GGUF MoE files in Q4_K_M, Q8_0 and
 * Q2_K), resident and with the experts streamed through a minimal expert
 * cache, on two threads and on the scalar kernels, for passes of 2 to 9
 * positions; and SmolLM2 Q4_1 (the default model) where it is installed.
 * DELTAFIN_TEST_BACKEND=cuda runs it all on the CUDA backend (a CUDA build on a
 * GPU machine: bench/cuda/device_run.sh), whose exact products launch the
 * decode kernels with the one-token split, its attention a position at a
 * time and a MoE layer's experts a position at a time (backend.h).
 * The pass then continues like plain steps: after a cut back to an accepted
 * prefix, the next step's logits equal the plain session's. And `auto`
 * speculates only on a backend whose verify pass is exact: with the CPU
 * table's exact_products hidden (as the CUDA table has none) it takes plain
 * steps and its stats say why.
 * Runs from the repository root. */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/ggml_quant.h"
#include "core/core.h"
#include "deltafin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fails, passes;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static df_engine *open_model(const char *path, int64_t expert_cache) {
    df_options o;
    df_options_default(&o);
    o.n_threads = 2;
    o.expert_cache_bytes = expert_cache;
    o.backend = getenv("DELTAFIN_TEST_BACKEND"); /* NULL: the CPU; "cuda" on a GPU machine (bench/cuda/device_run.sh) */
    char err[512];
    df_engine *e = df_engine_open(path, &o, err, sizeof err);
    if (!e) fprintf(stderr, "cannot open %s: %s\n", path, err);
    return e;
}

static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) if (memcmp(a + i, b + i, 4)) return (long)i;
    return -1;
}

/* A prompt of P ids, then passes of n = 2..9 positions at several lengths. */
static void check_model(const char *path, int64_t expert_cache, const char *how) {
    df_engine *e = open_model(path, expert_cache);
    CHECK(e, "open %s", path);
    if (!e) return;
    df_model_info mi;
    df_engine_info(e, &mi);
    const int V = mi.vocab_size, P = 11, N = 9;
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (int32_t)((i * 97 + 13) % V);
    df_session *a = df_session_new(e, 128), *b = df_session_new(e, 128);
    CHECK(a && b, "%s: sessions", path);
    if (!a || !b || !df_session_truncatable(a)) { df_session_free(a), df_session_free(b), df_engine_close(e); return; }
    /* plain steps: the logits after each pushed id */
    float *plain = malloc((size_t)(P + 3 * N) * V * 4), *out = malloc((size_t)N * V * 4);
    CHECK(!df_session_sync(a, ids, P), "%s: sync", path);
    for (int i = P; i < P + 3 * N; i++) {
        CHECK(!df_session_push(a, ids[i]), "%s: push %d", path, i);
        memcpy(plain + (size_t)i * V, df_session_logits(a), (size_t)V * 4);
    }
    /* verify passes of n positions from length L (each after a cut back to L) */
    CHECK(!df_session_sync(b, ids, P), "%s: sync b", path);
    int L = P;
    for (int n = 2; n <= N; n++) {
        int rc = df_session_verify(b, ids + L, (size_t)n, out);
        CHECK(!rc, "%s: verify of %d at %d: %s", path, n, L, df_engine_error(e));
        if (rc) break;
        for (int i = 0; i < n; i++) {
            long d = first_diff(out + (size_t)i * V, plain + (size_t)(L + i) * V, (size_t)V);
            CHECK(d < 0, "%s (%s): pass of %d at %d: position %d logit %ld: %.9g, plain step %.9g", path, how, n, L, i, d,
                  d < 0 ? 0.0 : out[(size_t)i * V + d], d < 0 ? 0.0 : plain[(size_t)(L + i) * V + d]);
            passes++;
        }
        /* accept half the pass: cut back, then the next id as a plain step */
        const int keep = n / 2;
        CHECK(!df_session_cut(b, (size_t)(L + keep), out + (size_t)(keep - 1) * V, 0), "%s: cut", path);
        L += keep;
        CHECK(!df_session_push(b, ids[L]), "%s: push after cut", path);
        L++;
        CHECK(first_diff(df_session_logits(b), plain + (size_t)(L - 1) * V, (size_t)V) < 0, "%s (%s): plain step after a pass of %d differs", path, how, n);
        if (L + N > P + 3 * N) break;
    }
    free(plain), free(out);
    df_session_free(a), df_session_free(b);
    df_engine_close(e);
}

/* auto on a backend without exact products: off, with the reason; on the CPU: on */
static void check_auto_needs_exact(void) {
    df_engine *e = open_model("tests/data/models/qwen3-f16", -1);
    CHECK(e, "open qwen3-f16");
    if (!e) return;
    static df_backend_ops hidden;
    const df_backend_ops *cpu = df_be;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) hidden = *cpu, hidden.exact_products = NULL, df_be = &hidden;
        df_session *s = df_session_new(e, 64);
        int32_t ids[4] = {5, 6, 7, 8};
        CHECK(s && !df_session_sync(s, ids, 4), "sync");
        df_gen_config c;
        memset(&c, 0, sizeof c);
        c.spec = DF_SPEC_AUTO;
        c.max_new = 4;
        df_gen *g = s ? df_gen_new(e, s, &c) : NULL;
        CHECK(g, "df_gen_new");
        if (g) {
            df_spec_stats ss;
            df_gen_spec_stats(g, &ss);
            if (pass == 0) CHECK(!ss.off_reason[0], "auto on the CPU: on, got off: %s", ss.off_reason);
            else CHECK(strstr(ss.off_reason, "not bit-identical to plain steps"), "auto without exact products: off_reason '%s'", ss.off_reason);
        }
        df_gen_free(g);
        df_session_free(s);
    }
    df_be = cpu;
    df_engine_close(e);
}

int main(int argc, char **argv) {
    static const char *models[] = {
        "tests/data/models/llama-bf16", "tests/data/models/llama-f32-tied", "tests/data/models/qwen3-f16",
        "tests/data/models/qwen3-moe-bf16", "tests/data/models/qwen3-moe-k70", "tests/data/models/deepseek-v3-bf16",
        "tests/data/models/deepseek-v3-fp8", "tests/data/models/deepseek-v3-k70", "tests/data/models/kimi-k2-int4",
        "tests/data/models/kimi-k3-mxfp4", "tests/data/models/kimi-k3-tiny",
        "tests/data/gguf_moe/qwen3moe-q4_k_m.gguf", "tests/data/gguf_moe/deepseek2-q4_k_m.gguf",
        "tests/data/gguf_moe/qwen3moe-q8_0.gguf", "tests/data/gguf_moe/deepseek2-q2_k.gguf"};
    const int only = argc > 1 ? atoi(argv[1]) : -1; /* one model by index (debugging) */
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        if (only < 0 || (size_t)only == i) check_model(models[i], -1, "resident");
    if (only < 0) {
        check_auto_needs_exact();
        /* the experts streamed through a minimal expert cache */
        check_model("tests/data/models/qwen3-moe-k70", 0, "streamed");
        check_model("tests/data/models/kimi-k2-int4", 0, "streamed");
        check_model("tests/data/gguf_moe/deepseek2-q4_k_m.gguf", 0, "streamed");
        /* the scalar kernels (the CPU's) */
        if (!getenv("DELTAFIN_TEST_BACKEND")) {
            df_set_isa(DF_ISA_SCALAR), df_ggml_set_isa(DF_GGML_ISA_SCALAR);
            check_model("tests/data/models/deepseek-v3-fp8", -1, "scalar");
            check_model("tests/data/gguf_moe/qwen3moe-q4_k_m.gguf", -1, "scalar");
            df_set_isa(-1), df_ggml_set_isa(DF_GGML_ISA_AUTO);
        }
        /* the default model (SmolLM2 Q4_1 + Q8_0), when installed */
        char p[1024];
        const char *home = getenv("HOME");
        snprintf(p, sizeof p, "%s/.cache/deltafin/models/smollm2-135m-instruct/model.gguf", home ? home : "");
        if (!access(p, R_OK)) check_model(p, -1, "default model");
        else printf("test_core_verify: %s not installed, skipped\n", p);
    }
    printf("test_core_verify (%s backend): %d positions compared, %d failures\n", df_be ? df_be->name : "no", passes, fails);
    return fails ? 1 : 0;
}
