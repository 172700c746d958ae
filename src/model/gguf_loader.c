/* gguf_loader.c - builds a df_model from a GGUF file (llama.cpp tensor
 * names and metadata keys). Weights stay in their GGML block types and are
 * executed as stored. Supported architectures: llama, qwen3, qwen3moe.
 *
 * Names: token_embd, output_norm, output (absent: tied), blk.N.{attn_norm,
 * attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm,
 * ffn_gate, ffn_up, ffn_down, ffn_gate_inp, ffn_{gate,up,down}_exps}.
 * GGUF dims are ne[0] = input (row length), ne[1] = output rows, ne[2] =
 * expert. llama-arch files store q/k rows permuted for adjacent-pair RoPE
 * (llama.cpp's converter), so those models rotate adjacent pairs. */
#include "backend/ggml_quant.h"
#include "deltafin.h"
#include "format/gguf.h"
#include "model/model.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    df_model *m;
    const char *path;
    char *err;
    size_t errlen;
    int rc;
} gl;

static const df_gguf_tensor *gt(gl *c, const char *name, int required) {
    if (c->rc) return NULL;
    const df_gguf_tensor *t = df_gguf_tensor_find(c->m->gguf, name);
    if (!t && required) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing tensor '%s'", c->path, name);
    return t;
}

static int wfmt_of(gl *c, const df_gguf_tensor *t, df_weight *w) {
    switch (t->type) {
    case DF_GGML_F32: w->fmt = DF_W_F32; return 0;
    case DF_GGML_F16: w->fmt = DF_W_F16; return 0;
    case DF_GGML_BF16: w->fmt = DF_W_BF16; return 0;
    default:
        if (!df_ggml_traits_of(t->type))
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: tensor '%s': GGML type %s is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4)",
                                  c->path, t->name, df_gguf_type_name(t->type));
        w->fmt = DF_W_GGML;
        w->ggml_type = t->type;
        return 0;
    }
}

/* A matrix [rows x cols] (expert e of a stacked [cols, rows, E] tensor if e >= 0). */
static void mat(gl *c, const char *name, int64_t rows, int64_t cols, int e, int64_t n_exp, df_weight *w, int required) {
    memset(w, 0, sizeof *w);
    const df_gguf_tensor *t = gt(c, name, required);
    if (!t) return;
    int nd = e >= 0 ? 3 : 2;
    int ok = t->ne[0] == cols && t->ne[1] == rows && (nd == 2 ? t->n_dims <= 2 : (t->n_dims == 3 && t->ne[2] == n_exp));
    if (!ok) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld, %lld%s], got [%lld, %lld, %lld] (%d dims)", c->path, name,
                       (long long)cols, (long long)rows, nd == 3 ? ", n_experts" : "", (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims);
        return;
    }
    if (wfmt_of(c, t, w)) return;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)df_gguf_tensor_row_bytes(t);
    w->data = t->data + (e >= 0 ? (size_t)e * (size_t)rows * w->row_bytes : 0);
}

static float *vecf(gl *c, const char *name, int64_t n, int required) {
    const df_gguf_tensor *t = gt(c, name, required);
    if (!t) return NULL;
    if (t->ne[0] != n || t->n_dims != 1) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld], got [%lld, %lld]", c->path, name, (long long)n, (long long)t->ne[0], (long long)t->ne[1]);
        return NULL;
    }
    df_weight w = {0};
    if (wfmt_of(c, t, &w)) return NULL;
    w.rows = 1;
    w.cols = n;
    w.row_bytes = t->nbytes;
    w.data = t->data;
    float *v = df_xmalloc((size_t)n * sizeof(float));
    df_dequant_row(&w, 0, v);
    return v;
}

static int64_t kv_int(gl *c, const char *arch, const char *key, int64_t def, int required) {
    if (c->rc) return def;
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v = def;
    int r = df_gguf_get_i64(c->m->gguf, k, &v, c->err, c->errlen);
    if (r < 0) c->rc = r;
    else if (r == 0 && required) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing metadata key '%s'", c->path, k);
    return v;
}
static double kv_f(gl *c, const char *arch, const char *key, double def) {
    if (c->rc) return def;
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float v = (float)def;
    int r = df_gguf_get_f32(c->m->gguf, k, &v, c->err, c->errlen);
    if (r < 0) c->rc = r;
    return r == 1 ? v : def;
}

