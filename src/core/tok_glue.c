/* tok_glue.c - engine-side tokenizer calls (temporary: until the tokenizer
 * module is wired in, models run with --ids only). */
#include "deltafin.h"
#include <stdlib.h>
int df_has_tokenizer(const df_engine *e) { (void)e; return 0; }
int df_engine_adds_bos(const df_engine *e) { (void)e; return 0; }
int df_tokenize(df_engine *e, const char *text, size_t len, int32_t **ids, size_t *n) { (void)e; (void)text; (void)len; *ids = NULL; *n = 0; return DF_EUNSUPPORTED; }
int df_chat_render(df_engine *e, const char *m, const char *t, int g, char **out) { (void)e; (void)m; (void)t; (void)g; *out = NULL; return DF_EUNSUPPORTED; }
df_detok *df_detok_new(df_engine *e) { (void)e; return NULL; }
void df_detok_free(df_detok *d) { (void)d; }
const char *df_detok_push(df_detok *d, int32_t id, size_t *n) { (void)d; (void)id; *n = 0; return ""; }
const char *df_detok_flush(df_detok *d, size_t *n) { (void)d; *n = 0; return ""; }
