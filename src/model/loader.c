/* loader.c - builds a df_model from a Hugging Face checkpoint directory.
 * Every tensor the family needs is looked up by its published name and its
 * dtype and shape checked; the error names the file and tensor with the
 * expected and actual values. Weights stay memory-mapped as stored; only
 * small vectors (norm weights, biases, router bias) are copied to f32. */
#include "model/model.h"
#include "model/family.h"
#include "model/loader_int.h"
#include "store/store.h"
#include "format/gguf.h"
#include "backend/cpu/kernels.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

const char *ld_tfile(ld *c, const df_st_tensor *t) { return df_st_file_path(c->m->st, t->file_index); }

static void shape_str(const df_st_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->n_dims && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

const df_st_tensor *ld_need(ld *c, const char *name) {
    if (c->rc) return NULL;
    const df_st_tensor *t = df_st_find(c->m->st, name);
    if (!t) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: missing tensor '%s'", c->m->dir, name);
        return NULL;
    }
    c->used[t - df_st_at(c->m->st, 0)] = 1;
    return t;
}

int ld_check_shape(ld *c, const df_st_tensor *t, int nd, int64_t d0, int64_t d1) {
    if (c->rc) return c->rc;
    int ok = t->n_dims == nd && t->shape[0] == d0 && (nd < 2 || t->shape[1] == d1);
    if (!ok) {
        char got[128];
        shape_str(t, got, sizeof got);
        if (nd == 1) c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected shape [%lld], got %s", ld_tfile(c, t), t->name, (long long)d0, got);
        else c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected shape [%lld, %lld], got %s", ld_tfile(c, t), t->name, (long long)d0, (long long)d1, got);
    }
    return c->rc;
}

static int scale_dtype(ld *c, const df_st_tensor *t, df_scale_dtype *out) {
    switch (t->dtype) {
    case DF_ST_F32: *out = DF_SCALE_F32; return 0;
    case DF_ST_BF16: *out = DF_SCALE_BF16; return 0;
    case DF_ST_F16: *out = DF_SCALE_F16; return 0;
    default:
        return c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': scale dtype %s is not supported (expected F32, BF16 or F16)",
                              ld_tfile(c, t), t->name, df_st_dtype_name(t->dtype));
    }
}

/* MXFP4 (compressed-tensors mxfp4-pack-quantized): prefix.weight_packed U8
 * [rows, cols/2] (tp) + prefix.weight_scale U8 [rows, cols/32] (E8M0). */
static void mxfp4_linear(ld *c, const char *prefix, const df_st_tensor *tp, int64_t rows, int64_t cols, df_weight *w) {
    char name[512];
    if (cols % DF_MXFP4_GROUP) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': MXFP4 needs input columns in groups of %d, got %lld columns", ld_tfile(c, tp), tp->name,
                       DF_MXFP4_GROUP, (long long)cols);
        return;
    }
    if (tp->dtype != DF_ST_U8) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype U8, got %s", ld_tfile(c, tp), tp->name, df_st_dtype_name(tp->dtype));
        return;
    }
    const int64_t rb = df_wfmt_row_bytes(DF_W_MXFP4, cols), ng = cols / DF_MXFP4_GROUP;
    if (ld_check_shape(c, tp, 2, rows, rb)) return;
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    const df_st_tensor *ts = ld_need(c, name);
    if (!ts) return;
    if (ts->dtype != DF_ST_U8) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype U8 (E8M0 scales), got %s", ld_tfile(c, ts), name, df_st_dtype_name(ts->dtype));
        return;
    }
    if (ld_check_shape(c, ts, 2, rows, ng)) return;
    w->fmt = DF_W_MXFP4;
    w->data = tp->data;
    w->row_bytes = (size_t)rb;
    w->scale = ts->data;
    w->scale_dtype = DF_SCALE_E8M0;
    w->blk_r = 1;
    w->blk_c = DF_MXFP4_GROUP;
    w->scale_cols = ng;
}

