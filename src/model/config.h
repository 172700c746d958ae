/* config.h - a model's configuration, parsed from config.json (both the hub
 * style `rope_scaling` + `rope_theta` and the transformers >= 5 style
 * `rope_parameters`), generation_config.json and quantization_config.
 * After df_config_load succeeds every field is consistent (checked shapes,
 * known family, supported quantization). */
#ifndef DF_CONFIG_H
#define DF_CONFIG_H

#include <stdint.h>
#include <stddef.h>

typedef enum { DF_FAM_LLAMA, DF_FAM_QWEN3, DF_FAM_QWEN3_MOE, DF_FAM_DEEPSEEK_V3, DF_FAM_KIMI_LINEAR } df_family;
typedef enum { DF_ROPE_DEFAULT, DF_ROPE_LINEAR, DF_ROPE_LLAMA3, DF_ROPE_YARN } df_rope_type;
/* DF_QUANT_MXFP4: compressed-tensors "mxfp4-pack-quantized" (E2M1 weights, an
 * E8M0 uint8 scale per 32 inputs; backend.h DF_W_MXFP4) */
typedef enum { DF_QUANT_NONE, DF_QUANT_FP8, DF_QUANT_INT4_PACK, DF_QUANT_MXFP4 } df_quant;

#define DF_MAX_LAYERS 512
#define DF_MAX_EOS 16

/* Limits on the sizes a model file may declare (config.json or GGUF
 * metadata). Each width fits in int and so does every width the engine
 * derives from them (heads x head dim, kv_lora_rank + rope dims, shared
 * experts x moe_intermediate_size, checked where parsed), and every element
 * count (vocab x hidden, experts x width x hidden) fits in int64. */
#define DF_MAX_VOCAB (1 << 26)
#define DF_MAX_HIDDEN (1 << 20)
#define DF_MAX_HEADS 4096
#define DF_MAX_HEAD_DIM (1 << 16)
#define DF_MAX_FFN (1 << 24)       /* intermediate_size, moe_intermediate_size */
#define DF_MAX_EXPERTS (1 << 16)
#define DF_MAX_RANK (1 << 20)      /* q_lora_rank, kv_lora_rank */
#define DF_MAX_SHARED_EXPERTS (1 << 10)
#define DF_MAX_MTP_LAYERS 16
#define DF_MAX_QUANT_BLOCK 65536   /* FP8 weight_block_size entries, INT4 group_size */
/* Ranges of the real-valued fields: each keeps every value derived from it
 * finite (RoPE frequencies and angles, YaRN's log(theta) and mscale^2, the
 * norms' 1/sqrt(mean + eps)); see docs/CLI.md "Model files". */
#define DF_MAX_ROUTED_SCALING 1e4  /* routed_scaling_factor in (0, this] */
#define DF_MIN_RMS_EPS 1e-30       /* rms_norm_eps in [this, 1) */
#define DF_MIN_ROPE_FACTOR 1e-3    /* rope scaling factor in [this, DF_MAX_ROPE_FACTOR] */
#define DF_MAX_ROPE_FACTOR 1e6
#define DF_MAX_MSCALE 1000.0       /* yarn mscale, mscale_all_dim in [0, this]; attention_factor in (0, this] */

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
    int mla_nope;            /* kimi: no RoPE anywhere (the rope dims are plain dims) */
    int mla_out_gate;        /* kimi k3: attention output * sigmoid(g_proj x) */

    /* Kimi Linear / Kimi K3 (family kimi_linear; kimi_k3 wraps it in text_config) */
    char tensor_prefix[32];  /* "language_model." for the K3 wrapper, else "" */
    uint8_t layer_kda[DF_MAX_LAYERS]; /* 1: KDA layer (linear_attn_config.kda_layers, 1-based there) */
    int kda_heads, kda_head_dim, kda_conv;
    int kda_full_rank_gate;  /* gate g_proj [H*d x hidden] (K3) instead of g_a/g_b (Kimi Linear) */
    int kda_has_lower_bound;
    double kda_lower_bound;  /* forget gate lb * sigmoid(...) (K3) instead of -exp(A) softplus(...) */
    int moe_layer_freq;
    int act_situ;            /* hidden_act "situ" */
    double situ_beta, situ_linear_beta; /* linear_beta 0: up is not squashed */
    int latent_dim;          /* routed_expert_hidden_size (latent MoE), 0: none */
    int latent_norm;         /* latent_moe_use_norm */
    int attn_res_block;      /* attn_res_block_size (block attention residuals), 0: plain residuals */

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

/* Checks a real value read from a model file: finite and within lo..hi
 * (lo_open / hi_open: the bound itself excluded; hi may be INFINITY). On
 * failure writes "<file>: <label>: expected a finite number <range>, got <v>"
 * (label e.g. `field "rope_theta"`) and returns DF_EFORMAT; else 0. */
int df_check_real(const char *file, const char *label, double v, double lo, int lo_open, double hi, int hi_open, char *err, size_t errlen);

/* Loads dir/config.json (+ generation_config.json if present). */
int df_config_load(const char *dir, df_config *c, char *err, size_t errlen);
void df_config_free(df_config *c);
/* Layer l has routed experts? */
int df_config_is_moe_layer(const df_config *c, int l);
/* Is module (e.g. "model.layers.0.self_attn.q_proj") in the quantization ignore list? */
int df_config_quant_ignored(const df_config *c, const char *module);

#endif
