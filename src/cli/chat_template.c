/* chat_template.c - placeholder until the template renderer lands (that work replaces this file). */
#include "cli/cli.h"
#include <stdio.h>
int df_cmd_chat_template(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "deltafin chat-template: not supported yet\n"); return 2; }
