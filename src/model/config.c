/* config.c - see config.h. Every missing or wrong field is reported as
 * "<file>: field \"name\": expected ..., got ...". */
#include "model/config.h"
#include "deltafin.h"
#include "util/util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *root;
    const char *file;
    char *err;
    size_t errlen;
    int rc;
} ctx;

/* Integer field: required if def == INT32_MIN. null counts as absent. */
static int get_int_in(ctx *c, json_t *obj, const char *key, int def, int lo, int hi) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        if (def == INT32_MIN && !c->rc)
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing required field \"%s\"", c->file, key);
        return def == INT32_MIN ? 0 : def;
    }
    if (!json_is_integer(v)) {
        if (!c->rc) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s\": expected an integer", c->file, key);
        return 0;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        if (!c->rc)
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s\": expected %d..%d, got %lld", c->file, key, lo, hi, (long long)x);
        return 0;
    }
    return (int)x;
}
static int get_int(ctx *c, const char *key, int def, int lo, int hi) { return get_int_in(c, c->root, key, def, lo, hi); }

static double get_num_in(ctx *c, json_t *obj, const char *key, double def, int required) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        if (required && !c->rc) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing required field \"%s\"", c->file, key);
        return def;
    }
    if (!json_is_number(v)) {
        if (!c->rc) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s\": expected a number", c->file, key);
        return def;
    }
    return json_number_value(v);
}

int df_check_real(const char *file, const char *label, double v, double lo, int lo_open, double hi, int hi_open, char *err, size_t errlen) {
    if (isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi)) return 0;
    char range[96];
    if (isinf(hi)) snprintf(range, sizeof range, "%s %.10g", lo_open ? ">" : ">=", lo);
    else snprintf(range, sizeof range, "in %c%.10g, %.10g%c", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    return df_err(err, errlen, DF_EFORMAT, "%s: %s: expected a finite number %s, got %.10g", file, label, range, v);
}

/* Real field prefix+key (after defaults) checked with df_check_real. */
static void check_num(ctx *c, const char *prefix, const char *key, double v, double lo, int lo_open, double hi, int hi_open) {
    if (c->rc) return;
    char label[128];
    snprintf(label, sizeof label, "field \"%s%s\"", prefix, key);
    c->rc = df_check_real(c->file, label, v, lo, lo_open, hi, hi_open, c->err, c->errlen);
}

static int get_bool(ctx *c, const char *key, int def) {
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) {
        if (!c->rc) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s\": expected true or false", c->file, key);
        return def;
    }
    return json_is_true(v);
}

/* Adds the eos id(s) of v (an integer or an array of them) from file. An id
 * outside 0..vocab_size-1 could never be generated; it is an error rather
 * than truncated to int (a 2^32 + 5 would make token 5 an end token). */
static int add_ids(df_config *cfg, json_t *v, const char *file, const char *key, char *err, size_t errlen) {
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= cfg->vocab)
            return df_err(err, errlen, DF_EFORMAT, "%s: field \"%s\": expected token ids 0..%d (vocab_size - 1), got %lld", file, key, cfg->vocab - 1, (long long)x);
        int id = (int)x;
        for (int i = 0; i < cfg->n_eos; i++) if (cfg->eos[i] == id) return 0;
        if (cfg->n_eos < DF_MAX_EOS) cfg->eos[cfg->n_eos++] = id;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            int rc = add_ids(cfg, x, file, key, err, errlen);
            if (rc) return rc;
        }
    }
    return 0;
}

/* bos_token_id of obj (file): -1 if absent or null, else an id in 0..vocab_size-1. */
static int get_bos(df_config *cfg, json_t *obj, const char *file, int *out, char *err, size_t errlen) {
    json_t *b = json_object_get(obj, "bos_token_id");
    *out = -1;
    if (!json_is_integer(b)) return 0;
    json_int_t x = json_integer_value(b);
    if (x < 0 || x >= cfg->vocab)
        return df_err(err, errlen, DF_EFORMAT, "%s: field \"bos_token_id\": expected 0..%d (vocab_size - 1), got %lld", file, cfg->vocab - 1, (long long)x);
    *out = (int)x;
    return 0;
}

