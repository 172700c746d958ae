/* engine.c - the public engine/session API of deltafin.h over the model
 * module. An engine owns the loaded model and statistics; a session owns one
 * timeline (tokens, KV/latent cache, sampler state). Prompts are processed
 * in chunks of up to DF_MAX_BATCH tokens; decode is one token per step. */
#include "core/core.h"
#include "core/engine_int.h"
#include "backend/backend.h"
#include "model/model.h"
#include "store/ecache.h"
#include "store/store.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#define DF_MAX_BATCH 64
#define DF_DEFAULT_CTX 4096


struct df_session {
    df_engine *e;
    df_state st;
    int32_t *tokens;
    size_t len;
    int logits_valid;
    float *logits;   /* [vocab] */
    float *work;     /* sampler scratch [vocab * 2] */
    df_rng rng;
};

void df_options_default(df_options *o) {
    memset(o, 0, sizeof *o);
    o->expert_cache_bytes = -1;
}
void df_sampling_default(df_sampling *s) {
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
}

/* Resolves a model argument: a path, or a name installed under $DELTAFIN_HOME/models. */
static char *resolve_model(const char *model) {
    struct stat st;
    char buf[4096];
    const char *p = model;
    if (stat(model, &st) != 0 && !strchr(model, '/')) {
        const char *home = getenv("DELTAFIN_HOME");
        if (home && *home) snprintf(buf, sizeof buf, "%s/models/%s", home, model);
        else snprintf(buf, sizeof buf, "%s/.cache/deltafin/models/%s", getenv("HOME") ? getenv("HOME") : ".", model);
        if (stat(buf, &st) == 0) p = buf;
    }
    /* an installed GGUF model is a directory holding model.gguf */
    if (df_is_dir(p)) {
        char *cfg = df_path_join(p, "config.json"), *g = df_path_join(p, "model.gguf");
        int use_gguf = !df_file_exists(cfg) && df_file_exists(g);
        free(cfg);
        if (use_gguf) return g;
        free(g);
    }
    return df_xstrdup(p);
}

static df_engine *engine_new(df_model *m, const df_options *o, char *err, size_t errlen);

/* Creates the expert cache of a streamed model. Its budget is --expert-cache
 * when given (0 = the minimum: one layer's experts), else what the memory
 * budget leaves after the resident spine and a reserve for caches. */
static int start_streaming(df_model *m, const df_options *o, int64_t budget, char *err, size_t errlen) {
    const df_config *c = &m->cfg;
    int64_t expert_bytes = 0;
    df_ffn *tmpl = df_xcalloc((size_t)c->n_layers * (size_t)c->n_experts, sizeof(df_ffn));
    for (int l = 0; l < c->n_layers; l++) {
        if (!m->layers[l].moe) continue;
        for (int e = 0; e < c->n_experts; e++) {
            tmpl[(size_t)l * c->n_experts + e] = m->layers[l].experts[e];
            for (int p = 0; p < m->layers[l].experts[e].n_parts; p++) expert_bytes += (int64_t)m->layers[l].experts[e].part[p].len;
        }
    }
    int64_t cache = o->expert_cache_bytes;
    /* what the budget must also hold: the resident spine, a session's cache at the
     * default context, and a fixed reserve for code, scratch and the tokenizer */
    int64_t kv = (int64_t)df_state_bytes_per_token(m) * (c->max_pos < 4096 ? c->max_pos : 4096);
    if (cache < 0) cache = budget - (m->bytes - expert_bytes) - kv - ((int64_t)48 << 20);
    df_ecache_opts eo = {cache > 0 ? cache : 0, c->n_experts_used, DF_EVICT_LRU, 1, !getenv("DELTAFIN_NO_POPULATE")};
    if (getenv("DELTAFIN_NO_IO_URING")) eo.use_io_uring = 0;
    m->ecache = df_ecache_new((const char *const *)m->files, m->n_files, c->n_layers, c->n_experts, tmpl, &eo, err, errlen);
    m->ecache_tmpl = tmpl;
    if (!m->ecache) return DF_EIO;
    /* Eviction, chosen by replaying recorded traces (bench/replay_policies.py,
     * docs/PERFORMANCE.md): LFU wins by up to 8 points on some traces and
     * loses by up to 16 on others, LRU's worst loss is 8: LRU has the smaller
     * regret. DELTAFIN_EVICT=lfu overrides. */
    const char *pol = getenv("DELTAFIN_EVICT");
    df_ecache_set_policy(m->ecache, pol && !strcmp(pol, "lfu") ? DF_EVICT_LFU : DF_EVICT_LRU);
    /* prefetch needs room for the next layer's experts beside this layer's */
    int pf = getenv("DELTAFIN_NO_PREFETCH") ? 2 : o->prefetch;
    m->prefetch = pf != 2 && df_ecache_slots(m->ecache) >= 2 * c->n_experts_used;
    df_ecache_set_prefetch(m->ecache, pf == 1 ? DF_PF_ALWAYS : pf == 2 || !m->prefetch ? DF_PF_NEVER : DF_PF_AUTO);
    m->prefetch_mode = m->prefetch ? pf : 2;
    if (o->trace_path) {
        m->trace = fopen(o->trace_path, "w");
        if (!m->trace) return df_err(err, errlen, DF_EIO, "%s: cannot open the trace file", o->trace_path);
        df_ecache_set_trace(m->ecache, m->trace);
    }
    return 0;
}

