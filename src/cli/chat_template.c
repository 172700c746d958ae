/* chat_template.c - `deltafin chat-template`: renders a conversation with a
 * tokenizer directory's own chat template, exactly as transformers'
 * apply_chat_template(..., tokenize=False) does, and prints it unchanged
 * (no trailing newline added).
 *
 * Invariants: every failure is one line on stderr naming the file, field or
 * template line, and exit code 2 for bad input (1 for internal failures);
 * nothing is printed to stdout unless the render succeeded.
 */
#include "cli/cli.h"
#include "deltafin.h"
#include "tok/kimi_k3_chat.h"
#include "tok/template.h"
#include "tok/tokenizer.h"
#include "util/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin chat-template --tokenizer DIR --messages FILE [--tools FILE]\n"
            "                              [--add-generation-prompt] [--var NAME=JSON ...]\n\n"
            "Renders a conversation with the chat template of DIR/tokenizer_config.json (or\n"
            "DIR/chat_template.jinja when present) and prints the prompt exactly, adding nothing.\n\n"
            "  --tokenizer DIR           directory holding tokenizer_config.json; its chat_template\n"
            "                            may be a string or a list of {name, template} (\"default\",\n"
            "                            or \"tool_use\" when --tools is given and it exists)\n"
            "  --messages FILE           JSON array of messages ({\"role\", \"content\", ...}); '-' reads stdin\n"
            "  --tools FILE              JSON array of tool schemas, passed as `tools`\n"
            "  --add-generation-prompt   set add_generation_prompt (open an assistant turn)\n"
            "  --var NAME=JSON           extra template variable, e.g. --var enable_thinking=false or\n"
            "                            --var 'date_string=\"26 Jul 2024\"' (repeatable)\n\n"
            "bos_token, eos_token, unk_token, pad_token, ... come from tokenizer_config.json.\n"
            "Messages are normalized as transformers does: null fields are dropped, and reasoning\n"
            "(reasoning_content, thinking or reasoning) is offered under both reasoning_content and thinking.\n"
            "See docs/CHAT_TEMPLATES.md for the supported Jinja subset.\n\n"
            "Kimi K3 (DIR/config.json has model_type kimi_k3) has no Jinja template: its own chat\n"
            "format is rendered instead; --var thinking=false, thinking_effort=\"low\"|\"high\"|\"max\"|null,\n"
            "tool_choice and response_format are its options. Only there:\n"
            "  --segments                print the prompt's segments, [[text, special], ...], as JSON\n"
            "  --ids                     print its token ids (each segment encoded alone; needs\n"
            "                            DIR/tiktoken.model) as JSON\n");
}

static int fail(int code, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "deltafin chat-template: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return code;
}

static int read_input(const char *path, char **out, char *err, size_t errlen) {
    if (strcmp(path, "-") != 0) return df_read_file(path, out, NULL, err, errlen);
    df_buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, stdin)) > 0) df_buf_put(&b, tmp, n);
    df_buf_put(&b, "", 1);
    *out = b.p;
    return 0;
}

/* Kimi K3: its chat format (src/tok/kimi_k3_chat.c); mode 0 the text, 1 the
 * segments, 2 the token ids. */
static int k3_chat(const char *dir, const char *messages, const char *tools, int add_gen, json_t *vars, int mode) {
    char err[1024];
    char *msgs = NULL, *tools_text = NULL, *opts = json_dumps(vars, JSON_COMPACT);
    df_k3_prompt p = {0};
    df_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 2;
    if (read_input(messages, &msgs, err, sizeof err) || (tools && df_read_file(tools, &tools_text, NULL, err, sizeof err))) {
        fail(2, "%s%s", err, "");
        goto out;
    }
    int r = df_k3_chat_render(msgs, tools_text, add_gen, opts, &p, err, sizeof err);
    if (r) {
        const char *file = !strncmp(err, "tools", 5) ? tools : !strncmp(err, "messages", 8) ? messages : "--var";
        rc = fail(df_exit_code(r), "%s: %s", file, err);
        goto out;
    }
    if (mode == 0) {
        if (fwrite(p.text, 1, p.len, stdout) != p.len) { rc = fail(1, "writing the prompt failed%s%s", "", ""); goto out; }
    } else if (mode == 1) {
        json_t *a = json_array();
        for (size_t i = 0; i < p.n_seg; i++)
            json_array_append_new(a, json_pack("[s#,b]", p.text + p.seg[i].off, (int)p.seg[i].len, p.seg[i].special));
        char *s = json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(a);
        fputs(s ? s : "null", stdout);
        free(s);
    } else {
        if (!(t = df_tok_load(dir, err, sizeof err))) { fail(2, "%s%s", err, ""); goto out; }
        if ((r = df_k3_prompt_encode(t, &p, 0, &ids, &n, err, sizeof err))) { rc = fail(df_exit_code(r), "%s%s", err, ""); goto out; }
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
        putchar(']');
    }
    rc = fflush(stdout) ? 1 : 0;
out:
    free(msgs);
    free(tools_text);
    free(opts);
    free(ids);
    df_k3_prompt_free(&p);
    df_tok_free(t);
    return rc;
}

