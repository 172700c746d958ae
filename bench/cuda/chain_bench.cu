/* chain_bench.cu - what one dependent step costs on this GPU when it is a kernel boundary, against a barrier
 * inside one persistent kernel, and what a dependent load costs inside a kernel: the latency floor under a
 * batch-1 decode step that is a chain of ~9 dependent launches a layer (docs/PERFORMANCE.md, issue 13).
 *
 * Every arm runs N dependent steps over W blocks: step i's block b reads the value block (b + 1) % W wrote in
 * step i - 1 (buffers alternate) and writes it plus one, so no step can start its read before the step before
 * has finished everywhere; at the end every value must be N (checked: an arm whose chain did not hold fails).
 *   plain-W        N launches in stream order
 *   pdl-W          the same with programmatic stream serialization (griddepcontrol.launch_dependents at
 *                  entry, then griddepcontrol.wait before the read: what the backend's kernels do)
 *   q-plain-W, q-pdl-W  the same queued whole behind a kernel that waits for a host flag (N <= 256), so that
 *                  the GPU runs them at its own pace, not the host's launch rate
 *   graph-W        the plain chain captured into a CUDA graph and replayed
 *   graph-pdl-W    the PDL chain captured (programmatic edges) and replayed
 *   bar-W          ONE cooperative launch of W blocks, the N steps separated by a grid barrier (an arrival
 *                  counter and a generation word, release / acquire at gpu scope)
 *   cgsync-W       the same with cooperative groups' grid.sync()
 * W = 1 and W = the SM count (one block an SM, 256 threads). Then dependent loads in one thread (pointer chase
 * over a random cycle of 128-byte lines): L2-resident (8 MiB) and DRAM (1 GiB), ns a load.
 * Then tokens of 41 such steps (a Qwen3-shape decode token's launches) issued as launches, as a graph whose nodes get
 * each token's arguments, and as a graph captured anew and updated a token: wall and host time a token (run_tokens).
 * Usage: chain_bench [N (default 2000)]. Prints one line an arm: us a step (best of 5 runs) and "ok" / "FAILED". */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "chain_bench: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static __device__ __forceinline__ void pdl_go(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
static __device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* one step: out[b] = in[(b + 1) % W] + 1 (thread 0 of each block; the other threads only take part in the launch) */
__global__ void __launch_bounds__(256) k_step(const unsigned *in, unsigned *out, int pdl) {
    if (pdl) pdl_go(), pdl_wait();
    if (!threadIdx.x) {
        const unsigned v = *(volatile const unsigned *)&in[(blockIdx.x + 1) % gridDim.x];
        out[blockIdx.x] = v + 1;
    }
}

/* the grid barrier of a persistent kernel: arrive on cnt; the last arrival resets it and bumps gen */
static __device__ __forceinline__ void grid_bar(unsigned *cnt, unsigned *gen, unsigned nb) {
    __syncthreads();
    if (!threadIdx.x) {
        unsigned g;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
        unsigned a;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(a) : "l"(cnt) : "memory");
        if (a == nb - 1) {
            *(volatile unsigned *)cnt = 0;
            asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(gen), "r"(g + 1) : "memory");
        } else {
            unsigned c;
            do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(c) : "l"(gen) : "memory");
            while (c == g);
        }
    }
    __syncthreads();
}
__global__ void __launch_bounds__(256) k_persist(unsigned *buf, int N, unsigned *bar, int use_cg) {
    const unsigned W = gridDim.x;
    for (int i = 0; i < N; i++) {
        const unsigned *in = buf + (size_t)(i & 1) * W;
        unsigned *out = buf + (size_t)((i + 1) & 1) * W;
        if (!threadIdx.x) {
            const unsigned v = *(volatile const unsigned *)&in[(blockIdx.x + 1) % W];
            *(volatile unsigned *)&out[blockIdx.x] = v + 1;
        }
        if (use_cg) cg::this_grid().sync();
        else grid_bar(bar, bar + 32, W);
    }
}

