/* diskbench.h - disk read bandwidth as the expert cache sees it. */
#ifndef DF_STORE_DISKBENCH_H
#define DF_STORE_DISKBENCH_H
#include <stddef.h>
#include <stdint.h>
/* Reads up to max_bytes (0: all) of path with O_DIRECT block-size reads at queue depth qd; GB/s in *gbs. */
int df_disk_read_bw(const char *path, int qd, size_t block, int64_t max_bytes, double *gbs, char *err, size_t errlen);
#endif
