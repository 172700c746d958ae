# Deltafin build.  `make` builds ./deltafin; `make test` runs every test;
# `make asan` runs the suite under AddressSanitizer + UBSan; `make deps`
# installs the Debian packages and the Python test packages.
#
# Out-of-tree builds: `make O=build-x` puts objects and binaries in build-x/
# (several people can build at once).  `make unit-MOD` builds and runs only
# tests/unit/test_MOD*.c linked against the modules MOD depends on.

# CUDA=1: the CUDA backend (src/backend/cuda, nvcc) is linked in; objects go
# to build-cuda/ unless O is given, so the default build stays CPU-only.
CUDA     ?= 0
ifeq ($(CUDA),1)
O        ?= build-cuda
endif
O        ?= build
CC       ?= cc
OPT      ?= -O2
SAN      ?=
PKGS      = jansson libpcre2-8 libmicrohttpd liburing libxxhash libcrypto libcurl
CFLAGS   += -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter \
            -Iinclude -Isrc -pthread $(SAN) $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread
LDFLAGS  += $(SAN)

# Per-file ISA flags: kernels are compiled per ISA and picked at run time.
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c

MODULES  = util format tok grammar model backend store core server cli
src_of   = $(wildcard src/$(1)/*.c) $(wildcard src/$(1)/*/*.c)
SRCS     = $(foreach m,$(MODULES),$(call src_of,$(m)))
OBJS     = $(SRCS:%.c=$(O)/%.o)
MAIN_OBJ = $(O)/src/main.o

# Which modules a unit test of module M links against.
DEPS_util    = util
DEPS_format  = format util
DEPS_tok     = tok format util
DEPS_backend = backend format util
DEPS_model   = model backend format util
DEPS_store   = store format util
DEPS_grammar = grammar tok format util
objs_of  = $(foreach m,$(1),$(patsubst %.c,$(O)/%.o,$(call src_of,$(m)))) $(call cu_objs_of,$(1))

