/* mtp.c - the MTP module as a drafter (see mtp.h for the math).
 *
 * The module's decoder layer is an ordinary layer of the model's kinds, so
 * it runs through the same mixer and FFN code as the main layers: a shallow
 * copy of the model whose only layer is the MTP layer gives the kinds their
 * (m, l = 0) view, and a df_state made for that copy holds exactly one
 * layer's cache. RoPE positions: the entry of h_i is at position i; the
 * reference places it at i + 1 (the position of the embedded token), which
 * gives the same scores since rotary scores depend only on the distance
 * between positions. Entries follow the main cache: truncating the session
 * leaves stale entries past the cut that are recomputed before use (the
 * drafter in core/spec.c tracks how many are valid). */
#include "model/mtp.h"
#include "model/kinds.h"
#include "deltafin.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

struct df_mtp {
    df_model sh;     /* the main model with the MTP layer as its only layer */
    const df_model *m;
    df_state st;
    df_act *cat;     /* [max_batch x 2*hidden]: enorm(emb) | hnorm(h) */
    float *host;     /* [max_batch x 2*hidden] */
};

df_mtp *df_mtp_new(const df_model *m, int max_ctx, int max_batch, char *err, size_t errlen) {
    if (!m->mtp.layer) {
        df_err(err, errlen, DF_EINPUT, "%s has no MTP module (config num_nextn_predict_layers and tensors model.layers.%d.eh_proj/enorm/hnorm/shared_head)",
               m->dir, m->cfg.n_layers);
        return NULL;
    }
    df_mtp *p = df_xcalloc(1, sizeof *p);
    p->m = m;
    p->sh = *m;
    p->sh.cfg.n_layers = 1;
    p->sh.layers = m->mtp.layer;
    p->sh.resident_src = df_model_resident_source(&p->sh);
    const size_t H2 = 2 * (size_t)m->cfg.hidden;
    if (df_state_init(&p->sh, max_ctx, max_batch, max_batch, &p->st, err, errlen)) {
        free(p->sh.resident_src);
        free(p);
        return NULL;
    }
    p->cat = df_alloc((size_t)max_batch * H2);
    p->host = malloc((size_t)max_batch * H2 * sizeof(float));
    if (!p->cat || !p->host) {
        df_mtp_free(p);
        df_err(err, errlen, DF_ENOMEM, "cannot allocate the MTP module's scratch for %d entries", max_batch);
        return NULL;
    }
    return p;
}

void df_mtp_free(df_mtp *p) {
    if (!p) return;
    df_state_free(&p->st);
    df_free(p->cat);
    free(p->host);
    free(p->sh.resident_src);
    free(p);
}

int df_mtp_forward(df_mtp *p, const float *h, const int32_t *tok, int n, int pos0, float *logits, int all, float *hout,
                   char *err, size_t errlen) {
    const df_model *m = &p->sh;
    const df_mtp_weights *t = &p->m->mtp;
    const df_layer *L = t->layer;
    df_state *s = &p->st;
    const df_config *c = &m->cfg;
    const int H = c->hidden;
    const size_t NH = (size_t)n * H, H2 = 2 * (size_t)H;
    const float eps = (float)c->rms_eps;
    if (n <= 0 || n > s->max_batch || pos0 < 0 || pos0 + n > s->max_ctx)
        return df_err(err, errlen, DF_EINPUT, "MTP: entries %d..%d outside 0..%d (batch of at most %d)", pos0, pos0 + n, s->max_ctx, s->max_batch);
    for (int j = 0; j < n; j++) {
        if (tok[j] < 0 || tok[j] >= c->vocab) return df_err(err, errlen, DF_EINPUT, "MTP: token id %d out of range (vocab_size %d)", tok[j], c->vocab);
        df_dequant_row(&t->embed, tok[j], p->host + (size_t)j * H2);
        memcpy(p->host + (size_t)j * H2 + H, h + (size_t)j * H, (size_t)H * sizeof(float));
    }
    s->err[0] = 0;
    df_write(p->cat, p->host, (size_t)n * H2);
    df_rmsnorm_rows(p->cat, H2, p->cat, H2, t->enorm, n, H, eps);
    df_rmsnorm_rows(DF_AT(p->cat, H), H2, DF_AT(p->cat, H), H2, t->hnorm, n, H, eps);
    df_matmul(&t->eh_proj, p->cat, n, s->x);
    df_rope_table(s->rope_cs, pos0, n, m->inv_freq, c->rope_dim / 2, m->rope_scale);
    /* the decoder layer, as forward.c runs a plain-residual layer */
    df_rmsnorm_rows(s->xn, H, s->x, H, L->attn_norm, n, H, eps);
    df_mixer_of(L->kind.mixer)->forward(m, s, 0, n, pos0);
    df_add(s->x, s->o, NH);
    df_rmsnorm_rows(s->xn, H, s->x, H, L->ffn_norm, n, H, eps);
    int rc = L->kind.ffn == DF_FFN_MOE ? df_ffn_moe(m, s, L, 0, n) : df_ffn_dense(m, s, L, n);
    if (rc) return df_err(err, errlen, rc, "MTP layer: %s", s->err[0] ? s->err : "forward failed");
    df_add(s->x, s->ffn_out, NH);
    const int first = all ? 0 : n - 1, cnt = all ? n : 1;
    if (hout) df_read(hout, DF_AT(s->x, (size_t)(n - 1) * H), (size_t)H);
    df_rmsnorm_rows(s->xn, H, DF_AT(s->x, (size_t)first * H), H, t->head_norm, cnt, H, eps);
    df_matmul(&t->head, s->xn, cnt, s->logits);
    df_read(logits, s->logits, (size_t)cnt * c->vocab);
    return 0;
}
