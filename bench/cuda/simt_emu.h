/* simt_emu.h - a CPU emulation of the CUDA subset bench/cuda/layer_bench.cu uses, to check the benchmark's logic on a
 * machine without a GPU: every GPU thread of a launch is a fiber (ucontext) of one OS thread, switching at block
 * barriers, warp shuffles / barriers and spin waits; all blocks of a launch run together (a persistent kernel's
 * blocks wait on each other). What it shows: indices, task cuts, counters and tickets, a deadlock (a round in which
 * every live thread only polled: reported, then exit 3), and the results. What it does not: speed, the GPU's memory
 * model (every access here is sequentially consistent but cp.async's, whose copies land only when a wait retires
 * their group), inline PTX (the benchmark gives each such helper a plain C++ body under SIMT_EMU).
 * Usage: #define SIMT_EMU before including; launch with emu_launch(grid, block, smem bytes, [&] { kernel(args); }). */
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __grid_constant__
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct EmuCopy {
    void *dst;
    unsigned char bytes[16];
};
/* The switch between fibers. glibc's swapcontext saves and restores the signal mask (a system call each way: a third
 * of the emulation's time); on x86-64 a switch of the callee-saved registers and the stack pointer does (the fibers
 * never touch the signal mask, MXCSR or the x87 control word). SIMT_EMU_UCONTEXT forces ucontext. */
#if defined(__x86_64__) && !defined(SIMT_EMU_UCONTEXT)
#define EMU_FAST_SWITCH 1
extern "C" void emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n.globl emu_switch\n.type emu_switch, @function\nemu_switch:\n"
        "\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
        "\tmovq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n"
        "\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n"
        ".size emu_switch, .-emu_switch\n");
#endif
struct EmuFiber {
    ucontext_t ctx;
    void *sp; /* (fast switch) the saved stack pointer */
    dim3 ti, bi;
    int done;
    std::vector<std::vector<EmuCopy>> groups; /* cp.async: committed groups not yet waited for, oldest first */
    std::vector<EmuCopy> open;                /* copies issued since the last commit */
};
struct EmuBlock {
    unsigned arrived, gen;                 /* __syncthreads */
    unsigned warrived[32], wgen[32];       /* each warp's barrier */
    float wbuf[32][32];                    /* each warp's shuffle slots */
    std::vector<unsigned char> smem, stat; /* dynamic and "static" shared memory */
};
static struct {
    ucontext_t sched;
    void *sched_sp;
    std::vector<EmuFiber> f;
    std::vector<EmuBlock> b;
    std::vector<std::vector<char>> stacks;
    dim3 grid, block;
    EmuFiber *cur;
    int progress;                 /* something other than a poll happened since the last round */
    unsigned long long switches;  /* the emulated clock */
    const std::function<void()> *body;
} g_emu;

#define threadIdx (g_emu.cur->ti)
#define blockIdx (g_emu.cur->bi)
#define blockDim (g_emu.block)
#define gridDim (g_emu.grid)