/* a pointer chase of n loads from p[0]: the time of the whole chain in clock ticks */
__global__ void k_chase(const unsigned *p, unsigned start, int n, unsigned *sink, long long *ticks) {
    unsigned i = start;
    const long long t0 = clock64();
    for (int k = 0; k < n; k++) i = __ldcg(p + (size_t)i * 32);
    const long long t1 = clock64();
    *sink = i;
    *ticks = t1 - t0;
}

static void launch_step(cudaStream_t s, int W, const unsigned *in, unsigned *out, int pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)W), cfg.blockDim = dim3(256), cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k_step, in, out, pdl));
}
/* the N steps of one chain, queued on s (the value after them: buf[(N & 1) * W ...]) */
static void queue_chain(cudaStream_t s, int W, unsigned *buf, int N, int pdl) {
    for (int i = 0; i < N; i++) launch_step(s, W, buf + (size_t)(i & 1) * W, buf + (size_t)((i + 1) & 1) * W, pdl);
}
static int check(const unsigned *dbuf, int W, int N) {
    unsigned *h = (unsigned *)malloc((size_t)W * sizeof(unsigned));
    CK(cudaMemcpy(h, dbuf + (size_t)(N & 1) * W, (size_t)W * sizeof(unsigned), cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int b = 0; b < W; b++) ok &= h[b] == (unsigned)N;
    free(h);
    return ok;
}
enum { A_PLAIN, A_PDL, A_GPLAIN, A_GPDL, A_GRAPH, A_GRAPH_PDL, A_BAR, A_CG };
static const char *arm_name[] = {"plain", "pdl", "q-plain", "q-pdl", "graph", "graph-pdl", "bar", "cgsync"};
/* the q- arms: the chain queued whole behind a kernel that spins until the host sets a mapped flag, so the GPU
 * runs it at its own pace (the plain / pdl arms wait for the host's launches as they come) */
__global__ void k_gate(volatile unsigned *flag) {
    while (!*flag) {
    }
}
static volatile unsigned *g_flag_h;
static unsigned *g_flag_d;

static int run_arm(int arm, int W, int N, cudaStream_t s, unsigned *buf, unsigned *bar) {
    if ((arm == A_GPLAIN || arm == A_GPDL) && N > 256) N = 256; /* all queued before the flag: the launch queue's depth */
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    cudaGraphExec_t ge = NULL;
    if (arm == A_GRAPH || arm == A_GRAPH_PDL) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        queue_chain(s, W, buf, N, arm == A_GRAPH_PDL);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
    }
    float best = 1e30f;
    int ok = 1;
    for (int rep = 0; rep < 6; rep++) { /* the first run warms up; the best of the other 5 */
        CK(cudaMemsetAsync(buf, 0, 2 * (size_t)W * sizeof(unsigned), s));
        CK(cudaMemsetAsync(bar, 0, 64 * sizeof(unsigned), s));
        CK(cudaStreamSynchronize(s));
        if (arm == A_GPLAIN || arm == A_GPDL) {
            *g_flag_h = 0;
            k_gate<<<1, 1, 0, s>>>(g_flag_d);
        }
        CK(cudaEventRecord(a, s));
        if (arm == A_PLAIN || arm == A_PDL) queue_chain(s, W, buf, N, arm == A_PDL);
        else if (arm == A_GPLAIN || arm == A_GPDL) {
            queue_chain(s, W, buf, N, arm == A_GPDL);
            __sync_synchronize();
            *g_flag_h = 1;
        }
        else if (ge) CK(cudaGraphLaunch(ge, s));
        else {
            int n = N, use_cg = arm == A_CG;
            void *args[] = {&buf, &n, &bar, &use_cg};
            CK(cudaLaunchCooperativeKernel((const void *)k_persist, dim3((unsigned)W), dim3(256), args, 0, s));
        }
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        ok &= check(buf, W, N);
        if (rep && ms < best) best = ms;
    }
    if (ge) CK(cudaGraphExecDestroy(ge));
    printf("chain %-9s W=%-4d N=%d: %7.3f us a step  %s\n", arm_name[arm], W, N, best * 1e3f / N, ok ? "ok" : "FAILED");
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ok;
}