/* A linear layer "prefix" (e.g. model.layers.0.self_attn.q_proj) of shape [rows x cols]. */
void ld_linear(ld *c, const char *prefix, int64_t rows, int64_t cols, df_weight *w) {
    if (c->rc) return;
    char name[512];
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    const df_config *cfg = &c->m->cfg;
    snprintf(name, sizeof name, "%s.weight_packed", prefix);
    const df_st_tensor *tp = df_st_find(c->m->st, name);
    if (tp) {
        if (cfg->quant != DF_QUANT_INT4_PACK && cfg->quant != DF_QUANT_MXFP4) {
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s' is pack-quantized but config.json has no compressed-tensors quantization_config", ld_tfile(c, tp), name);
            return;
        }
        if (df_config_quant_ignored(cfg, prefix)) {
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': module '%s' is in quantization_config.ignore but is stored pack-quantized", ld_tfile(c, tp), name, prefix);
            return;
        }
        ld_need(c, name);
        if (cfg->quant == DF_QUANT_MXFP4) {
            mxfp4_linear(c, prefix, tp, rows, cols, w);
            return;
        }
        if (tp->dtype != DF_ST_I32) {
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype I32, got %s", ld_tfile(c, tp), name, df_st_dtype_name(tp->dtype));
            return;
        }
        if (ld_check_shape(c, tp, 2, rows, (cols + 7) / 8)) return;
        snprintf(name, sizeof name, "%s.weight_shape", prefix);
        const df_st_tensor *ts = df_st_find(c->m->st, name);
        if (ts) {
            ld_need(c, name);
            int64_t v[2] = {0, 0};
            if (ts->n_dims == 1 && ts->shape[0] == 2 && (ts->dtype == DF_ST_I32 || ts->dtype == DF_ST_I64)) {
                for (int i = 0; i < 2; i++) {
                    if (ts->dtype == DF_ST_I32) { int32_t x; memcpy(&x, ts->data + 4 * i, 4); v[i] = x; }
                    else memcpy(&v[i], ts->data + 8 * i, 8);
                }
            }
            if (v[0] != rows || v[1] != cols) {
                c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected [%lld, %lld], got [%lld, %lld]", ld_tfile(c, ts), name,
                               (long long)rows, (long long)cols, (long long)v[0], (long long)v[1]);
                return;
            }
        }
        snprintf(name, sizeof name, "%s.weight_scale", prefix);
        const df_st_tensor *tsc = ld_need(c, name);
        if (!tsc) return;
        int g = cfg->int4_group;
        if (ld_check_shape(c, tsc, 2, rows, (cols + g - 1) / g) || scale_dtype(c, tsc, &w->scale_dtype)) return;
        w->fmt = DF_W_INT4;
        w->data = tp->data;
        w->row_bytes = (size_t)df_wfmt_row_bytes(DF_W_INT4, cols);
        w->scale = tsc->data;
        w->blk_r = 1;
        w->blk_c = g;
        w->scale_cols = (cols + g - 1) / g;
        return;
    }
    snprintf(name, sizeof name, "%s.weight", prefix);
    const df_st_tensor *t = ld_need(c, name);
    if (!t || ld_check_shape(c, t, 2, rows, cols)) return;
    if ((cfg->quant == DF_QUANT_INT4_PACK || cfg->quant == DF_QUANT_MXFP4) && !df_config_quant_ignored(cfg, prefix) && strstr(prefix, ".experts.")) {
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': module is not in quantization_config.ignore, so '%s.weight_packed' was expected", ld_tfile(c, t), name, prefix);
        return;
    }
    w->data = t->data;
    switch (t->dtype) {
    case DF_ST_F32: w->fmt = DF_W_F32; break;
    case DF_ST_BF16: w->fmt = DF_W_BF16; break;
    case DF_ST_F16: w->fmt = DF_W_F16; break;
    case DF_ST_I8: {
        /* row-int8: only in the spine of a store built with --spine int8 (not exact) */
        if (!c->m->spine_int8) {
            c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: tensor '%s': dtype I8 is only accepted in the spine of a store built with --spine int8",
                           ld_tfile(c, t), name);
            return;
        }
        snprintf(name, sizeof name, "%s.weight_row_scale", prefix);
        const df_st_tensor *ts = ld_need(c, name);
        if (!ts || ld_check_shape(c, ts, 1, rows, 0)) return;
        if (ts->dtype != DF_ST_F32) { c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype F32", ld_tfile(c, ts), name); return; }
        w->fmt = DF_W_I8ROW;
        w->scale = ts->data;
        w->scale_dtype = DF_SCALE_F32;
        w->blk_r = 1;
        w->blk_c = (int)cols;
        w->scale_cols = 1;
        break;
    }
    case DF_ST_F8_E4M3: {
        if (cfg->quant != DF_QUANT_FP8) {
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s' is F8_E4M3 but config.json has no fp8 quantization_config", ld_tfile(c, t), name);
            return;
        }
        snprintf(name, sizeof name, "%s.weight_scale_inv", prefix);
        const df_st_tensor *ts = ld_need(c, name);
        if (!ts) return;
        int br = cfg->fp8_block[0], bc = cfg->fp8_block[1];
        if (ld_check_shape(c, ts, 2, (rows + br - 1) / br, (cols + bc - 1) / bc) || scale_dtype(c, ts, &w->scale_dtype)) return;
        w->fmt = DF_W_FP8;
        w->scale = ts->data;
        w->blk_r = br;
        w->blk_c = bc;
        w->scale_cols = (cols + bc - 1) / bc;
        break;
    }
    default:
        c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: tensor '%s': dtype %s is not supported for weights (expected BF16, F16, F32 or F8_E4M3)",
                       ld_tfile(c, t), name, df_st_dtype_name(t->dtype));
    }
    if (!c->rc) w->row_bytes = (size_t)df_wfmt_row_bytes(w->fmt, cols);
}

/* A 1-D vector copied to f32. */
float *ld_vec(ld *c, const char *name, int64_t n) {
    const df_st_tensor *t = ld_need(c, name);
    if (!t || ld_check_shape(c, t, 1, n, 0)) return NULL;
    float *v = df_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case DF_ST_F32: memcpy(&v[i], t->data + 4 * i, 4); break;
        case DF_ST_BF16: { uint16_t h; memcpy(&h, t->data + 2 * i, 2); v[i] = df_bf16_to_f32(h); break; }
        case DF_ST_F16: { uint16_t h; memcpy(&h, t->data + 2 * i, 2); v[i] = df_f16_to_f32(h); break; }
        default:
            free(v);
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype F32, BF16 or F16, got %s", ld_tfile(c, t), name, df_st_dtype_name(t->dtype));
            return NULL;
        }
    }
    return v;
}
float *ld_vec_opt(ld *c, const char *name, int64_t n) {
    if (c->rc || !df_st_find(c->m->st, name)) return NULL;
    return ld_vec(c, name, n);
}