int df_model_load_gguf(const char *path, int mode, df_model **out, char *err, size_t errlen) {
    *out = NULL;
    df_model *m = df_xcalloc(1, sizeof *m);
    m->dir = df_xstrdup(path);
    int rc = df_gguf_open(path, &m->gguf, err, errlen);
    if (rc) { df_model_free(m); return rc; }
    gl c = {m, path, err, errlen, 0};
    df_config *cfg = &m->cfg;
    const char *arch = NULL;
    if (df_gguf_get_str(m->gguf, "general.architecture", &arch, err, errlen) != 1) {
        if (arch == NULL) df_err(err, errlen, DF_EFORMAT, "%s: missing metadata key 'general.architecture'", path);
        df_model_free(m);
        return DF_EFORMAT;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", arch);
    if (!strcmp(arch, "llama")) cfg->family = DF_FAM_LLAMA, cfg->family_name = "llama", m->rope_adjacent = 1;
    else if (!strcmp(arch, "qwen3")) cfg->family = DF_FAM_QWEN3, cfg->family_name = "qwen3";
    else if (!strcmp(arch, "qwen3moe")) cfg->family = DF_FAM_QWEN3_MOE, cfg->family_name = "qwen3_moe";
    else {
        df_err(err, errlen, DF_EUNSUPPORTED, "%s: general.architecture \"%s\" is not supported for GGUF yet (supported: llama, qwen3, qwen3moe)", path, arch);
        df_model_free(m);
        return DF_EUNSUPPORTED;
    }
    cfg->n_layers = (int)kv_int(&c, arch, "block_count", 0, 1);
    cfg->hidden = (int)kv_int(&c, arch, "embedding_length", 0, 1);
    cfg->intermediate = (int)kv_int(&c, arch, "feed_forward_length", 0, 0);
    cfg->n_heads = (int)kv_int(&c, arch, "attention.head_count", 0, 1);
    cfg->n_kv_heads = (int)kv_int(&c, arch, "attention.head_count_kv", cfg->n_heads, 0);
    cfg->max_pos = (int)kv_int(&c, arch, "context_length", 4096, 0);
    cfg->rms_eps = kv_f(&c, arch, "attention.layer_norm_rms_epsilon", 1e-6);
    cfg->rope_theta = kv_f(&c, arch, "rope.freq_base", 10000.0);
    if (c.rc) goto fail;
    if (cfg->n_layers <= 0 || cfg->n_layers >= DF_MAX_LAYERS || cfg->hidden <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 ||
        cfg->n_heads % cfg->n_kv_heads) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: inconsistent metadata: %d layers, hidden %d, %d heads, %d kv heads", path, cfg->n_layers, cfg->hidden, cfg->n_heads, cfg->n_kv_heads);
        goto fail;
    }
    cfg->head_dim = (int)kv_int(&c, arch, "attention.key_length", cfg->hidden / cfg->n_heads, 0);
    cfg->rope_dim = (int)kv_int(&c, arch, "rope.dimension_count", cfg->head_dim, 0);
    if (cfg->rope_dim != cfg->head_dim) {
        c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: partial rotary embedding (rope.dimension_count %d of head dim %d) is not supported", path, cfg->rope_dim, cfg->head_dim);
        goto fail;
    }
    {
        char k[256];
        const char *st = NULL;
        snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
        if (df_gguf_get_str(m->gguf, k, &st, err, errlen) == 1 && strcmp(st, "none")) {
            if (!strcmp(st, "linear")) cfg->rope_type = DF_ROPE_LINEAR, cfg->rope_factor = kv_f(&c, arch, "rope.scaling.factor", 1.0);
            else { c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: %s \"%s\" is not supported for GGUF yet", path, k, st); goto fail; }
        }
    }
    const df_gguf_tensor *emb = gt(&c, "token_embd.weight", 1);
    if (!emb) goto fail;
    cfg->vocab = (int)emb->ne[1];
    if (cfg->family == DF_FAM_QWEN3_MOE) {
        cfg->n_experts = (int)kv_int(&c, arch, "expert_count", 0, 1);
        cfg->n_experts_used = (int)kv_int(&c, arch, "expert_used_count", 0, 1);
        cfg->moe_intermediate = (int)kv_int(&c, arch, "expert_feed_forward_length", 0, 1);
        cfg->decoder_sparse_step = 1;
        int norm = 1;
        char k[256];
        snprintf(k, sizeof k, "%s.expert_weights_norm", arch);
        if (df_gguf_get_bool(m->gguf, k, &norm, err, errlen) < 0) { c.rc = DF_EFORMAT; goto fail; }
        cfg->norm_topk_prob = norm;
        if (c.rc) goto fail;
        if (cfg->n_experts <= 0 || cfg->n_experts_used <= 0 || cfg->n_experts_used > cfg->n_experts) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: expert_count %d / expert_used_count %d are inconsistent", path, cfg->n_experts, cfg->n_experts_used);
            goto fail;
        }
    }
    {
        int64_t v;
        if (df_gguf_get_i64(m->gguf, "tokenizer.ggml.bos_token_id", &v, err, errlen) == 1) cfg->bos_id = (int)v; else cfg->bos_id = -1;
        if (df_gguf_get_i64(m->gguf, "tokenizer.ggml.eos_token_id", &v, err, errlen) == 1) cfg->eos[cfg->n_eos++] = (int)v;
        if (df_gguf_get_i64(m->gguf, "tokenizer.ggml.eot_token_id", &v, err, errlen) == 1 && (cfg->n_eos == 0 || cfg->eos[0] != v)) cfg->eos[cfg->n_eos++] = (int)v;
    }
    const int64_t H = cfg->hidden, qd = (int64_t)cfg->n_heads * cfg->head_dim, kd = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    mat(&c, "token_embd.weight", cfg->vocab, H, -1, 0, &m->embed, 1);
    m->final_norm = vecf(&c, "output_norm.weight", H, 1);
    if (!c.rc && df_gguf_tensor_find(m->gguf, "output.weight")) mat(&c, "output.weight", cfg->vocab, H, -1, 0, &m->lm_head, 1);
    else m->lm_head = m->embed, cfg->tie_embeddings = 1;
    m->layers = df_xcalloc((size_t)cfg->n_layers, sizeof(df_layer));
    char n[256];
    for (int l = 0; l < cfg->n_layers && !c.rc; l++) {
        df_layer *L = &m->layers[l];
#define N(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
        L->attn_norm = vecf(&c, N("attn_norm.weight"), H, 1);
        L->ffn_norm = vecf(&c, N("ffn_norm.weight"), H, 1);
        mat(&c, N("attn_q.weight"), qd, H, -1, 0, &L->wq, 1);
        mat(&c, N("attn_k.weight"), kd, H, -1, 0, &L->wk, 1);
        mat(&c, N("attn_v.weight"), kd, H, -1, 0, &L->wv, 1);
        mat(&c, N("attn_output.weight"), H, qd, -1, 0, &L->wo, 1);
        L->bq = vecf(&c, N("attn_q.bias"), qd, 0);
        L->bk = vecf(&c, N("attn_k.bias"), kd, 0);
        L->bv = vecf(&c, N("attn_v.bias"), kd, 0);
        L->bo = vecf(&c, N("attn_output.bias"), H, 0);
        if (cfg->family != DF_FAM_LLAMA) {
            L->q_norm = vecf(&c, N("attn_q_norm.weight"), cfg->head_dim, 1);
            L->k_norm = vecf(&c, N("attn_k_norm.weight"), cfg->head_dim, 1);
        }
        L->moe = cfg->family == DF_FAM_QWEN3_MOE && df_gguf_tensor_find(m->gguf, N("ffn_gate_inp.weight"));
        if (!L->moe) {
            mat(&c, N("ffn_gate.weight"), cfg->intermediate, H, -1, 0, &L->mlp.gate, 1);
            mat(&c, N("ffn_up.weight"), cfg->intermediate, H, -1, 0, &L->mlp.up, 1);
            mat(&c, N("ffn_down.weight"), H, cfg->intermediate, -1, 0, &L->mlp.down, 1);
        } else {
            const int E = cfg->n_experts, I = cfg->moe_intermediate;
            mat(&c, N("ffn_gate_inp.weight"), E, H, -1, 0, &L->router, 1);
            L->experts = df_xcalloc((size_t)E, sizeof(df_ffn));
            for (int e = 0; e < E && !c.rc; e++) {
                mat(&c, N("ffn_gate_exps.weight"), I, H, e, E, &L->experts[e].gate, 1);
                mat(&c, N("ffn_up_exps.weight"), I, H, e, E, &L->experts[e].up, 1);
                mat(&c, N("ffn_down_exps.weight"), H, I, e, E, &L->experts[e].down, 1);
            }
        }
#undef N
    }
    if (c.rc) goto fail;
    if (mode == 2 && cfg->n_experts) {
        c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: streaming the experts of GGUF models is not supported yet", path);
        goto fail;
    }
    df_model_finish(m);
    {
        /* llama 3.x stores its rope scaling as per-dimension frequency factors */
        const df_gguf_tensor *rf = df_gguf_tensor_find(m->gguf, "rope_freqs.weight");
        if (rf) {
            float *ff = vecf(&c, "rope_freqs.weight", cfg->rope_dim / 2, 1);
            if (!ff) goto fail;
            for (int i = 0; i < cfg->rope_dim / 2; i++) m->inv_freq[i] /= ff[i];
            free(ff);
        }
    }
    *out = m;
    return 0;
fail:
    df_model_free(m);
    return c.rc ? c.rc : DF_EFORMAT;
}
