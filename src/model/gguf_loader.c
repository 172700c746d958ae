/* gguf_loader.c - builds a df_model from a GGUF file (llama.cpp tensor
 * names and metadata keys). Weights stay in their GGML block types and are
 * executed as stored. Supported architectures: llama, qwen3, qwen3moe,
 * deepseek2 (DeepSeek-V3/R1, Kimi K2 conversions).
 *
 * Names: token_embd, output_norm, output (absent: tied), blk.N.{attn_norm,
 * attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm,
 * ffn_gate, ffn_up, ffn_down, ffn_gate_inp, ffn_{gate,up,down}_exps}; MLA
 * (deepseek2): blk.N.{attn_q_a, attn_q_a_norm, attn_q_b | attn_q,
 * attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b | attn_k_b + attn_v_b,
 * exp_probs_b.bias, ffn_{gate,up,down}_shexp}.
 * GGUF dims are ne[0] = input (row length), ne[1] = output rows, ne[2] =
 * expert (or head, for attn_k_b / attn_v_b). llama-arch files store q/k rows
 * permuted for adjacent-pair RoPE (llama.cpp's converter), so those models
 * rotate adjacent pairs; deepseek2 rotates adjacent pairs too (GGML "norm"
 * RoPE), which is DeepSeek's interleaved RoPE, with no permutation.
 *
 * Routed experts are slices of the stacked tensors: expert e of a tensor
 * [cols, rows, E] is rows * row_bytes bytes at e * rows * row_bytes. In
 * streaming mode (2) those slices become the experts' on-disk extents and
 * the spine moves into owned memory (df_model_own_spine), as for
 * safetensors checkpoints. */
#include "backend/ggml_quant.h"
#include "deltafin.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/family.h"
#include "util/util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* A matrix [rows x cols] (expert e of a stacked [cols, rows, E] tensor if e >= 0).
 * Returns the tensor (NULL if absent or on error). */
static const df_gguf_tensor *mat(gl *c, const char *name, int64_t rows, int64_t cols, int e, int64_t n_exp, df_weight *w, int required) {
    memset(w, 0, sizeof *w);
    const df_gguf_tensor *t = gt(c, name, required);
    if (!t) return NULL;
    int nd = e >= 0 ? 3 : 2;
    int ok = t->ne[0] == cols && t->ne[1] == rows && (nd == 2 ? t->n_dims <= 2 : (t->n_dims == 3 && t->ne[2] == n_exp));
    if (!ok) {
        if (nd == 3)
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld, %lld, %lld] (in, out, experts), got [%lld, %lld, %lld] (%d dims)", c->path, name,
                           (long long)cols, (long long)rows, (long long)n_exp, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims);
        else
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld, %lld], got [%lld, %lld, %lld] (%d dims)", c->path, name,
                           (long long)cols, (long long)rows, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims);
        return NULL;
    }
    if (wfmt_of(c, t, w)) return NULL;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)df_gguf_tensor_row_bytes(t);
    w->data = t->data + (e >= 0 ? (size_t)e * (size_t)rows * w->row_bytes : 0);
    return t;
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

/* The decimal a float32 metadata value was written from (the shortest one
 * that rounds back to it), so that e.g. rope_theta, eps or
 * routed_scaling_factor equal the config.json doubles they came from. */
static double f32_decimal(float v) {
    char b[40];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)v);
        double d = strtod(b, NULL);
        if ((float)d == v) return d;
    }
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
/* Float key; *found (optional) says whether it was present. */
static double kv_f2(gl *c, const char *arch, const char *key, double def, int *found) {
    if (found) *found = 0;
    if (c->rc) return def;
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float v = (float)def;
    int r = df_gguf_get_f32(c->m->gguf, k, &v, c->err, c->errlen);
    if (r < 0) c->rc = r;
    if (r == 1 && found) *found = 1;
    return r == 1 ? f32_decimal(v) : def;
}
static double kv_f(gl *c, const char *arch, const char *key, double def) { return kv_f2(c, arch, key, def, NULL); }

/* Integer key in lo..hi (a file's integers feed int casts and allocations):
 * "<file>: metadata key '<arch>.<key>': expected lo..hi, got v". The default
 * is not checked. */
static int kv_int_in(gl *c, const char *arch, const char *key, int64_t def, int required, int64_t lo, int64_t hi) {
    if (c->rc) return 0;
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v = 0;
    int r = df_gguf_get_i64(c->m->gguf, k, &v, c->err, c->errlen);
    if (r < 0) { c->rc = r; return 0; }
    if (r == 0) {
        if (required) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing metadata key '%s'", c->path, k);
        return (int)def;
    }
    if (v < lo || v > hi) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: metadata key '%s.%s': expected %lld..%lld, got %lld", c->path, arch, key, (long long)lo, (long long)hi, (long long)v);
        return 0;
    }
    return (int)v;
}