# The CUDA backend: sm_90 machine code (H100/H200) plus compute_90 PTX that the
# driver compiles for later GPUs.  Linked statically against the CUDA runtime.
NVCC      ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS  = -std=c++17 $(OPT) -g $(CUDA_ARCH) -Iinclude -Isrc -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter
CU_SRCS    = $(wildcard src/backend/cuda/*.cu)
CU_OBJS    = $(CU_SRCS:%.cu=$(O)/%.cu.o)
ifeq ($(CUDA),1)
CFLAGS    += -DDF_CUDA=1
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lstdc++
OBJS      += $(CU_OBJS)
cu_objs_of = $(if $(filter backend,$(1)),$(CU_OBJS))
endif

UNIT_SRCS = $(wildcard tests/unit/test_*.c)
UNIT_BINS = $(UNIT_SRCS:tests/unit/%.c=$(O)/tests/%)
FUZZ_SRCS = $(wildcard tests/fuzz/fuzz_*.c)

.PHONY: all test unit asan hostile-asan deps demo clean fuzz fuzz-objs bench cuda-check deltafin
all: $(O)/deltafin
ifeq ($(O),$(if $(filter 1,$(CUDA)),build-cuda,build))
all: deltafin
# phony: ./deltafin follows the last build, CPU-only or CUDA=1
deltafin: $(O)/deltafin
	@ln -sfn $(O)/deltafin deltafin
endif

$(O)/deltafin: $(MAIN_OBJ) $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(O)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS))) -MMD -MP -c -o $@ $<

$(O)/%.cu.o: %.cu src/backend/cuda/cuda.h src/backend/cuda/cuda_int.cuh src/backend/backend.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# Proof that the CUDA backend builds and links, with no GPU needed: the
# backend object, the op-by-op conformance test linked against it (run it
# with --backend cuda on a GPU), and test_backend_cuda (selection and
# register-time refusals; runs without a device).
cuda-check:
	@$(MAKE) --no-print-directory CUDA=1 O=build-cuda build-cuda/tests/test_backend_ops build-cuda/tests/test_backend_cuda
	./build-cuda/tests/test_backend_cuda

# bench/cuda: the CUDA backend's speed against floors measured in the same run
# (HBM read, cuBLAS SGEMM / BF16 GEMM); run on a GPU (tools/cuda_device.sh).
$(O)/bench/cuda_bench: $(O)/bench/cuda/cuda_bench.cu.o $(call objs_of,backend format util)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# unit test binaries: link against the test's module deps (all modules if unlisted)
.SECONDEXPANSION:
$(O)/tests/test_%: tests/unit/test_%.c $$(call objs_of,$$(or $$(DEPS_$$(firstword $$(subst _, ,$$*))),$(MODULES)))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# bench/grammar_bench: constrained decoding's mask cost per token (docs/PERFORMANCE.md)
$(O)/bench/grammar_bench: bench/grammar_bench.c $(call objs_of,grammar tok format util)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# bench/kernel_bench: the CPU products (decode GB/s, prefill GFLOP/s) against floors of the same run (docs/PERFORMANCE.md)
$(O)/bench/kernel_bench: bench/kernel_bench.c $(call objs_of,backend format util)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

unit: $(UNIT_BINS)
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

unit_bins = $(patsubst tests/unit/%.c,$(O)/tests/%,$(wildcard tests/unit/test_$(1).c tests/unit/test_$(1)_*.c))
unit-%: $$(call unit_bins,$$*)
	@fail=0; for t in $^; do echo "== $$t"; $$t || fail=1; done; exit $$fail

# The whole suite: unit tests, then Python tests (parity, CLI, server), the
# CUDA backend's compile check (~20 s; skipped without nvcc), the
# server's ASan build against hostile clients, and a short fuzz run per parser.
test: all $(UNIT_BINS)
	O=$(O) ./tests/run_all.sh
	@if command -v $(NVCC) >/dev/null 2>&1; then $(MAKE) --no-print-directory cuda-check; else echo "cuda-check skipped: $(NVCC) not found"; fi
	$(MAKE) --no-print-directory hostile-asan
	$(MAKE) --no-print-directory fuzz

ASAN_SAN = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
asan:
	$(MAKE) O=build-asan OPT=-O1 SAN="$(ASAN_SAN)" all $(patsubst $(O)/%,build-asan/%,$(UNIT_BINS))
	O=build-asan ASAN_OPTIONS=detect_leaks=1 ./tests/run_all.sh

# The ASan/UBSan build of the server against tests/hostile_client.py (slow
# clients, bad framing, oversize bodies, huge chats): part of `make test`.
hostile-asan:
	@$(MAKE) --no-print-directory O=build-asan OPT=-O1 SAN="$(ASAN_SAN)" build-asan/deltafin
	DELTAFIN_BIN=$(CURDIR)/build-asan/deltafin python3 -m pytest -q -p no:cacheprovider tests/py/test_server_hostile.py

# Fuzz targets (clang libFuzzer): the library objects are built once with
# clang and sanitizer coverage into build-fuzz/, then each tests/fuzz/fuzz_*.c
# target is linked and run for FUZZ_SECONDS on its seed corpus.
FUZZ_SECONDS ?= 10
FUZZ_SAN = -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
fuzz:
	@$(MAKE) --no-print-directory O=build-fuzz CC=clang OPT=-O1 SAN="$(FUZZ_SAN)" fuzz-objs
	@set -e; for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); \
	  clang $(CFLAGS) -O1 -fsanitize=fuzzer,address,undefined -o build-fuzz/$$n $$f \
	    $(patsubst %.c,build-fuzz/%.o,$(SRCS)) $(LDLIBS); \
	  mkdir -p build-fuzz/corpus-$$n; cp tests/fuzz/corpus/$$n/* build-fuzz/corpus-$$n/ 2>/dev/null || true; \
	  echo "fuzzing $$n for $(FUZZ_SECONDS) s"; \
	  ./build-fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 $$(test -f tests/fuzz/$$n.dict && echo -dict=tests/fuzz/$$n.dict) build-fuzz/corpus-$$n 2>build-fuzz/$$n.log \
	    || { tail -40 build-fuzz/$$n.log; exit 1; }; done
fuzz-objs: $(OBJS)

deps:
	./tools/install_deps.sh

demo: deps all
	./deltafin setup --model smollm2-135m-instruct
	./deltafin run --chat --prompt "What is the capital of France?" --max-new 64

clean:
	rm -rf build build-asan build-fuzz build-cuda deltafin

-include $(OBJS:.o=.d) $(MAIN_OBJ:.o=.d)
