/* safetensors.c - see safetensors.h.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {...}}, then the data section; offsets are relative to
 * the start of the data section. */
#include "format/safetensors.h"
#include "deltafin.h"

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEADER (100u << 20) /* 100 MB, as the reference implementation */

typedef struct {
    df_mapped map;
} st_file;

struct df_st_set {
    st_file *files;
    int n_files;
    df_st_tensor *t;
    int n, cap;
    /* open-addressing hash of names -> index+1 */
    int *hash;
    int hash_cap;
    int resident;
};

static const struct { const char *name; int size; } dtypes[DF_ST_N_DTYPES] = {
    [DF_ST_F32] = {"F32", 4},       [DF_ST_F16] = {"F16", 2},     [DF_ST_BF16] = {"BF16", 2},
    [DF_ST_F64] = {"F64", 8},       [DF_ST_F8_E4M3] = {"F8_E4M3", 1}, [DF_ST_F8_E5M2] = {"F8_E5M2", 1},
    [DF_ST_I8] = {"I8", 1},         [DF_ST_U8] = {"U8", 1},       [DF_ST_I16] = {"I16", 2},
    [DF_ST_I32] = {"I32", 4},       [DF_ST_I64] = {"I64", 8},     [DF_ST_BOOL] = {"BOOL", 1},
};

const char *df_st_dtype_name(df_st_dtype t) { return t < DF_ST_N_DTYPES ? dtypes[t].name : "?"; }
int df_st_dtype_size(df_st_dtype t) { return t < DF_ST_N_DTYPES ? dtypes[t].size : 0; }

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void rehash(df_st_set *s) {
    free(s->hash);
    s->hash_cap = 64;
    while (s->hash_cap < s->n * 2 + 2) s->hash_cap *= 2;
    s->hash = df_xcalloc((size_t)s->hash_cap, sizeof(int));
    for (int i = 0; i < s->n; i++) {
        uint64_t h = hash_str(s->t[i].name) & (uint64_t)(s->hash_cap - 1);
        while (s->hash[h]) h = (h + 1) & (uint64_t)(s->hash_cap - 1);
        s->hash[h] = i + 1;
    }
}

/* Adds the newest tensor to the name index (growing it when half full). */
static void index_last(df_st_set *s) {
    if (s->n * 2 + 2 > s->hash_cap) { rehash(s); return; }
    uint64_t h = hash_str(s->t[s->n - 1].name) & (uint64_t)(s->hash_cap - 1);
    while (s->hash[h]) h = (h + 1) & (uint64_t)(s->hash_cap - 1);
    s->hash[h] = s->n;
}

const df_st_tensor *df_st_find(const df_st_set *s, const char *name) {
    if (!s->hash_cap) return NULL;
    uint64_t h = hash_str(name) & (uint64_t)(s->hash_cap - 1);
    while (s->hash[h]) {
        const df_st_tensor *t = &s->t[s->hash[h] - 1];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & (uint64_t)(s->hash_cap - 1);
    }
    return NULL;
}

int df_st_count(const df_st_set *s) { return s->n; }
const df_st_tensor *df_st_at(const df_st_set *s, int i) { return &s->t[i]; }
const char *df_st_file_path(const df_st_set *s, int i) { return s->files[i].map.path; }
int df_st_file_fd(const df_st_set *s, int i) { return s->files[i].map.fd; }
int df_st_n_files(const df_st_set *s) { return s->n_files; }
const uint8_t *df_st_file_data(const df_st_set *s, int i, size_t *size) {
    *size = s->files[i].map.resident ? 0 : s->files[i].map.size;
    return s->files[i].map.resident ? NULL : s->files[i].map.data;
}

void df_st_unmap(df_st_set *s) {
    for (int i = 0; i < s->n_files; i++) {
        char *p = s->files[i].map.path;
        s->files[i].map.path = NULL;
        df_unmap_file(&s->files[i].map);
        s->files[i].map.path = p;
    }
    for (int i = 0; i < s->n; i++) s->t[i].data = NULL;
}

