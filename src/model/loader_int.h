/* loader_int.h - the tensor-lookup helpers shared by the safetensors
 * loaders (loader.c, loader_kimi.c). Internal to src/model. Each helper is
 * a no-op once c->rc is set, and sets it (with a message naming the file,
 * tensor, expected and actual value) on the first failure. */
#ifndef DF_MODEL_LOADER_INT_H
#define DF_MODEL_LOADER_INT_H

#include "model/model.h"

typedef struct {
    df_model *m;
    char *err;
    size_t errlen;
    int rc;
    uint8_t *used; /* per tensor index */
} ld;

const char *ld_tfile(ld *c, const df_st_tensor *t);
/* The tensor called name (marked used), or NULL with c->rc set. */
const df_st_tensor *ld_need(ld *c, const char *name);
int ld_check_shape(ld *c, const df_st_tensor *t, int nd, int64_t d0, int64_t d1);
/* The linear layer prefix (prefix.weight, or its quantized parts) of shape [rows x cols] in its stored format. */
void ld_linear(ld *c, const char *prefix, int64_t rows, int64_t cols, df_weight *w);
/* A 1-D vector of n values copied to f32 (F32, BF16, F16). _opt: NULL when absent. */
float *ld_vec(ld *c, const char *name, int64_t n);
float *ld_vec_opt(ld *c, const char *name, int64_t n);
/* A gated FFN prefix.{names[0..2]} (gate, up, down) from width h to inter and back. */
extern const char *const ld_hf_glu[3];
void ld_ffn_named(ld *c, const char *prefix, const char *const names[3], int64_t h, int64_t inter, df_glu *f);
/* Where the bytes of routed expert prefix.{proj[0..2]} are (streaming). */
void ld_expert_extents(ld *c, const char *prefix, const char *const proj[3], df_ffn *f);

/* Kimi Linear / Kimi K3 (loader_kimi.c): the tensors of layer l (pre = "<prefix>model.layers.l")
 * other than the two pre-norms, and the model-level attention-residual weights. */
void ld_kimi_layer(ld *c, const char *pre, int l, df_layer *L);
void ld_kimi_model(ld *c);

#endif