static int parse_rope(ctx *c, df_config *cfg) {
    json_t *rp = json_object_get(c->root, "rope_parameters");
    json_t *rs = json_object_get(c->root, "rope_scaling");
    json_t *p = json_is_object(rp) ? rp : (json_is_object(rs) ? rs : NULL);
    double theta_top = get_num_in(c, c->root, "rope_theta", NAN, 0);
    const int theta_in_p = p && json_is_number(json_object_get(p, "rope_theta"));
    double theta = p ? get_num_in(c, p, "rope_theta", theta_top, 0) : theta_top;
    if (isnan(theta)) theta = 10000.0; /* transformers' default_theta for these families */
    cfg->rope_theta = theta;
    /* inv_freq = theta^(-2i/d) lies in [1/theta, 1] only for theta >= 1, and YaRN divides by log(theta) */
    const char *pp = p == rp ? "rope_parameters." : "rope_scaling.";
    check_num(c, theta_in_p ? pp : "", "rope_theta", theta, 1, 1, FLT_MAX, 0);
    cfg->rope_type = DF_ROPE_DEFAULT;
    cfg->attention_factor = 1.0;
    if (!p) return c->rc;
    json_t *jt = json_object_get(p, "rope_type");
    if (!json_is_string(jt)) jt = json_object_get(p, "type");
    const char *t = json_is_string(jt) ? json_string_value(jt) : "default";
    if (!strcmp(t, "default")) return c->rc;
    cfg->rope_factor = get_num_in(c, p, "factor", 1.0, 1);
    check_num(c, pp, "factor", cfg->rope_factor, DF_MIN_ROPE_FACTOR, 0, DF_MAX_ROPE_FACTOR, 0);
    if (!strcmp(t, "linear")) {
        cfg->rope_type = DF_ROPE_LINEAR;
    } else if (!strcmp(t, "llama3")) {
        cfg->rope_type = DF_ROPE_LLAMA3;
        cfg->low_freq_factor = get_num_in(c, p, "low_freq_factor", 1, 1);
        cfg->high_freq_factor = get_num_in(c, p, "high_freq_factor", 4, 1);
        cfg->orig_max_pos = get_num_in(c, p, "original_max_position_embeddings", 8192, 1);
        check_num(c, pp, "low_freq_factor", cfg->low_freq_factor, 0, 1, INFINITY, 0);
        /* the smoothing between the two wavelengths divides by high - low */
        check_num(c, pp, "high_freq_factor", cfg->high_freq_factor, cfg->low_freq_factor, 1, INFINITY, 0);
        check_num(c, pp, "original_max_position_embeddings", cfg->orig_max_pos, 0, 1, INT32_MAX, 0);
    } else if (!strcmp(t, "yarn")) {
        cfg->rope_type = DF_ROPE_YARN;
        double top_orig = get_num_in(c, c->root, "original_max_position_embeddings", cfg->max_pos, 0);
        const int orig_in_p = json_is_number(json_object_get(p, "original_max_position_embeddings"));
        cfg->orig_max_pos = get_num_in(c, p, "original_max_position_embeddings", top_orig, 0);
        check_num(c, orig_in_p ? pp : "", "original_max_position_embeddings", cfg->orig_max_pos, 0, 1, INT32_MAX, 0);
        cfg->beta_fast = get_num_in(c, p, "beta_fast", 32, 0);
        cfg->beta_slow = get_num_in(c, p, "beta_slow", 1, 0);
        if (cfg->beta_fast == 0) cfg->beta_fast = 32;
        if (cfg->beta_slow == 0) cfg->beta_slow = 1;
        /* the correction range takes log(original_max_position_embeddings / (2 pi beta)) */
        check_num(c, pp, "beta_fast", cfg->beta_fast, 0, 1, INFINITY, 0);
        check_num(c, pp, "beta_slow", cfg->beta_slow, 0, 1, INFINITY, 0);
        cfg->mscale = get_num_in(c, p, "mscale", 0, 0);
        cfg->mscale_all_dim = get_num_in(c, p, "mscale_all_dim", 0, 0);
        /* 0.1 * mscale * log(factor) + 1 must stay positive: it divides, and is squared into the softmax scale */
        check_num(c, pp, "mscale", cfg->mscale, 0, 0, DF_MAX_MSCALE, 0);
        check_num(c, pp, "mscale_all_dim", cfg->mscale_all_dim, 0, 0, DF_MAX_MSCALE, 0);
        json_t *tr = json_object_get(p, "truncate");
        cfg->rope_truncate = json_is_boolean(tr) ? json_is_true(tr) : 1;
        double af = get_num_in(c, p, "attention_factor", NAN, 0);
        double f = cfg->rope_factor;
#define GET_MSCALE(s, m) ((s) <= 1 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
        if (!isnan(af)) {
            check_num(c, pp, "attention_factor", af, 0, 1, DF_MAX_MSCALE, 0);
            cfg->attention_factor = af;
        } else if (cfg->mscale != 0 && cfg->mscale_all_dim != 0)
            cfg->attention_factor = GET_MSCALE(f, cfg->mscale) / GET_MSCALE(f, cfg->mscale_all_dim);
        else cfg->attention_factor = GET_MSCALE(f, 1.0);
#undef GET_MSCALE
    } else {
        return c->rc ? c->rc : (c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: rope type \"%s\" is not supported (supported: default, linear, llama3, yarn)", c->file, t));
    }
    return c->rc;
}

/* A text of a compressed-tensors quantization_config: absent/null is allowed
 * when may_absent; otherwise it must equal want. Names the field, expected vs actual. */
