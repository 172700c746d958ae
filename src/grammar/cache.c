/* cache.c - a process-wide cache of compiled grammars, so that requests
 * with the same schema share one automaton and its per-node mask caches
 * (the first request pays for building them, the next ones find them warm:
 * docs/PERFORMANCE.md). Grammars are reference-counted: the cache holds one
 * reference, each user one more; df_grammar_free drops one. */
#include "grammar/grammar_int.h"

#include <stdlib.h>
#include <string.h>

#define SLOTS 8

static struct {
    char *key;      /* root "\n" text */
    size_t klen;
    df_grammar *g;
    uint64_t used;
} slots[SLOTS];
static uint64_t clock_;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int df_grammar_compile_cached(const char *text, size_t len, const char *root, df_grammar **out, char *err,
                              size_t errlen) {
    *out = NULL;
    if (!root || !*root) root = "root";
    size_t rl = strlen(root), kl = rl + 1 + len;
    char *key = malloc(kl ? kl : 1);
    if (!key) return df_err(err, errlen, DF_ENOMEM, "grammar: out of memory");
    memcpy(key, root, rl);
    key[rl] = '\n';
    memcpy(key + rl + 1, text, len);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].g && slots[i].klen == kl && !memcmp(slots[i].key, key, kl)) {
            slots[i].used = ++clock_;
            atomic_fetch_add(&slots[i].g->refs, 1);
            *out = slots[i].g;
            pthread_mutex_unlock(&mu);
            free(key);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    df_grammar *g;
    int rc = df_grammar_compile(text, len, root, &g, err, errlen);
    if (rc) { free(key); return rc; }
    pthread_mutex_lock(&mu);
    int v = 0;
    for (int i = 1; i < SLOTS; i++)
        if (!slots[i].g || (slots[v].g && slots[i].used < slots[v].used)) v = i;
    df_grammar *old = slots[v].g;
    free(slots[v].key);
    slots[v].key = key;
    slots[v].klen = kl;
    slots[v].g = g;
    slots[v].used = ++clock_;
    atomic_fetch_add(&g->refs, 1); /* the cache's and the caller's */
    pthread_mutex_unlock(&mu);
    df_grammar_free(old);
    *out = g;
    return 0;
}
