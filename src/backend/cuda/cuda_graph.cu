/* cuda_graph.cu - the launches of a step replayed as a CUDA graph (round 25; cuda_int.cuh says the contract).
 *
 * Why: on the H200 a dependent programmatic launch costs the GPU ~1.2 us and the host 3.2-4.8 us; a node of a graph
 * replayed with programmatic edges 0.8 us of GPU and, updated in place, 0.8 us of host (bench/cuda/chain_bench.cu,
 * docs/PERFORMANCE.md round 24). A decode step is the same sequence of kernels every token, with arguments that
 * change (positions, the cache length, the ticket): the sequence is recorded, and from its second sighting on replayed
 * as a graph whose nodes are given the arguments that changed.
 *
 * The backend launches on the legacy stream, which cannot be captured, so the graph is built node by node
 * (cudaGraphAddNode, an edge from each node to the next: programmatic, from the kernel's programmatic port, where
 * the launch was programmatic). Only a step's end (gr_flush_step: the host is about to read the step's result)
 * issues a graph; other flushes, and a step's first sighting, go out as launches; so does a step whose first launch
 * finds the GPU idle (launched as it comes: see g_direct). A sequence is keyed by its kernels in order; up to GR_CACHE
 * graphs are kept (the least recently used one goes). Sequences shorter than g_gr_min kernels are launched as
 * recorded. Any failure to build, instantiate, update or launch a graph (host memory for the recorder's buffers or a
 * graph's arrays included) is reported once and turns recording off: the launches go out as recorded, then every
 * later launch directly. */
#include "backend/cuda/cuda_int.cuh"

#define GR_MAXN 16384          /* records before a flush is forced */
#define GR_MAXA (GR_MAXN * 12) /* arguments */
#define GR_ARENA ((size_t)16 << 20)
#define GR_CACHE 8
#define GR_SEEN 64

typedef struct {
    const void *fn;
    dim3 g, b;
    unsigned sm;
    int pdl, nargs;
    uint32_t a0;         /* its first argument's index in g_aoff */
    uint32_t lo, hi;     /* its arguments' bytes in the arena */
    const char *op;      /* named by post() */
    int layer;
} GrRec;

typedef struct {
    int n;                 /* nodes; 0: a free entry */
    uint64_t key;
    const void **fn;       /* the kernels in order */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t *node;
    GrRec *last;           /* the shapes the nodes hold now */
    char *bytes;           /* the argument bytes they hold now */
    size_t nbytes;
    uint64_t used;
} GrGraph;

int g_gr_state = -1;
static int g_gr_min = 16, g_stats;
static pthread_mutex_t g_gr_mu = PTHREAD_MUTEX_INITIALIZER;
static GrRec *g_rec;
static int g_nrec;
static uint32_t *g_aoff;
static int g_naoff;
static void **g_ptr;
static char *g_arena;
static size_t g_an;
static GrGraph g_gc[GR_CACHE];
static uint64_t g_seen[GR_SEEN];
static int g_nseen;
static uint64_t g_tick;
/* A step the GPU waits for (nothing queued when its first launch comes: sampled decoding, a step not run ahead) goes
 * out launch by launch, as before round 25: recorded whole, the GPU would idle while the host records it (~140 us
 * for a DeepSeek-V3-shape token of 4 layers in round 25's trace). g_step_new: a step's end flushed since the last
 * launch; g_direct: this step's launches go out as they come. */
static int g_step_new = 1, g_direct, g_idle_check = 1;
#define GR_SITES 64
static struct { const char *file; int line; int64_t n, launches; } g_site[GR_SITES]; /* where flushes came from */
static int64_t g_st[7]; /* flushes, graph launches, graphs built, nodes updated, launches replayed directly, records */

/* NULL (said on stderr) where the host cannot give n bytes: the caller turns graphs off, launches go out as they come */
static void *gr_zalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) fprintf(stderr, "deltafin: cuda backend: graph recorder: out of host memory (%zu bytes)\n", n);
    return p;
}

