/* common.c - helpers shared by the subcommands. */
#include "cli/cli.h"
#include "deltafin.h"

#include <stdlib.h>
#include <string.h>

int df_exit_code(int rc) {
    switch (rc) {
    case DF_OK: return 0;
    case DF_EINPUT: case DF_EFORMAT: case DF_EUNSUPPORTED: return 2;
    default: return 1;
    }
}

/* The library reads no environment: the streaming switches documented in
 * docs/CLI.md are read here, once, into the options. */
static int env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

void df_cli_options_default(df_options *o) {
    df_options_default(o);
    const char *ev = getenv("DELTAFIN_EVICT");
    o->evict_lfu = ev && !strcmp(ev, "lfu");
    o->no_io_uring = env_set("DELTAFIN_NO_IO_URING");
    o->no_populate = env_set("DELTAFIN_NO_POPULATE");
    o->resident_embed = env_set("DELTAFIN_RESIDENT_EMBED");
    if (env_set("DELTAFIN_NO_PREFETCH")) o->prefetch = 2;
    const char *fm = getenv("DELTAFIN_FRESH_MEMORY");
    o->fresh_memory = fm && !strcmp(fm, "slow") ? 1 : fm && !strcmp(fm, "fast") ? 2 : 0;
}