static inline EmuBlock &emu_blk(void) { return g_emu.b[g_emu.cur->bi.x]; }
static inline void emu_yield(void) {
    g_emu.switches++;
#ifdef EMU_FAST_SWITCH
    emu_switch(&g_emu.cur->sp, g_emu.sched_sp);
#else
    swapcontext(&g_emu.cur->ctx, &g_emu.sched);
#endif
}
/* a barrier over `count` threads: arrive, then poll until the generation moves */
static inline void emu_bar(unsigned &arrived, unsigned &gen, unsigned count) {
    const unsigned g = gen;
    g_emu.progress = 1;
    if (++arrived == count) {
        arrived = 0, gen++;
        return;
    }
    while (gen == g) emu_yield();
    g_emu.progress = 1;
}
static inline void __syncthreads(void) { emu_bar(emu_blk().arrived, emu_blk().gen, g_emu.block.x); }
static inline void emu_warp_bar(void) {
    const unsigned w = g_emu.cur->ti.x >> 5;
    EmuBlock &b = emu_blk();
    const unsigned nwarp = (g_emu.block.x + 31) / 32, lanes = w + 1 < nwarp || !(g_emu.block.x & 31) ? 32 : (g_emu.block.x & 31);
    emu_bar(b.warrived[w], b.wgen[w], lanes);
}
static inline void __syncwarp(unsigned m = ~0u) { (void)m, emu_warp_bar(); }
template <class T> static inline T emu_shfl(T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    const unsigned w = g_emu.cur->ti.x >> 5, lane = g_emu.cur->ti.x & 31;
    EmuBlock &b = emu_blk();
    memcpy(&b.wbuf[w][lane], &v, 4);
    emu_warp_bar();
    T r;
    memcpy(&r, &b.wbuf[w][src & 31], 4);
    emu_warp_bar();
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int o) { return (void)m, emu_shfl(v, (int)(g_emu.cur->ti.x & 31) ^ o); }
template <class T> static inline T __shfl_sync(unsigned m, T v, int src) { return (void)m, emu_shfl(v, src); }
static inline void __threadfence(void) {}
static inline void __nanosleep(unsigned) { emu_yield(); } /* a poll: not progress */
static inline long long clock64(void) { return (long long)g_emu.switches; }
template <class T> static inline T atomicAdd(T *p, T v) { const T o = *p; *p = o + v; g_emu.progress = 1; return o; }
template <class T> static inline T atomicMin(T *p, T v) { const T o = *p; if (v < o) *p = v; g_emu.progress = 1; return o; }
template <class T> static inline T atomicMax(T *p, T v) { const T o = *p; if (v > o) *p = v; g_emu.progress = 1; return o; }
template <class T> static inline T atomicExch(T *p, T v) { const T o = *p; *p = v; g_emu.progress = 1; return o; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
/* cp.async as the GPU may run it: the 16 source bytes read at issue, written to shared memory only when a wait
 * retires the copy's group (a missing or short wait reads what the slot held before, as it could on the GPU) */
static inline void emu_cp16(void *dst, const void *src) {
    EmuCopy c;
    c.dst = dst;
    memcpy(c.bytes, src, 16);
    g_emu.cur->open.push_back(c);
}
static inline void emu_cp_commit(void) {
    g_emu.cur->groups.push_back(g_emu.cur->open);
    g_emu.cur->open.clear();
}
static inline void emu_cp_wait(int n) { /* wait_group n: at most n groups left pending */
    auto &gs = g_emu.cur->groups;
    while ((int)gs.size() > n) {
        for (const EmuCopy &c : gs.front()) memcpy(c.dst, c.bytes, 16);
        gs.erase(gs.begin());
    }
}
static inline void *emu_smem(void) { return emu_blk().smem.data(); }
static inline void *emu_static(size_t n) {
    EmuBlock &b = emu_blk();
    if (b.stat.size() < n) b.stat.resize(n); /* (first use, before any thread keeps a pointer: every call asks the same size) */
    return b.stat.data();
}

static void emu_entry(void) {
    (*g_emu.body)();
    g_emu.cur->done = 1;
    g_emu.progress = 1;
#ifdef EMU_FAST_SWITCH
    emu_switch(&g_emu.cur->sp, g_emu.sched_sp); /* never resumed */
#else
    swapcontext(&g_emu.cur->ctx, &g_emu.sched);
#endif
}
/* runs body as grid x block threads (1-D), smem bytes of dynamic shared memory a block; exit 3 on a deadlock */
static void emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const size_t nb = grid.x, nt = block.x, n = nb * nt, stack = 64 << 10;
    g_emu.grid = grid, g_emu.block = block, g_emu.body = &body;
    g_emu.f.assign(n, EmuFiber());
    g_emu.b.assign(nb, EmuBlock());
    for (auto &b : g_emu.b) b.smem.assign(smem + 16, 0xAB), b.stat.assign(1024, 0);
    if (g_emu.stacks.size() < n) g_emu.stacks.resize(n);
    for (size_t i = 0; i < n; i++) {
        EmuFiber &f = g_emu.f[i];
        f.bi = dim3((unsigned)(i / nt)), f.ti = dim3((unsigned)(i % nt)), f.done = 0, f.groups.clear(), f.open.clear();
        g_emu.stacks[i].resize(stack);
#ifdef EMU_FAST_SWITCH
        /* the new stack as emu_switch leaves one: six saved registers, then the address `ret` goes to (emu_entry),
         * placed so that emu_entry starts with rsp = 8 mod 16, as after a call */
        uintptr_t top = ((uintptr_t)g_emu.stacks[i].data() + stack) & ~(uintptr_t)15;
        void **sp = (void **)(top - 8); /* emu_entry's slot at top - 16: after `ret`, rsp = top - 8 */
        *--sp = (void *)emu_entry;
        for (int r = 0; r < 6; r++) *--sp = NULL;
        f.sp = sp;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_emu.stacks[i].data(), f.ctx.uc_stack.ss_size = stack, f.ctx.uc_link = &g_emu.sched;
        makecontext(&f.ctx, emu_entry, 0);
#endif
    }
    for (size_t live = n; live;) {
        g_emu.progress = 0;
        live = 0;
        for (size_t i = 0; i < n; i++) {
            if (g_emu.f[i].done) continue;
            g_emu.cur = &g_emu.f[i];
#ifdef EMU_FAST_SWITCH
            emu_switch(&g_emu.sched_sp, g_emu.f[i].sp);
#else
            swapcontext(&g_emu.sched, &g_emu.f[i].ctx);
#endif
            live += !g_emu.f[i].done;
        }
        if (live && !g_emu.progress) {
            fprintf(stderr, "simt_emu: deadlock: %zu threads live and a whole round in which every one only polled\n", live);
            exit(3);
        }
    }
    g_emu.cur = NULL;
}
