/* backend.c - the registry of backends and the selected one (df_be). */
#include "backend/backend.h"
#include "deltafin.h"

#include <string.h>

const df_backend_ops *df_be = &df_backend_cpu;

static const df_backend_ops *const backends[] = {&df_backend_cpu, &df_backend_cpu_scalar};

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
