/* ktrace.c - a CUPTI activity tracer loaded by the CUDA driver (CUDA_INJECTION64_PATH=libktrace.so), for the GPU
 * machine, which has CUPTI but not Nsight Systems (issue 13 item 5a; bench/cuda/crit_path.py reads its output).
 *
 *   CUDA_INJECTION64_PATH=.../libktrace.so KTRACE_OUT=trace.txt deltafin run --backend cuda ...
 *
 * Records every kernel (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels keep running concurrently, programmatic
 * launches included) and every memory copy, with the GPU's start and end timestamps (ns), and writes at exit one line
 * each:  K start end gridX gridY gridZ blockX name   /   M start end copyKind bytes
 * and, with KTRACE_API set, every CUDA runtime call on the host (the same clock):  R start end threadId name
 * Build: cc -O2 -shared -fPIC -I$CUDA/include -o libktrace.so ktrace.c -L$CUDA/lib -lcupti */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;

static void CUPTIAPI buf_req(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K %llu %llu %d %d %d %d %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->gridX,
                    k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *nm = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &nm) != CUPTI_SUCCESS || !nm) nm = "?";
            fprintf(out, "R %llu %llu %u %s\n", (unsigned long long)a->start, (unsigned long long)a->end, (unsigned)a->threadId, nm);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "M %llu %llu %u %llu\n", (unsigned long long)m->start, (unsigned long long)m->end, (unsigned)m->copyKind,
                    (unsigned long long)m->bytes);
        }
    }
    free(buf);
}

static void at_end(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out), out = NULL;
}

int InitializeInjection(void) {
    const char *p = getenv("KTRACE_OUT");
    if (!(out = fopen(p && *p ? p : "ktrace.txt", "w"))) return 0;
    if (cuptiActivityRegisterCallbacks(buf_req, buf_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        (getenv("KTRACE_API") && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)) {
        fprintf(stderr, "ktrace: CUPTI activity tracing refused\n");
        return 0;
    }
    atexit(at_end);
    return 1;
}