/* the recorder's buffers (~16 MB), once; 0 if the host has not got them (nothing kept: recording stays off) */
static int gr_alloc(void) {
    if (g_rec) return 1;
    GrRec *rec = (GrRec *)gr_zalloc(GR_MAXN * sizeof *rec);
    uint32_t *aoff = rec ? (uint32_t *)gr_zalloc(GR_MAXA * sizeof *aoff) : NULL;
    void **ptr = aoff ? (void **)gr_zalloc(GR_MAXA * sizeof *ptr) : NULL;
    char *arena = ptr ? (char *)gr_zalloc(GR_ARENA) : NULL;
    if (!arena) {
        free(rec), free(aoff), free(ptr);
        fprintf(stderr, "deltafin: cuda backend: CUDA graphs off (DELTAFIN_CUDA_GRAPH=0 does the same)\n");
        return 0;
    }
    g_rec = rec, g_aoff = aoff, g_ptr = ptr, g_arena = arena;
    return 1;
}

/* DELTAFIN_CUDA_GRAPH_STATS=1: one line at exit (a measurement aid) */
static void gr_print(void) {
    fprintf(stderr, "deltafin: cuda: graphs: %lld flushes, %lld graph launches, %lld graphs built, %lld nodes updated, %lld launches direct, %lld recorded, "
                    "%lld steps found the GPU idle\n",
            (long long)g_st[0], (long long)g_st[1], (long long)g_st[2], (long long)g_st[3], (long long)g_st[4], (long long)g_st[5], (long long)g_st[6]);
    for (int i = 0; i < GR_SITES && g_site[i].file; i++)
        fprintf(stderr, "deltafin: cuda: graphs: flushed at %s:%d %lld times, %lld launches\n", g_site[i].file, g_site[i].line, (long long)g_site[i].n,
                (long long)g_site[i].launches);
}

/* Off with DELTAFIN_CUDA_GRAPH=0, with DELTAFIN_CUDA_SYNC (a wait after every op) and DELTAFIN_CUDA_PROF (timing
 * per op): those measure each launch as it goes. DELTAFIN_CUDA_GRAPH_MIN: the fewest kernels a graph is built for. */
int gr_init(void) {
    pthread_mutex_lock(&g_gr_mu);
    if (g_gr_state < 0) {
        const char *e = getenv("DELTAFIN_CUDA_GRAPH"), *s = getenv("DELTAFIN_CUDA_SYNC"), *p = getenv("DELTAFIN_CUDA_PROF"),
                   *m = getenv("DELTAFIN_CUDA_GRAPH_MIN");
        if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
            fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_GRAPH=%s is not 0 or 1: 1 (graphs on)\n", e);
        int on = !(e && *e && !strcmp(e, "0"));
        if ((s && *s && strcmp(s, "0")) || (p && *p && strcmp(p, "0"))) on = 0;
        if (m && *m) {
            char *end = NULL;
            const long v = strtol(m, &end, 10);
            if (*end || v < 2 || v > GR_MAXN)
                fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_GRAPH_MIN=%s is not an integer in 2..%d (the fewest launches a graph is built for): %d\n", m,
                        GR_MAXN, g_gr_min);
            else g_gr_min = (int)v;
        }
        const char *ps = getenv("DELTAFIN_CUDA_GRAPH_STATS");
        if (ps && !strcmp(ps, "1")) g_stats = 1, atexit(gr_print);
        if (on && !gr_alloc()) on = 0;
        g_gr_state = on;
    }
    pthread_mutex_unlock(&g_gr_mu);
    return g_gr_state > 0;
}

static void gr_flush_locked(int step);