int df_st_dtype_from_name(const char *name) {
    for (int i = 0; i < DF_ST_N_DTYPES; i++)
        if (!strcmp(name, dtypes[i].name)) return i;
    return -1;
}

int df_st_add_virtual(df_st_set *s, const char *name, df_st_dtype dtype, int n_dims, const int64_t *shape, const char *path,
                      uint64_t off, uint64_t nbytes, char *err, size_t errlen) {
    if (df_st_find(s, name)) return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s' appears twice", path, name);
    if (n_dims < 0 || n_dims > 8) return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': %d dims", path, name, n_dims);
    uint64_t nel = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || (shape[i] && nel > UINT64_MAX / (uint64_t)shape[i])) return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': bad shape", path, name);
        nel *= (uint64_t)shape[i];
    }
    if (nel * (uint64_t)dtypes[dtype].size != nbytes)
        return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': shape and dtype %s need %llu bytes, the store records %llu", path, name,
                      dtypes[dtype].name, (unsigned long long)(nel * (uint64_t)dtypes[dtype].size), (unsigned long long)nbytes);
    int fi = -1;
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->files[i].map.path, path)) fi = i;
    if (fi < 0) {
        s->files = df_xrealloc(s->files, (size_t)(s->n_files + 1) * sizeof *s->files);
        memset(&s->files[s->n_files], 0, sizeof s->files[s->n_files]);
        s->files[s->n_files].map.fd = -1;
        s->files[s->n_files].map.path = df_xstrdup(path);
        fi = s->n_files++;
    }
    df_st_tensor t = {0};
    t.name = df_xstrdup(name);
    t.dtype = dtype;
    t.n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t.shape[i] = shape[i];
    t.nbytes = nbytes;
    t.file_offset = off;
    t.file_index = fi;
    if (s->n == s->cap) s->t = df_xrealloc(s->t, (size_t)(s->cap = s->cap ? s->cap * 2 : 64) * sizeof *s->t);
    s->t[s->n++] = t;
    index_last(s);
    return 0;
}

void df_st_close(df_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->t);
    for (int i = 0; i < s->n_files; i++) df_unmap_file(&s->files[i].map);
    free(s->files);
    free(s->hash);
    free(s);
}

