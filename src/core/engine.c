/* engine.c - the engine half of deltafin.h: opening a model (directory,
 * GGUF, store, installed name), the one owner of expert residency (the
 * resident source, or the expert cache with its budget, eviction, prefetch
 * and trace), model facts and statistics. Sessions are in session.c,
 * inspect's description in describe.c. */
#include "core/core.h"
#include "core/engine_int.h"
#include "backend/backend.h"
#include "model/model.h"
#include "store/ecache.h"
#include "store/store.h"
#include "hub/hub.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>


void df_options_default(df_options *o) {
    memset(o, 0, sizeof *o);
    o->expert_cache_bytes = -1;
}
void df_sampling_default(df_sampling *s) {
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
}

/* Resolves a model argument: a path, a name installed under $DELTAFIN_HOME/models,
 * or a Hugging Face repo id ORG/NAME[@REV] set up in the hub cache (setup --full / --stream). */
static char *resolve_model(const char *model) {
    struct stat st;
    char buf[4096];
    const char *p = model;
    if (stat(model, &st) != 0 && df_hub_is_repo_id(model)) {
        char herr[512];
        if (!df_hub_model_dir(model, buf, sizeof buf, herr, sizeof herr)) p = buf;
        else fprintf(stderr, "deltafin: %s\n", herr);
    }
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

static df_engine *engine_new(df_model *m, const df_options *o, int64_t budget, char *err, size_t errlen);

/* The expert cache's hook before it rewrites a slot: the backend's copies out of it are done. */
static void host_fence(void) { df_host_fence(); }

/* Creates the expert cache of a streamed model: the engine is the one owner
 * of expert residency (budget, eviction, prefetch, trace); the model only
 * says where each expert is. Its budget is --expert-cache when given (0 =
 * the minimum: one layer's experts), else what the memory budget leaves
 * after the resident spine and a reserve for caches. */
static int start_streaming(df_engine *e, const df_options *o, int64_t budget, char *err, size_t errlen) {
    df_model *m = e->model;
    const df_config *c = &m->cfg;
    const int64_t expert_bytes = df_model_expert_bytes(m);
    int64_t cache = o->expert_cache_bytes;
    /* what the budget must also hold: the resident spine, a session's cache at the
     * default context, and a fixed reserve for code, scratch and the tokenizer */
    int64_t kv = (int64_t)df_state_bytes_per_token(m) * (c->max_pos < 4096 ? c->max_pos : 4096) + (int64_t)df_state_fixed_bytes(m);
    if (cache < 0) cache = budget - (m->bytes - expert_bytes) - kv - ((int64_t)48 << 20);
    df_ecache_opts eo = {.budget = cache > 0 ? cache : 0, .min_slots = c->n_experts_used, .policy = o->evict_lfu ? DF_EVICT_LFU : DF_EVICT_LRU,
                         .use_io_uring = !o->no_io_uring, .populate = !o->no_populate, .fresh_memory = o->fresh_memory,
                         .before_reuse = host_fence};
    df_expert_loc *locs = df_model_expert_locs(m);
    e->ecache = df_ecache_new((const char *const *)m->files, m->n_files, c->n_layers, c->n_experts, locs, &eo, err, errlen);
    free(locs);
    if (!e->ecache) return DF_EIO;
    /* Eviction, chosen by replaying recorded traces (bench/replay_policies.py,
     * docs/PERFORMANCE.md): LFU wins by up to 8 points on some traces and
     * loses by up to 16 on others, LRU's worst loss is 8: LRU has the smaller
     * regret. --evict lfu overrides. */
    /* prefetch needs room for the next layer's experts beside this layer's */
    int pf = o->prefetch;
    int room = df_ecache_slots(e->ecache) >= 2 * c->n_experts_used;
    df_ecache_set_prefetch(e->ecache, pf == 1 && room ? DF_PF_ALWAYS : pf == 2 || !room ? DF_PF_NEVER : DF_PF_AUTO);
    e->prefetch_mode = pf != 2 && room ? pf : 2;
    if (o->trace_path) {
        e->trace = fopen(o->trace_path, "w");
        if (!e->trace) return df_err(err, errlen, DF_EIO, "%s: cannot open the trace file", o->trace_path);
        df_ecache_set_trace(e->ecache, e->trace);
    }
    e->src = df_ecache_source(e->ecache);
    if (df_engine_is_hub_stream(m->dir)) return df_engine_hub_stream(e, err, errlen);
    return 0;
}

df_engine *df_engine_open(const char *model, const df_options *opt, char *err, size_t errlen) {
    df_options o;
    if (opt) o = *opt; else df_options_default(&o);
    if (df_backend_choose(o.backend, err, errlen)) return NULL;
    char *path = resolve_model(model);
    df_backend_init(o.n_threads);
    if (df_file_exists(path)) {
        struct stat fs;
        int64_t total = stat(path, &fs) == 0 ? fs.st_size : 0;
        int64_t budget = o.ram_bytes > 0 ? o.ram_bytes : df_mem_available() - ((int64_t)2 << 30);
        df_load_opts lo = {.mode = o.expert_cache_bytes >= 0 || total >= budget ? 2 : 0, .resident_embed = o.resident_embed, .populate = !o.no_populate,
                           .spine_budget = budget};
        df_model *m = NULL;
        int rc = df_model_load_gguf(path, &lo, &m, err, errlen);
        free(path);
        if (rc) return NULL;
        return engine_new(m, &o, budget, err, errlen);
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
    const int mode = o.expert_cache_bytes >= 0 || total >= budget || df_is_store(path) || df_engine_is_hub_stream(path) ? 2 : o.mmap_weights ? 0 : 1;
    /* a device backend that decodes one token ahead gathers the next token's embedding row itself (backend.h
     * embed_token): the embedding is then kept and registered like the other weights instead of read from its file
     * row by row, unless the experts stream (memory is short then) */
    df_load_opts lo = {.mode = mode, .resident_embed = o.resident_embed || (mode != 2 && df_be->queued && df_be->embed_token),
                       .populate = !o.no_populate, .spine_budget = budget};
    df_model *m = NULL;
    int rc = df_model_load(path, &lo, &m, err, errlen);
    free(path);
    if (rc) return NULL;
    return engine_new(m, &o, budget, err, errlen);
}

static df_engine *engine_new(df_model *m, const df_options *o, int64_t budget, char *err, size_t errlen) {
    df_engine *e = df_xcalloc(1, sizeof *e);
    e->model = m;
    e->opt = *o;
    e->src = m->resident_src;
    /* the device budget: the spine's share leaves room for a session's state at
     * the default context and activations (the same estimate as the host budget's) */
    {
        const df_config *c = &m->cfg;
        int64_t kv = (int64_t)df_state_bytes_per_token(m) * (c->max_pos < 4096 ? c->max_pos : 4096) + (int64_t)df_state_fixed_bytes(m);
        df_backend_set_memory(o->gpu_memory_bytes, kv + ((int64_t)8 << 20), df_model_expert_bytes(m));
    }
    if (df_model_backend_attach(m, err, errlen) || (m->streamed && start_streaming(e, o, budget, err, errlen))) {
        df_engine_close(e);
        return NULL;
    }
    if (e->ecache) { /* a device backend copies experts out of the host cache's slots: page-lock them */
        void *p;
        size_t n;
        df_ecache_memory(e->ecache, &p, &n);
        if (n && !df_host_pin(p, n)) e->pinned = p;
    }
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
    if (e->pinned) df_host_unpin(e->pinned);
    df_tier_reset();
    df_engine_hub_stream_close(e);
    df_ecache_free(e->ecache);
    if (e->trace) fclose(e->trace);
    if (e->model) df_model_backend_detach(e->model);
    df_model_free(e->model);
    free(e);
}
static _Thread_local char tl_err[DF_ERRLEN];
char *df_errbuf(void) { return tl_err; }
const char *df_engine_error(const df_engine *e) { (void)e; return tl_err; }

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
    out->backend = df_be->name;
    out->backend_threads = df_backend_threads();
    out->weight_bytes = e->model->bytes;
    out->weight_bytes_active = e->model->bytes_active;
}

void df_stats_get(df_engine *e, df_stats *out) {
    *out = e->stats;
    out->peak_rss_bytes = df_peak_rss();
    out->state_bytes_per_token = (int64_t)df_state_bytes_per_token(e->model);
    out->state_bytes_fixed = (int64_t)df_state_fixed_bytes(e->model);
    if (e->ecache) {
        df_ecache_stats es;
        df_ecache_stats_get(e->ecache, &es);
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
        out->prefetch_mode = e->prefetch_mode;
        out->stale_reuses = es.stale_reuses;
        out->slot_touch_gbs = es.touch_gbs;
        out->spine_load_seconds = e->model->spine_load_s;
        out->spine_load_bytes = e->model->spine_load_bytes;
        out->expert_cache_bytes = (int64_t)es.n_slots * es.slot_bytes;
        out->expert_cache_slots = es.n_slots;
    }
    df_engine_hub_stats(e, out);
    df_tier_stats ts;
    if (!df_tier_stats_get(&ts)) {
        out->gpu_budget_bytes = ts.budget, out->gpu_used_bytes = ts.used;
        out->gpu_spine_bytes = ts.spine_dev_bytes, out->gpu_spine_host_bytes = ts.spine_host_bytes, out->gpu_spine_host_weights = ts.spine_host_weights;
        out->gpu_cache_bytes = ts.cache_bytes, out->gpu_cache_slots = ts.cache_slots, out->gpu_evict_lfu = ts.eviction_lfu;
        out->gpu_cache_hits = ts.cache_hits, out->gpu_cache_misses = ts.cache_misses;
        out->gpu_cache_evictions = ts.cache_evictions, out->gpu_cache_bypasses = ts.cache_bypasses;
        out->gpu_pinned_bytes = ts.pinned_bytes;
        out->gpu_h2d_expert_bytes = ts.h2d_expert_bytes, out->gpu_h2d_expert_pinned_bytes = ts.h2d_expert_pinned_bytes;
        out->gpu_h2d_spine_bytes = ts.h2d_spine_bytes, out->gpu_h2d_expert_staged_bytes = ts.h2d_expert_staged_bytes;
    }
}
void df_stats_reset(df_engine *e) { memset(&e->stats, 0, sizeof e->stats); }