df_engine *df_engine_open(const char *model, const df_options *opt, char *err, size_t errlen) {
    df_options o;
    if (opt) o = *opt; else df_options_default(&o);
    char *path = resolve_model(model);
    df_pool_init(o.n_threads);
    if (df_file_exists(path)) {
        struct stat fs;
        int64_t total = stat(path, &fs) == 0 ? fs.st_size : 0;
        int64_t budget = o.ram_bytes > 0 ? o.ram_bytes : df_mem_available() - ((int64_t)2 << 30);
        int mode = o.expert_cache_bytes >= 0 || total >= budget ? 2 : 0;
        df_model *m = NULL;
        int rc = df_model_load_gguf(path, mode, &m, err, errlen);
        free(path);
        if (rc) return NULL;
        if (mode == 2 && m->cfg.n_experts && start_streaming(m, &o, budget, err, errlen)) { df_model_free(m); return NULL; }
        return engine_new(m, &o, err, errlen);
    }
    if (!df_is_dir(path)) {
        df_err(err, errlen, DF_EINPUT, "%s: no such model directory or GGUF file (and no installed model of that name)", model);
        free(path);
        return NULL;
    }
    /* Weights that fit the memory budget are read into engine-owned memory, so the
     * kernel's page cache cannot evict the spine between tokens. */
    int64_t total = 0;
    {
        DIR *d = opendir(path);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                char *f = df_path_join(path, de->d_name);
                struct stat fs;
                if (stat(f, &fs) == 0) total += fs.st_size;
                free(f);
            }
        }
        if (d) closedir(d);
    }
    int64_t budget = o.ram_bytes > 0 ? o.ram_bytes : df_mem_available() - ((int64_t)2 << 30);
    /* mode: 1 everything resident; 2 routed experts stream through the expert
     * cache (asked for with --expert-cache, or when the weights exceed the budget) */
    int mode = o.expert_cache_bytes >= 0 || total >= budget || df_is_store(path) ? 2 : o.mmap_weights ? 0 : 1;
    df_model *m = NULL;
    int rc = df_model_load(path, mode, &m, err, errlen);
    free(path);
    if (rc) return NULL;
    if (mode == 2 && m->cfg.n_experts && start_streaming(m, &o, budget, err, errlen)) { df_model_free(m); return NULL; }
    return engine_new(m, &o, err, errlen);
}

static df_engine *engine_new(df_model *m, const df_options *o, char *err, size_t errlen) {
    df_engine *e = df_xcalloc(1, sizeof *e);
    e->model = m;
    e->opt = *o;
    for (int i = 0; i < m->cfg.n_eos; i++) df_engine_add_stop(e, m->cfg.eos[i]);
    if (df_engine_tok_load(e, m->dir, err, errlen)) {
        df_engine_close(e);
        return NULL;
    }
    return e;
}

void df_engine_add_stop(df_engine *e, int32_t id) {
    for (int i = 0; i < e->n_stop; i++) if (e->stop[i] == id) return;
    if (e->n_stop < (int)(sizeof e->stop / sizeof *e->stop)) e->stop[e->n_stop++] = id;
}

void df_engine_close(df_engine *e) {
    if (!e) return;
    df_engine_tok_free(e);
    df_model_free(e->model);
    free(e);
}
const char *df_engine_error(const df_engine *e) { return e->errbuf; }

