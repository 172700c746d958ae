/* hubsrc.c - the engine's glue for a model set up with `setup --stream`: the
 * expert cache reads the sparse local shards, and in front of it an
 * rsource fetches each routed expert from the hub on first use (store/rsource.h
 * does the bookkeeping, hub/hub.h the network). */
#include "core/engine_int.h"
#include "hub/hub.h"
#include "model/model.h"
#include "store/rsource.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int df_engine_is_hub_stream(const char *dir) {
    char *p = df_path_join(dir, "stream.json");
    int r = df_file_exists(p);
    free(p);
    return r;
}

static int fetch(void *ctx, const df_extent *ext, int n, const int *fds, char *err, size_t errlen) {
    df_engine *e = ctx;
    df_hub_piece *pc = df_xcalloc((size_t)n + 1, sizeof *pc);
    for (int i = 0; i < n; i++) {
        const char *path = e->model->files[ext[i].file], *b = strrchr(path, '/');
        pc[i] = (df_hub_piece){b ? b + 1 : path, ext[i].off, ext[i].len, fds[ext[i].file]};
    }
    int rc = df_hub_stream_fetch(e->hstream, pc, n, err, errlen);
    free(pc);
    return rc;
}

int df_engine_hub_stream(df_engine *e, char *err, size_t errlen) {
    df_model *m = e->model;
    if (!(e->hstream = df_hub_stream_open(m->dir, err, errlen))) return DF_EFORMAT;
    char *state = df_path_join(m->dir, "experts.state");
    df_expert_loc *locs = df_model_expert_locs(m);
    e->rsrc = df_rsource_new(e->src, (const char *const *)m->files, m->n_files, m->cfg.n_layers, m->cfg.n_experts, locs, state,
                             df_hub_stream_disk_budget(e->hstream), fetch, e, err, errlen);
    free(locs);
    free(state);
    if (!e->rsrc) return DF_EIO;
    e->src = df_rsource_source(e->rsrc);
    return 0;
}

void df_engine_hub_stream_close(df_engine *e) {
    df_rsource_free(e->rsrc);
    e->rsrc = NULL;
    df_hub_stream_free(e->hstream);
    e->hstream = NULL;
}

void df_engine_hub_stats(df_engine *e, df_stats *out) {
    df_hub_net n;
    df_hub_net_get(&n);
    out->net_bytes = n.bytes, out->net_requests = n.requests, out->net_retries = n.retries, out->net_seconds = n.seconds;
    if (e->rsrc) {
        df_rsource_stats s;
        df_rsource_stats_get(e->rsrc, &s);
        out->net_experts_fetched = s.experts_fetched, out->net_fetch_seconds = s.fetch_seconds, out->net_evictions = s.evictions;
        out->stream_disk_bytes = s.disk_bytes, out->stream_disk_budget = s.disk_budget;
        out->hub_stream = 1;
    }
}