/* Checks the value v of real key arch.key with df_check_real (finite, within lo..hi). */
static void kv_check(gl *c, const char *arch, const char *key, double v, double lo, int lo_open, double hi, int hi_open) {
    if (c->rc) return;
    char label[300];
    snprintf(label, sizeof label, "metadata key '%s.%s'", arch, key);
    c->rc = df_check_real(c->path, label, v, lo, lo_open, hi, hi_open, c->err, c->errlen);
}
/* Real key (def if absent), checked with kv_check when present. */
static double kv_real(gl *c, const char *arch, const char *key, double def, int *found, double lo, int lo_open, double hi, int hi_open) {
    int has = 0;
    double v = kv_f2(c, arch, key, def, &has);
    if (found) *found = has;
    if (has) kv_check(c, arch, key, v, lo, lo_open, hi, hi_open);
    return v;
}
static int kv_bool(gl *c, const char *arch, const char *key, int def) {
    if (c->rc) return def;
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int v = def;
    int r = df_gguf_get_bool(c->m->gguf, k, &v, c->err, c->errlen);
    if (r < 0) c->rc = r;
    return v;
}

/* Records a buffer owned by the model (freed by df_model_free). */
static void own_buf(df_model *m, void *p) {
    m->owned = df_xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(void *));
    m->owned[m->n_owned++] = p;
}

/* RoPE scaling keys: none, linear, yarn. For yarn, transformers' semantics:
 * cos/sin carry attention_factor (rope.scaling.yarn_attn_factor when given);
 * deepseek2 files carry yarn_log_multiplier = 0.1 * mscale_all_dim (the
 * converter's legacy factor, undone here), which scales the softmax by
 * mscale(mscale_all_dim)^2. The converter does not store mscale; as llama.cpp
 * does, mscale == mscale_all_dim is assumed (true for every DeepSeek and Kimi
 * release), so attention_factor is 1 unless yarn_attn_factor says otherwise. */
static int rope_scaling(gl *c, const char *arch) {
    df_config *cfg = &c->m->cfg;
    char k[256];
    const char *st = NULL;
    cfg->attention_factor = 1.0;
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    int r = df_gguf_get_str(c->m->gguf, k, &st, c->err, c->errlen);
    if (r < 0) return c->rc = r;
    if (r == 0 || !strcmp(st, "none")) return 0;
    if (!strcmp(st, "linear")) {
        cfg->rope_type = DF_ROPE_LINEAR;
        cfg->rope_factor = kv_real(c, arch, "rope.scaling.factor", 1.0, NULL, DF_MIN_ROPE_FACTOR, 0, DF_MAX_ROPE_FACTOR, 0);
        return c->rc;
    }
    if (strcmp(st, "yarn"))
        return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: %s \"%s\" is not supported for GGUF (supported: none, linear, yarn)", c->path, k, st);
    int has_f, has_af, has_lm, has_ext;
    cfg->rope_type = DF_ROPE_YARN;
    cfg->rope_factor = kv_real(c, arch, "rope.scaling.factor", 1.0, &has_f, DF_MIN_ROPE_FACTOR, 0, DF_MAX_ROPE_FACTOR, 0);
    cfg->orig_max_pos = (double)kv_int_in(c, arch, "rope.scaling.original_context_length", cfg->max_pos, 0, 1, INT32_MAX);
    cfg->beta_fast = kv_f(c, arch, "rope.scaling.yarn_beta_fast", 32.0);
    cfg->beta_slow = kv_f(c, arch, "rope.scaling.yarn_beta_slow", 1.0);
    double ext = kv_f2(c, arch, "rope.scaling.yarn_ext_factor", 1.0, &has_ext);
    double af = kv_real(c, arch, "rope.scaling.yarn_attn_factor", 1.0, &has_af, 0, 1, DF_MAX_MSCALE, 0);
    /* 0.1 * mscale_all_dim (see above) */
    double lm = kv_real(c, arch, "rope.scaling.yarn_log_multiplier", 0.0, &has_lm, 0, 0, 0.1 * DF_MAX_MSCALE, 0);
    if (c->rc) return c->rc;
    if (!has_f)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: yarn rope scaling needs a positive '%s.rope.scaling.factor'", c->path, arch);
    if (has_ext && ext != 1.0)
        return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: '%s.rope.scaling.yarn_ext_factor' %g is not supported (expected 1)", c->path, arch, ext);
    if (cfg->beta_fast == 0) cfg->beta_fast = 32;
    if (cfg->beta_slow == 0) cfg->beta_slow = 1;
    kv_check(c, arch, "rope.scaling.yarn_beta_fast", cfg->beta_fast, 0, 1, INFINITY, 0);
    kv_check(c, arch, "rope.scaling.yarn_beta_slow", cfg->beta_slow, 0, 1, INFINITY, 0);
    if (c->rc) return c->rc;
    cfg->rope_truncate = 1;
    double f = cfg->rope_factor;
    if (has_lm && lm != 0 && cfg->family == DF_FAM_DEEPSEEK_V3) {
        cfg->mscale_all_dim = lm / 0.1;
        cfg->mscale = cfg->mscale_all_dim;
        cfg->attention_factor = 1.0;
    } else {
        cfg->attention_factor = f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;
    }
    if (has_af) cfg->attention_factor = af;
    return 0;
}

