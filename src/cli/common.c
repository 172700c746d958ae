/* common.c - helpers shared by the subcommands. */
#include "cli/cli.h"
#include "deltafin.h"

int df_exit_code(int rc) {
    switch (rc) {
    case DF_OK: return 0;
    case DF_EINPUT: case DF_EFORMAT: case DF_EUNSUPPORTED: return 2;
    default: return 1;
    }
}
