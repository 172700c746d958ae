/* cli.h - one entry point per subcommand (src/cli/<name>.c). Each returns the
 * process exit code: 0 ok, 1 runtime failure, 2 bad input (usage, bad file). */
#ifndef DF_CLI_H
#define DF_CLI_H

int df_cmd_run(int argc, char **argv);
int df_cmd_eval(int argc, char **argv);
int df_cmd_inspect(int argc, char **argv);
int df_cmd_tokenize(int argc, char **argv);
int df_cmd_detokenize(int argc, char **argv);
int df_cmd_chat_template(int argc, char **argv);
int df_cmd_serve(int argc, char **argv);
int df_cmd_bench(int argc, char **argv);

/* Maps a DF_E* code to the CLI exit code. */
int df_exit_code(int rc);

#endif
