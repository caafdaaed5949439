# vgrpo build. `make` builds build/vgrpo; `make test` installs missing system packages, builds and runs the suite.
# Sources are found by wildcard: a new .c file in a module folder is picked up without editing this file.
CC       ?= gcc
# Idle OpenMP threads sleep instead of spinning, so processes sharing the cores (a test spawning vgrpo, the
# colocated run's processes) do not starve each other.
export OMP_WAIT_POLICY ?= passive
OPT      ?= -O3 -march=native
# OpenBLAS: the OpenMP build, named explicitly so the Debian alternatives setting cannot swap in the pthread one.
BLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
# --- MPI (sp/: sequence-parallel collectives; OpenMPI, Debian libopenmpi-dev): flags from the mpicc wrapper ---
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
# --- end MPI ---
CFLAGS   := $(OPT) -std=c11 -ffp-contract=off -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -I. -I$(BLAS_INC) $(MPI_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS   := -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -ljansson -lxxhash -lavformat -lavcodec -lswscale -lavutil -lpng16 -lzmq $(MPI_LIBS) -lm $(EXTRA_LDLIBS)
LDFLAGS  := -fopenmp $(EXTRA_LDFLAGS)
BUILD    ?= build

LIB_SRC  := $(wildcard core/*.c kernels/*.c kernels/cpu/*.c model/*/*.c sp/*.c rollout/*.c media/*.c reward/*.c trainer/*.c bench/*.c cli/opts.c cli/progress.c)
CLI_SRC  := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
MPI_TEST_OBJ := $(MPI_TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test test-slow asan bench fuzz deps clean demo
all: $(BUILD)/vgrpo

deps:
	@scripts/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libvgrpo.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/vgrpo: $(CLI_OBJ) $(BUILD)/libvgrpo.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libvgrpo.a $(LDLIBS)

$(BUILD)/vgrpo_tests: $(TEST_OBJ) $(BUILD)/libvgrpo.a
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libvgrpo.a $(LDLIBS)

# Multi-rank test programs (tests/mpi/), one binary, case name as argv[1]; tests/test_sp.c runs it under mpirun.
$(BUILD)/vgrpo_mpi_tests: $(MPI_TEST_OBJ) $(BUILD)/libvgrpo.a
	$(CC) $(LDFLAGS) -o $@ $(MPI_TEST_OBJ) $(BUILD)/libvgrpo.a $(LDLIBS)

# The suite: unit, fixture-parity and end-to-end tests in one runner; prints `N passed, N failed`.
test: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo $(BUILD)/vgrpo_tests $(BUILD)/vgrpo_mpi_tests
	VGRPO_BIN=$(BUILD)/vgrpo VGRPO_MPI_TESTS=$(BUILD)/vgrpo_mpi_tests $(BUILD)/vgrpo_tests

# Slow suites (learning runs, long multi-rank runs); CI does not run these.
test-slow: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo $(BUILD)/vgrpo_tests $(BUILD)/vgrpo_mpi_tests
	VGRPO_BIN=$(BUILD)/vgrpo VGRPO_MPI_TESTS=$(BUILD)/vgrpo_mpi_tests VGRPO_SLOW=1 $(BUILD)/vgrpo_tests

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build folder.
asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -march=native -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	  EXTRA_LDFLAGS="-fsanitize=address,undefined" build-asan/vgrpo build-asan/vgrpo_tests build-asan/vgrpo_mpi_tests
	ASAN_OPTIONS=detect_leaks=1 VGRPO_BIN=build-asan/vgrpo VGRPO_MPI_TESTS=build-asan/vgrpo_mpi_tests VGRPO_ASAN=1 build-asan/vgrpo_tests

# The demo: a tiny random Wan pipeline (made once); `vgrpo eval` of its initial weights; GRPO on it in one process
# (recipes/tiny-cpu.yaml, which saves checkpoint-<total_steps> at the end); `vgrpo eval` of that checkpoint; and
# the curves drawn (scripts/plot_metrics.py) and the two evals' color_match compared (scripts/compare_eval.py).
DEMO_RUN := runs/tiny-cpu
demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo
	@test -f runs/demo/model/model_index.json || { mkdir -p runs/demo && $(BUILD)/vgrpo init-model --preset tiny --out runs/demo/model --seed 0; }
	$(BUILD)/vgrpo eval recipes/tiny-cpu.yaml --out $(DEMO_RUN)/eval-initial
	$(BUILD)/vgrpo run recipes/tiny-cpu.yaml
	@ck=$(DEMO_RUN)/checkpoint-$$(sed -n 's/^  total_steps: *//p' $(DEMO_RUN)/config.resolved.yaml); set -x; \
	  $(BUILD)/vgrpo eval recipes/tiny-cpu.yaml --checkpoint $$ck --out $(DEMO_RUN)/eval-final
	@python3 scripts/plot_metrics.py $(DEMO_RUN)/metrics.jsonl $(DEMO_RUN)/metrics.png
	@python3 scripts/compare_eval.py $(DEMO_RUN)/eval-initial/eval.json $(DEMO_RUN)/eval-final/eval.json --scorer color_match

bench: all
	$(BUILD)/vgrpo bench kernels
	$(BUILD)/vgrpo bench dit

# The layering check (scripts/check_layout.py): which folder may include which, no file-level cycles inside a
# folder (from the objects in $(BUILD); build first), and a warning list of long cli/ files.
.PHONY: check-layout
check-layout: $(BUILD)/vgrpo
	python3 scripts/check_layout.py --build $(BUILD)

# libFuzzer targets (clang), each run for FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
# The fuzzed parsers and what they need (no OpenMP, BLAS or other heavy code).
FUZZ_LIB_SRC := core/error.c core/tensor.c core/wire.c core/wire_rollout.c core/trajectory.c core/safetensors.c $(wildcard core/st_*.c) $(wildcard core/config*.c) \
  core/log.c core/checksum.c core/json.c core/philox.c trainer/ctl_msg.c rollout/worker_msg.c model/dit/wan_params.c model/dit/wan_hash.c model/dit/wan_config.c
fuzz: deps
	@mkdir -p build-fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
	  clang -g -O1 -std=c11 -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined -o build-fuzz/$$t tests/fuzz/$$t.c $(FUZZ_LIB_SRC) \
	    -lyaml -ljansson -lxxhash -lm; \
	  mkdir -p build-fuzz/corpus-$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  rc=0; build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=build-fuzz/$$t- \
	    build-fuzz/corpus-$$t tests/fuzz/seeds-$$t > build-fuzz/$$t.log 2>&1 || rc=$$?; \
	  tail -n 12 build-fuzz/$$t.log; \
	  if [ $$rc -ne 0 ]; then echo "fuzz: $$t FAILED (exit $$rc); log build-fuzz/$$t.log, crash input build-fuzz/$$t-*"; exit 1; fi; \
	done

clean:
	rm -rf build build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(MPI_TEST_OBJ:.o=.d)