/* MLA kv_b [NH*(nope+v) x kv_lora] (kv_b_proj as transformers stores it) from
 * the current converter's split tensors: attn_k_b ne [nope, kv_lora, NH]
 * (per head W_uk transposed: k_b[h][c][i] = kv_b[h*(nope+v) + i][c]) and
 * attn_v_b ne [kv_lora, v, NH] (per head W_uv: v_b[h][i][c] =
 * kv_b[h*(nope+v) + nope + i][c]). Float types of one kind are rearranged
 * into owned memory in that type (the same elements, bit for bit, so such
 * files give exactly the logits of the safetensors checkpoint); block types
 * cannot be rearranged, so they are kept as stored in L->k_b / L->v_b and the
 * MLA attention uses them in that split form. */
static void kv_b_from_split(gl *c, int l, df_weight *out, df_weight *k_b, df_weight *v_b) {
    df_model *m = c->m;
    const df_config *cfg = &m->cfg;
    const int64_t NH = cfg->n_heads, nope = cfg->qk_nope_dim, vd = cfg->v_head_dim, R = cfg->kv_lora_rank;
    char nk[64], nv[64];
    snprintf(nk, sizeof nk, "blk.%d.attn_k_b.weight", l);
    snprintf(nv, sizeof nv, "blk.%d.attn_v_b.weight", l);
    const df_gguf_tensor *tk = gt(c, nk, 1), *tv = gt(c, nv, 1);
    if (!tk || !tv) return;
    if (tk->n_dims != 3 || tk->ne[0] != nope || tk->ne[1] != R || tk->ne[2] != NH) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld, %lld, %lld] (nope, kv_lora, heads), got [%lld, %lld, %lld] (%d dims)", c->path, nk,
                       (long long)nope, (long long)R, (long long)NH, (long long)tk->ne[0], (long long)tk->ne[1], (long long)tk->ne[2], tk->n_dims);
        return;
    }
    if (tv->n_dims != 3 || tv->ne[0] != R || tv->ne[1] != vd || tv->ne[2] != NH) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected ne [%lld, %lld, %lld] (kv_lora, v, heads), got [%lld, %lld, %lld] (%d dims)", c->path, nv,
                       (long long)R, (long long)vd, (long long)NH, (long long)tv->ne[0], (long long)tv->ne[1], (long long)tv->ne[2], tv->n_dims);
        return;
    }
    df_weight wk = {0}, wv = {0};
    if (wfmt_of(c, tk, &wk) || wfmt_of(c, tv, &wv)) return;
    wk.rows = NH * R, wk.cols = nope, wk.row_bytes = (size_t)df_gguf_tensor_row_bytes(tk), wk.data = tk->data;
    wv.rows = NH * vd, wv.cols = R, wv.row_bytes = (size_t)df_gguf_tensor_row_bytes(tv), wv.data = tv->data;
    const int64_t rows = NH * (nope + vd);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = R;
    if (tk->type == tv->type && wk.fmt != DF_W_GGML) {
        const size_t es = (size_t)df_wfmt_row_bytes(wk.fmt, 1); /* F32, F16 or BF16: bytes per element */
        uint8_t *p = df_aligned_alloc((size_t)rows * (size_t)R * es);
        own_buf(m, p);
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t i = 0; i < nope; i++)
                for (int64_t col = 0; col < R; col++)
                    memcpy(p + ((size_t)(h * (nope + vd) + i) * (size_t)R + (size_t)col) * es, tk->data + ((size_t)(h * R + col) * (size_t)nope + (size_t)i) * es, es);
            memcpy(p + (size_t)(h * (nope + vd) + nope) * (size_t)R * es, tv->data + (size_t)(h * vd) * (size_t)R * es, (size_t)vd * (size_t)R * es);
        }
        out->fmt = wk.fmt;
        out->row_bytes = (size_t)R * es;
        out->data = p;
        return;
    }
    memset(out, 0, sizeof *out);
    *k_b = wk;
    *v_b = wv;
}

