/* tokenize.c - placeholder until the tokenizer module lands (the tok work replaces this file). */
#include "cli/cli.h"
#include <stdio.h>
int df_cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin tokenize: not supported yet\n"); return 2; }
int df_cmd_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin detokenize: not supported yet\n"); return 2; }