void df_engine_info(const df_engine *e, df_model_info *out) {
    const df_config *c = &e->model->cfg;
    memset(out, 0, sizeof *out);
    out->family = c->family_name;
    out->model_type = c->model_type;
    out->n_layers = c->n_layers;
    out->hidden = c->hidden;
    out->vocab_size = c->vocab;
    out->n_experts = c->n_experts;
    out->n_experts_used = c->n_experts_used;
    out->max_context = c->max_pos;
    out->bos_id = c->bos_id;
    out->n_eos = e->n_stop;
    out->eos_ids = e->stop;
    out->n_params = e->model->n_params;
    out->n_params_active = e->model->n_params_active;
    out->weight_bytes = e->model->bytes;
    out->weight_bytes_active = e->model->bytes_active;
}

static void count_fmt(const df_weight *w, int64_t *bytes_by_fmt) {
    if (w->data) bytes_by_fmt[w->fmt] += df_weight_bytes(w);
}

char *df_engine_describe(const df_engine *e) {
    const df_model *m = e->model;
    const df_config *c = &m->cfg;
    df_buf b = {0};
    df_buf_printf(&b, "model        %s\n", m->dir);
    df_buf_printf(&b, "family       %s (model_type %s)\n", c->family_name, c->model_type);
    df_buf_printf(&b, "layers       %d, hidden %d, vocab %d, max positions %d\n", c->n_layers, c->hidden, c->vocab, c->max_pos);
    if (c->family == DF_FAM_DEEPSEEK_V3)
        df_buf_printf(&b, "attention    MLA: %d heads, q_lora_rank %d, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d (latent cache %zu B/token)\n",
                      c->n_heads, c->q_lora_rank, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim, df_state_bytes_per_token(m));
    else
        df_buf_printf(&b, "attention    GQA: %d heads, %d kv heads, head_dim %d%s (KV cache %zu B/token)\n", c->n_heads, c->n_kv_heads, c->head_dim,
                      c->family != DF_FAM_LLAMA ? ", q/k norm" : "", df_state_bytes_per_token(m));
    const char *rt[] = {"default", "linear", "llama3", "yarn"};
    df_buf_printf(&b, "rope         %s, theta %g%s", rt[c->rope_type], c->rope_theta, c->rope_interleave && c->family == DF_FAM_DEEPSEEK_V3 ? ", interleaved" : "");
    if (c->rope_type != DF_ROPE_DEFAULT) df_buf_printf(&b, ", factor %g", c->rope_factor);
    df_buf_puts(&b, "\n");
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += m->layers[l].moe;
    if (c->n_experts) {
        df_buf_printf(&b, "experts      %d routed (top-%d), width %d, %d MoE layers of %d", c->n_experts, c->n_experts_used, c->moe_intermediate, n_moe, c->n_layers);
        if (c->n_shared_experts) df_buf_printf(&b, ", %d shared", c->n_shared_experts);
        if (c->family == DF_FAM_DEEPSEEK_V3) df_buf_printf(&b, ", sigmoid noaux_tc, %d groups keep %d, scale %g", c->n_group, c->topk_group, c->routed_scaling);
        else df_buf_printf(&b, ", softmax router%s", c->norm_topk_prob ? ", norm_topk_prob" : "");
        df_buf_puts(&b, "\n");
    }
    if (c->intermediate && n_moe < c->n_layers) df_buf_printf(&b, "dense mlp    width %d\n", c->intermediate);
    int64_t by[7] = {0};
    count_fmt(&m->embed, by);
    if (m->lm_head.data != m->embed.data) count_fmt(&m->lm_head, by);
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        const df_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->q_a, &L->q_b, &L->q_proj, &L->kv_a, &L->kv_b, &L->k_b, &L->v_b, &L->mlp.gate, &L->mlp.up, &L->mlp.down,
                                 &L->router, &L->shared.gate, &L->shared.up, &L->shared.down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) count_fmt(ws[i], by);
        if (L->moe)
            for (int x = 0; x < c->n_experts; x++) { count_fmt(&L->experts[x].gate, by); count_fmt(&L->experts[x].up, by); count_fmt(&L->experts[x].down, by); }
    }
    const char *fn[] = {"F32", "F16", "BF16", "FP8_E4M3 (block scales)", "INT4 pack-quantized", "GGML", "I8ROW (not exact)"};
    df_buf_puts(&b, "dtypes      ");
    for (int i = 0; i < 7; i++) if (by[i]) df_buf_printf(&b, " %s %.1f MB;", fn[i], by[i] / 1e6);
    df_buf_puts(&b, "\n");
    if (c->quant == DF_QUANT_FP8) df_buf_printf(&b, "quantization fp8 e4m3, weight_block_size [%d, %d]\n", c->fp8_block[0], c->fp8_block[1]);
    if (c->quant == DF_QUANT_INT4_PACK) df_buf_printf(&b, "quantization compressed-tensors pack-quantized int4, group %d, symmetric, %d ignore entries\n", c->int4_group, c->n_quant_ignore);
    if (m->spine_int8) df_buf_puts(&b, "spine        row-int8 (store built with --spine int8): results are NOT exact\n");
    df_buf_printf(&b, "parameters   %.3f M total, %.3f M active per token\n", m->n_params / 1e6, m->n_params_active / 1e6);
    df_buf_printf(&b, "weight bytes %.3f MB total, %.3f MB active per token\n", m->bytes / 1e6, m->bytes_active / 1e6);
    if (m->n_ignored_tensors) df_buf_printf(&b, "unused       %d MTP-layer tensors (recognised, not used)\n", m->n_ignored_tensors);
    df_buf_printf(&b, "eos ids     ");
    for (int i = 0; i < c->n_eos; i++) df_buf_printf(&b, " %d", c->eos[i]);
    df_buf_printf(&b, "\nbos id       %d\n", c->bos_id);
    return b.p;
}

