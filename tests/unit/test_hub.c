/* hub: repo ids and revisions, the cache directory's environment precedence
 * (HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > HF_HOME/hub > XDG_CACHE_HOME >
 * ~/.cache), the repo folder name, snapshot lookup through refs, and the
 * routed-expert tensor names stream mode leaves for later. */
#include "deltafin.h"
#include "hub/hub.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    const char *good[] = {"Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3@main", "a/b@0123456789abcdef0123456789abcdef01234567", "o/n@refs/pr/1"};
    const char *bad[] = {"", "noslash", "/abs/path", "./rel/x", "../etc", "a/b/c", "a//b", "a/b@", "a/.x", "a b/c", "a/b@x y", "a/"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK(df_hub_is_repo_id(good[i]), "'%s' is a repo id", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!df_hub_is_repo_id(bad[i]), "'%s' is not a repo id", bad[i]);
    char repo[256], rev[256], err[512];
    CHECK(df_hub_parse_ref("org/name", repo, sizeof repo, rev, sizeof rev, err, sizeof err) == 0 && !strcmp(repo, "org/name") && !strcmp(rev, "main"),
          "default revision");
    CHECK(df_hub_parse_ref("org/name@v1.0", repo, sizeof repo, rev, sizeof rev, err, sizeof err) == 0 && !strcmp(rev, "v1.0"), "revision");
    CHECK(df_hub_parse_ref("org/name@a/../../x", repo, sizeof repo, rev, sizeof rev, err, sizeof err) == DF_EINPUT, "'..' in a revision");
    CHECK(df_hub_parse_ref("../etc", repo, sizeof repo, rev, sizeof rev, err, sizeof err) == DF_EINPUT && strstr(err, "ORG/NAME"), "message: %s", err);

    char buf[4096];
    unsetenv("HF_HUB_CACHE"), unsetenv("HUGGINGFACE_HUB_CACHE"), unsetenv("HF_HOME"), unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/h", 1);
    CHECK(!strcmp(df_hub_cache_dir(buf, sizeof buf), "/h/.cache/huggingface/hub"), "default: %s", buf);
    setenv("XDG_CACHE_HOME", "/x", 1);
    CHECK(!strcmp(df_hub_cache_dir(buf, sizeof buf), "/x/huggingface/hub"), "XDG: %s", buf);
    setenv("HF_HOME", "/hf", 1);
    CHECK(!strcmp(df_hub_cache_dir(buf, sizeof buf), "/hf/hub"), "HF_HOME: %s", buf);
    setenv("HUGGINGFACE_HUB_CACHE", "/legacy", 1);
    CHECK(!strcmp(df_hub_cache_dir(buf, sizeof buf), "/legacy"), "HUGGINGFACE_HUB_CACHE: %s", buf);
    setenv("HF_HUB_CACHE", "/new", 1);
    CHECK(!strcmp(df_hub_cache_dir(buf, sizeof buf), "/new"), "HF_HUB_CACHE wins: %s", buf);
    df_hub_repo_dir("/c", "Qwen/Qwen3-8B", buf, sizeof buf);
    CHECK(!strcmp(buf, "/c/models--Qwen--Qwen3-8B"), "repo dir: %s", buf);

    /* snapshots through refs */
    char dir[] = "/tmp/df_hub_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char p[4300];
    const char *commit = "0123456789abcdef0123456789abcdef01234567";
    CHECK(df_hub_snapshot_dir(dir, "o/n", "main", buf, sizeof buf, err, sizeof err) == DF_EINPUT && strstr(err, "refs/main"), "missing ref: %s", err);
    snprintf(p, sizeof p, "%s/models--o--n/snapshots/%s", dir, commit);
    CHECK(df_mkdirs(p) == 0, "mkdir");
    snprintf(p, sizeof p, "%s/models--o--n/refs", dir);
    df_mkdirs(p);
    snprintf(p, sizeof p, "%s/models--o--n/refs/main", dir);
    FILE *f = fopen(p, "w");
    fputs(commit, f);
    fclose(f);
    CHECK(df_hub_snapshot_dir(dir, "o/n", "main", buf, sizeof buf, err, sizeof err) == 0 && strstr(buf, commit), "snapshot via ref: %s", err);
    CHECK(df_hub_snapshot_dir(dir, "o/n", commit, buf, sizeof buf, err, sizeof err) == 0, "snapshot by commit: %s", err);
    f = fopen(p, "w");
    fputs("not-a-commit", f);
    fclose(f);
    CHECK(df_hub_snapshot_dir(dir, "o/n", "main", buf, sizeof buf, err, sizeof err) == DF_EFORMAT && strstr(err, "40-hex"), "bad ref: %s", err);
    unlink(p);
    snprintf(p, sizeof p, "%s/models--o--n/snapshots/%s", dir, commit);
    rmdir(p);
    snprintf(p, sizeof p, "%s/models--o--n/snapshots", dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s/models--o--n/refs", dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s/models--o--n", dir);
    rmdir(p);
    rmdir(dir);

    CHECK(df_hub_is_expert_tensor("model.layers.3.mlp.experts.17.gate_proj.weight"), "routed expert");
    CHECK(df_hub_is_expert_tensor("language_model.model.layers.3.mlp.experts.0.down_proj.weight_scale"), "prefixed routed expert");
    CHECK(!df_hub_is_expert_tensor("model.layers.3.mlp.shared_experts.gate_proj.weight"), "shared experts are resident");
    CHECK(!df_hub_is_expert_tensor("model.layers.3.mlp.gate.weight"), "the router is resident");
    CHECK(!df_hub_is_expert_tensor("model.layers.3.mlp.experts.gate_up_proj"), "a fused tensor has no expert index");
    CHECK(!df_hub_is_expert_tensor("model.layers.1.mlp.experts.0.gate_proj.weight_shape"), "INT4's weight_shape is read at load");
    CHECK(df_hub_is_expert_tensor("model.layers.1.mlp.experts.0.gate_proj.weight_packed"), "INT4 packed weight");
    CHECK(df_hub_is_expert_tensor("model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"), "FP8 scale");

    /* the revision API's answer: an LFS file's size is lfs.size, which must be a size too (fuzz_hub_revision found a
     * negative one accepted and handed to the downloader) */
    {
        static const char *const lfs_sizes[] = {"1000", "-1000", "\"12\"", "null"};
        for (int k = 0; k < 4; k++) {
            char txt[512];
            snprintf(txt, sizeof txt,
                     "{\"sha\": \"0123456789abcdef0123456789abcdef01234567\", \"siblings\": [{\"rfilename\": \"m.safetensors\", "
                     "\"size\": 134, \"blobId\": \"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\", \"lfs\": {\"sha256\": "
                     "\"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\", \"size\": %s}}]}",
                     lfs_sizes[k]);
            df_hub_repo r;
            memset(&r, 0, sizeof r);
            int rc = df_hub_parse_revision(txt, strlen(txt), "rev", &r, err, sizeof err);
            if (k == 0) CHECK(rc == 0 && r.n_files == 1 && r.files[0].size == 1000, "lfs.size 1000: rc %d %s", rc, err);
            else CHECK(rc == DF_EFORMAT && strstr(err, "siblings[0].lfs.size"), "lfs.size %s: rc %d %s", lfs_sizes[k], rc, err);
            df_hub_repo_free(&r);
        }
    }
    if (failures) { fprintf(stderr, "%d failures\n", failures); return 1; }
    printf("hub: all checks passed\n");
    return 0;
}