static int cmp_range(const void *a, const void *b) {
    const df_st_tensor *x = *(df_st_tensor *const *)a, *y = *(df_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Parses one file's header and appends its tensors (file_index fi) to s. */
static int parse_into(df_st_set *s, const uint8_t *buf, size_t size, const char *name, int fi, char *err, size_t errlen) {
    if (size < 8)
        return df_err(err, errlen, DF_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", name, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > MAX_HEADER)
        return df_err(err, errlen, DF_EFORMAT, "%s: header length %llu exceeds the limit of %u bytes", name,
                      (unsigned long long)hlen, MAX_HEADER);
    if (hlen > size - 8)
        return df_err(err, errlen, DF_EFORMAT, "%s: header length %llu but only %zu bytes follow (truncated file?)",
                      name, (unsigned long long)hlen, size - 8);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return df_err(err, errlen, DF_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)", name, je.text, je.position);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = df_err(err, errlen, DF_EFORMAT, "%s: header must be a JSON object", name);
        goto done;
    }
    int first = s->n;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: __metadata__ must be an object", name); goto done; }
            continue;
        }
        if (!json_is_object(v)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': entry must be an object", name, key); goto done; }
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': needs string dtype, array shape, and data_offsets [begin, end]", name, key);
            goto done;
        }
        df_st_tensor t = {0};
        const char *ds = json_string_value(jd);
        int dt = -1;
        for (int i = 0; i < DF_ST_N_DTYPES; i++)
            if (!strcmp(ds, dtypes[i].name)) dt = i;
        if (dt < 0) { rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: tensor '%s': unsupported dtype \"%s\"", name, key, ds); goto done; }
        t.dtype = (df_st_dtype)dt;
        if (json_array_size(js) > 8) { rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': %zu dims, at most 8 supported", name, key, json_array_size(js)); goto done; }
        t.n_dims = (int)json_array_size(js);
        uint64_t nel = 1;
        int overflow = 0;
        for (int i = 0; i < t.n_dims; i++) {
            json_t *d = json_array_get(js, (size_t)i);
            if (!json_is_integer(d) || json_integer_value(d) < 0) { rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", name, key, i); goto done; }
            t.shape[i] = json_integer_value(d);
            if (t.shape[i] && nel > UINT64_MAX / (uint64_t)t.shape[i]) overflow = 1;
            nel *= (uint64_t)t.shape[i];
        }
        json_t *b0 = json_array_get(jo, 0), *b1 = json_array_get(jo, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 || json_integer_value(b1) < json_integer_value(b0)) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': data_offsets must be integers with 0 <= begin <= end", name, key);
            goto done;
        }
        uint64_t beg = (uint64_t)json_integer_value(b0), end = (uint64_t)json_integer_value(b1);
        uint64_t want = nel * (uint64_t)dtypes[dt].size;
        if (overflow || (nel && want / nel != (uint64_t)dtypes[dt].size) || want != end - beg) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': shape and dtype %s need %llu bytes but data_offsets span %llu",
                         name, key, ds, (unsigned long long)want, (unsigned long long)(end - beg));
            goto done;
        }
        if (end > dsize) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': data_offsets end %llu is past the data section (%llu bytes; truncated file?)",
                         name, key, (unsigned long long)end, (unsigned long long)dsize);
            goto done;
        }
        if (df_st_find(s, key)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s' appears twice in the checkpoint", name, key); goto done; }
        t.name = df_xstrdup(key);
        t.data = data + beg;
        t.nbytes = end - beg;
        t.file_offset = 8 + hlen + beg;
        t.file_index = fi;
        if (s->n == s->cap) s->t = df_xrealloc(s->t, (size_t)(s->cap = s->cap ? s->cap * 2 : 64) * sizeof *s->t);
        s->t[s->n++] = t;
        index_last(s);
    }
    /* overlap check within this file */
    {
        int cnt = s->n - first;
        df_st_tensor **v2 = df_xmalloc((size_t)(cnt ? cnt : 1) * sizeof *v2);
        for (int i = 0; i < cnt; i++) v2[i] = &s->t[first + i];
        qsort(v2, (size_t)cnt, sizeof *v2, cmp_range);
        for (int i = 1; i < cnt; i++)
            if (v2[i - 1]->data + v2[i - 1]->nbytes > v2[i]->data && v2[i]->nbytes && v2[i - 1]->nbytes) {
                rc = df_err(err, errlen, DF_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data section", name, v2[i - 1]->name, v2[i]->name);
                break;
            }
        free(v2);
    }
done:
    json_decref(root);
    return rc;
}

df_st_set *df_st_parse(const uint8_t *buf, size_t size, const char *name, char *err, size_t errlen) {
    df_st_set *s = df_xcalloc(1, sizeof *s);
    if (parse_into(s, buf, size, name, 0, err, errlen) != 0) {
        df_st_close(s);
        return NULL;
    }
    return s;
}

static int add_file(df_st_set *s, const char *path, char *err, size_t errlen) {
    s->files = df_xrealloc(s->files, (size_t)(s->n_files + 1) * sizeof *s->files);
    st_file *f = &s->files[s->n_files];
    int rc = s->resident ? df_load_file(path, &f->map, err, errlen) : df_map_file(path, &f->map, err, errlen);
    if (rc) return rc;
    s->n_files++;
    return parse_into(s, f->map.data, f->map.size, path, s->n_files - 1, err, errlen);
}

