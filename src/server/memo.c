/* memo.c - exact answers to recent deterministic requests (see oai_int.h).
 *
 * A doubly linked list, most recently used first, under one mutex; keys are
 * compared by FNV-1a hash, then length and bytes. An answer larger than a
 * quarter of the byte budget is not kept.
 */
#include "server/oai_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    struct entry *prev, *next;
    uint64_t hash;
    char *key;
    size_t klen;
    df_memo_answer a;
    size_t bytes;
} entry;

struct df_memo {
    pthread_mutex_t mu;
    int max_n, n;
    size_t max_bytes, bytes;
    entry *head, *tail; /* most recently used first */
};

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ull; }
    return h;
}

static void unlink_entry(df_memo *m, entry *x) {
    if (x->prev) x->prev->next = x->next; else m->head = x->next;
    if (x->next) x->next->prev = x->prev; else m->tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(df_memo *m, entry *x) {
    x->next = m->head;
    x->prev = NULL;
    if (m->head) m->head->prev = x; else m->tail = x;
    m->head = x;
}

void df_memo_answer_free(df_memo_answer *a) {
    free(a->text);
    free(a->logprobs);
    a->text = a->logprobs = NULL;
}

static void entry_free(entry *x) {
    free(x->key);
    df_memo_answer_free(&x->a);
    free(x);
}

df_memo *df_memo_new(int max_entries, size_t max_bytes) {
    df_memo *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->max_n = max_entries;
    m->max_bytes = max_bytes;
    return m;
}

void df_memo_free(df_memo *m) {
    if (!m) return;
    while (m->head) {
        entry *x = m->head;
        unlink_entry(m, x);
        entry_free(x);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int df_memo_get(df_memo *m, const char *key, size_t klen, df_memo_answer *out) {
    memset(out, 0, sizeof *out);
    uint64_t h = fnv1a(key, klen);
    int hit = 0;
    pthread_mutex_lock(&m->mu);
    for (entry *x = m->head; x; x = x->next) {
        if (x->hash != h || x->klen != klen || memcmp(x->key, key, klen)) continue;
        unlink_entry(m, x);
        push_front(m, x);
        *out = x->a;
        out->text = malloc(x->a.tlen + 1);
        if (out->text) memcpy(out->text, x->a.text, x->a.tlen + 1);
        out->logprobs = x->a.logprobs ? strdup(x->a.logprobs) : NULL;
        hit = out->text && (!x->a.logprobs || out->logprobs);
        break;
    }
    pthread_mutex_unlock(&m->mu);
    if (!hit) df_memo_answer_free(out);
    return hit;
}

void df_memo_put(df_memo *m, char *key, size_t klen, df_memo_answer *a) {
    entry *x = calloc(1, sizeof *x);
    if (!x) { free(key); df_memo_answer_free(a); return; }
    x->key = key;
    x->klen = klen;
    x->hash = fnv1a(key, klen);
    x->a = *a;
    a->text = a->logprobs = NULL;
    x->bytes = sizeof *x + klen + x->a.tlen + (x->a.logprobs ? strlen(x->a.logprobs) : 0);
    if (x->bytes > m->max_bytes / 4) { entry_free(x); return; }
    pthread_mutex_lock(&m->mu);
    for (entry *y = m->head; y; y = y->next)
        if (y->hash == x->hash && y->klen == klen && !memcmp(y->key, key, klen)) {
            pthread_mutex_unlock(&m->mu);
            entry_free(x);
            return;
        }
    push_front(m, x);
    m->n++;
    m->bytes += x->bytes;
    while (m->tail && (m->n > m->max_n || m->bytes > m->max_bytes)) {
        entry *old = m->tail;
        unlink_entry(m, old);
        m->n--;
        m->bytes -= old->bytes;
        entry_free(old);
    }
    pthread_mutex_unlock(&m->mu);
}