const char *const ld_hf_glu[3] = {"gate_proj", "up_proj", "down_proj"};

void ld_ffn_named(ld *c, const char *prefix, const char *const names[3], int64_t h, int64_t inter, df_glu *f) {
    char p[512];
    snprintf(p, sizeof p, "%s.%s", prefix, names[0]);
    ld_linear(c, p, inter, h, &f->gate);
    snprintf(p, sizeof p, "%s.%s", prefix, names[1]);
    ld_linear(c, p, inter, h, &f->up);
    snprintf(p, sizeof p, "%s.%s", prefix, names[2]);
    ld_linear(c, p, h, inter, &f->down);
}
static void ffn(ld *c, const char *prefix, int64_t inter, df_glu *f) { ld_ffn_named(c, prefix, ld_hf_glu, c->m->cfg.hidden, inter, f); }

/* Records where an expert's bytes are (for streaming): each weight's data
 * tensor, then its scale tensor for FP8 / INT4 / MXFP4. */
void ld_expert_extents(ld *c, const char *prefix, const char *const proj[3], df_ffn *f) {
    df_expert_loc *loc = &f->loc;
    if (c->rc) return;
    const df_weight *ws[3] = {&f->gate, &f->up, &f->down};
    char name[1024];
    loc->n_parts = 0;
    for (int w = 0; w < 3; w++) {
        const int packed = ws[w]->fmt == DF_W_INT4 || ws[w]->fmt == DF_W_MXFP4;
        const char *dn = packed ? "weight_packed" : "weight";
        const char *sn = ws[w]->fmt == DF_W_FP8 ? "weight_scale_inv" : packed ? "weight_scale" : NULL;
        for (int k = 0; k < (sn ? 2 : 1); k++) {
            snprintf(name, sizeof name, "%s.%s.%s", prefix, proj[w], k ? sn : dn);
            const df_st_tensor *t = df_st_find(c->m->st, name);
            if (!t) { c->rc = df_err(c->err, c->errlen, DF_EINTERNAL, "%s: tensor '%s' vanished", c->m->dir, name); return; }
            loc->part[loc->n_parts++] = (df_extent){t->file_index, t->file_offset, t->nbytes};
        }
    }
}

/* Streaming: the spine (everything but routed experts) moves into memory
 * the engine owns. Its bytes are read straight from the weight files with
 * O_DIRECT into one huge-page arena (df_read_extents): each byte lands in RAM
 * once (no page-cache copy) and is touched through 2 MiB pages, which matters
 * where first touches are expensive (a VM backs fresh memory at ~1 GB/s).
 * Tensors that share a 4 KiB page are read as one run; bytes that are not in
 * a file mapping (rebuilt or converted tensors) are copied. Routed experts
 * keep only their extents. */
typedef struct {
    const uint8_t **pp; /* the weight field to repoint */
    size_t nb;
    int file;           /* -1: not in a file mapping, copied */
    uint64_t off;
    int run;
    uint64_t pos;       /* byte position in the arena */
} spine_item;

static int item_cmp(const void *a, const void *b) {
    const spine_item *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void add_item(spine_item **it, int *n, int *cap, const uint8_t **pp, size_t nb) {
    if (!*pp || !nb) return;
    for (int i = 0; i < *n; i++)
        if ((*it)[i].pp == pp) return;
    if (*n == *cap) *cap = *cap ? 2 * *cap : 256, *it = df_xrealloc(*it, (size_t)*cap * sizeof **it);
    (*it)[(*n)++] = (spine_item){pp, nb, -1, 0, -1, 0};
}

typedef struct {
    spine_item *it;
    int n, cap;
} spine_list;

static void add_weight(void *p, df_weight *w) {
    spine_list *sl = p;
    add_item(&sl->it, &sl->n, &sl->cap, (const uint8_t **)&w->data, (size_t)w->rows * w->row_bytes);
    if (w->scale) add_item(&sl->it, &sl->n, &sl->cap, (const uint8_t **)&w->scale, (size_t)df_weight_scale_bytes(w));
}

#define PG 4096u
static uint64_t pg_down(uint64_t x) { return x & ~(uint64_t)(PG - 1); }
static uint64_t pg_up(uint64_t x) { return (x + PG - 1) & ~(uint64_t)(PG - 1); }

/* A store's spine: every tensor of spine.safetensors is checked against the
 * manifest's xxh3 once the spine has been read, from the arena where it was
 * read to (no extra I/O: xxh3 runs at memory speed, on several threads), else
 * from its mapping (tensors not read into the arena: an untied embedding kept
 * on disk, unused MTP tensors, small vectors converted at load). it[] is
 * sorted by (file, offset) and already points into the arena. */
static int verify_store_spine(df_model *m, const spine_item *it, int n, char *err, size_t errlen) {
    int nt = df_st_count(m->st), k = 0;
    const char **names = df_xmalloc((size_t)(nt ? nt : 1) * sizeof *names);
    const uint8_t **data = df_xmalloc((size_t)(nt ? nt : 1) * sizeof *data);
    uint64_t *sizes = df_xmalloc((size_t)(nt ? nt : 1) * sizeof *sizes);
    for (int i = 0; i < nt; i++) {
        const df_st_tensor *t = df_st_at(m->st, i);
        if (!t->data) continue; /* virtual: a routed expert, checked by the expert cache */
        int lo = 0, hi = n;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (it[mid].file < t->file_index || (it[mid].file == t->file_index && it[mid].off < t->file_offset)) lo = mid + 1;
            else hi = mid;
        }
        const uint8_t *p = t->data;
        if (lo < n && it[lo].file == t->file_index && it[lo].off == t->file_offset && it[lo].nb == t->nbytes) p = *it[lo].pp;
        names[k] = t->name, data[k] = p, sizes[k] = t->nbytes, k++;
    }
    int rc = df_store_spine_verify(m->store_spine, k, names, data, sizes, df_n_cpus(), err, errlen);
    free(names), free(data), free(sizes);
    return rc;
}