static int ct_expect_str(ctx *c, json_t *obj, const char *field, const char *key, const char *want, int may_absent) {
    json_t *v = json_object_get(obj, key);
    if ((!v || json_is_null(v)) && may_absent) return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), want)) return 0;
    return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"%s.%s\": expected \"%s\", got %s%s%s", c->file, field, key, want,
                          json_is_string(v) ? "\"" : "", json_is_string(v) ? json_string_value(v) : !v ? "(missing)" : "a non-string",
                          json_is_string(v) ? "\"" : "");
}
static int ct_expect_bool(ctx *c, json_t *obj, const char *field, const char *key, int want) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || (json_is_boolean(v) && json_is_true(v) == want)) return 0;
    return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"%s.%s\": expected %s, got %s", c->file, field, key, want ? "true" : "false",
                          json_is_boolean(v) ? (json_is_true(v) ? "true" : "false") : "a non-boolean");
}
static int ct_expect_int(ctx *c, json_t *obj, const char *field, const char *key, int want) {
    json_t *v = json_object_get(obj, key);
    if (json_is_integer(v) && json_integer_value(v) == want) return 0;
    char got[32];
    if (json_is_integer(v)) snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
    else snprintf(got, sizeof got, "%s", !v ? "(missing)" : "a non-integer");
    return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"%s.%s\": expected %d, got %s", c->file, field, key, want, got);
}

/* compressed-tensors "mxfp4-pack-quantized", as Kimi K3 publishes it: one
 * config group whose weights are num_bits 4, type "float", strategy "group",
 * group_size 32, symmetric, scale_dtype "torch.uint8" (E8M0), not dynamic; no
 * activation quantization. Anything else is refused naming the field. */
static int parse_mxfp4_group(ctx *c, const char *gk, json_t *g) {
    char f[256];
    snprintf(f, sizeof f, "quantization_config.config_groups.%s", gk);
    if (!json_is_object(g)) return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s\": expected an object", c->file, f);
    if (ct_expect_str(c, g, f, "format", "mxfp4-pack-quantized", 1)) return c->rc;
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "output_activations" : "input_activations";
        json_t *a = json_object_get(g, key);
        if (a && !json_is_null(a))
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"%s.%s\": expected null (activation quantization is not supported), got an object", c->file, f, key);
    }
    json_t *w = json_object_get(g, "weights");
    if (!json_is_object(w)) return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s.weights\": expected an object", c->file, f);
    snprintf(f + strlen(f), sizeof f - strlen(f), ".weights");
    if (ct_expect_int(c, w, f, "num_bits", 4) || ct_expect_str(c, w, f, "type", "float", 0) || ct_expect_str(c, w, f, "strategy", "group", 0) ||
        ct_expect_int(c, w, f, "group_size", 32) || ct_expect_bool(c, w, f, "symmetric", 1) ||
        ct_expect_str(c, w, f, "scale_dtype", "torch.uint8", 1) || ct_expect_bool(c, w, f, "dynamic", 0))
        return c->rc;
    return 0;
}

static int parse_quant(ctx *c, df_config *cfg) {
    json_t *q = json_object_get(c->root, "quantization_config");
    if (!q || json_is_null(q)) { /* Kimi K3 keeps it in text_config */
        json_t *tc = json_object_get(c->root, "text_config");
        q = json_is_object(tc) ? json_object_get(tc, "quantization_config") : NULL;
    }
    if (!q || json_is_null(q)) return 0;
    json_t *m = json_object_get(q, "quant_method");
    const char *method = json_is_string(m) ? json_string_value(m) : "(missing)";
    if (!strcmp(method, "fp8")) {
        json_t *fmt = json_object_get(q, "fmt");
        if (json_is_string(fmt) && strcmp(json_string_value(fmt), "e4m3"))
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: quantization_config.fmt \"%s\" is not supported (expected \"e4m3\")", c->file, json_string_value(fmt));
        json_t *bs = json_object_get(q, "weight_block_size");
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) || !json_is_integer(json_array_get(bs, 1)))
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: quantization_config.weight_block_size: expected [rows, cols] of positive integers (per-tensor FP8 scales are not supported)", c->file);
        for (int i = 0; i < 2; i++) {
            json_int_t b = json_integer_value(json_array_get(bs, (size_t)i));
            if (b < 1 || b > DF_MAX_QUANT_BLOCK)
                return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"quantization_config.weight_block_size[%d]\": expected 1..%d, got %lld", c->file, i,
                                      DF_MAX_QUANT_BLOCK, (long long)b);
        }
        cfg->quant = DF_QUANT_FP8;
        cfg->fp8_block[0] = (int)json_integer_value(json_array_get(bs, 0));
        cfg->fp8_block[1] = (int)json_integer_value(json_array_get(bs, 1));
    } else if (!strcmp(method, "compressed-tensors")) {
        json_t *fmt = json_object_get(q, "format");
        const int mx = json_is_string(fmt) && !strcmp(json_string_value(fmt), "mxfp4-pack-quantized");
        if (!mx && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "pack-quantized")))
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: quantization_config.format %s is not supported (expected \"pack-quantized\" or \"mxfp4-pack-quantized\")", c->file, json_is_string(fmt) ? json_string_value(fmt) : "(missing)");
        json_t *groups = json_object_get(q, "config_groups");
        if (!json_is_object(groups) || json_object_size(groups) != 1)
            return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: quantization_config.config_groups: expected exactly one group", c->file);
        const char *gk;
        json_t *g;
        json_object_foreach(groups, gk, g) {
            if (mx) {
                if (parse_mxfp4_group(c, gk, g)) return c->rc;
                continue;
            }
            json_t *w = json_object_get(g, "weights");
            int bits = get_int_in(c, w, "num_bits", INT32_MIN, 1, 64);
            json_t *ty = json_object_get(w, "type"), *st = json_object_get(w, "strategy"), *sym = json_object_get(w, "symmetric");
            if (c->rc) return c->rc;
            if (bits != 4 || !json_is_string(ty) || strcmp(json_string_value(ty), "int") || !json_is_string(st) ||
                strcmp(json_string_value(st), "group"))
                return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: config_groups.%s.weights: only num_bits 4, type \"int\", strategy \"group\" is supported", c->file, gk);
            cfg->int4_group = get_int_in(c, w, "group_size", INT32_MIN, 1, DF_MAX_QUANT_BLOCK);
            if (c->rc) return c->rc;
            cfg->int4_symmetric = !json_is_false(sym);
            if (!cfg->int4_symmetric)
                return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: config_groups.%s.weights.symmetric false (zero points) is not supported", c->file, gk);
            json_t *ia = json_object_get(g, "input_activations");
            if (ia && !json_is_null(ia))
                return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: config_groups.%s.input_activations: activation quantization is not supported", c->file, gk);
        }
        cfg->quant = mx ? DF_QUANT_MXFP4 : DF_QUANT_INT4_PACK;
        json_t *ig = json_object_get(q, "ignore");
        if (json_is_array(ig)) {
            cfg->quant_ignore = df_xcalloc(json_array_size(ig) + 1, sizeof(char *));
            size_t i;
            json_t *x;
            json_array_foreach(ig, i, x) {
                if (!json_is_string(x)) return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: quantization_config.ignore[%zu]: expected a string", c->file, i);
                const char *s = json_string_value(x);
                if (!strncmp(s, "re:", 3)) { /* validate the regex now */
                    int ec;
                    PCRE2_SIZE eo;
                    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(s + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_UTF, &ec, &eo, NULL);
                    if (!re) return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: quantization_config.ignore[%zu]: bad regex \"%s\" at offset %zu", c->file, i, s + 3, (size_t)eo);
                    pcre2_code_free(re);
                }
                cfg->quant_ignore[cfg->n_quant_ignore++] = df_xstrdup(s);
            }
        }
    } else {
        return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: quantization_config.quant_method \"%s\" is not supported (supported: fp8 with weight_block_size, compressed-tensors pack-quantized int4 or mxfp4-pack-quantized)", c->file, method);
    }
    return 0;
}

