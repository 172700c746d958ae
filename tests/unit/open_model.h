/* open_model.h - a test model opened with the default options on 2 threads, or NULL with the reason on stderr.
 * Included by one test file per binary (tests/data/models, from the repository root). */
#ifndef DF_TEST_OPEN_MODEL_H
#define DF_TEST_OPEN_MODEL_H
#include "deltafin.h"

#include <stdio.h>

static df_engine *open_model(const char *dir) {
    df_options o;
    df_options_default(&o);
    o.n_threads = 2;
    char err[512];
    df_engine *e = df_engine_open(dir, &o, err, sizeof err);
    if (!e) fprintf(stderr, "cannot open %s: %s\n", dir, err);
    return e;
}

#endif