/* ---- sessions ------------------------------------------------------------ */

df_session *df_session_new(df_engine *e, int max_context) {
    const df_config *c = &e->model->cfg;
    if (max_context <= 0) max_context = c->max_pos < DF_DEFAULT_CTX ? c->max_pos : DF_DEFAULT_CTX;
    df_session *s = df_xcalloc(1, sizeof *s);
    s->e = e;
    if (df_state_init(e->model, max_context, DF_MAX_BATCH, &s->st, e->errbuf, sizeof e->errbuf)) {
        free(s);
        return NULL;
    }
    s->tokens = df_xmalloc((size_t)max_context * sizeof(int32_t));
    s->logits = df_xmalloc((size_t)c->vocab * sizeof(float));
    s->work = df_xmalloc((size_t)c->vocab * 2 * sizeof(float));
    df_rng_seed(&s->rng, 0);
    return s;
}

void df_session_free(df_session *s) {
    if (!s) return;
    df_state_free(&s->st);
    free(s->tokens);
    free(s->logits);
    free(s->work);
    free(s);
}

size_t df_session_len(const df_session *s) { return s->len; }
const float *df_session_logits(df_session *s) { return s->logits_valid ? s->logits : NULL; }
void df_session_seed(df_session *s, uint64_t seed) { df_rng_seed(&s->rng, seed); }

static int check_ids(df_session *s, const int32_t *ids, size_t n) {
    const df_config *c = &s->e->model->cfg;
    if (n > (size_t)s->st.max_ctx)
        return df_err(s->e->errbuf, sizeof s->e->errbuf, DF_EINPUT, "%zu tokens exceed the session context of %d", n, s->st.max_ctx);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return df_err(s->e->errbuf, sizeof s->e->errbuf, DF_EINPUT, "token id %d at position %zu is out of range (vocab_size %d)", ids[i], i, c->vocab);
    return 0;
}

/* Runs ids[from..n) after the cache holds ids[0..from); logits of the last. */
static int run_tokens(df_session *s, const int32_t *ids, size_t from, size_t n) {
    df_engine *e = s->e;
    double t0 = df_now();
    size_t todo = n - from;
    df_ecache_stats es0 = {0}, es1 = {0};
    if (e->model->ecache) df_ecache_stats_get(e->model->ecache, &es0);
    for (size_t p = from; p < n; p += DF_MAX_BATCH) {
        int cnt = (int)(n - p < DF_MAX_BATCH ? n - p : DF_MAX_BATCH);
        int rc = df_forward(e->model, &s->st, ids + p, cnt, (int)p, s->logits, 0);
        if (rc) return df_err(e->errbuf, sizeof e->errbuf, rc, "forward pass failed at position %zu: %s", p, s->st.err[0] ? s->st.err : "bad input");
        memcpy(s->tokens + p, ids + p, (size_t)cnt * sizeof(int32_t));
        s->len = p + (size_t)cnt;
    }
    double dt = df_now() - t0;
    if (e->model->ecache) df_ecache_stats_get(e->model->ecache, &es1);
    if (todo == 1) {
        e->stats.decode_bytes_read += es1.bytes_read - es0.bytes_read;
        e->stats.decode_io_wait_seconds += es1.io_wait_s - es0.io_wait_s;
        e->stats.decode_tokens++;
        e->stats.decode_seconds += dt;
        e->stats.weight_bytes_touched += e->model->bytes_active;
    } else {
        e->stats.prefill_tokens += (int64_t)todo;
        e->stats.prefill_seconds += dt;
    }
    e->stats.t_attention = s->st.t_attn;
    e->stats.t_experts = s->st.t_ffn;
    e->stats.t_other = s->st.t_other;
    s->logits_valid = 1;
    return 0;
}

