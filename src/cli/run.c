/* run.c - placeholder until the engine lands. */
#include "cli/cli.h"
#include <stdio.h>
int df_cmd_run(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin run: not supported yet\n"); return 2; }
int df_cmd_eval(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin eval: not supported yet\n"); return 2; }
int df_cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin inspect: not supported yet\n"); return 2; }