int df_cmd_chat_template(int argc, char **argv) {
    const char *dir = NULL, *messages = NULL, *tools = NULL;
    int add_gen = 0, k3_mode = 0;
    json_t *vars = json_object();
    char err[1024];
    int rc = 2;
    char *cfg_text = NULL, *tpl_src = NULL, *special = NULL, *msgs = NULL, *tools_text = NULL, *extra = NULL,
         *ctx = NULL, *out = NULL, *cfg_path = NULL, *jinja_path = NULL;
    df_template *t = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "--add-generation-prompt")) { add_gen = 1; continue; }
        if (!strcmp(a, "--segments")) { k3_mode = 1; continue; }
        if (!strcmp(a, "--ids")) { k3_mode = 2; continue; }
        int takes = !strcmp(a, "--tokenizer") || !strcmp(a, "--messages") || !strcmp(a, "--tools") || !strcmp(a, "--var");
        if (!takes) {
            fail(2, "unknown option '%s'%s", a, " (see --help)");
            goto done;
        }
        if (i + 1 >= argc) {
            fail(2, "%s needs a value%s", a, "");
            goto done;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--tokenizer")) dir = v;
        else if (!strcmp(a, "--messages")) messages = v;
        else if (!strcmp(a, "--tools")) tools = v;
        else {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) {
                fail(2, "--var '%s': expected NAME=JSON%s", v, "");
                goto done;
            }
            json_error_t je;
            json_t *val = json_loads(eq + 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!val) {
                fail(2, "--var '%s': the value is not JSON (%s); quote strings, e.g. NAME='\"text\"'", v, je.text);
                goto done;
            }
            json_object_setn_new(vars, v, (size_t)(eq - v), val);
        }
    }
    if (!dir || !messages) {
        fail(2, "%s%s", !dir ? "--tokenizer DIR is required" : "--messages FILE is required", " (see --help)");
        goto done;
    }
    if (!df_is_dir(dir)) {
        fail(2, "%s: not a directory%s", dir, "");
        goto done;
    }
    if (df_k3_is_model_dir(dir)) {
        rc = k3_chat(dir, messages, tools, add_gen, vars, k3_mode);
        goto done;
    }
    if (k3_mode) {
        fail(2, "%s: --segments and --ids need a Kimi K3 directory (config.json model_type kimi_k3)%s", dir, "");
        goto done;
    }
    cfg_path = df_path_join(dir, "tokenizer_config.json");
    jinja_path = df_path_join(dir, "chat_template.jinja");
    int have_jinja = df_file_exists(jinja_path);
    if (df_file_exists(cfg_path)) {
        if (df_read_file(cfg_path, &cfg_text, NULL, err, sizeof err)) {
            fail(2, "%s%s", err, "");
            goto done;
        }
    } else if (!have_jinja) {
        fail(2, "%s: no such file (and no chat_template.jinja)%s", cfg_path, "");
        goto done;
    } else {
        cfg_text = df_xstrdup("{}");
    }
    int r = df_chat_config_parse(cfg_text, cfg_path, tools != NULL, have_jinja ? NULL : &tpl_src, &special, err, sizeof err);
    if (r) {
        rc = fail(df_exit_code(r), "%s%s", err, "");
        goto done;
    }
    const char *tpl_name = cfg_path;
    if (have_jinja) {
        if (df_read_file(jinja_path, &tpl_src, NULL, err, sizeof err)) {
            fail(2, "%s%s", err, "");
            goto done;
        }
        tpl_name = jinja_path;
    }
    t = df_template_parse(tpl_src, err, sizeof err);
    if (!t) {
        fail(2, "%s: chat_template: %s", tpl_name, err);
        goto done;
    }
    if (read_input(messages, &msgs, err, sizeof err)) {
        fail(2, "%s%s", err, "");
        goto done;
    }
    if (tools && df_read_file(tools, &tools_text, NULL, err, sizeof err)) {
        fail(2, "%s%s", err, "");
        goto done;
    }
    extra = json_object_size(vars) ? json_dumps(vars, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    r = df_chat_context_build(msgs, tools_text, add_gen, special, extra, &ctx, err, sizeof err);
    if (r) {
        /* name the file the problem came from */
        const char *file = !strncmp(err, "tools", 5) ? tools : !strncmp(err, "messages", 8) ? messages : "--var";
        rc = fail(df_exit_code(r), "%s: %s", file, err);
        goto done;
    }
    size_t len = 0;
    r = df_template_render(t, ctx, &out, &len, err, sizeof err);
    if (r) {
        rc = fail(df_exit_code(r), "%s: chat_template: %s", tpl_name, err);
        goto done;
    }
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) {
        fail(1, "writing the prompt failed%s%s", "", "");
        rc = 1;
        goto done;
    }
    rc = 0;
done:
    if (rc != 0 && rc != 1) rc = 2;
    json_decref(vars);
    df_template_free(t);
    free(cfg_text);
    free(tpl_src);
    free(special);
    free(msgs);
    free(tools_text);
    free(extra);
    free(ctx);
    free(out);
    free(cfg_path);
    free(jinja_path);
    return rc;
}