df_st_set *df_st_open_file(const char *path, char *err, size_t errlen) {
    df_st_set *s = df_xcalloc(1, sizeof *s);
    if (add_file(s, path, err, errlen) != 0) { df_st_close(s); return NULL; }
    return s;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

df_st_set *df_st_open_dir(const char *dir, char *err, size_t errlen) { return df_st_open_dir2(dir, 0, err, errlen); }

df_st_set *df_st_open_dir2(const char *dir, int resident, char *err, size_t errlen) {
    df_st_set *s = df_xcalloc(1, sizeof *s);
    s->resident = resident;
    char *idx = df_path_join(dir, "model.safetensors.index.json");
    int rc = 0;
    if (df_file_exists(idx)) {
        json_error_t je;
        json_t *root = json_load_file(idx, 0, &je);
        json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
        if (!root) rc = df_err(err, errlen, DF_EFORMAT, "%s: not valid JSON: %s (line %d)", idx, je.text, je.line);
        else if (!json_is_object(wm)) rc = df_err(err, errlen, DF_EFORMAT, "%s: missing object \"weight_map\"", idx);
        /* open each distinct shard once, in name order */
        char **names = NULL;
        size_t nn = 0;
        const char *key;
        json_t *v;
        if (!rc) json_object_foreach(wm, key, v) {
            if (!json_is_string(v)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: weight_map[\"%s\"] must be a file name", idx, key); break; }
            const char *fn = json_string_value(v);
            if (strchr(fn, '/') || !strcmp(fn, "..")) { rc = df_err(err, errlen, DF_EFORMAT, "%s: weight_map[\"%s\"] = \"%s\" is not a plain file name", idx, key, fn); break; }
            size_t i;
            for (i = 0; i < nn; i++) if (!strcmp(names[i], fn)) break;
            if (i == nn) { names = df_xrealloc(names, (nn + 1) * sizeof *names); names[nn++] = df_xstrdup(fn); }
        }
        if (!rc) qsort(names, nn, sizeof *names, cmp_str);
        for (size_t i = 0; i < nn && !rc; i++) {
            char *p = df_path_join(dir, names[i]);
            rc = add_file(s, p, err, errlen);
            free(p);
        }
        if (!rc) json_object_foreach(wm, key, v) {
            const df_st_tensor *t = df_st_find(s, key);
            if (!t) { rc = df_err(err, errlen, DF_EFORMAT, "%s: weight_map names tensor '%s' in %s, but that file does not contain it", idx, key, json_string_value(v)); break; }
            const char *actual = strrchr(df_st_file_path(s, t->file_index), '/');
            actual = actual ? actual + 1 : df_st_file_path(s, t->file_index);
            if (strcmp(actual, json_string_value(v))) { rc = df_err(err, errlen, DF_EFORMAT, "%s: weight_map puts tensor '%s' in %s, but it is in %s", idx, key, json_string_value(v), actual); break; }
        }
        if (!rc && (size_t)s->n != json_object_size(wm))
            rc = df_err(err, errlen, DF_EFORMAT, "%s: weight_map lists %zu tensors but the shards hold %d", idx, json_object_size(wm), s->n);
        for (size_t i = 0; i < nn; i++) free(names[i]);
        free(names);
        json_decref(root);
    } else {
        DIR *d = opendir(dir);
        if (!d) rc = df_err(err, errlen, DF_EIO, "%s: cannot open directory", dir);
        char **names = NULL;
        size_t nn = 0;
        struct dirent *de;
        while (d && (de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                names = df_xrealloc(names, (nn + 1) * sizeof *names);
                names[nn++] = df_xstrdup(de->d_name);
            }
        }
        if (d) closedir(d);
        if (!rc && !nn) rc = df_err(err, errlen, DF_EINPUT, "%s: no model.safetensors.index.json and no *.safetensors files", dir);
        if (!rc) qsort(names, nn, sizeof *names, cmp_str);
        for (size_t i = 0; i < nn && !rc; i++) {
            char *p = df_path_join(dir, names[i]);
            rc = add_file(s, p, err, errlen);
            free(p);
        }
        for (size_t i = 0; i < nn; i++) free(names[i]);
        free(names);
    }
    free(idx);
    if (rc) { df_st_close(s); return NULL; }
    return s;
}