/* ns a dependent load over a random cycle through `lines` 128-byte lines (each line's first word: the next index) */
static int chase(size_t lines, const char *what, int clk_khz) {
    unsigned *h = (unsigned *)malloc(lines * 128), *d = NULL, *sink = NULL;
    unsigned *perm = (unsigned *)malloc(lines * sizeof(unsigned));
    for (size_t i = 0; i < lines; i++) perm[i] = (unsigned)i;
    uint64_t x = 88172645463325252ull;
    for (size_t i = lines - 1; i > 0; i--) { /* Fisher-Yates with xorshift */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const size_t j = x % (i + 1);
        const unsigned t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t i = 0; i < lines; i++) h[(size_t)perm[i] * 32] = perm[(i + 1) % lines];
    long long *dt = NULL, ticks = 0;
    CK(cudaMalloc(&d, lines * 128));
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    CK(cudaMalloc(&dt, sizeof(long long)));
    CK(cudaMemcpy(d, h, lines * 128, cudaMemcpyHostToDevice));
    const int n = 20000;
    k_chase<<<1, 1>>>(d, 0, n, sink, dt); /* warms the lines it touches (the L2 arm times the same ones again) */
    CK(cudaDeviceSynchronize());
    unsigned start = 0;
    if (lines > ((size_t)64 << 13)) CK(cudaMemcpy(&start, sink, sizeof start, cudaMemcpyDeviceToHost)); /* DRAM arm: lines not touched yet */
    k_chase<<<1, 1>>>(d, start, n, sink, dt);
    CK(cudaMemcpy(&ticks, dt, sizeof ticks, cudaMemcpyDeviceToHost));
    printf("chase %-5s %zu MiB: %.0f cycles = %.0f ns a dependent load (SM clock %d MHz)\n", what, lines * 128 >> 20, (double)ticks / n,
           (double)ticks / n / (clk_khz / 1e6), clk_khz / 1000);
    CK(cudaFree(d));
    CK(cudaFree(sink));
    CK(cudaFree(dt));
    free(h);
    free(perm);
    return 1;
}