/* A 1-based list of layer numbers (linear_attn_config.<key>) into mark[] (1 for each listed layer). */
static int layer_list(ctx *c, json_t *la, const char *key, int n_layers, uint8_t *mark) {
    json_t *a = json_object_get(la, key);
    if (!json_is_array(a))
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"linear_attn_config.%s\": expected an array of 1-based layer numbers", c->file, key);
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > n_layers)
            return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"linear_attn_config.%s[%zu]\": expected a layer number 1..%d (1-based)", c->file, key, i, n_layers);
        if (mark[json_integer_value(x) - 1])
            return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"linear_attn_config.%s[%zu]\": layer %lld is listed twice", c->file, key, i, (long long)json_integer_value(x));
        mark[json_integer_value(x) - 1] = 1;
    }
    return 0;
}

static int get_bool_in(ctx *c, json_t *obj, const char *prefix, const char *key, int def) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) {
        if (!c->rc) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"%s%s\": expected true or false", c->file, prefix, key);
        return def;
    }
    return json_is_true(v);
}

/* Kimi Linear / Kimi K3 text config (Moonshot's KimiLinearConfig names): MLA
 * without RoPE (+ output gate), KDA layers listed 1-based in linear_attn_config,
 * MoE with a sigmoid router + correction bias, optional latent MoE, SiTU and
 * block attention residuals. */
