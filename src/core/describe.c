/* describe.c - df_engine_describe: what `deltafin inspect` prints. Layers
 * are described by their kinds (model/kinds.h), grouped when consecutive
 * layers share them; state bytes per token and per snapshot come from the
 * kinds themselves, so a new kind shows up here without code. */
#include "core/engine_int.h"
#include "model/kinds.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

static void count_fmt(void *ctx, df_weight *w) {
    int64_t *by = ctx;
    by[w->fmt] += df_weight_bytes(w);
}

static void mixer_line(df_buf *b, const df_model *m, const df_layer_kind *kd) {
    const df_config *c = &m->cfg;
    const df_mixer_kind k = kd->mixer;
    const int qk_norm = kd->qk_norm;
    switch (k) {
    case DF_MIXER_MLA:
        df_buf_printf(b, "MLA: %d heads, q_lora_rank %d, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d%s%s", c->n_heads, c->q_lora_rank,
                      c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim, kd->nope ? ", no RoPE" : "", kd->out_gate ? ", output gate" : "");
        break;
    case DF_MIXER_KDA:
        df_buf_printf(b, "KDA: %d heads x %d, conv %d, %s output gate, forget gate %s", c->kda_heads, c->kda_head_dim, c->kda_conv,
                      c->kda_full_rank_gate ? "full-rank" : "low-rank", c->kda_has_lower_bound ? "with lower bound" : "softplus");
        if (c->kda_has_lower_bound) df_buf_printf(b, " %g", c->kda_lower_bound);
        break;
    case DF_MIXER_GQA:
        df_buf_printf(b, "GQA: %d heads, %d kv heads, head_dim %d%s", c->n_heads, c->n_kv_heads, c->head_dim, qk_norm ? ", q/k norm" : "");
        break;
    default:
        df_buf_puts(b, df_mixer_of(k)->name);
    }
}

