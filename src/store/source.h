/* source.h - where a routed expert's bytes come from.
 *
 * The model asks for "experts ids[0..k) of layer l" and is handed, for each,
 * pointers to its parts (gate data, [gate scale], up data, [up scale], down
 * data, [down scale]) as they become available. Resident weights (the model's
 * own memory), the expert cache over files and packs (store/ecache.c) and,
 * next, a VRAM tier implement this one interface, so the model's MoE code has
 * one path whatever the tier. A source deals in bytes and extents, never in
 * model structs: this header includes nothing from src/model.
 *
 * Invariant: parts handed to ready() stay valid until release(). */
#ifndef DF_STORE_SOURCE_H
#define DF_STORE_SOURCE_H

#include <stddef.h>
#include <stdint.h>

/* One contiguous piece of an expert in a weight file. */
typedef struct {
    int file;            /* index into the source's file list */
    uint64_t off, len;   /* absolute byte offset and length */
} df_extent;

#define DF_EXPERT_PARTS 6
/* Where one routed expert lives: its parts in order, and a checksum of
 * their bytes (in part order) when the store recorded one. */
typedef struct {
    int n_parts;         /* 0: no expert here (a dense layer) */
    df_extent part[DF_EXPERT_PARTS];
    uint64_t xxh3;
    int has_xxh3;
} df_expert_loc;

/* i >= 0: expert ids[i] is ready, parts[n_parts] point at its bytes.
 * i == -1: the source is about to wait for I/O, or is done: a caller may
 * compute what it has batched so far. */
typedef void (*df_expert_ready_fn)(void *ctx, int i, const uint8_t *const *parts);

typedef struct df_expert_source df_expert_source;
typedef struct {
    /* Makes experts ids[0..k) of layer l available and pinned; calls ready for
     * each (order unspecified) and ready(ctx, -1, NULL) at least once at the
     * end. pf_l/pf_ids/pf_k: a prediction of the next layer's experts (pf_k 0:
     * none), used only to warm the source. 0 or a negative DF_E* code. */
    int (*acquire)(df_expert_source *s, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k,
                   df_expert_ready_fn ready, void *ctx, char *err, size_t errlen);
    void (*release)(df_expert_source *s);   /* unpins what acquire pinned */
    int (*capacity)(const df_expert_source *s); /* most experts one acquire may pin */
    int (*wants_prediction)(const df_expert_source *s); /* whether pf_* are used (compute them only then) */
    void (*set_token)(df_expert_source *s, int64_t pos); /* position of the batch, for traces */
    /* Optional (NULL: none). DF_EXPERT_PARTS words that go with the bytes of expert e of layer l, which
     * acquire has pinned: 0 each time the source (re)loads those bytes, kept while they stay loaded, valid
     * until release(). A caller keeps there what it derived from a part's bytes (ffn.c: part p's FP8 NaN
     * codes, df_weight.nan_codes), so it derives it once per load, not once per use. NULL: the source has
     * none for this expert (the caller derives nothing, or derives it every time). */
    int *(*part_notes)(df_expert_source *s, int l, int e);
} df_expert_source_ops;

struct df_expert_source {
    const df_expert_source_ops *ops;
};

#endif