/* Where expert e's slice of a stacked tensor lies in its file. */
static df_extent slice_extent(const df_gguf_tensor *t, int e, const df_weight *w) {
    uint64_t len = (uint64_t)w->rows * (uint64_t)w->row_bytes;
    return (df_extent){t->file_index, t->file_offset + (uint64_t)e * len, len};
}

/* Routed experts of layer l: views into the stacked tensors and, for
 * streaming, their extents (gate, up, down). */
static void load_experts(gl *c, int l, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int E = cfg->n_experts, I = cfg->moe_intermediate, H = cfg->hidden;
    char ng[64], nu[64], nd[64];
    snprintf(ng, sizeof ng, "blk.%d.ffn_gate_exps.weight", l);
    snprintf(nu, sizeof nu, "blk.%d.ffn_up_exps.weight", l);
    snprintf(nd, sizeof nd, "blk.%d.ffn_down_exps.weight", l);
    L->experts = df_xcalloc((size_t)E, sizeof(df_ffn));
    for (int e = 0; e < E && !c->rc; e++) {
        df_ffn *f = &L->experts[e];
        const df_gguf_tensor *tg = mat(c, ng, I, H, e, E, &f->gate, 1);
        const df_gguf_tensor *tu = mat(c, nu, I, H, e, E, &f->up, 1);
        const df_gguf_tensor *td = mat(c, nd, H, I, e, E, &f->down, 1);
        if (c->rc) return;
        f->loc.n_parts = 3;
        f->loc.part[0] = slice_extent(tg, e, &f->gate);
        f->loc.part[1] = slice_extent(tu, e, &f->up);
        f->loc.part[2] = slice_extent(td, e, &f->down);
    }
}

static void ffn_dense(gl *c, int l, const char *suffix, int64_t inter, df_glu *f) {
    char n[64];
    const int64_t H = c->m->cfg.hidden;
    snprintf(n, sizeof n, "blk.%d.ffn_gate%s.weight", l, suffix);
    mat(c, n, inter, H, -1, 0, &f->gate, 1);
    snprintf(n, sizeof n, "blk.%d.ffn_up%s.weight", l, suffix);
    mat(c, n, inter, H, -1, 0, &f->up, 1);
    snprintf(n, sizeof n, "blk.%d.ffn_down%s.weight", l, suffix);
    mat(c, n, H, inter, -1, 0, &f->down, 1);
}

