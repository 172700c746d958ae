#!/bin/sh
# Builds bench/attn_bench.c against the objects of the last `make` (O=build)
# and runs it: bench/attn_bench.sh [threads] [n] [ctx] [reps]
set -e
O=${O:-build}
OBJS=$(ls $O/src/backend/*.o $O/src/backend/cpu/*.o $O/src/util/*.o $O/src/format/*.o)
cc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -Isrc -pthread -o $O/attn_bench bench/attn_bench.c $OBJS \
    -ljansson -lpcre2-8 -lmicrohttpd -luring -lxxhash -lcrypto -lcurl -lm
exec $O/attn_bench "$@"
