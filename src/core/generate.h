/* generate.h - internals of the generation step (src/core/generate.c); the
 * API is the generation section of include/deltafin.h.
 *
 * The stop-string scan is a pure function, kept here so that it can be
 * tested and reasoned about on its own.
 */
#ifndef DF_CORE_GENERATE_H
#define DF_CORE_GENERATE_H

#include "deltafin.h"

#include <stddef.h>

/* Looks for stop strings in text[final..len) (text[0..final) is known to
 * hold none and no start of one). Returns 1 and sets *cut to the first
 * occurrence's offset if there is one. Otherwise returns 0 and sets *cut
 * to the new final length: everything but a tail that could be the start of
 * a stop string (all of text when at_end). */
int df_stop_scan(const char *text, size_t len, size_t final, const char *const *stop, int n_stop, int at_end,
                 size_t *cut);

#endif