/* deepseek2 metadata: MLA shapes, MoE routing, layer kinds. */
static int deepseek2_config(gl *c, const char *arch) {
    df_config *cfg = &c->m->cfg;
    const char *path = c->path;
    cfg->n_kv_heads = cfg->n_heads; /* the file says 1 (MLA as MQA over the latent); K/V are per head */
    cfg->q_lora_rank = kv_int_in(c, arch, "attention.q_lora_rank", 0, 0, 0, DF_MAX_RANK);
    cfg->kv_lora_rank = kv_int_in(c, arch, "attention.kv_lora_rank", 0, 1, 1, DF_MAX_RANK);
    cfg->rope_dim = cfg->qk_rope_dim = kv_int_in(c, arch, "rope.dimension_count", 0, 1, 2, DF_MAX_HEAD_DIM);
    /* The current converter writes key_length = kv_lora + rope and value_length =
     * kv_lora (the absorbed MQA view) and the per-head sizes in the _mla keys;
     * older files have only key_length = nope + rope and value_length = v. */
    const int64_t kmax = DF_MAX_RANK + DF_MAX_HEAD_DIM; /* key_length may be kv_lora_rank + rope dims */
    int64_t klm = kv_int_in(c, arch, "attention.key_length_mla", 0, 0, 1, 2 * DF_MAX_HEAD_DIM), vlm = kv_int_in(c, arch, "attention.value_length_mla", 0, 0, 1, DF_MAX_HEAD_DIM);
    int64_t kl = kv_int_in(c, arch, "attention.key_length", 0, 0, 1, kmax), vl = kv_int_in(c, arch, "attention.value_length", 0, 0, 1, kmax);
    if (c->rc) return c->rc;
    if (klm && vlm) {
        cfg->qk_nope_dim = (int)(klm - cfg->qk_rope_dim);
        cfg->v_head_dim = (int)vlm;
    } else if (kl && vl) {
        cfg->qk_nope_dim = (int)(kl - cfg->qk_rope_dim);
        cfg->v_head_dim = (int)vl;
    } else {
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing metadata keys '%s.attention.key_length_mla' / 'value_length_mla' (or the older key_length / value_length)", path, arch);
    }
    if (cfg->kv_lora_rank <= 0 || cfg->q_lora_rank < 0 || cfg->qk_rope_dim <= 0 || cfg->qk_rope_dim % 2 || cfg->qk_nope_dim < 0 || cfg->qk_nope_dim > DF_MAX_HEAD_DIM ||
        cfg->v_head_dim <= 0 || cfg->v_head_dim > DF_MAX_HEAD_DIM)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: inconsistent MLA metadata: kv_lora_rank %d, q_lora_rank %d, rope dims %d, nope %d, v %d", path,
                              cfg->kv_lora_rank, cfg->q_lora_rank, cfg->qk_rope_dim, cfg->qk_nope_dim, cfg->v_head_dim);
    cfg->head_dim = cfg->qk_nope_dim + cfg->qk_rope_dim;
    cfg->rope_interleave = 1;
    cfg->n_experts = kv_int_in(c, arch, "expert_count", 0, 0, 0, DF_MAX_EXPERTS);
    cfg->first_k_dense = kv_int_in(c, arch, "leading_dense_block_count", 0, 0, 0, DF_MAX_LAYERS);
    if (cfg->n_experts && !c->rc) {
        const int E = cfg->n_experts;
        cfg->n_experts_used = kv_int_in(c, arch, "expert_used_count", 0, 1, 1, E);
        cfg->moe_intermediate = kv_int_in(c, arch, "expert_feed_forward_length", 0, 1, 1, DF_MAX_FFN);
        cfg->n_shared_experts = kv_int_in(c, arch, "expert_shared_count", 0, 0, 0, DF_MAX_SHARED_EXPERTS);
        cfg->n_group = kv_int_in(c, arch, "expert_group_count", 1, 0, 1, E);
        cfg->topk_group = kv_int_in(c, arch, "expert_group_used_count", 1, 0, 1, c->rc ? 1 : cfg->n_group);
        cfg->routed_scaling = kv_real(c, arch, "expert_weights_scale", 1.0, NULL, 0, 1, DF_MAX_ROUTED_SCALING, 0);
        cfg->norm_topk_prob = kv_bool(c, arch, "expert_weights_norm", 0);
        int64_t gating = kv_int(c, arch, "expert_gating_func", 0, 0);
        if (c->rc) return c->rc;
        if (gating != 2)
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: '%s.expert_gating_func' %s is not supported (expected 2, sigmoid with exp_probs_b: DeepSeek-V3/R1, Kimi K2; DeepSeek-V2's softmax router is not supported)",
                                  path, arch, gating == 0 ? "absent (softmax, DeepSeek-V2)" : gating == 1 ? "1 (softmax)" : "of an unknown kind");
        /* noaux_tc routing: a group scores by the sum of its top 2 experts, expert_group_used_count
         * groups are kept, and expert_used_count experts are chosen among theirs */
        const int G = cfg->n_group, per = E / G;
        if (E % G || per < 2)
            return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: metadata key '%s.expert_group_count': expected a divisor of expert_count (%d) leaving groups of at least 2 experts, got %d",
                                  path, arch, E, G);
        if (cfg->n_experts_used > cfg->topk_group * per)
            return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: metadata key '%s.expert_used_count': expected 1..%d (the experts of expert_group_used_count %d groups of %d), got %d",
                                  path, arch, cfg->topk_group * per, cfg->topk_group, per, cfg->n_experts_used);
        if ((int64_t)cfg->moe_intermediate * (cfg->n_shared_experts > 1 ? cfg->n_shared_experts : 1) > INT32_MAX)
            return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: metadata key '%s.expert_shared_count': expected at most %d (shared experts x expert_feed_forward_length %d must fit in int), got %d",
                                  path, arch, (int)(INT32_MAX / cfg->moe_intermediate), cfg->moe_intermediate, cfg->n_shared_experts);
    }
    return c->rc;
}