int df_model_own_spine(df_model *m, const df_load_opts *o, char *err, size_t errlen) {
    const int tied = m->lm_head.data == m->embed.data;
    spine_list sl = {0};
    df_model_foreach_weight(m, add_weight, &sl);
    spine_item *it = sl.it;
    int n = sl.n;
    /* where each item lives: a mapped weight file, or nowhere (copied) */
    int nf = m->gguf ? df_gguf_n_files(m->gguf) : m->st ? df_st_n_files(m->st) : 0;
    const char **paths = df_xcalloc((size_t)(nf ? nf : 1), sizeof(char *));
    for (int f = 0; f < nf; f++) {
        size_t sz = 0;
        const uint8_t *base = m->gguf ? df_gguf_file_data(m->gguf, f, &sz) : df_st_file_data(m->st, f, &sz);
        paths[f] = m->gguf ? df_gguf_path(m->gguf, f) : df_st_file_path(m->st, f);
        for (int i = 0; i < n && base; i++)
            if (it[i].file < 0 && *it[i].pp >= base && *it[i].pp + it[i].nb <= base + sz)
                it[i].file = f, it[i].off = (uint64_t)(*it[i].pp - base);
    }
    /* An untied embedding stays in its file: a forward pass reads one row per token
     * (df_model_embed_row), so its bytes need neither a read at load nor memory. */
    m->embed_on_disk = 0;
    for (int i = 0; i < n && !tied && !o->resident_embed; i++) {
        if (it[i].pp != (const uint8_t **)&m->embed.data || it[i].file < 0 || m->embed.scale) continue;
        int fd = open(paths[it[i].file], O_RDONLY | O_CLOEXEC);
        if (fd < 0) break;
        m->embed_fd = fd, m->embed_off = it[i].off, m->embed_on_disk = 1;
        it[i] = it[--n];
        break;
    }
    qsort(it, (size_t)n, sizeof *it, item_cmp); /* by file and offset (copied items, file -1, first) */
    /* runs of file items whose 4 KiB-aligned spans touch; each run is one aligned read */
    df_read_req *rq = df_xcalloc((size_t)(n ? n : 1), sizeof *rq);
    int nr = 0;
    for (int i = 0; i < n; i++) {
        if (it[i].file < 0) continue;
        df_read_req *last = nr ? &rq[nr - 1] : NULL;
        if (last && last->file == it[i].file && pg_down(it[i].off) <= last->off + last->len) {
            uint64_t end = pg_up(it[i].off + it[i].nb);
            if (end > last->off + last->len) last->len = end - last->off;
            if (it[i].off + it[i].nb > last->need_end) last->need_end = it[i].off + it[i].nb;
        } else {
            rq[nr++] = (df_read_req){it[i].file, pg_down(it[i].off), pg_up(it[i].off + it[i].nb) - pg_down(it[i].off),
                                     it[i].off + it[i].nb, NULL};
        }
        it[i].run = nr - 1;
    }
    /* arena layout: the runs back to back (4 KiB multiples), then the copied items */
    uint64_t pos = 0;
    uint64_t *run_pos = df_xmalloc((size_t)(nr ? nr : 1) * sizeof *run_pos);
    for (int r = 0; r < nr; r++) run_pos[r] = pos, pos += rq[r].len;
    for (int i = 0; i < n; i++)
        if (it[i].file < 0) it[i].pos = pos, pos += (it[i].nb + 63) & ~(uint64_t)63;
    size_t bytes = (size_t)pg_up(pos);
    size_t map_bytes = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    /* the spine stays resident (it is not streamed): refuse before reading what cannot fit */
    const int over = o->spine_budget > 0 && (int64_t)bytes > o->spine_budget;
    uint8_t *arena = map_bytes && !over ? mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    int rc = 0;
    if (over)
        rc = df_err(err, errlen, DF_ENOMEM, "%s: the resident weights (everything but the routed experts) need %.1f MB, more than the memory budget of %.1f MB (--ram); "
                    "they are kept in memory, only routed experts stream from disk", m->dir, bytes / 1e6, o->spine_budget / 1e6);
    if (arena == MAP_FAILED) {
        rc = df_err(err, errlen, DF_ENOMEM, "cannot allocate %zu bytes for the resident weights", bytes);
        arena = NULL;
    }
    if (!rc && arena) {
        madvise(arena, map_bytes, MADV_HUGEPAGE);
        for (int r = 0; r < nr; r++) rq[r].dst = arena + run_pos[r];
        /* fault the arena in ahead of the reads, in the order they are issued, from several threads */
        double t0 = df_now();
        df_prefault *pf = o->populate ? df_prefault_start(arena, bytes, 8) : NULL;
        rc = df_read_extents(paths, nf, rq, nr, "resident weights", pf, err, errlen);
        df_prefault_finish(pf);
        m->spine_load_s = df_now() - t0;
        m->spine_load_bytes = (int64_t)bytes;
    }
    if (!rc) {
        for (int i = 0; i < n; i++) {
            uint8_t *dst = it[i].file < 0 ? arena + it[i].pos : rq[it[i].run].dst + (it[i].off - rq[it[i].run].off);
            if (it[i].file < 0) memcpy(dst, *it[i].pp, it[i].nb);
            *it[i].pp = dst;
        }
        if (tied) m->lm_head = m->embed;
        if (m->embed_on_disk) m->embed.data = NULL;
        if (m->store_spine) rc = verify_store_spine(m, it, n, err, errlen);
        m->spine_arena = arena;
        m->spine_arena_bytes = map_bytes;
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (m->layers[l].kind.ffn == DF_FFN_MOE)
                for (int e = 0; e < m->cfg.n_experts; e++) {
                    df_ffn *f = &m->layers[l].experts[e];
                    f->gate.data = f->up.data = f->down.data = NULL;
                    f->gate.scale = f->up.scale = f->down.scale = NULL;
                }
    } else if (arena) {
        munmap(arena, map_bytes);
    }
    free(it), free(rq), free(paths), free(run_pos);
    return rc;
}
#undef PG