void gr_begin(const void *fn, dim3 g, dim3 b, size_t sm, int pdl, int nargs, size_t bytes) {
    pthread_mutex_lock(&g_gr_mu);
    if (g_nrec == GR_MAXN || g_naoff + nargs > GR_MAXA || g_an + bytes > GR_ARENA) gr_flush_locked(0);
    if (g_step_new && !g_nrec && g_idle_check) { /* a step's first launch: is the GPU busy with the steps queued before it? */
        g_step_new = 0;
        g_direct = cudaStreamQuery(0) == cudaSuccess; /* (an error is left for the next synchronizing call to report) */
        if (g_direct) g_st[6]++;
    }
    GrRec *r = &g_rec[g_nrec++];
    r->fn = fn, r->g = g, r->b = b, r->sm = (unsigned)sm, r->pdl = pdl, r->nargs = nargs;
    r->a0 = (uint32_t)g_naoff, r->lo = r->hi = (uint32_t)g_an, r->op = "launch", r->layer = df_be_layer;
    g_st[5]++;
}
void *gr_arg(size_t size, size_t align) {
    g_an = (g_an + align - 1) & ~(align - 1);
    void *p = g_arena + g_an;
    g_aoff[g_naoff++] = (uint32_t)g_an;
    g_an += size;
    g_rec[g_nrec - 1].hi = (uint32_t)g_an;
    return p;
}
void gr_end(void) {
    if (g_direct) gr_flush_locked(0);
    pthread_mutex_unlock(&g_gr_mu);
}

void gr_note(const char *op) {
    pthread_mutex_lock(&g_gr_mu);
    if (g_nrec) g_rec[g_nrec - 1].op = op, g_rec[g_nrec - 1].layer = df_be_layer;
    pthread_mutex_unlock(&g_gr_mu);
}

static void gr_report(const GrRec *r, const char *what, cudaError_t e) {
    if (r && r->layer >= 0)
        fprintf(stderr, "deltafin: cuda backend: layer %d: %s: %s: %s (%s)\n", r->layer, r->op, what, cudaGetErrorString(e), cudaGetErrorName(e));
    else fprintf(stderr, "deltafin: cuda backend: %s: %s: %s (%s)\n", r ? r->op : "graph", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* records [i0, n) launched as recorded */
static void gr_direct(int i0) {
    for (int i = i0; i < g_nrec; i++) {
        const GrRec *r = &g_rec[i];
        cudaError_t e = cudaErrorNotSupported;
        if (r->pdl && pdl_on()) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1] = {};
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = r->g, cfg.blockDim = r->b, cfg.dynamicSmemBytes = r->sm, cfg.stream = 0, cfg.attrs = at, cfg.numAttrs = 1;
            e = cudaLaunchKernelExC(&cfg, r->fn, g_ptr + r->a0);
            if (e != cudaSuccess) pdl_refused(e);
        }
        if (e != cudaSuccess) e = cudaLaunchKernel(r->fn, r->g, r->b, g_ptr + r->a0, r->sm, 0);
        if (e != cudaSuccess) gr_report(r, "launch", e);
        g_st[4]++;
    }
}

static uint64_t gr_key(void) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)g_nrec;
    for (int i = 0; i < g_nrec; i++) h = (h ^ (uint64_t)(uintptr_t)g_rec[i].fn ^ ((uint64_t)g_rec[i].pdl << 63)) * 1099511628211ull;
    return h;
}
static int gr_same(const GrGraph *c, uint64_t key) {
    if (c->n != g_nrec || c->key != key) return 0;
    for (int i = 0; i < g_nrec; i++)
        if (c->fn[i] != g_rec[i].fn || c->last[i].pdl != g_rec[i].pdl) return 0;
    return 1;
}
static void gr_drop(GrGraph *c) {
    if (!c->n) return;
    cudaGraphExecDestroy(c->exec), cudaGraphDestroy(c->graph), cudaGetLastError();
    free(c->fn), free(c->node), free(c->last), free(c->bytes);
    memset(c, 0, sizeof *c);
}
static void gr_kp(const GrRec *r, cudaKernelNodeParams *kp) {
    *kp = cudaKernelNodeParams{};
    kp->func = (void *)r->fn, kp->gridDim = r->g, kp->blockDim = r->b, kp->sharedMemBytes = r->sm, kp->kernelParams = g_ptr + r->a0;
}
static void gr_off(const GrRec *r, const char *what, cudaError_t e) {
    gr_report(r, what, e);
    fprintf(stderr, "deltafin: cuda backend: CUDA graphs off from here (DELTAFIN_CUDA_GRAPH=0 does the same)\n");
    cudaGetLastError();
    g_gr_state = 0;
}