/* MLA attention tensors of layer l. */
static void mla_layer(gl *c, int l, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden, NH = cfg->n_heads, qk = cfg->qk_nope_dim + cfg->qk_rope_dim;
    char n[64];
#define N(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
    if (cfg->q_lora_rank) {
        mat(c, N("attn_q_a.weight"), cfg->q_lora_rank, H, -1, 0, &L->w.q_a, 1);
        L->q_a_norm = vecf(c, N("attn_q_a_norm.weight"), cfg->q_lora_rank, 1);
        mat(c, N("attn_q_b.weight"), NH * qk, cfg->q_lora_rank, -1, 0, &L->w.q_b, 1);
    } else {
        mat(c, N("attn_q.weight"), NH * qk, H, -1, 0, &L->w.q_proj, 1);
    }
    mat(c, N("attn_kv_a_mqa.weight"), cfg->kv_lora_rank + cfg->qk_rope_dim, H, -1, 0, &L->w.kv_a, 1);
    L->kv_a_norm = vecf(c, N("attn_kv_a_norm.weight"), cfg->kv_lora_rank, 1);
    if (!c->rc && df_gguf_tensor_find(c->m->gguf, N("attn_kv_b.weight")))
        mat(c, n, NH * (cfg->qk_nope_dim + cfg->v_head_dim), cfg->kv_lora_rank, -1, 0, &L->w.kv_b, 1);
    else
        kv_b_from_split(c, l, &L->w.kv_b, &L->w.k_b, &L->w.v_b);
    mat(c, N("attn_output.weight"), H, NH * cfg->v_head_dim, -1, 0, &L->w.wo, 1);
#undef N
}

