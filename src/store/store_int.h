/* store_int.h - internals shared by store.c (opening a store: manifest
 * validation, attach, spine verification) and store_setup.c (the setup
 * writer). Not a public header.
 */
#ifndef DF_STORE_STORE_INT_H
#define DF_STORE_STORE_INT_H

#include "store/store.h"

#include <stdint.h>
#include <string.h>

#define FORMAT_VERSION DF_STORE_FORMAT_VERSION
/* Parses "PREFIX.{gate,up,down}_proj.{weight,weight_scale_inv,weight_packed,weight_scale}",
 * PREFIX being fmt (DF_STORE_EXPERT_FMT) with layer and expert spelled
 * canonically, into layer, expert and the part's rank (proj * 2 + is_scale);
 * 0 if not an expert part. */
int store_expert_part(const df_store_layout *lay, const char *name, int *l, int *e, int *rank);

/* Parses exactly 16 lowercase/uppercase hex digits; -1 if s is not that. */
static inline int parse_hex16(const char *s, uint64_t *v) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 0;
}

#endif
