# Deltafin build.  `make` builds ./deltafin; `make test` runs every test;
# `make asan` runs the suite under AddressSanitizer + UBSan; `make deps`
# installs the Debian packages and the Python test packages.
#
# Out-of-tree builds: `make O=build-x` puts objects and binaries in build-x/
# (several people can build at once).  `make unit-MOD` builds and runs only
# tests/unit/test_MOD*.c linked against the modules MOD depends on.

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

MODULES  = util format tok model backend store spec core server cli
src_of   = $(wildcard src/$(1)/*.c) $(wildcard src/$(1)/*/*.c)
SRCS     = $(foreach m,$(MODULES),$(call src_of,$(m)))
OBJS     = $(SRCS:%.c=$(O)/%.o)
MAIN_OBJ = $(O)/src/main.o

# Which modules a unit test of module M links against.
DEPS_util    = util
DEPS_format  = format util
DEPS_tok     = tok util
DEPS_backend = backend format util
DEPS_model   = model backend format util
DEPS_store   = store model backend format util
objs_of  = $(foreach m,$(1),$(patsubst %.c,$(O)/%.o,$(call src_of,$(m))))

UNIT_SRCS = $(wildcard tests/unit/test_*.c)
UNIT_BINS = $(UNIT_SRCS:tests/unit/%.c=$(O)/tests/%)
FUZZ_SRCS = $(wildcard tests/fuzz/fuzz_*.c)

.PHONY: all test unit asan deps demo clean fuzz bench
all: $(O)/deltafin
ifeq ($(O),build)
all: deltafin
deltafin: $(O)/deltafin
	ln -sf $(O)/deltafin deltafin
endif

$(O)/deltafin: $(MAIN_OBJ) $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(O)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS))) -MMD -MP -c -o $@ $<

# unit test binaries: link against the test's module deps (all modules if unlisted)
.SECONDEXPANSION:
$(O)/tests/test_%: tests/unit/test_%.c $$(call objs_of,$$(or $$(DEPS_$$(firstword $$(subst _, ,$$*))),$(MODULES)))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

unit: $(UNIT_BINS)
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

unit-%: $$(patsubst tests/unit/%.c,$(O)/tests/%,$$(wildcard tests/unit/test_$$*.c tests/unit/test_$$*_*.c))
	@fail=0; for t in $^; do echo "== $$t"; $$t || fail=1; done; exit $$fail

# The whole suite: unit tests, then Python tests (parity, CLI, server).
test: all $(UNIT_BINS)
	O=$(O) ./tests/run_all.sh

asan:
	$(MAKE) O=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# Fuzz targets (clang libFuzzer), each run for FUZZ_SECONDS.
FUZZ_SECONDS ?= 20
fuzz:
	@for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); mkdir -p build-fuzz; \
	  clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	    $$(pkg-config --cflags $(PKGS)) -o build-fuzz/$$n $$f $(filter-out src/main.c,$(SRCS)) \
	    $$(pkg-config --libs $(PKGS)) -lm -pthread $(AVX2_FLAGS) $(AVX512_FLAGS) || exit 1; \
	  mkdir -p build-fuzz/corpus-$$n; cp -n tests/fuzz/corpus/$$n/* build-fuzz/corpus-$$n/ 2>/dev/null; \
	  ./build-fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 build-fuzz/corpus-$$n || exit 1; done

deps:
	./tools/install_deps.sh

demo: deps all
	./deltafin setup --model smollm2-135m-instruct
	./deltafin run --chat --prompt "What is the capital of France?" --max-new 64

clean:
	rm -rf build build-asan build-fuzz deltafin

-include $(OBJS:.o=.d) $(MAIN_OBJ:.o=.d)
