/* dec_layers.h - the shapes and the layer table of the persistent decode kernel (dec_kernel.cuh), in C as well as
 * C++: what the CUDA backend's decode_layers op (cuda_dec.cu), bench/cuda/layer_bench.cu, the CPU-emulated runner
 * bench/cuda/dec_emu.cc and the check against the CPU backend (tests/emu/dec_cpu_parity.c) share.
 *
 * The layer: Qwen3-MoE's decoder layer (transformers' Qwen3MoeDecoderLayer) at one position: RMSNorm, q/k/v, per-head
 * q/k RMSNorm, rotate-half RoPE, GQA attention over the cache, o; RMSNorm, softmax router, top TOPK renormalised,
 * SiLU-gated experts. Hidden 2048, 32 q heads / 4 KV heads of 128 (Qwen3-30B-A3B); the routed experts' count and
 * width are DEC_NE (128) and DEC_IE (768) unless a build sets them (the CPU check uses a smaller checkpoint: 32 of
 * 256). The kernel's code assumes: H = 8 x 256 threads, 8 q heads a KV head (a warp each), head_dim 128, NE a
 * multiple of 32, IE a multiple of 256 (static_asserts in dec_kernel.cuh). */
#ifndef DF_DEC_LAYERS_H
#define DF_DEC_LAYERS_H
#include <stdint.h>

#ifndef DEC_NE
#define DEC_NE 128
#endif
#ifndef DEC_IE
#define DEC_IE 768
#endif
#ifndef DEC_CH /* the attention's cached positions a task (a lane a position: at most 32) */
#define DEC_CH 32
#endif
#ifdef __cplusplus
namespace dec { /* (the names are short: kept out of the CUDA backend's own) */
#endif
enum { H = 2048, NQ = 32, NKV = 4, HD_ = 128, QR = NQ * HD_, KR = NKV * HD_, QKV = QR + 2 * KR, NE = DEC_NE, TOPK = 8, IE = DEC_IE, CH = DEC_CH };
#ifdef __cplusplus
}
#endif

/* A layer's weights and cache as the backend holds them (the kernels read a table of these in device memory: a kernel
 * parameter's arrays indexed by a run-time layer would be copied to local memory): q, k, v, o and the router as their
 * own BF16 tensors (row-major, [out][in]); each routed expert's gate, up and down as its own tensor, found through a
 * table of 3 NE entries of estride bytes (expert e's part p, 0 gate, 1 up, 2 down: the pointer stored at etab + (3 e +
 * p) estride), so that the CUDA backend's own device table of VRAM-resident experts (an array of its weight views,
 * slots in no particular order) is read in place; the norms' f32 vectors; the K/V cache in f32 rows, a position's K
 * row then its V row (src/model/kinds/gqa.c). */
typedef struct {
    const uint16_t *wq, *wk, *wv, *wo, *wr;            /* [QR][H], [KR][H] x2, [H][QR], [NE][H] */
    const uint8_t *etab;                               /* [NE][3] entries -> [IE][H], [IE][H], [H][IE] */
    int estride;                                       /* bytes from one entry to the next */
    const float *n1, *n2, *qn, *kn;                    /* input norm [H], post-attention norm [H], q/k norms [HD_] */
    float *kv;                                         /* [positions][K | V][KR] */
} dec_layer;

/* One decode position through a run of layers, on the CPU emulation of the kernel (dec_emu.cc). h: [H] in and out
 * (the residual stream: the embedding row in, what the last layer leaves out); cs: RoPE at the position, [HD_/2][cos,
 * sin] (the backend's rope_table); the cache rows 0 .. pos - 1 of every layer are read, row pos written. ids: NULL
 * or [n_layers][TOPK], the experts each layer chose in order. blocks: the resident blocks (persistent) or the blocks
 * of each launch's wave (launch arm). Returns 0, or -1 (a wait timed out: a deadlock). */
typedef struct {
    const dec_layer *layers;
    int n_layers, pos;
    const float *cs;
    float eps, scale;
    float *h;
    int *ids;
    int persistent, blocks;
} dec_run_args;

#ifdef __cplusplus
extern "C" {
#endif
int dec_emu_run(const dec_run_args *a);
#ifdef __cplusplus
}
#endif

#endif