int df_model_embed_row(const df_model *m, int32_t tok, float *out, char *err, size_t errlen) {
    if (!m->embed_on_disk) {
        df_dequant_row(&m->embed, tok, out);
        return 0;
    }
    const size_t rb = m->embed.row_bytes;
    uint8_t stack[1 << 16], *buf = rb <= sizeof stack ? stack : df_xmalloc(rb);
    const uint64_t off = m->embed_off + (uint64_t)tok * rb;
    size_t got = 0;
    while (got < rb) {
        ssize_t r = pread(m->embed_fd, buf + got, rb - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            if (buf != stack) free(buf);
            return df_err(err, errlen, DF_EIO, "embedding row of token %d: read of %zu bytes at %llu failed: %s", tok, rb,
                          (unsigned long long)off, r < 0 ? strerror(e) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    df_weight w = m->embed;
    w.data = buf;
    df_dequant_row(&w, 0, out);
    if (buf != stack) free(buf);
    return 0;
}

static int64_t wparams(const df_weight *w) { return w->rows * w->cols; }
static int64_t ffn_params(const df_ffn *f) { return wparams(&f->gate) + wparams(&f->up) + wparams(&f->down); }
static int64_t ffn_bytes(const df_ffn *f) { return df_weight_bytes(&f->gate) + df_weight_bytes(&f->up) + df_weight_bytes(&f->down); }

static void setup_rope(df_model *m) {
    const df_config *c = &m->cfg;
    int d = c->rope_dim, half = d / 2;
    m->inv_freq = df_xmalloc((size_t)half * sizeof(float));
    m->rope_scale = 1.0f;
    for (int i = 0; i < half; i++) {
        /* as transformers: base ** (arange(0, d, 2) / d) in float32 */
        float expo = (float)(2 * i) / (float)d;
        float pf = (float)pow(c->rope_theta, expo);
        float inv = 1.0f / pf;
        switch (c->rope_type) {
        case DF_ROPE_DEFAULT: break;
        case DF_ROPE_LINEAR: inv = inv / (float)c->rope_factor; break;
        case DF_ROPE_LLAMA3: {
            double lw = c->orig_max_pos / c->low_freq_factor, hw = c->orig_max_pos / c->high_freq_factor;
            double wl = 2 * M_PI / inv;
            if (wl > lw) inv = inv / (float)c->rope_factor;
            else if (!(wl < hw)) {
                double sm = (c->orig_max_pos / wl - c->low_freq_factor) / (c->high_freq_factor - c->low_freq_factor);
                inv = (float)((1 - sm) * inv / c->rope_factor + sm * inv);
            }
            break;
        }
        case DF_ROPE_YARN: {
            double base = c->rope_theta, f = c->rope_factor, omp = c->orig_max_pos;
#define CORR_DIM(rot) ((d * log(omp / ((rot) * 2 * M_PI))) / (2 * log(base)))
            double lo = CORR_DIM(c->beta_fast), hi = CORR_DIM(c->beta_slow);
#undef CORR_DIM
            if (c->rope_truncate) { lo = floor(lo); hi = ceil(hi); }
            if (lo < 0) lo = 0;
            if (hi > d - 1) hi = d - 1;
            if (lo == hi) hi += 0.001;
            float ramp = (float)(((double)i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extra = 1.0f - ramp; /* inv_freq_extrapolation_factor */
            float inter = 1.0f / ((float)f * pf), extr = 1.0f / pf;
            inv = inter * (1 - extra) + extr * extra;
            break;
        }
        }
        m->inv_freq[i] = inv;
    }
    if (c->rope_type == DF_ROPE_YARN) m->rope_scale = (float)c->attention_factor;
}

/* Total and per-token (active) parameters and weight bytes: per token one
 * embedding row, every other spine weight and norm, n_experts_used experts
 * per MoE layer. */
typedef struct { int64_t p, b; } count_acc;
static void count_weight(void *ctx, df_weight *w) {
    count_acc *a = ctx;
    a->p += wparams(w), a->b += df_weight_bytes(w);
}

static void count_params(df_model *m) {
    const df_config *c = &m->cfg;
    const int64_t H = c->hidden;
    count_acc all = {0};
    df_model_foreach_weight(m, count_weight, &all);
    const int tied = m->lm_head.data == m->embed.data;
    /* norms: final + two per layer */
    int64_t norms = H + 2 * H * c->n_layers;
    int64_t p = all.p + norms, b = all.b;
    /* active: the embedding counts one row (and the head in full, tied or not) */
    int64_t pa = p - wparams(&m->embed) + H + (tied ? wparams(&m->lm_head) : 0);
    int64_t ba = b - df_weight_bytes(&m->embed) + (int64_t)m->embed.row_bytes + (tied ? df_weight_bytes(&m->lm_head) : 0);
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        if (L->kind.ffn != DF_FFN_MOE) continue;
        for (int e = 0; e < c->n_experts; e++) p += ffn_params(&L->experts[e]), b += ffn_bytes(&L->experts[e]);
        pa += ffn_params(&L->experts[0]) * c->n_experts_used;
        ba += ffn_bytes(&L->experts[0]) * c->n_experts_used;
    }
    m->n_params = p, m->bytes = b, m->n_params_active = pa, m->bytes_active = ba;
}

int df_model_finish(df_model *m, char *err, size_t errlen) {
    const df_config *cfg = &m->cfg;
    (void)err, (void)errlen;
    count_params(m);
    setup_rope(m);
    int mla = 0;
    for (int l = 0; l < cfg->n_layers; l++) mla |= m->layers[l].kind.mixer == DF_MIXER_MLA;
    if (mla) {
        double s = 1.0 / sqrt((double)(cfg->qk_nope_dim + cfg->qk_rope_dim));
        if (cfg->rope_type != DF_ROPE_DEFAULT && cfg->mscale_all_dim != 0) {
            double ms = cfg->rope_factor <= 1 ? 1.0 : 0.1 * cfg->mscale_all_dim * log(cfg->rope_factor) + 1.0;
            s *= ms * ms;
        }
        m->attn_scale = (float)s;
    } else {
        m->attn_scale = (float)(1.0 / sqrt((double)cfg->head_dim));
    }
    if (!m->streamed) m->resident_src = df_model_resident_source(m);
    return 0;
}

void df_model_free(df_model *m) {
    if (!m) return;
    free(m->mtp.enorm);
    free(m->mtp.hnorm);
    free(m->mtp.head_norm);
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers + (m->mtp.layer != NULL); l++) {
            df_layer *L = &m->layers[l];
            free(L->attn_norm); free(L->ffn_norm); free(L->bq); free(L->bk); free(L->bv); free(L->bo);
            free(L->q_norm); free(L->k_norm); free(L->q_a_norm); free(L->kv_a_norm); free(L->router_bias);
            for (int i = 0; i < 3; i++) free(L->conv[i]);
            free(L->A_log); free(L->dt_bias); free(L->o_norm); free(L->lat_norm);
            for (int i = 0; i < 2; i++) free(L->res_norm[i]), free(L->res_proj[i]);
            free(L->experts);
        }
        free(m->layers);
    }
    free(m->final_norm);
    free(m->out_res_norm);
    free(m->out_res_proj);
    free(m->inv_freq);
    free(m->resident_src);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    if (m->spine_arena) munmap(m->spine_arena, m->spine_arena_bytes);
    if (m->embed_on_disk) close(m->embed_fd);
    for (int i = 0; i < m->n_files; i++) free(m->files[i]);
    free(m->files);
    df_store_spine_free(m->store_spine);
    df_st_close(m->st);
    df_gguf_close(m->gguf);
    df_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

/* ---- tensors of each layer kind, by their Hugging Face names ---------- */
#define P(fmt) (snprintf(p, sizeof p, "%s." fmt, pre), p)

static void load_gqa(ld *c, const char *pre, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden, qd = (int64_t)cfg->n_heads * cfg->head_dim, kd = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    char p[512];
    ld_linear(c, P("self_attn.q_proj"), qd, H, &L->w.wq);
    ld_linear(c, P("self_attn.k_proj"), kd, H, &L->w.wk);
    ld_linear(c, P("self_attn.v_proj"), kd, H, &L->w.wv);
    ld_linear(c, P("self_attn.o_proj"), H, qd, &L->w.wo);
    L->bq = ld_vec_opt(c, P("self_attn.q_proj.bias"), qd);
    L->bk = ld_vec_opt(c, P("self_attn.k_proj.bias"), kd);
    L->bv = ld_vec_opt(c, P("self_attn.v_proj.bias"), kd);
    L->bo = ld_vec_opt(c, P("self_attn.o_proj.bias"), H);
    if (cfg->attention_bias && !c->rc && (!L->bq || !L->bk || !L->bv))
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: attention_bias is true but %s.self_attn.{q,k,v}_proj.bias are missing", c->m->dir, pre);
    if (L->kind.qk_norm) {
        L->q_norm = ld_vec(c, P("self_attn.q_norm.weight"), cfg->head_dim);
        L->k_norm = ld_vec(c, P("self_attn.k_norm.weight"), cfg->head_dim);
    }
}

static void load_mla(ld *c, const char *pre, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden, qk = cfg->qk_nope_dim + cfg->qk_rope_dim, NH = cfg->n_heads;
    char p[512];
    if (cfg->q_lora_rank) {
        ld_linear(c, P("self_attn.q_a_proj"), cfg->q_lora_rank, H, &L->w.q_a);
        L->q_a_norm = ld_vec(c, P("self_attn.q_a_layernorm.weight"), cfg->q_lora_rank);
        ld_linear(c, P("self_attn.q_b_proj"), NH * qk, cfg->q_lora_rank, &L->w.q_b);
    } else {
        ld_linear(c, P("self_attn.q_proj"), NH * qk, H, &L->w.q_proj);
    }
    ld_linear(c, P("self_attn.kv_a_proj_with_mqa"), cfg->kv_lora_rank + cfg->qk_rope_dim, H, &L->w.kv_a);
    L->kv_a_norm = ld_vec(c, P("self_attn.kv_a_layernorm.weight"), cfg->kv_lora_rank);
    ld_linear(c, P("self_attn.kv_b_proj"), NH * (cfg->qk_nope_dim + cfg->v_head_dim), cfg->kv_lora_rank, &L->w.kv_b);
    ld_linear(c, P("self_attn.o_proj"), H, NH * cfg->v_head_dim, &L->w.wo);
}

static void load_moe(ld *c, const char *pre, int l, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden;
    const int E = cfg->n_experts;
    char p[512];
    ld_linear(c, P("mlp.gate"), E, H, &L->w.router);
    if (L->kind.router == DF_ROUTER_SIGMOID_GROUPS) L->router_bias = ld_vec(c, P("mlp.gate.e_score_correction_bias"), E);
    L->experts = df_xcalloc((size_t)E, sizeof(df_ffn));
    for (int e = 0; e < E && !c->rc; e++) {
        char pe[512];
        df_glu g = {0};
        snprintf(pe, sizeof pe, "model.layers.%d.mlp.experts.%d", l, e);
        ffn(c, pe, cfg->moe_intermediate, &g);
        L->experts[e].gate = g.gate, L->experts[e].up = g.up, L->experts[e].down = g.down;
        ld_expert_extents(c, pe, ld_hf_glu, &L->experts[e]);
    }
    if (cfg->n_shared_experts) {
        L->has_shared = 1;
        ffn(c, P("mlp.shared_experts"), (int64_t)cfg->moe_intermediate * cfg->n_shared_experts, &L->w.shared);
    }
}

/* The MTP module of a DeepSeek-V3-style checkpoint (num_nextn_predict_layers
 * >= 1; the first one, layer N = num_hidden_layers): eh_proj, enorm, hnorm,
 * shared_head.{norm,head} (head absent: the main lm_head), embed_tokens
 * (absent: the main embedding) and a full decoder layer of layer N's kind.
 * Only for resident models: a streamed model leaves these tensors unused
 * (its spine arena holds the main layers only). Not loading it is no error:
 * `--spec mtp` then says the model has none. */
static void load_mtp(ld *c) {
    df_model *m = c->m;
    const df_config *cfg = &m->cfg;
    const int N = cfg->n_layers;
    const int64_t H = cfg->hidden;
    char pre[64], p[512];
    snprintf(pre, sizeof pre, "%smodel.layers.%d", cfg->tensor_prefix, N);
    if (cfg->family != DF_FAM_DEEPSEEK_V3 || cfg->n_mtp_layers < 1 || !df_st_find(m->st, P("eh_proj.weight"))) return;
    df_layer *L = &m->layers[N];
    if (df_family_layer_kind(cfg, N, df_config_is_moe_layer(cfg, N), &L->kind)) {
        c->rc = df_err(c->err, c->errlen, DF_EUNSUPPORTED, "%s: MTP layer %d: family %s has no such layer", m->dir, N, cfg->family_name);
        return;
    }
    df_mtp_weights *t = &m->mtp;
    t->layer = L;
    L->attn_norm = ld_vec(c, P("input_layernorm.weight"), H);
    L->ffn_norm = ld_vec(c, P("post_attention_layernorm.weight"), H);
    load_mla(c, pre, L);
    if (L->kind.ffn == DF_FFN_MOE) load_moe(c, pre, N, L);
    else ffn(c, P("mlp"), cfg->intermediate, &L->w.mlp);
    ld_linear(c, P("eh_proj"), H, 2 * H, &t->eh_proj);
    t->enorm = ld_vec(c, P("enorm.weight"), H);
    t->hnorm = ld_vec(c, P("hnorm.weight"), H);
    t->head_norm = ld_vec(c, P("shared_head.norm.weight"), H);
    t->embed = m->embed, t->head = m->lm_head;
    if (!c->rc && df_st_find(m->st, P("embed_tokens.weight"))) ld_linear(c, P("embed_tokens"), cfg->vocab, H, &t->embed);
    if (!c->rc && df_st_find(m->st, P("shared_head.head.weight"))) ld_linear(c, P("shared_head.head"), cfg->vocab, H, &t->head);
}

int df_model_load(const char *dir, const df_load_opts *o, df_model **out, char *err, size_t errlen) {
    const int resident = o->mode;
    *out = NULL;
    df_model *m = df_xcalloc(1, sizeof *m);
    m->dir = df_xstrdup(dir);
    int rc = df_config_load(dir, &m->cfg, err, errlen);
    if (rc) { df_model_free(m); return rc; }
    m->st = df_st_open_dir2(dir, resident == 1, err, errlen);
    if (!m->st) { df_model_free(m); return DF_EFORMAT; }
    /* a store: routed experts live in its packs (or the source shards), with checksums */
    uint64_t *store_xxh3 = NULL;
    df_store_layout lay;
    char lay_fmt[128];
    df_model_store_layout(&m->cfg, lay_fmt, sizeof lay_fmt, &lay);
    rc = df_store_attach(dir, m->st, &lay, &store_xxh3, &m->spine_int8, &m->store_spine, err, errlen);
    if (rc < 0) { df_model_free(m); return rc; }
    if (rc == 1 && resident != 2) {
        free(store_xxh3);
        df_model_free(m);
        return df_err(err, errlen, DF_EINTERNAL, "%s: a store must be opened in streaming mode", dir);
    }
    m->n_files = df_st_n_files(m->st);
    m->files = df_xcalloc((size_t)m->n_files, sizeof(char *));
    for (int i = 0; i < m->n_files; i++) m->files[i] = df_xstrdup(df_st_file_path(m->st, i));
    const df_config *cfg = &m->cfg;
    ld c = {m, err, errlen, 0, df_xcalloc((size_t)df_st_count(m->st) + 1, 1)};
    const int64_t H = cfg->hidden;
    char p[512];

    const char *tp = cfg->tensor_prefix; /* "language_model." in the K3 wrapper */
    const int kimi = cfg->family == DF_FAM_KIMI_LINEAR;
    snprintf(p, sizeof p, "%smodel.embed_tokens", tp);
    ld_linear(&c, p, cfg->vocab, H, &m->embed);
    snprintf(p, sizeof p, "%smodel.norm.weight", tp);
    m->final_norm = ld_vec(&c, p, H);
    if (!c.rc) {
        snprintf(p, sizeof p, "%slm_head.weight", tp);
        if (cfg->tie_embeddings && !df_st_find(m->st, p)) m->lm_head = m->embed;
        else snprintf(p, sizeof p, "%slm_head", tp), ld_linear(&c, p, cfg->vocab, H, &m->lm_head);
    }
    if (kimi) ld_kimi_model(&c);
    m->layers = df_xcalloc((size_t)cfg->n_layers + 1, sizeof(df_layer)); /* + the MTP layer, when loaded */
    for (int l = 0; l < cfg->n_layers && !c.rc; l++) {
        df_layer *L = &m->layers[l];
        char pre[64];
        snprintf(pre, sizeof pre, "%smodel.layers.%d", tp, l);
        if (df_family_layer_kind(cfg, l, df_config_is_moe_layer(cfg, l), &L->kind)) {
            c.rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: layer %d: family %s has no such layer", dir, l, cfg->family_name);
            break;
        }
        L->attn_norm = ld_vec(&c, P("input_layernorm.weight"), H);
        L->ffn_norm = ld_vec(&c, P("post_attention_layernorm.weight"), H);
        switch (L->kind.mixer) {
        case DF_MIXER_GQA: load_gqa(&c, pre, L); break;
        case DF_MIXER_MLA: load_mla(&c, pre, L); break;
        default: break;
        }
        if (kimi) ld_kimi_layer(&c, pre, l, L);
        else if (L->kind.ffn == DF_FFN_MOE) load_moe(&c, pre, l, L);
        else ffn(&c, P("mlp"), cfg->intermediate, &L->w.mlp);
    }
    if (!c.rc && resident != 2) load_mtp(&c);
    /* every tensor must be used, except MTP layers (index >= n_layers) not loaded above, which are recognised and left unused */
    for (int i = 0; i < df_st_count(m->st) && !c.rc; i++) {
        if (c.used[i]) continue;
        const df_st_tensor *t = df_st_at(m->st, i);
        int layer;
        if (*tp && strncmp(t->name, tp, strlen(tp))) { /* the K3 wrapper's vision tower and projector: not needed for text */
            m->n_ignored_tensors++;
            continue;
        }
        if (sscanf(t->name + strlen(tp), "model.layers.%d.", &layer) == 1 && layer >= cfg->n_layers && layer < cfg->n_layers + (cfg->n_mtp_layers ? cfg->n_mtp_layers : 1)) {
            m->n_ignored_tensors++;
            continue;
        }
        if (strstr(t->name, "rotary_emb.inv_freq")) continue; /* old checkpoints carry this buffer */
        c.rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s' is not used by a %s model with this config (unexpected tensor)",
                      df_st_file_path(m->st, t->file_index), t->name, cfg->model_type);
    }
    free(c.used);
    if (c.rc) { free(store_xxh3); df_model_free(m); return c.rc; }
    m->streamed = resident == 2;
    rc = df_model_finish(m, err, errlen);
    if (rc) { free(store_xxh3); df_model_free(m); return rc; }
    if (resident == 2) {
        rc = df_model_own_spine(m, o, err, errlen);
        if (rc) { free(store_xxh3); df_model_free(m); return rc; }
        df_st_unmap(m->st); /* experts are read through the cache's own descriptors */
    }
    df_store_spine_free(m->store_spine);
    m->store_spine = NULL;
    if (store_xxh3) {
        for (int l = 0; l < cfg->n_layers; l++)
            if (m->layers[l].kind.ffn == DF_FFN_MOE)
                for (int e = 0; e < cfg->n_experts; e++) {
                    m->layers[l].experts[e].loc.xxh3 = store_xxh3[(size_t)l * cfg->n_experts + e];
                    m->layers[l].experts[e].loc.has_xxh3 = 1;
                }
        free(store_xxh3);
    }
    *out = m;
    return 0;
}
#undef P