int df_session_sync(df_session *s, const int32_t *ids, size_t n) {
    int rc = check_ids(s, ids, n);
    if (rc) return rc;
    if (n == 0) {
        s->len = 0;
        s->logits_valid = 0;
        return 0;
    }
    size_t common = 0;
    while (common < s->len && common < n && s->tokens[common] == ids[common]) common++;
    if (common == n && s->len == n && s->logits_valid) return 0;
    if (common >= n) common = n - 1; /* recompute the last position for its logits */
    s->len = common;
    s->logits_valid = 0;
    return run_tokens(s, ids, common, n);
}

int df_session_push(df_session *s, int32_t id) {
    if (s->len >= (size_t)s->st.max_ctx)
        return df_err(s->e->errbuf, sizeof s->e->errbuf, DF_EINPUT, "context full (%d tokens)", s->st.max_ctx);
    int rc = check_ids(s, &id, 1);
    if (rc) return rc;
    s->tokens[s->len] = id;
    return run_tokens(s, s->tokens, s->len, s->len + 1);
}

int df_session_sample(df_session *s, const df_sampling *sp, int32_t *out_id) {
    if (!s->logits_valid) return df_err(s->e->errbuf, sizeof s->e->errbuf, DF_EINPUT, "no logits: the session is empty");
    *out_id = df_sample(s->logits, s->e->model->cfg.vocab, sp, &s->rng, s->work);
    return 0;
}

int df_session_eval_all(df_session *s, const int32_t *ids, size_t n, float *out) {
    int rc = check_ids(s, ids, n);
    if (rc) return rc;
    df_engine *e = s->e;
    const size_t V = (size_t)e->model->cfg.vocab;
    s->len = 0;
    s->logits_valid = 0;
    double t0 = df_now();
    for (size_t p = 0; p < n; p += DF_MAX_BATCH) {
        int cnt = (int)(n - p < DF_MAX_BATCH ? n - p : DF_MAX_BATCH);
        rc = df_forward(e->model, &s->st, ids + p, cnt, (int)p, out + p * V, 1);
        if (rc) return df_err(e->errbuf, sizeof e->errbuf, rc, "forward pass failed at position %zu: %s", p, s->st.err[0] ? s->st.err : "bad input");
        memcpy(s->tokens + p, ids + p, (size_t)cnt * sizeof(int32_t));
        s->len = p + (size_t)cnt;
    }
    e->stats.prefill_tokens += (int64_t)n;
    e->stats.prefill_seconds += df_now() - t0;
    if (n) {
        memcpy(s->logits, out + (n - 1) * V, V * sizeof(float));
        s->logits_valid = 1;
    }
    return 0;
}

void df_stats_get(df_engine *e, df_stats *out) {
    *out = e->stats;
    out->peak_rss_bytes = df_peak_rss();
    if (e->model->ecache) {
        df_ecache_stats es;
        df_ecache_stats_get(e->model->ecache, &es);
        out->streaming = 1;
        out->spine_int8 = e->model->spine_int8;
        out->expert_hits = es.hits;
        out->expert_prefetch_hits = es.prefetch_hits;
        out->expert_misses = es.misses;
        out->bytes_read = es.bytes_read;
        out->io_wait_seconds = es.io_wait_s;
        out->prefetch_issued = es.prefetch_issued;
        out->prefetch_unused = es.prefetch_unused;
        out->prefetch_predicted = es.predicted;
        out->prefetch_predicted_right = es.predicted_right;
        out->prefetch_mode = e->model->prefetch_mode;
        out->stale_reuses = es.stale_reuses;
        out->slot_touch_gbs = es.touch_gbs;
        out->spine_load_seconds = e->model->spine_load_s;
        out->spine_load_bytes = e->model->spine_load_bytes;
        out->expert_cache_bytes = (int64_t)es.n_slots * es.slot_bytes;
        out->expert_cache_slots = es.n_slots;
    }
}
void df_stats_reset(df_engine *e) { memset(&e->stats, 0, sizeof e->stats); }