/* the graph of the records, built and instantiated; 0 on failure (reported, recording off) */
static int gr_build(GrGraph *c, uint64_t key) {
    cudaError_t e = cudaGraphCreate(&c->graph, 0);
    if (e != cudaSuccess) return gr_off(NULL, "graph create", e), 0;
    c->node = (cudaGraphNode_t *)gr_zalloc(g_nrec * sizeof *c->node);
    if (!c->node) {
        cudaGraphDestroy(c->graph);
        return gr_off(NULL, "graph nodes", cudaErrorMemoryAllocation), 0;
    }
    for (int i = 0; i < g_nrec; i++) {
        const GrRec *r = &g_rec[i];
        alignas(cudaGraphNodeParams) unsigned char npb[sizeof(cudaGraphNodeParams)]; /* a union with dim3s: no default constructor */
        memset(npb, 0, sizeof npb);
        cudaGraphNodeParams &np = *reinterpret_cast<cudaGraphNodeParams *>(npb);
        np.type = cudaGraphNodeTypeKernel;
        np.kernel.func = (void *)r->fn, np.kernel.gridDim = r->g, np.kernel.blockDim = r->b, np.kernel.sharedMemBytes = r->sm;
        np.kernel.kernelParams = g_ptr + r->a0;
        cudaGraphEdgeData ed;
        memset(&ed, 0, sizeof ed);
        if (r->pdl) ed.from_port = cudaGraphKernelNodePortProgrammatic, ed.type = cudaGraphDependencyTypeProgrammatic;
        e = cudaGraphAddNode(&c->node[i], c->graph, i ? &c->node[i - 1] : NULL, i ? &ed : NULL, i ? 1 : 0, &np);
        if (e != cudaSuccess) {
            cudaGraphDestroy(c->graph), free(c->node), c->node = NULL;
            return gr_off(r, "graph node", e), 0;
        }
    }
    e = cudaGraphInstantiate(&c->exec, c->graph, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(c->graph), free(c->node), c->node = NULL;
        return gr_off(&g_rec[0], "graph instantiate", e), 0;
    }
    c->n = g_nrec, c->key = key;
    c->fn = (const void **)gr_zalloc(g_nrec * sizeof *c->fn);
    c->last = c->fn ? (GrRec *)gr_zalloc(g_nrec * sizeof *c->last) : NULL;
    c->bytes = c->last ? (char *)gr_zalloc(g_an) : NULL, c->nbytes = g_an;
    if (!c->bytes) { /* (gr_drop frees what was had) */
        gr_drop(c);
        return gr_off(NULL, "graph arrays", cudaErrorMemoryAllocation), 0;
    }
    for (int i = 0; i < g_nrec; i++) c->fn[i] = g_rec[i].fn;
    memcpy(c->last, g_rec, g_nrec * sizeof *g_rec);
    memcpy(c->bytes, g_arena, g_an);
    g_st[2]++;
    return 1;
}

/* the graph's nodes given what changed since its last launch */
static int gr_update(GrGraph *c) {
    const int same_layout = c->nbytes == g_an;
    for (int i = 0; i < g_nrec; i++) {
        const GrRec *r = &g_rec[i], *l = &c->last[i];
        if (same_layout && r->lo == l->lo && r->hi == l->hi && r->sm == l->sm && r->g.x == l->g.x && r->g.y == l->g.y && r->g.z == l->g.z &&
            r->b.x == l->b.x && r->b.y == l->b.y && r->b.z == l->b.z && !memcmp(g_arena + r->lo, c->bytes + r->lo, r->hi - r->lo))
            continue;
        cudaKernelNodeParams kp;
        gr_kp(r, &kp);
        const cudaError_t e = cudaGraphExecKernelNodeSetParams(c->exec, c->node[i], &kp);
        if (e != cudaSuccess) return gr_off(r, "graph node update", e), 0;
        g_st[3]++;
    }
    memcpy(c->last, g_rec, g_nrec * sizeof *g_rec);
    if (!same_layout) {
        free(c->bytes), c->bytes = (char *)gr_zalloc(g_an), c->nbytes = g_an;
        if (!c->bytes) { /* the nodes hold this step's arguments, but what they hold is no longer known: the graph goes */
            gr_drop(c);
            return gr_off(NULL, "graph arguments", cudaErrorMemoryAllocation), 0;
        }
    }
    memcpy(c->bytes, g_arena, g_an);
    return 1;
}