static int parse_kimi(ctx *c, df_config *cfg) {
    json_t *r = c->root;
    const int nl = cfg->n_layers;
    int ne = get_int(c, "num_experts", 0, 0, DF_MAX_EXPERTS);
    cfg->n_experts = ne;
    cfg->n_experts_used = get_int(c, "num_experts_per_token", ne ? INT32_MIN : 0, ne ? 1 : 0, DF_MAX_EXPERTS);
    cfg->moe_intermediate = get_int(c, "moe_intermediate_size", ne ? INT32_MIN : 0, ne ? 1 : 0, DF_MAX_FFN);
    cfg->n_shared_experts = get_int(c, "num_shared_experts", 0, 0, DF_MAX_SHARED_EXPERTS);
    cfg->first_k_dense = get_int(c, "first_k_dense_replace", 0, 0, DF_MAX_LAYERS);
    cfg->moe_layer_freq = get_int(c, "moe_layer_freq", 1, 1, DF_MAX_LAYERS);
    cfg->n_group = get_int(c, "num_expert_group", 1, 1, DF_MAX_EXPERTS);
    cfg->topk_group = get_int(c, "topk_group", 1, 1, DF_MAX_EXPERTS);
    cfg->routed_scaling = get_num_in(c, r, "routed_scaling_factor", 1.0, 0);
    check_num(c, "", "routed_scaling_factor", cfg->routed_scaling, 0, 1, DF_MAX_ROUTED_SCALING, 0);
    /* KimiMoEGate renormalises only when top_k > 1 */
    cfg->norm_topk_prob = get_bool(c, "moe_renormalize", 1) && cfg->n_experts_used > 1;
    json_t *fa = json_object_get(r, "moe_router_activation_func");
    if (ne && (!json_is_string(fa) || strcmp(json_string_value(fa), "sigmoid")))
        return c->rc ? c->rc : (c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"moe_router_activation_func\": expected \"sigmoid\", got %s", c->file, json_is_string(fa) ? json_string_value(fa) : "(missing)"));
    cfg->q_lora_rank = get_int(c, "q_lora_rank", 0, 0, DF_MAX_RANK);
    cfg->kv_lora_rank = get_int(c, "kv_lora_rank", INT32_MIN, 1, DF_MAX_RANK);
    cfg->qk_nope_dim = get_int(c, "qk_nope_head_dim", INT32_MIN, 0, DF_MAX_HEAD_DIM);
    cfg->qk_rope_dim = get_int(c, "qk_rope_head_dim", INT32_MIN, 0, DF_MAX_HEAD_DIM);
    cfg->v_head_dim = get_int(c, "v_head_dim", INT32_MIN, 1, DF_MAX_HEAD_DIM);
    cfg->n_mtp_layers = get_int(c, "num_nextn_predict_layers", 0, 0, DF_MAX_MTP_LAYERS);
    cfg->mla_nope = get_bool(c, "mla_use_nope", 0);
    cfg->mla_out_gate = get_bool(c, "mla_use_output_gate", 0);
    if (!c->rc && !cfg->mla_nope)
        return c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: field \"mla_use_nope\": expected true (Moonshot's modeling code has no RoPE path), got false", c->file);
    cfg->rope_dim = 0;
    cfg->latent_dim = get_int(c, "routed_expert_hidden_size", 0, 1, DF_MAX_HIDDEN);
    cfg->latent_norm = get_bool(c, "latent_moe_use_norm", 0);
    cfg->attn_res_block = get_int(c, "attn_res_block_size", 0, 1, DF_MAX_LAYERS);
    json_t *act = json_object_get(r, "hidden_act");
    const char *an = json_is_string(act) ? json_string_value(act) : "silu";
    if (!strcmp(an, "situ")) {
        cfg->act_situ = 1;
        double b = get_num_in(c, r, "activation_situ_beta", 1.0, 0);
        if (b == 0) b = 1.0; /* the modeling code: beta or 1.0 */
        cfg->situ_beta = b;
        cfg->situ_linear_beta = get_num_in(c, r, "activation_situ_linear_beta", 0, 0);
        check_num(c, "", "activation_situ_beta", cfg->situ_beta, 0, 1, 1e30, 0);
        if (cfg->situ_linear_beta != 0) check_num(c, "", "activation_situ_linear_beta", cfg->situ_linear_beta, 0, 1, 1e30, 0);
    } else if (strcmp(an, "silu")) {
        return c->rc ? c->rc : (c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (expected \"silu\" or \"situ\")", c->file, an));
    }
    json_t *la = json_object_get(r, "linear_attn_config");
    if (la && !json_is_null(la)) {
        if (!json_is_object(la)) return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"linear_attn_config\": expected an object", c->file);
        uint8_t full[DF_MAX_LAYERS] = {0};
        if (layer_list(c, la, "kda_layers", nl, cfg->layer_kda) || layer_list(c, la, "full_attn_layers", nl, full)) return c->rc;
        for (int l = 0; l < nl; l++)
            if (full[l] == cfg->layer_kda[l])
                return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: linear_attn_config: layer %d (1-based) must be in exactly one of kda_layers and full_attn_layers, it is in %s",
                                      c->file, l + 1, full[l] ? "both" : "neither");
        cfg->kda_heads = get_int_in(c, la, "num_heads", INT32_MIN, 1, DF_MAX_HEADS);
        cfg->kda_head_dim = get_int_in(c, la, "head_dim", INT32_MIN, 1, 1024);
        cfg->kda_conv = get_int_in(c, la, "short_conv_kernel_size", INT32_MIN, 1, 64);
        cfg->kda_full_rank_gate = get_bool_in(c, la, "linear_attn_config.", "use_full_rank_gate", 0);
        json_t *lb = json_object_get(la, "gate_lower_bound");
        if (lb && !json_is_null(lb)) {
            cfg->kda_has_lower_bound = 1;
            cfg->kda_lower_bound = get_num_in(c, la, "gate_lower_bound", 0, 1);
            check_num(c, "linear_attn_config.", "gate_lower_bound", cfg->kda_lower_bound, -1e4, 0, 0, 1);
        }
    }
    if (c->rc) return c->rc;
    if (ne && cfg->n_experts_used > ne)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"num_experts_per_token\": expected 1..%d (num_experts), got %d", c->file, ne, cfg->n_experts_used);
    if (ne && (ne % cfg->n_group || cfg->topk_group > cfg->n_group || cfg->n_experts_used > cfg->topk_group * (ne / cfg->n_group)))
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: fields \"num_expert_group\" %d / \"topk_group\" %d: expected a divisor of num_experts (%d) and topk_group groups holding at least num_experts_per_token experts",
                              c->file, cfg->n_group, cfg->topk_group, ne);
    if (cfg->n_group > 1 && ne / cfg->n_group < 2)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"num_expert_group\": expected groups of at least 2 experts, got %d groups of %d", c->file, cfg->n_group, ne / cfg->n_group);
    if ((int64_t)cfg->moe_intermediate * (cfg->n_shared_experts > 1 ? cfg->n_shared_experts : 1) > INT32_MAX)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: field \"num_shared_experts\": shared experts x moe_intermediate_size must fit in int", c->file);
    if ((int64_t)cfg->kda_heads * cfg->kda_head_dim > DF_MAX_HIDDEN * 16)
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: linear_attn_config: num_heads x head_dim = %lld is too large", c->file, (long long)cfg->kda_heads * cfg->kda_head_dim);
    return 0;
}

