/* backend.c - the registry of backends and the selected one (df_be). */
#include "backend/backend.h"
#include "deltafin.h"
#include "util/util.h"
#ifdef DF_CUDA
#include "backend/cuda/cuda.h"
#endif

#include <string.h>

const df_backend_ops *df_be = &df_backend_cpu;
int df_alloc_quiet;
_Thread_local int df_be_layer = -1;

static const df_backend_ops *const backends[] = {
    &df_backend_cpu, &df_backend_cpu_scalar,
#ifdef DF_CUDA
    &df_backend_cuda,
#endif
};

const df_backend_ops *df_backend_find(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

int df_backend_select(const char *name) {
    const df_backend_ops *b = df_backend_find(name);
    if (!b) return DF_EINPUT;
    df_be = b;
    return 0;
}

int df_backend_cuda_built(void) {
#ifdef DF_CUDA
    return 1;
#else
    return 0;
#endif
}

void df_backend_set_memory(int64_t budget, int64_t reserve, int64_t expert_bytes) {
#ifdef DF_CUDA
    if (df_be == &df_backend_cuda) df_cuda_set_memory(budget, reserve, expert_bytes);
#else
    (void)budget, (void)reserve, (void)expert_bytes;
#endif
}

int df_backend_choose(const char *name, char *err, size_t errlen) {
    if (!name || !*name) return 0;
    if (!strcmp(name, "auto")) {
#ifdef DF_CUDA
        if (df_cuda_available()) return df_backend_select("cuda");
#endif
        return df_backend_select("cpu");
    }
    if (!strcmp(name, "cuda")) {
#ifdef DF_CUDA
        if (!df_cuda_available())
            return df_err(err, errlen, DF_EUNSUPPORTED, "--backend cuda: no CUDA device is available (use --backend cpu or auto)");
        return df_backend_select("cuda");
#else
        return df_err(err, errlen, DF_EUNSUPPORTED, "--backend cuda: this deltafin was built without CUDA (rebuild with make CUDA=1)");
#endif
    }
    if (!strcmp(name, "cpu")) return df_backend_select("cpu");
    return df_err(err, errlen, DF_EINPUT, "--backend: expected cpu, cuda or auto, got '%s'", name);
}