int df_model_load_gguf(const char *path, const df_load_opts *o, df_model **out, char *err, size_t errlen) {
    const int mode = o->mode;
    *out = NULL;
    df_model *m = df_xcalloc(1, sizeof *m);
    m->dir = df_xstrdup(path);
    int rc = df_gguf_open(path, &m->gguf, err, errlen);
    if (rc) { df_model_free(m); return rc; }
    /* The 1-D tensors (norms, biases) are copied out of the mapping one by one; in a
     * large MoE file they lie between gigabytes of experts, so from a cold disk each is
     * a separate read (~60 on the 30-layer benchmark, ~0.3 s one after another). Ask
     * for all of them at once. */
    for (int i = 0; i < df_gguf_n_tensors(m->gguf); i++) {
        const df_gguf_tensor *t = df_gguf_tensor_at(m->gguf, i);
        if (t->n_dims != 1 || !t->nbytes || !t->data) continue;
        uintptr_t a = (uintptr_t)t->data & ~(uintptr_t)4095, e = (uintptr_t)t->data + t->nbytes;
        madvise((void *)a, e - a, MADV_WILLNEED);
    }
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
    else if (!strcmp(arch, "deepseek2")) cfg->family = DF_FAM_DEEPSEEK_V3, cfg->family_name = "deepseek_v3";
    else {
        df_err(err, errlen, DF_EUNSUPPORTED, "%s: general.architecture \"%s\" is not supported for GGUF yet (supported: llama, qwen3, qwen3moe, deepseek2)", path, arch);
        df_model_free(m);
        return DF_EUNSUPPORTED;
    }
    const int mla = cfg->family == DF_FAM_DEEPSEEK_V3;
    int n_blocks = kv_int_in(&c, arch, "block_count", 0, 1, 1, DF_MAX_LAYERS - 1 + DF_MAX_MTP_LAYERS);
    /* trailing NextN/MTP blocks, when a file carries them, are not used */
    cfg->n_mtp_layers = kv_int_in(&c, arch, "nextn_predict_layers", 0, 0, 0, DF_MAX_MTP_LAYERS);
    cfg->n_layers = n_blocks - cfg->n_mtp_layers;
    cfg->hidden = kv_int_in(&c, arch, "embedding_length", 0, 1, 1, DF_MAX_HIDDEN);
    cfg->intermediate = kv_int_in(&c, arch, "feed_forward_length", 0, 0, 0, DF_MAX_FFN);
    cfg->n_heads = kv_int_in(&c, arch, "attention.head_count", 0, 1, 1, DF_MAX_HEADS);
    cfg->n_kv_heads = kv_int_in(&c, arch, "attention.head_count_kv", cfg->n_heads, 0, 1, DF_MAX_HEADS);
    /* the session context is an int: a larger value would wrap (to 0 for 2^40) */
    cfg->max_pos = kv_int_in(&c, arch, "context_length", 4096, 0, 1, INT32_MAX);
    cfg->rms_eps = kv_real(&c, arch, "attention.layer_norm_rms_epsilon", 1e-6, NULL, DF_MIN_RMS_EPS, 0, 1, 1);
    /* inv_freq = base^(-2i/d) lies in [1/base, 1] only for base >= 1, and YaRN divides by log(base) */
    cfg->rope_theta = kv_real(&c, arch, "rope.freq_base", 10000.0, NULL, 1, 1, FLT_MAX, 0);
    if (c.rc) goto fail;
    if (cfg->n_layers <= 0 || cfg->n_layers >= DF_MAX_LAYERS) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: metadata keys '%s.block_count' %d - '%s.nextn_predict_layers' %d: expected 1..%d layers, got %d", path, arch, n_blocks,
                      arch, cfg->n_mtp_layers, DF_MAX_LAYERS - 1, cfg->n_layers);
        goto fail;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: metadata key '%s.attention.head_count_kv': expected a divisor of head_count (%d), got %d", path, arch, cfg->n_heads, cfg->n_kv_heads);
        goto fail;
    }
    if (mla) {
        if (deepseek2_config(&c, arch)) goto fail;
    } else {
        cfg->head_dim = kv_int_in(&c, arch, "attention.key_length", cfg->hidden / cfg->n_heads, 0, 1, DF_MAX_HEAD_DIM);
        cfg->rope_dim = kv_int_in(&c, arch, "rope.dimension_count", cfg->head_dim, 0, 1, DF_MAX_HEAD_DIM);
        if (c.rc) goto fail;
        if (cfg->head_dim <= 0 || cfg->head_dim % 2) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: head dim %d must be positive and even", path, cfg->head_dim);
            goto fail;
        }
        if (cfg->rope_dim != cfg->head_dim) {
            c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: partial rotary embedding (rope.dimension_count %d of head dim %d) is not supported", path, cfg->rope_dim, cfg->head_dim);
            goto fail;
        }
    }
    if (rope_scaling(&c, arch)) goto fail;
    const df_gguf_tensor *emb = gt(&c, "token_embd.weight", 1);
    if (!emb) goto fail;
    if (emb->ne[1] < 1 || emb->ne[1] > DF_MAX_VOCAB) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor 'token_embd.weight': expected 1..%d rows (the vocabulary), got %lld", path, DF_MAX_VOCAB, (long long)emb->ne[1]);
        goto fail;
    }
    cfg->vocab = (int)emb->ne[1];
    if (cfg->family == DF_FAM_QWEN3_MOE) {
        cfg->n_experts = kv_int_in(&c, arch, "expert_count", 0, 1, 1, DF_MAX_EXPERTS);
        cfg->n_experts_used = kv_int_in(&c, arch, "expert_used_count", 0, 1, 1, c.rc ? 1 : cfg->n_experts);
        cfg->moe_intermediate = kv_int_in(&c, arch, "expert_feed_forward_length", 0, 1, 1, DF_MAX_FFN);
        cfg->decoder_sparse_step = 1;
        /* llama.cpp always normalises qwen3moe's top-k weights; the key may say otherwise */
        cfg->norm_topk_prob = kv_bool(&c, arch, "expert_weights_norm", 1);
        if (c.rc) goto fail;
        if (cfg->n_experts <= 0 || cfg->n_experts_used <= 0 || cfg->n_experts_used > cfg->n_experts || cfg->moe_intermediate <= 0) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: expert_count %d / expert_used_count %d / expert_feed_forward_length %d are inconsistent", path, cfg->n_experts,
                          cfg->n_experts_used, cfg->moe_intermediate);
            goto fail;
        }
    }
    {
        /* special token ids: in the vocabulary (an out-of-range id would be truncated to int) */
        static const char *const keys[3] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
        int id[3];
        for (int k = 0; k < 3; k++) {
            int64_t v;
            int r = df_gguf_get_i64(m->gguf, keys[k], &v, err, errlen);
            if (r < 0) { c.rc = r; goto fail; }
            if (r == 1 && (v < 0 || v >= cfg->vocab)) {
                c.rc = df_err(err, errlen, DF_EFORMAT, "%s: metadata key '%s': expected 0..%d (the vocabulary), got %lld", path, keys[k], cfg->vocab - 1, (long long)v);
                goto fail;
            }
            id[k] = r == 1 ? (int)v : -1;
        }
        cfg->bos_id = id[0];
        if (id[1] >= 0) cfg->eos[cfg->n_eos++] = id[1];
        if (id[2] >= 0 && (cfg->n_eos == 0 || cfg->eos[0] != id[2])) cfg->eos[cfg->n_eos++] = id[2];
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
        int moe = mla ? cfg->n_experts > 0 && l >= cfg->first_k_dense
                      : cfg->family == DF_FAM_QWEN3_MOE && df_gguf_tensor_find(m->gguf, N("ffn_gate_inp.weight"));
        if (df_family_layer_kind(cfg, l, moe, &L->kind)) {
            c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: layer %d: family %s has no such layer", path, l, cfg->family_name);
            break;
        }
        L->attn_norm = vecf(&c, N("attn_norm.weight"), H, 1);
        L->ffn_norm = vecf(&c, N("ffn_norm.weight"), H, 1);
        if (mla) {
            mla_layer(&c, l, L);
        } else {
            mat(&c, N("attn_q.weight"), qd, H, -1, 0, &L->w.wq, 1);
            mat(&c, N("attn_k.weight"), kd, H, -1, 0, &L->w.wk, 1);
            mat(&c, N("attn_v.weight"), kd, H, -1, 0, &L->w.wv, 1);
            mat(&c, N("attn_output.weight"), H, qd, -1, 0, &L->w.wo, 1);
            L->bq = vecf(&c, N("attn_q.bias"), qd, 0);
            L->bk = vecf(&c, N("attn_k.bias"), kd, 0);
            L->bv = vecf(&c, N("attn_v.bias"), kd, 0);
            L->bo = vecf(&c, N("attn_output.bias"), H, 0);
            if (L->kind.qk_norm) {
                L->q_norm = vecf(&c, N("attn_q_norm.weight"), cfg->head_dim, 1);
                L->k_norm = vecf(&c, N("attn_k_norm.weight"), cfg->head_dim, 1);
            }
        }
        if (L->kind.ffn != DF_FFN_MOE) {
            if (cfg->intermediate <= 0 && !c.rc)
                c.rc = df_err(err, errlen, DF_EFORMAT, "%s: layer %d has a dense FFN but '%s.feed_forward_length' is missing", path, l, arch);
            ffn_dense(&c, l, "", cfg->intermediate, &L->w.mlp);
        } else {
            mat(&c, N("ffn_gate_inp.weight"), cfg->n_experts, H, -1, 0, &L->w.router, 1);
            if (mla) {
                L->router_bias = vecf(&c, N("exp_probs_b.bias"), cfg->n_experts, 0);
                if (!c.rc && !L->router_bias) L->router_bias = df_xcalloc((size_t)cfg->n_experts, sizeof(float)); /* no correction bias */
            }
            load_experts(&c, l, L);
            if (mla && cfg->n_shared_experts) {
                L->has_shared = 1;
                ffn_dense(&c, l, "_shexp", (int64_t)cfg->moe_intermediate * cfg->n_shared_experts, &L->w.shared);
            }
        }
#undef N
    }
    if (c.rc) goto fail;
    /* Every block's tensors belong to a block the metadata declares: a block_count one short
     * would otherwise run the model without its last layer. */
    for (int i = 0; i < df_gguf_n_tensors(m->gguf); i++) {
        const char *tn = df_gguf_tensor_at(m->gguf, i)->name;
        if (strncmp(tn, "blk.", 4)) continue;
        char *end;
        long b = strtol(tn + 4, &end, 10);
        if (end != tn + 4 && *end == '.' && (b < 0 || b >= n_blocks)) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': block %ld is outside the %d blocks of metadata key '%s.block_count' (expected 0..%d)", path, tn, b, n_blocks,
                          arch, n_blocks - 1);
            goto fail;
        }
    }
    m->streamed = mode == 2 && cfg->n_experts;
    if ((c.rc = df_model_finish(m, err, errlen))) goto fail;
    {
        /* llama 3.x stores its rope scaling as per-dimension frequency factors */
        const df_gguf_tensor *rf = df_gguf_tensor_find(m->gguf, "rope_freqs.weight");
        if (rf) {
            float *ff = vecf(&c, "rope_freqs.weight", cfg->rope_dim / 2, 1);
            if (!ff) goto fail;
            /* each divides a frequency: as the rope scaling factor, finite and within its range */
            for (int i = 0; i < cfg->rope_dim / 2 && !c.rc; i++) {
                char label[64];
                snprintf(label, sizeof label, "tensor 'rope_freqs.weight' element %d", i);
                c.rc = df_check_real(path, label, ff[i], DF_MIN_ROPE_FACTOR, 0, DF_MAX_ROPE_FACTOR, 0, err, errlen);
            }
            if (c.rc) { free(ff); goto fail; }
            for (int i = 0; i < cfg->rope_dim / 2; i++) m->inv_freq[i] /= ff[i];
            free(ff);
        }
    }
    if (mode == 2 && cfg->n_experts) {
        /* streaming: experts are read from the GGUF file (or its split parts) by the expert cache */
        m->n_files = df_gguf_n_files(m->gguf);
        m->files = df_xcalloc((size_t)m->n_files, sizeof(char *));
        for (int i = 0; i < m->n_files; i++) m->files[i] = df_xstrdup(df_gguf_path(m->gguf, i));
        if (df_model_own_spine(m, o, err, errlen)) goto fail_own;
    }
    *out = m;
    return 0;
fail:
    df_model_free(m);
    return c.rc ? c.rc : DF_EFORMAT;
fail_own:
    df_model_free(m);
    return DF_EIO;
}
