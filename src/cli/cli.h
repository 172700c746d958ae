/* cli.h - one entry point per subcommand (src/cli/<name>.c). Each returns the
 * process exit code: 0 ok, 1 runtime failure, 2 bad input (usage, bad file). */
#ifndef DF_CLI_H
#define DF_CLI_H
#include "deltafin.h"
#include <stddef.h>

/* The model used when --model is not given (installed by `deltafin setup`). */
#define DF_DEFAULT_MODEL "smollm2-135m-instruct"

int df_cmd_run(int argc, char **argv);
int df_cmd_eval(int argc, char **argv);
int df_cmd_inspect(int argc, char **argv);
int df_cmd_tokenize(int argc, char **argv);
int df_cmd_detokenize(int argc, char **argv);
int df_cmd_chat_template(int argc, char **argv);
int df_cmd_serve(int argc, char **argv);
int df_cmd_bench(int argc, char **argv);
int df_cmd_setup(int argc, char **argv);
int df_cmd_bench_disk(int argc, char **argv);
int df_cmd_doctor(int argc, char **argv);
int df_cmd_upgrade(int argc, char **argv);
/* The installed file, sha256 (hex) and size of a model `setup --model NAME`
 * knows (setup.c's catalog); 0 if name is not one. */
int df_setup_catalog(const char *name, const char **file, const char **sha256, int64_t *size);
/* $DELTAFIN_HOME or ~/.cache/deltafin, into buf. */
const char *df_home_dir(char *buf, size_t n);

/* df_options_default, then the DELTAFIN_* streaming switches of the environment (docs/CLI.md). */
void df_cli_options_default(df_options *o);
/* Maps a DF_E* code to the CLI exit code. */
int df_exit_code(int rc);

/* --trace PATH: checks that PATH can be written (run.c). 0, or DF_EIO with err filled. */
int df_trace_probe(const char *path, char *err, size_t errlen);

#endif