int df_config_quant_ignored(const df_config *cfg, const char *module) {
    for (int i = 0; i < cfg->n_quant_ignore; i++) {
        const char *s = cfg->quant_ignore[i];
        if (!strncmp(s, "re:", 3)) {
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)(s + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_UTF, &ec, &eo, NULL);
            if (!re) continue;
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
            int r = pcre2_match(re, (PCRE2_SPTR)module, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
            pcre2_match_data_free(md);
            pcre2_code_free(re);
            if (r >= 0) return 1;
        } else if (!strcmp(s, module)) {
            return 1;
        }
    }
    return 0;
}

int df_config_is_moe_layer(const df_config *c, int l) {
    switch (c->family) {
    case DF_FAM_QWEN3_MOE:
        return c->n_experts > 0 && !c->mlp_only[l] && (l + 1) % c->decoder_sparse_step == 0;
    case DF_FAM_DEEPSEEK_V3:
        return c->n_experts > 0 && l >= c->first_k_dense;
    case DF_FAM_KIMI_LINEAR:
        return c->n_experts > 0 && l >= c->first_k_dense && l % c->moe_layer_freq == 0;
    default:
        return 0;
    }
}

void df_config_free(df_config *c) {
    for (int i = 0; i < c->n_quant_ignore; i++) free(c->quant_ignore[i]);
    free(c->quant_ignore);
    c->quant_ignore = NULL;
    c->n_quant_ignore = 0;
}

