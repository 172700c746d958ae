/* template.h - a Jinja2-subset renderer for Hugging Face chat templates.
 *
 * The output is byte-identical to what transformers' apply_chat_template
 * renders with jinja2 configured as transformers configures it:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]) plus its own tojson, raise_exception,
 * strftime_now, namespace and dict globals. docs/CHAT_TEMPLATES.md lists the
 * supported subset.
 *
 * Invariants: a parsed df_template is immutable and may be rendered from
 * several threads at once (each render owns its own memory arena). Every
 * error is a negative DF_E* code plus a one-line message; nothing here
 * exits, aborts or prints. Rendering is bounded in steps, memory and output
 * size (df_template_set_limits), so a hostile template cannot hang or
 * exhaust the process.
 */
#ifndef DF_TOK_TEMPLATE_H
#define DF_TOK_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct df_template df_template;

/* Parses a template source (UTF-8). Returns NULL and writes a message naming
 * the line and column into err on a syntax error or unsupported syntax
 * (DF_EUNSUPPORTED-class problems are reported the same way). */
df_template *df_template_parse(const char *src, char *err, size_t errlen);

/* Renders t with the variables of context_json (a JSON object: messages,
 * tools, add_generation_prompt, bos_token, eos_token and any extras such as
 * enable_thinking). On success *out is a malloc'd NUL-terminated string of
 * *out_len bytes (it may contain NUL bytes if the data does). Returns 0, or
 * DF_EINPUT (bad context, raise_exception - err is then exactly the
 * template's message - a runtime error such as an undefined attribute, or a
 * limit of df_template_set_limits / nesting, whose message names it),
 * DF_EUNSUPPORTED (a feature outside the subset) or DF_ENOMEM (malloc
 * failed). */
int df_template_render(const df_template *t, const char *context_json, char **out, size_t *out_len,
                       char *err, size_t errlen);

void df_template_free(df_template *t);

/* Resource limits of one render (0 keeps the current value). Defaults:
 * 64 MiB of output, 256 MiB of working memory, 20 million evaluation steps
 * (string and container work is charged too, at its measured cost per byte
 * or item; see template_int.h), and 256 nested macro calls. Fixed limits: 256 levels of
 * nesting in the source (brackets, blocks, syntax-tree depth) and in values,
 * 2048 levels of evaluator recursion, % format width/precision 100000.
 * docs/CHAT_TEMPLATES.md lists the messages. */
void df_template_set_limits(df_template *t, size_t max_output, size_t max_memory, uint64_t max_steps);

/* ---- chat helpers (what apply_chat_template does around the render) ---- */

/* Reads a tokenizer_config.json (text in config_json, its path in name for
 * messages) and returns the chat template source (chat_template as a string
 * or a list of {name, template}: "tool_use" when want_tools and present,
 * else "default") and a JSON object of the special-token variables
 * (bos_token, eos_token, unk_token, pad_token, ... as strings, from strings
 * or {"content": ...} objects; null ones left out). Both malloc'd.
 * Returns DF_EFORMAT with a message naming name and the field on bad input. */
int df_chat_config_parse(const char *config_json, const char *name, int want_tools, char **template_src,
                         char **special_tokens_json, char *err, size_t errlen);

/* Builds the render context the way apply_chat_template does: messages
 * (a JSON array of objects; null values stay null, i.e. None in the
 * template, and reasoning given as reasoning_content, thinking or reasoning is copied
 * under "thinking" and "reasoning_content"), tools (JSON array or NULL for
 * none), documents (none), add_generation_prompt, the special-token
 * variables (JSON object or NULL) and extra variables (JSON object or NULL;
 * they override special tokens). *context_json is malloc'd. */
int df_chat_context_build(const char *messages_json, const char *tools_json, int add_generation_prompt,
                          const char *special_tokens_json, const char *extra_vars_json, char **context_json,
                          char *err, size_t errlen);

#endif