char *df_engine_describe(const df_engine *e) {
    df_model *m = e->model;
    const df_config *c = &m->cfg;
    df_buf b = {0};
    df_buf_printf(&b, "model        %s\n", m->dir);
    df_buf_printf(&b, "family       %s (model_type %s)\n", c->family_name, c->model_type);
    df_buf_printf(&b, "layers       %d, hidden %d, vocab %d, max positions %d\n", c->n_layers, c->hidden, c->vocab, c->max_pos);
    if (!strcmp(df_be->name, "cpu"))
        df_buf_printf(&b, "backend      cpu, %d threads: weights, activations and session state in host memory\n", df_backend_threads());
    else {
        df_tier_stats ts;
        df_tier_stats_get(&ts);
        df_buf_printf(&b, "backend      %s: activations and session state in device memory; VRAM budget %.1f MB (--gpu-memory), %.1f MB in use\n",
                      df_be->name, ts.budget / 1e6, ts.used / 1e6);
        df_buf_printf(&b, "tiers        spine %.1f MB in VRAM", ts.spine_dev_bytes / 1e6);
        if (ts.spine_host_weights)
            df_buf_printf(&b, ", %.1f MB (%d weights) over the budget in host memory, copied for each product", ts.spine_host_bytes / 1e6, ts.spine_host_weights);
        if (c->n_experts)
            df_buf_printf(&b, "; routed experts: a VRAM cache (%s) over %s%s", ts.cache_slots ? "sized" : "sized at the first token from what the budget leaves",
                          e->ecache ? "the host expert cache (streamed from disk)" : "host memory",
                          ts.pinned_bytes ? ", whose slots are pinned" : "");
        if (ts.cache_slots) df_buf_printf(&b, ", %d slots, %.1f MB", ts.cache_slots, ts.cache_bytes / 1e6);
        df_buf_puts(&b, "\n");
    }
    /* runs of layers with the same kinds */
    for (int l0 = 0; l0 < c->n_layers;) {
        const df_layer_kind *k = &m->layers[l0].kind;
        int l1 = l0 + 1;
        while (l1 < c->n_layers && !memcmp(&m->layers[l1].kind, k, sizeof *k)) l1++;
        df_buf_printf(&b, "layers %d-%d  ", l0, l1 - 1);
        df_buf_printf(&b, "%s, %s%s FFN%s%s%s%s\n", df_mixer_of(k->mixer)->name, k->latent ? "latent " : "", df_kind_name_ffn(k->ffn),
                      k->ffn == DF_FFN_MOE ? ", router " : "", k->ffn == DF_FFN_MOE ? df_kind_name_router(k->router) : "",
                      k->act == DF_ACT_SITU_GLU ? ", SiTU" : "", k->resid == DF_RESID_ATTNRES ? ", attention residuals" : "");
        l0 = l1;
    }
    /* attention: one line per distinct mixer kind */
    int seen[DF_MIXER_N] = {0};
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer_kind *k = &m->layers[l].kind;
        if (seen[k->mixer]++) continue;
        df_buf_puts(&b, "attention    ");
        mixer_line(&b, m, k);
        df_buf_puts(&b, "\n");
    }
    df_buf_printf(&b, "state        %zu B per token (%s)", df_state_bytes_per_token(m), seen[DF_MIXER_MLA] ? "latent cache" : "KV cache");
    if (df_state_fixed_bytes(m)) df_buf_printf(&b, ", %zu B fixed per session and per snapshot%s", df_state_fixed_bytes(m), seen[DF_MIXER_KDA] ? " (KDA conv windows and matrix states)" : "");
    df_buf_printf(&b, "; %s\n", df_state_truncatable(m) ? "prefix reuse by truncation" : "prefix reuse by snapshots");
    const char *rt[] = {"default", "linear", "llama3", "yarn"};
    if (c->rope_dim) {
        df_buf_printf(&b, "rope         %s, theta %g%s", rt[c->rope_type], c->rope_theta, c->rope_interleave && seen[DF_MIXER_MLA] ? ", interleaved" : "");
        if (c->rope_type != DF_ROPE_DEFAULT) df_buf_printf(&b, ", factor %g", c->rope_factor);
        df_buf_puts(&b, "\n");
    } else {
        df_buf_puts(&b, "rope         none\n");
    }
    if (c->attn_res_block) df_buf_printf(&b, "residuals    block attention residuals, blocks of %d layers\n", c->attn_res_block);
    if (c->latent_dim) df_buf_printf(&b, "latent MoE   routed experts in width %d%s\n", c->latent_dim, c->latent_norm ? ", normed before the up-projection" : "");
    if (c->act_situ) df_buf_printf(&b, "activation   SiTU, beta %g, linear beta %g\n", c->situ_beta, c->situ_linear_beta);
    int n_moe = 0;
    df_router_kind router = DF_ROUTER_NONE;
    for (int l = 0; l < c->n_layers; l++)
        if (m->layers[l].kind.ffn == DF_FFN_MOE) n_moe++, router = m->layers[l].kind.router;
    if (c->n_experts) {
        df_buf_printf(&b, "experts      %d routed (top-%d), width %d, %d MoE layers of %d", c->n_experts, c->n_experts_used, c->moe_intermediate, n_moe, c->n_layers);
        if (c->n_shared_experts) df_buf_printf(&b, ", %d shared", c->n_shared_experts);
        if (router == DF_ROUTER_SIGMOID_GROUPS) df_buf_printf(&b, ", sigmoid noaux_tc, %d groups keep %d, scale %g", c->n_group, c->topk_group, c->routed_scaling);
        else df_buf_printf(&b, ", softmax router%s", c->norm_topk_prob ? ", norm_topk_prob" : "");
        df_buf_printf(&b, "; %s\n", e->ecache ? "streamed from disk through the expert cache" : "resident");
    }
    if (c->intermediate && n_moe < c->n_layers) df_buf_printf(&b, "dense mlp    width %d\n", c->intermediate);
    int64_t by[DF_W_NFMT] = {0};
    df_model_foreach_weight(m, count_fmt, by);
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        if (L->kind.ffn == DF_FFN_MOE)
            for (int x = 0; x < c->n_experts; x++) {
                by[L->experts[x].gate.fmt] += df_weight_bytes(&L->experts[x].gate);
                by[L->experts[x].up.fmt] += df_weight_bytes(&L->experts[x].up);
                by[L->experts[x].down.fmt] += df_weight_bytes(&L->experts[x].down);
            }
    }
    df_buf_puts(&b, "dtypes      ");
    for (int i = 0; i < DF_W_NFMT; i++) if (by[i]) df_buf_printf(&b, " %s %.1f MB;", df_wfmt_traits_of((df_wfmt)i)->desc, by[i] / 1e6);
    df_buf_puts(&b, "\n");
    if (c->quant == DF_QUANT_FP8) df_buf_printf(&b, "quantization fp8 e4m3, weight_block_size [%d, %d]\n", c->fp8_block[0], c->fp8_block[1]);
    if (c->quant == DF_QUANT_MXFP4) df_buf_printf(&b, "quantization compressed-tensors mxfp4-pack-quantized, group 32, E8M0 scales, %d ignore entries\n", c->n_quant_ignore);
    if (c->quant == DF_QUANT_INT4_PACK) df_buf_printf(&b, "quantization compressed-tensors pack-quantized int4, group %d, symmetric, %d ignore entries\n", c->int4_group, c->n_quant_ignore);
    if (m->spine_int8) df_buf_puts(&b, "spine        row-int8 (store built with --spine int8): results are NOT exact\n");
    df_buf_printf(&b, "parameters   %.3f M total, %.3f M active per token\n", m->n_params / 1e6, m->n_params_active / 1e6);
    df_buf_printf(&b, "weight bytes %.3f MB total, %.3f MB active per token\n", m->bytes / 1e6, m->bytes_active / 1e6);
    if (m->n_ignored_tensors) df_buf_printf(&b, "unused       %d %s tensors (recognised, not used)\n", m->n_ignored_tensors, c->tensor_prefix[0] ? "vision/MTP" : "MTP-layer");
    if (m->mtp.layer) df_buf_printf(&b, "mtp          layer %d loaded (not counted above): --spec mtp drafts with it\n", c->n_layers);
    df_buf_printf(&b, "eos ids     ");
    for (int i = 0; i < c->n_eos; i++) df_buf_printf(&b, " %d", c->eos[i]);
    df_buf_printf(&b, "\nbos id       %d\n", c->bos_id);
    return b.p;
}
