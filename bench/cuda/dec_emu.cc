/* dec_emu.cc - dec_emu_run (dec_layers.h): the decode kernels of dec_kernel.cuh on the CPU, every GPU thread a fiber
 * (simt_emu.h), for checks that need no GPU (tests/emu/dec_cpu_parity.c hands it the CPU backend's memory of a real
 * checkpoint). Built with g++ -DSIMT_EMU; one position of the run of layers a call, no token boundary (V = 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/dec_kernel.cuh"
using namespace dec;

template <class T> static T *zalloc(size_t n) { return (T *)calloc(n ? n : 1, sizeof(T)); }

extern "C" int dec_emu_run(const dec_run_args *a) {
    if (!a || !a->layers || a->n_layers < 1 || a->pos < 0 || !a->cs || !a->h || a->blocks < 1 || a->blocks > 64 * TOPK) return -2;
    Net n;
    memset(&n, 0, sizeof n);
    n.lw = a->layers, n.cs = a->cs, n.eps = a->eps, n.scale = a->scale, n.h = a->h;
    /* the persistent kernel gets the position as its argument only (Net's P left 0), as the CUDA backend calls it */
    n.L = a->n_layers, n.P = a->persistent ? 0 : a->pos, n.nch = (a->pos + CH) / CH, n.V = 0, n.dbg_n = a->n_layers;
    n.pf = 1, n.pexp = 1, n.nodep = 0, n.l2pf = 0, n.smw = a->persistent == 2;
    n.qkv = zalloc<float>(QKV), n.part = zalloc<float>((size_t)NKV * n.nch * 8 * KS), n.att = zalloc<float>(QR), n.lg = zalloc<float>(NE);
    n.act = zalloc<float>((size_t)TOPK * IE), n.dy = zalloc<float>((size_t)TOPK * H), n.ids_dbg = zalloc<int>((size_t)a->n_layers * TOPK);
    n.cnt = zalloc<unsigned>((size_t)C_N * 32), n.ts = zalloc<unsigned long long>((size_t)a->n_layers * NOPX * 4);
    decompose(n, a->blocks);
    if (a->persistent) emu_launch(dim3((unsigned)a->blocks), dim3(TH), PSMEM_BYTES, [&] { k_persist(&n, 0, n.L, a->pos); });
    else
        for (int s = 0; s < n.L; s++)
            for (int op = 0; op < NOP; op++) emu_launch_op(n, op, s);
    if (a->ids) memcpy(a->ids, n.ids_dbg, (size_t)a->n_layers * TOPK * sizeof(int));
    const int rc = n.cnt[32 * C_ERR] ? -1 : 0;
    free(n.qkv), free(n.part), free(n.att), free(n.lg), free(n.act), free(n.dy), free(n.ids_dbg), free(n.cnt), free(n.ts);
    return rc;
}