int df_config_load(const char *dir, df_config *cfg, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    char *path = df_path_join(dir, "config.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        int rc = df_file_exists(path) ? df_err(err, errlen, DF_EFORMAT, "%s: not valid JSON: %s (line %d)", path, je.text, je.line)
                                      : df_err(err, errlen, DF_EINPUT, "%s: no config.json in this directory", path);
        free(path);
        return rc;
    }
    ctx c = {root, path, err, errlen, 0};
    json_t *mt = json_object_get(root, "model_type");
    const char *t = json_is_string(mt) ? json_string_value(mt) : NULL;
    if (!t) { c.rc = df_err(err, errlen, DF_EFORMAT, "%s: missing field \"model_type\"", path); goto out; }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", t);
    if (!strcmp(t, "llama")) cfg->family = DF_FAM_LLAMA, cfg->family_name = "llama";
    else if (!strcmp(t, "qwen3")) cfg->family = DF_FAM_QWEN3, cfg->family_name = "qwen3";
    else if (!strcmp(t, "qwen3_moe")) cfg->family = DF_FAM_QWEN3_MOE, cfg->family_name = "qwen3_moe";
    else if (!strcmp(t, "deepseek_v3") || !strcmp(t, "kimi_k2")) cfg->family = DF_FAM_DEEPSEEK_V3, cfg->family_name = "deepseek_v3";
    else if (!strcmp(t, "kimi_linear")) cfg->family = DF_FAM_KIMI_LINEAR, cfg->family_name = "kimi_linear";
    else if (!strcmp(t, "kimi_k3")) {
        /* the multimodal wrapper: the text model's config is text_config, its tensors are under language_model. */
        json_t *tc = json_object_get(root, "text_config");
        json_t *tt = json_is_object(tc) ? json_object_get(tc, "model_type") : NULL;
        if (!json_is_string(tt) || strcmp(json_string_value(tt), "kimi_linear")) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"text_config.model_type\": expected \"kimi_linear\" in a kimi_k3 config, got %s", path,
                          json_is_string(tt) ? json_string_value(tt) : "(missing)");
            goto out;
        }
        cfg->family = DF_FAM_KIMI_LINEAR, cfg->family_name = "kimi_k3";
        snprintf(cfg->tensor_prefix, sizeof cfg->tensor_prefix, "language_model.");
        c.root = tc;
    } else {
        c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: llama, qwen3, qwen3_moe, deepseek_v3, kimi_k2, kimi_linear, kimi_k3)", path, t);
        goto out;
    }
    json_t *act = json_object_get(c.root, "hidden_act");
    if (cfg->family != DF_FAM_KIMI_LINEAR && json_is_string(act) && strcmp(json_string_value(act), "silu")) {
        c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (expected \"silu\")", path, json_string_value(act));
        goto out;
    }
    cfg->vocab = get_int(&c, "vocab_size", INT32_MIN, 1, DF_MAX_VOCAB);
    cfg->hidden = get_int(&c, "hidden_size", INT32_MIN, 1, DF_MAX_HIDDEN);
    cfg->n_layers = get_int(&c, "num_hidden_layers", INT32_MIN, 1, DF_MAX_LAYERS - 1);
    cfg->n_heads = get_int(&c, "num_attention_heads", INT32_MIN, 1, DF_MAX_HEADS);
    cfg->n_kv_heads = get_int(&c, "num_key_value_heads", cfg->n_heads, 1, DF_MAX_HEADS);
    cfg->intermediate = get_int(&c, "intermediate_size", 0, 0, DF_MAX_FFN);
    cfg->max_pos = get_int(&c, "max_position_embeddings", 4096, 1, INT32_MAX);
    cfg->rms_eps = get_num_in(&c, c.root, "rms_norm_eps", 1e-6, 0);
    check_num(&c, "", "rms_norm_eps", cfg->rms_eps, DF_MIN_RMS_EPS, 0, 1, 1);
    cfg->attention_bias = get_bool(&c, "attention_bias", 0);
    cfg->tie_embeddings = get_bool(&c, "tie_word_embeddings", cfg->family == DF_FAM_QWEN3 ? 0 : 0);
    if (c.rc) goto out;
    if (cfg->n_heads % cfg->n_kv_heads) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", path, cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    if (cfg->family != DF_FAM_DEEPSEEK_V3 && cfg->family != DF_FAM_KIMI_LINEAR && cfg->hidden % cfg->n_heads && !json_object_get(c.root, "head_dim")) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and no head_dim is given", path, cfg->hidden, cfg->n_heads);
        goto out;
    }
    cfg->head_dim = get_int(&c, "head_dim", cfg->hidden / cfg->n_heads, 1, DF_MAX_HEAD_DIM);
    cfg->rope_dim = cfg->head_dim;

    if (cfg->family == DF_FAM_QWEN3_MOE) {
        int ne = get_int(&c, "num_experts", 0, 0, DF_MAX_EXPERTS);
        if (!ne) ne = get_int(&c, "num_local_experts", INT32_MIN, 1, DF_MAX_EXPERTS);
        cfg->n_experts = ne;
        cfg->n_experts_used = get_int(&c, "num_experts_per_tok", INT32_MIN, 1, DF_MAX_EXPERTS);
        cfg->moe_intermediate = get_int(&c, "moe_intermediate_size", INT32_MIN, 1, DF_MAX_FFN);
        cfg->norm_topk_prob = get_bool(&c, "norm_topk_prob", 0);
        cfg->decoder_sparse_step = get_int(&c, "decoder_sparse_step", 1, 1, 1 << 16);
        json_t *mo = json_object_get(root, "mlp_only_layers");
        if (json_is_array(mo)) {
            size_t i;
            json_t *x;
            json_array_foreach(mo, i, x) {
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= cfg->n_layers) {
                    c.rc = df_err(err, errlen, DF_EFORMAT, "%s: mlp_only_layers[%zu]: expected a layer index 0..%d", path, i, cfg->n_layers - 1);
                    goto out;
                }
                cfg->mlp_only[json_integer_value(x)] = 1;
            }
        }
    }
    if (cfg->family == DF_FAM_DEEPSEEK_V3) {
        int ne = get_int(&c, "n_routed_experts", 0, 0, DF_MAX_EXPERTS);
        if (!ne) ne = get_int(&c, "num_local_experts", 0, 0, DF_MAX_EXPERTS);
        cfg->n_experts = ne;
        cfg->n_experts_used = get_int(&c, "num_experts_per_tok", ne ? INT32_MIN : 0, ne ? 1 : 0, DF_MAX_EXPERTS);
        cfg->moe_intermediate = get_int(&c, "moe_intermediate_size", ne ? INT32_MIN : 0, ne ? 1 : 0, DF_MAX_FFN);
        cfg->norm_topk_prob = get_bool(&c, "norm_topk_prob", 0);
        cfg->n_shared_experts = get_int(&c, "n_shared_experts", 0, 0, DF_MAX_SHARED_EXPERTS);
        cfg->first_k_dense = get_int(&c, "first_k_dense_replace", 0, 0, DF_MAX_LAYERS);
        cfg->n_group = get_int(&c, "n_group", 1, 1, DF_MAX_EXPERTS);
        cfg->topk_group = get_int(&c, "topk_group", 1, 1, DF_MAX_EXPERTS);
        cfg->routed_scaling = get_num_in(&c, root, "routed_scaling_factor", 1.0, 0);
        check_num(&c, "", "routed_scaling_factor", cfg->routed_scaling, 0, 1, DF_MAX_ROUTED_SCALING, 0);
        cfg->q_lora_rank = get_int(&c, "q_lora_rank", 0, 0, DF_MAX_RANK);
        cfg->kv_lora_rank = get_int(&c, "kv_lora_rank", INT32_MIN, 1, DF_MAX_RANK);
        cfg->qk_nope_dim = get_int(&c, "qk_nope_head_dim", INT32_MIN, 0, DF_MAX_HEAD_DIM);
        cfg->qk_rope_dim = get_int(&c, "qk_rope_head_dim", INT32_MIN, 2, DF_MAX_HEAD_DIM);
        cfg->v_head_dim = get_int(&c, "v_head_dim", INT32_MIN, 1, DF_MAX_HEAD_DIM);
        cfg->n_mtp_layers = get_int(&c, "num_nextn_predict_layers", 0, 0, DF_MAX_MTP_LAYERS);
        cfg->rope_interleave = get_bool(&c, "rope_interleave", 1);
        cfg->rope_dim = cfg->qk_rope_dim;
        json_t *sf = json_object_get(root, "scoring_func");
        if (json_is_string(sf) && strcmp(json_string_value(sf), "sigmoid")) {
            c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: scoring_func \"%s\" is not supported (expected \"sigmoid\")", path, json_string_value(sf));
            goto out;
        }
        json_t *tm = json_object_get(root, "topk_method");
        if (json_is_string(tm) && strcmp(json_string_value(tm), "noaux_tc")) {
            c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported (expected \"noaux_tc\")", path, json_string_value(tm));
            goto out;
        }
        if (c.rc) goto out;
        /* noaux_tc routing: a group scores by the sum of its top 2 experts, topk_group groups are
         * kept, and the num_experts_per_tok experts are chosen among theirs */
        if (ne && ne % cfg->n_group) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"n_group\": expected a divisor of n_routed_experts (%d), got %d", path, ne, cfg->n_group);
            goto out;
        }
        if (ne && ne / cfg->n_group < 2) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"n_group\": expected at most n_routed_experts / 2 = %d (groups of at least 2 experts), got %d", path, ne / 2, cfg->n_group);
            goto out;
        }
        if (ne && cfg->topk_group > cfg->n_group) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"topk_group\": expected 1..%d (n_group), got %d", path, cfg->n_group, cfg->topk_group);
            goto out;
        }
        if (ne && cfg->n_experts_used > cfg->topk_group * (ne / cfg->n_group)) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"num_experts_per_tok\": expected 1..%d (the experts of topk_group %d groups of %d), got %d", path,
                          cfg->topk_group * (ne / cfg->n_group), cfg->topk_group, ne / cfg->n_group, cfg->n_experts_used);
            goto out;
        }
        if ((int64_t)cfg->moe_intermediate * (cfg->n_shared_experts > 1 ? cfg->n_shared_experts : 1) > INT32_MAX) {
            c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"n_shared_experts\": expected at most %d (shared experts x moe_intermediate_size %d must fit in int), got %d", path,
                          (int)(INT32_MAX / cfg->moe_intermediate), cfg->moe_intermediate, cfg->n_shared_experts);
            goto out;
        }
    }
    if (cfg->family == DF_FAM_KIMI_LINEAR && parse_kimi(&c, cfg)) goto out;
    if (c.rc) goto out;
    if (cfg->n_experts && cfg->n_experts_used > cfg->n_experts) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"num_experts_per_tok\": expected 1..%d (the number of experts), got %d", path, cfg->n_experts, cfg->n_experts_used);
        goto out;
    }
    if (cfg->rope_dim % 2) {
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: rotary dimension %d must be even", path, cfg->rope_dim);
        goto out;
    }
    if (cfg->family != DF_FAM_KIMI_LINEAR && parse_rope(&c, cfg)) goto out;
    if (cfg->family == DF_FAM_KIMI_LINEAR) cfg->attention_factor = 1.0;
    {
        /* the K3 wrapper may carry quantization_config at either level */
        json_t *keep = c.root;
        if (!json_object_get(c.root, "quantization_config")) c.root = root;
        int qrc = parse_quant(&c, cfg);
        c.root = keep;
        if (qrc) goto out;
    }

    /* bos / eos: config.json, then generation_config.json */
    if ((c.rc = get_bos(cfg, root, path, &cfg->bos_id, err, errlen)) || (c.rc = add_ids(cfg, json_object_get(root, "eos_token_id"), path, "eos_token_id", err, errlen))) goto out;
    if (c.root != root) { /* the K3 wrapper: text_config may say it too */
        int tb = -1;
        if ((c.rc = get_bos(cfg, c.root, path, &tb, err, errlen)) || (c.rc = add_ids(cfg, json_object_get(c.root, "eos_token_id"), path, "text_config.eos_token_id", err, errlen))) goto out;
        if (cfg->bos_id < 0) cfg->bos_id = tb;
    }
    {
        char *gp = df_path_join(dir, "generation_config.json");
        if (df_file_exists(gp)) {
            json_t *g = json_load_file(gp, 0, &je);
            if (!g) {
                c.rc = df_err(err, errlen, DF_EFORMAT, "%s: not valid JSON: %s (line %d)", gp, je.text, je.line);
            } else {
                int gbos = -1;
                if (!(c.rc = add_ids(cfg, json_object_get(g, "eos_token_id"), gp, "eos_token_id", err, errlen)) && !(c.rc = get_bos(cfg, g, gp, &gbos, err, errlen)) &&
                    cfg->bos_id < 0)
                    cfg->bos_id = gbos;
                json_decref(g);
            }
        }
        free(gp);
    }
out:
    json_decref(root);
    free(path);
    if (c.rc) df_config_free(cfg);
    return c.rc;
}
