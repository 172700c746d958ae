/* main.c - subcommand dispatch. Every subcommand lives in src/cli/. */
#include "cli/cli.h"
#include "deltafin.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"setup", df_cmd_setup, "install a known model (e.g. smollm2-135m-instruct) under $DELTAFIN_HOME"},
    {"run", df_cmd_run, "generate text from a prompt or ids (streams the continuation)"},
    {"eval", df_cmd_eval, "one teacher-forced pass; dump logits for every position"},
    {"inspect", df_cmd_inspect, "describe a model: family, shapes, dtypes, parameters, bytes"},
    {"tokenize", df_cmd_tokenize, "text on stdin -> JSON array of token ids"},
    {"detokenize", df_cmd_detokenize, "JSON array of ids on stdin -> text"},
    {"chat-template", df_cmd_chat_template, "render a chat with the model's own template"},
    {"serve", df_cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench-disk", df_cmd_bench_disk, "measure a file's O_DIRECT read bandwidth (the disk floor)"},
    {"bench", df_cmd_bench, "workloads (decode, prefill, stream, server, tokenizer) A/B against floors; the floors"},
    {"doctor", df_cmd_doctor, "read-only health report: build, CPU, backends, RAM/disk, model integrity (--deep, --json)"},
    {"upgrade", df_cmd_upgrade, "update a source checkout (fast-forward only), rebuild with the same profile, self-test, swap"},
};

static void usage(FILE *f) {
    fprintf(f, "deltafin %s - run large mixture-of-experts models exactly, on one machine\n\n"
               "usage: deltafin COMMAND [options]   (deltafin COMMAND --help for its options)\n\ncommands:\n",
            DF_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("deltafin %s\n", DF_VERSION); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "deltafin: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