/* A decode step as the host would issue it: `tokens` tokens of NS dependent PDL steps over W blocks, each token's steps
 * continuing the value chain of the token before (so every token's launches take other buffers: their arguments
 * change), issued three ways: launched one by one (`stream`); a graph captured once whose nodes get each token's
 * arguments through cudaGraphExecKernelNodeSetParams, then one cudaGraphLaunch (`graph-set`); the token captured
 * anew, cudaGraphExecUpdate into the instantiated graph, one launch (`graph-recap`). Prints the wall time a token
 * (host and GPU overlapped: the larger wins) and the host's time in the calls a token. */
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static void queue_tok(cudaStream_t s, int W, unsigned *buf, int t, int NS) {
    for (int i = 0; i < NS; i++) {
        const long k = (long)t * NS + i;
        launch_step(s, W, buf + (size_t)(k & 1) * W, buf + (size_t)((k + 1) & 1) * W, 1);
    }
}
static int run_tokens(int mode, int W, int NS, int tokens, cudaStream_t s, unsigned *buf) {
    static const char *nm[] = {"stream", "graph-set", "graph-recap"};
    CK(cudaMemsetAsync(buf, 0, 2 * (size_t)W * sizeof(unsigned), s));
    CK(cudaStreamSynchronize(s));
    cudaGraphExec_t ge = NULL;
    cudaGraphNode_t *nodes = NULL;
    size_t nn = 0;
    cudaGraph_t g0 = NULL; /* graph-set: its nodes are the handles the updates name */
    if (mode) { /* token 0 captured and instantiated before the clock starts */
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        queue_tok(s, W, buf, 0, NS);
        CK(cudaStreamEndCapture(s, &g0));
        CK(cudaGraphInstantiate(&ge, g0, 0));
        CK(cudaGraphGetNodes(g0, NULL, &nn));
        nodes = (cudaGraphNode_t *)malloc(nn * sizeof *nodes);
        CK(cudaGraphGetNodes(g0, nodes, &nn));
        if ((int)nn != NS) return fprintf(stderr, "chain_bench: captured %zu nodes, expected %d\n", nn, NS), 0;
    }
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double host = 0;
    CK(cudaEventRecord(a, s));
    for (int t = 0; t < tokens; t++) {
        const double h0 = now_us();
        if (mode == 0) queue_tok(s, W, buf, t, NS);
        else if (mode == 1) {
            for (int i = 0; i < NS; i++) { /* node i: step i of token t (capture order = chain order; the check below says if not) */
                const long k = (long)t * NS + i;
                unsigned *in = buf + (size_t)(k & 1) * W, *out = buf + (size_t)((k + 1) & 1) * W;
                int pdl = 1;
                void *args[] = {&in, &out, &pdl};
                cudaKernelNodeParams kp = {};
                kp.func = (void *)k_step, kp.gridDim = dim3((unsigned)W), kp.blockDim = dim3(256), kp.kernelParams = args;
                CK(cudaGraphExecKernelNodeSetParams(ge, nodes[i], &kp));
            }
            CK(cudaGraphLaunch(ge, s));
        } else {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            queue_tok(s, W, buf, t, NS);
            CK(cudaStreamEndCapture(s, &g));
            cudaGraphExecUpdateResultInfo info;
            CK(cudaGraphExecUpdate(ge, g, &info));
            CK(cudaGraphDestroy(g));
            CK(cudaGraphLaunch(ge, s));
        }
        host += now_us() - h0;
    }
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    const int ok = check(buf, W, tokens * NS);
    printf("token %-11s W=%-4d %d steps a token, %d tokens: %7.2f us a token (%5.3f us a step), host %7.2f us a token in the calls  %s\n", nm[mode], W, NS,
           tokens, ms * 1e3 / tokens, ms * 1e3 / tokens / NS, host / tokens, ok ? "ok" : "FAILED");
    if (ge) CK(cudaGraphExecDestroy(ge));
    if (g0) CK(cudaGraphDestroy(g0));
    free(nodes);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ok;
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 2000;
    if (N < 2 || N > 1000000) return fprintf(stderr, "chain_bench: N %d out of 2..1000000\n", N), 2;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    int clk = 0;
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persist, 256, 0));
    printf("device: %s, %d SMs, L2 %d MiB, persistent blocks an SM %d\n", pr.name, pr.multiProcessorCount, pr.l2CacheSize >> 20, per_sm);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int SM = pr.multiProcessorCount;
    unsigned *buf = NULL, *bar = NULL;
    CK(cudaMalloc(&buf, 2 * (size_t)SM * sizeof(unsigned)));
    CK(cudaMalloc(&bar, 64 * sizeof(unsigned)));
    CK(cudaHostAlloc((void **)&g_flag_h, sizeof(unsigned), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&g_flag_d, (void *)g_flag_h, 0));
    int ok = 1;
    const int Ws[] = {1, SM};
    for (int wi = 0; wi < 2; wi++)
        for (int arm = 0; arm <= A_CG; arm++) ok &= run_arm(arm, Ws[wi], N, s, buf, bar);
    for (int mode = 0; mode < 3; mode++) ok &= run_tokens(mode, SM, 41, 500, s, buf); /* ~41 launches: a Qwen3-shape token */
    chase((size_t)8 << 13, "L2", clk);    /* 8 MiB */
    chase((size_t)1 << 23, "DRAM", clk);  /* 1 GiB */
    return ok ? 0 : 1;
}