static void gr_flush_locked(int step) {
    if (!g_nrec) return;
    g_st[0]++;
    for (int i = 0; i < g_nrec; i++)
        for (int j = 0; j < g_rec[i].nargs; j++) g_ptr[g_rec[i].a0 + j] = g_arena + g_aoff[g_rec[i].a0 + j];
    int done = 0;
    if (step && g_gr_state > 0 && g_nrec >= g_gr_min) {
        const uint64_t key = gr_key();
        GrGraph *c = NULL;
        for (int i = 0; i < GR_CACHE && !c; i++)
            if (gr_same(&g_gc[i], key)) c = &g_gc[i];
        int fresh = 0;
        if (!c) {
            int seen = 0;
            for (int i = 0; i < g_nseen && i < GR_SEEN; i++) seen |= g_seen[i] == key;
            if (!seen) g_seen[g_nseen++ % GR_SEEN] = key; /* the first sighting goes out as launches */
            else {
                c = &g_gc[0];
                for (int i = 1; i < GR_CACHE; i++)
                    if (!g_gc[i].n || (c->n && g_gc[i].used < c->used)) c = &g_gc[i];
                gr_drop(c);
                fresh = gr_build(c, key);
                if (!fresh) c = NULL;
            }
        }
        if (c && (fresh || gr_update(c))) {
            c->used = ++g_tick;
            const cudaError_t e = cudaGraphLaunch(c->exec, 0);
            if (e == cudaSuccess) done = 1, g_st[1]++;
            else gr_off(&g_rec[0], "graph launch", e);
        }
    }
    if (!done) gr_direct(0);
    g_nrec = 0, g_naoff = 0, g_an = 0;
}

void gr_flush_at(const char *file, int line, int step) {
    if (g_gr_state <= 0 && !g_nrec) return;
    pthread_mutex_lock(&g_gr_mu);
    if (step) g_step_new = 1, g_direct = 0;
    if (g_nrec && g_stats) /* where flushes come from: only for DELTAFIN_CUDA_GRAPH_STATS */
        for (int i = 0; i < GR_SITES; i++)
            if (!g_site[i].file || (g_site[i].line == line && !strcmp(g_site[i].file, file))) {
                g_site[i].file = file, g_site[i].line = line, g_site[i].n++, g_site[i].launches += g_nrec;
                break;
            }
    gr_flush_locked(step);
    pthread_mutex_unlock(&g_gr_mu);
}

extern "C" void df_cuda_set_graph(int on, int min_nodes) {
    gr_flush_at("df_cuda_set_graph", 0, 0);
    if (on && g_gr_state < 0) gr_init();
    pthread_mutex_lock(&g_gr_mu);
    if (on && !gr_alloc()) on = 0;
    g_gr_state = on ? 1 : 0;
    if (min_nodes >= 2) g_gr_min = min_nodes;
    pthread_mutex_unlock(&g_gr_mu);
}
extern "C" void df_cuda_set_graph_idle_check(int on) {
    pthread_mutex_lock(&g_gr_mu);
    g_idle_check = on != 0, g_direct = 0;
    pthread_mutex_unlock(&g_gr_mu);
}
extern "C" void df_cuda_graph_stats(int64_t out[7]) {
    pthread_mutex_lock(&g_gr_mu);
    memcpy(out, g_st, sizeof g_st);
    pthread_mutex_unlock(&g_gr_mu);
}
