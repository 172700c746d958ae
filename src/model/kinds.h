/* kinds.h - the code of each layer kind, reached through small ops tables
 * indexed by the kind enums of model.h. forward.c walks the layers and calls
 * these; a new kind (a recurrent mixer, a latent MoE, another router) is a
 * new file in src/model/kinds/ plus one entry here. Internal to src/model. */
#ifndef DF_MODEL_KINDS_H
#define DF_MODEL_KINDS_H

#include "model/model.h"

/* Mixers: mix information across positions (attention, recurrences). */
typedef struct {
    const char *name;
    int truncatable;   /* state at p is a prefix of the state at any later position */
    /* floats of growing cache per position, and of fixed state, for layer l */
    size_t (*cache_floats)(const df_model *m, int l);
    size_t (*fixed_floats)(const df_model *m, int l);
    /* s->xn[n x hidden] (normed input) -> s->o[n x hidden], updating layer l's state for positions pos0..
     * (backend memory: only through backend.h operations) */
    void (*forward)(const df_model *m, df_state *s, int l, int n, int pos0);
} df_mixer_ops;

/* Routers: n tokens' router logits [n x E] -> K expert ids per token (host, ids [n x K]) and their
 * weights (backend memory w [n x K], or NULL when only the ids are wanted). */
typedef void (*df_route_fn)(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w);

extern const df_mixer_ops df_mixer_gqa, df_mixer_mla, df_mixer_kda;
const df_mixer_ops *df_mixer_of(df_mixer_kind k);
df_route_fn df_router_of(df_router_kind k);
const char *df_kind_name_ffn(df_ffn_kind k);
const char *df_kind_name_router(df_router_kind k);

/* FFN kinds (kinds/ffn.c): s->xn -> s->ffn_out for layer l. 0 or DF_E*. */
int df_ffn_dense(const df_model *m, df_state *s, const df_layer *L, int n);
int df_ffn_moe(const df_model *m, df_state *s, const df_layer *L, int l, int n);

/* Router kinds (kinds/router.c). */
void df_route_softmax_topk(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w);
void df_route_sigmoid_groups(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w);
/* The backend route's arguments for layer L's router (both kinds above call df_route with them; the
 * device-routed MoE of ffn.c hands them to moe_fused). */
df_route_args df_route_args_of(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w);

#endif
