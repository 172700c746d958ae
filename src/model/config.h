/* config.h - a model's configuration, parsed from config.json (both the hub
 * style `rope_scaling` + `rope_theta` and the transformers >= 5 style
 * `rope_parameters`), generation_config.json and quantization_config.
 * After df_config_load succeeds every field is consistent (checked shapes,
 * known family, supported quantization). */
#ifndef DF_CONFIG_H
#define DF_CONFIG_H

#include <stdint.h>
#include <stddef.h>

typedef enum { DF_FAM_LLAMA, DF_FAM_QWEN3, DF_FAM_QWEN3_MOE, DF_FAM_DEEPSEEK_V3 } df_family;
typedef enum { DF_ROPE_DEFAULT, DF_ROPE_LINEAR, DF_ROPE_LLAMA3, DF_ROPE_YARN } df_rope_type;
typedef enum { DF_QUANT_NONE, DF_QUANT_FP8, DF_QUANT_INT4_PACK } df_quant;

#define DF_MAX_LAYERS 512
#define DF_MAX_EOS 16

typedef struct {
    df_family family;
    char model_type[32];
    const char *family_name;
    int vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, intermediate;
    double rms_eps;
    int tie_embeddings;
    int max_pos;
    int attention_bias;

    /* RoPE */
    df_rope_type rope_type;
    double rope_theta, rope_factor, low_freq_factor, high_freq_factor, orig_max_pos;
    double beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor; /* attention_factor: cos/sin scale */
    int rope_truncate;
    int rope_interleave;
    int rope_dim; /* rotary dims per head */

    /* MoE (qwen3_moe, deepseek_v3) */
    int n_experts, n_experts_used, moe_intermediate, norm_topk_prob;
    int decoder_sparse_step;
    uint8_t mlp_only[DF_MAX_LAYERS]; /* qwen3_moe: 1 = dense layer */
    int n_shared_experts, first_k_dense, n_group, topk_group;
    double routed_scaling;

    /* MLA (deepseek_v3) */
    int q_lora_rank; /* 0: plain q_proj */
    int kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    int n_mtp_layers;

    /* quantization */
    df_quant quant;
    int fp8_block[2];       /* rows, cols of a weight_scale_inv block */
    int int4_group, int4_symmetric;
    char **quant_ignore;    /* module names or "re:..." patterns */
    int n_quant_ignore;

    int bos_id;
    int eos[DF_MAX_EOS];
    int n_eos;
} df_config;

/* Loads dir/config.json (+ generation_config.json if present). */
int df_config_load(const char *dir, df_config *c, char *err, size_t errlen);
void df_config_free(df_config *c);
/* Layer l has routed experts? */
int df_config_is_moe_layer(const df_config *c, int l);
/* Is module (e.g. "model.layers.0.self_attn.q_proj") in the quantization ignore list? */
int df_config_quant_ignored(const df_config *c, const char *module);

#endif
