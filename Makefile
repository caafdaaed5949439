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
LDLIBS   := -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -ljansson -lxxhash -lutf8proc -lavformat -lavcodec -lswscale -lavutil -lpng16 -lzmq $(MPI_LIBS) -lm $(EXTRA_LDLIBS)
LDFLAGS  := -fopenmp $(EXTRA_LDFLAGS)
BUILD    ?= build

LIB_SRC  := $(wildcard core/*.c kernels/*.c kernels/cpu/*.c kernels/cuda/emu/*.c kernels/cuda/precond/*.c model/*/*.c sp/*.c rollout/*.c media/*.c reward/*.c trainer/*/*.c bench/*.c cli/opts.c cli/progress.c)
CLI_SRC  := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
MPI_TEST_OBJ := $(MPI_TEST_SRC:%.c=$(BUILD)/%.o)

# --- CUDA backend (kernels/cuda/; `make cuda` sets VGRPO_CUDA=1). A plain build compiles only kernels/cuda/absent.c
# (k_cuda_available answers "built without the CUDA backend") and needs no CUDA toolkit. The CUDA build adds the
# kernels (nvcc), the cuBLASLt/cuDNN wrappers and the static CUDA runtime; cuBLASLt and cuDNN are dlopen'ed at run
# time (kernels/cuda/dynload.h), so the binary starts on machines without them. ---
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_GENCODE ?= -gencode=arch=compute_90a,code=sm_90a
# -fmad=false: no contraction, so the kernel bodies round as on the CPU (kernels/body/kb_base.h).
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE) -fmad=false -Xcompiler -fno-threadsafe-statics,-fno-exceptions -I. -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -Wl,-rpath,$(CUDA_HOME)/lib64
CUDA_C_SRC  := $(filter-out kernels/cuda/absent.c,$(wildcard kernels/cuda/*.c))
CUDA_CU_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/cuda/*.cu))
ifeq ($(VGRPO_CUDA),1)
LIB_OBJ  += $(CUDA_C_SRC:%.c=$(BUILD)/%.o) $(CUDA_CU_OBJ)
CFLAGS   += -I$(CUDA_HOME)/include -DVGRPO_CUDA=1
LDLIBS   += $(CUDA_LIBS)
# the binary always carries the op table and k_cuda_available (-u: the linker keeps them from the static archive)
LDFLAGS  += -Wl,-u,k_cuda_ops -Wl,-u,k_cuda_available
else
# gemm_plan.c (cuBLASLt's column-major view and the batch-invariant plans, no CUDA header) is tested by make test too
LIB_OBJ  += $(BUILD)/kernels/cuda/absent.o $(BUILD)/kernels/cuda/gemm_plan.o
endif
# --- end CUDA variables (rules: the `cuda` section below) ---

# --- `vgrpo --version` (cli/cmd_version.c): the commit this tree is at ("-dirty" when tracked files differ from it;
# empty outside a git checkout) and OPT, compiled into that one file; $(BUILD)/.version-stamp changes with them, so a
# new commit or other flags rebuild only cli/cmd_version.o. ---
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git rev-parse --git-dir >/dev/null 2>&1 && \
  test -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo -dirty)
VERSION_INFO := commit=$(GIT_COMMIT) opt=$(OPT) cuda=$(VGRPO_CUDA)
VERSION_STAMP := $(BUILD)/.version-stamp
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(VERSION_STAMP) 2>/dev/null)" = '$(VERSION_INFO)' ] || echo '$(VERSION_INFO)' > $(VERSION_STAMP); })
$(BUILD)/cli/cmd_version.o: $(VERSION_STAMP)
$(BUILD)/cli/cmd_version.o: CFLAGS += -DVGRPO_GIT_COMMIT='"$(GIT_COMMIT)"' -DVGRPO_BUILD_OPT='"$(OPT)"'
# --- end version ---

.PHONY: all test test-slow asan bench fuzz deps clean demo demo-clip
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
# The NCCL cases load the fake NCCL beside it (VGRPO_NCCL_LIB), so it is built with it.
$(BUILD)/vgrpo_mpi_tests: $(MPI_TEST_OBJ) $(BUILD)/libvgrpo.a $(BUILD)/libfake_nccl.so
	$(CC) $(LDFLAGS) -o $@ $(MPI_TEST_OBJ) $(BUILD)/libvgrpo.a $(LDLIBS)

# The fake NCCL (tests/fake_nccl/fake_nccl.c): NCCL's calls over MPI on host memory, checked against NCCL's contract;
# sp/comm_nccl.c loads it through VGRPO_NCCL_LIB in the tests and in `make gpu-check-emu`.
$(BUILD)/libfake_nccl.so: tests/fake_nccl/fake_nccl.c sp/nccl_abi.h kernels/cuda/emu/emu_stream.h
	@mkdir -p $(dir $@)
	$(CC) -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fPIC -shared -I. $(MPI_CFLAGS) -o $@ $< $(MPI_LIBS)

# The suite: unit, fixture-parity and end-to-end tests in one runner, then the CUDA smoke subset (test-cuda-build).
# Every part runs whatever the one before it gave; each appends its counts to $(TEST_TALLY) (tests/test_main.c), and
# the last line is the totals of all of them: `make test: N passed, N failed (suite ...; cuda-smoke ...)`, exit
# status 1 when a test failed or a part did not run to its end (its build failed, or a test crashed the runner).
TEST_TALLY := $(BUILD)/test-tally.txt
# VBench's colour suite (Apache-2.0, not in this repository) for tests/test_eval.c eval_vbench_color_suite, where a
# checkout has the project's data folder beside it; the test skips, saying so, without it.
export VGRPO_VBENCH_COLOR ?= $(wildcard ../shared/data/vbench/color.json)
# VBench's prompt files, for tests/test_clip_tokenizer.c clip_tok_vbench_prompts_match_transformers (skips without).
export VGRPO_VBENCH_DIR ?= $(wildcard ../shared/data/vbench)
test: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo $(BUILD)/vgrpo_tests $(BUILD)/vgrpo_mpi_tests
	@rm -f $(TEST_TALLY)
	VGRPO_TEST_TALLY=$(TEST_TALLY) VGRPO_TEST_PART=suite VGRPO_BIN=$(BUILD)/vgrpo VGRPO_MPI_TESTS=$(BUILD)/vgrpo_mpi_tests VGRPO_TEST_TMP=$(BUILD)/test-tmp $(BUILD)/vgrpo_tests || true
	@$(MAKE) --no-print-directory test-cuda-build TALLY=$(TEST_TALLY) || true
	@$(BUILD)/vgrpo_tests --tally $(TEST_TALLY)

# The CUDA build cannot break unnoticed: where nvcc is installed, `make test` also compiles and links
# `make cuda` into $(BUILD)-cuda/ (build-cuda/ by default) and runs a smoke subset of the suite against that binary (CPU paths: recipes, run,
# generate, eval, the kernel bodies and the one-line refusals of cuda on a machine without a GPU, dit-forward
# --device cuda's among them). Skipped, saying so, without nvcc.
CUDA_SMOKE := kbody_ gemm_plan_ gpu_plans_ dev_budget_one_gpu run_recipe_errors fault_dry_run gen_checkpoint eval_one_vs_two colocated_equals_local wan_dev_cli bench_device version_names gpu_check_sh_cuda_binary
# With TALLY=FILE (make test passes its $(TEST_TALLY)), it records "start cuda-smoke" before the build, so a build that fails counts.
.PHONY: test-cuda-build
test-cuda-build:
	@if [ -x "$(NVCC)" ]; then \
	  if [ -n "$(TALLY)" ]; then echo "start cuda-smoke" >> "$(TALLY)"; fi; \
	  $(MAKE) --no-print-directory cuda BUILD=$(BUILD)-cuda && \
	  VGRPO_TEST_TALLY=$(TALLY) VGRPO_TEST_PART=cuda-smoke \
	  VGRPO_BIN=$(BUILD)-cuda/vgrpo VGRPO_MPI_TESTS=$(BUILD)/vgrpo_mpi_tests VGRPO_TEST_TMP=$(BUILD)/test-tmp \
	    $(BUILD)/vgrpo_tests $(CUDA_SMOKE); \
	else echo "test-cuda-build: skipped ($(NVCC) not found)"; \
	  if [ -n "$(TALLY)" ]; then echo "skipped cuda-smoke $(NVCC) not found" >> "$(TALLY)"; fi; fi

# Slow suites (learning runs, long multi-rank runs, the reward-hacking guard tripping on recipes/tiny-cpu-hack.yaml
# and not on the demo recipe: tests/test_guard.c guard_hack_recipe_trips_slow); CI does not run these.
test-slow: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo $(BUILD)/vgrpo_tests $(BUILD)/vgrpo_mpi_tests
	VGRPO_BIN=$(BUILD)/vgrpo VGRPO_MPI_TESTS=$(BUILD)/vgrpo_mpi_tests VGRPO_TEST_TMP=$(BUILD)/test-tmp VGRPO_SLOW=1 $(BUILD)/vgrpo_tests

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build folder.
asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -march=native -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	  EXTRA_LDFLAGS="-fsanitize=address,undefined" build-asan/vgrpo build-asan/vgrpo_tests build-asan/vgrpo_mpi_tests
	ASAN_OPTIONS=detect_leaks=1 VGRPO_BIN=build-asan/vgrpo VGRPO_MPI_TESTS=build-asan/vgrpo_mpi_tests VGRPO_TEST_TMP=build-asan/test-tmp VGRPO_ASAN=1 build-asan/vgrpo_tests

# The demo: a tiny random Wan pipeline (made once); `vgrpo eval` of its initial weights; GRPO on it in one process
# (recipes/tiny-cpu.yaml, which saves checkpoint-<total_steps> at the end; --overwrite: a second `make demo` starts
# afresh, replacing the first one's checkpoints); `vgrpo eval` of that checkpoint; and
# the curves drawn (scripts/plot_metrics.py) and the two evals' color_match compared (scripts/compare_eval.py).
DEMO_RUN := runs/tiny-cpu
demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo
	@test -f runs/demo/model/model_index.json || { mkdir -p runs/demo && $(BUILD)/vgrpo init-model --preset tiny --out runs/demo/model --seed 0; }
	$(BUILD)/vgrpo eval recipes/tiny-cpu.yaml --out $(DEMO_RUN)/eval-initial
	$(BUILD)/vgrpo run recipes/tiny-cpu.yaml --overwrite
	@ck=$(DEMO_RUN)/checkpoint-$$(sed -n 's/^  total_steps: *//p' $(DEMO_RUN)/config.resolved.yaml); set -x; \
	  $(BUILD)/vgrpo eval recipes/tiny-cpu.yaml --checkpoint $$ck --out $(DEMO_RUN)/eval-final
	@python3 scripts/plot_metrics.py $(DEMO_RUN)/metrics.jsonl $(DEMO_RUN)/metrics.png
	@python3 scripts/compare_eval.py $(DEMO_RUN)/eval-initial/eval.json $(DEMO_RUN)/eval-final/eval.json --scorer color_match

# The learned-reward demo: recipes/tiny-cpu-clip.yaml (clip_score on a tiny random CLIP, made once by init-clip).
demo-clip: deps
	@$(MAKE) --no-print-directory $(BUILD)/vgrpo
	@test -f runs/demo/clip/config.json || { mkdir -p runs/demo && $(BUILD)/vgrpo init-clip --preset tiny --out runs/demo/clip --seed 0; }
	$(BUILD)/vgrpo run recipes/tiny-cpu-clip.yaml --overwrite

bench: all
	$(BUILD)/vgrpo bench peak
	$(BUILD)/vgrpo bench kernels
	$(BUILD)/vgrpo bench dit

# vgrpo beside PyTorch eager in one window: scripts/bench_torch.py (the project's .venv: torch, diffusers,
# transformers; BENCH_PY to use another Python) times the same shapes at the same thread count into
# $(BUILD)/bench-torch.json, then vgrpo's tables print both (`--torch FILE`). BENCH_THREADS: threads of both (default:
# all cores).
BENCH_PY ?= .venv/bin/python
BENCH_THREADS ?= $(shell nproc)
.PHONY: bench-compare
bench-compare: all
	@rm -f $(BUILD)/bench-torch.json
	$(BENCH_PY) scripts/bench_torch.py --threads $(BENCH_THREADS) --json $(BUILD)/bench-torch.json
	$(BENCH_PY) scripts/bench_torch.py --umt5 --threads $(BENCH_THREADS) --json $(BUILD)/bench-torch.json
	$(BUILD)/vgrpo bench peak --threads $(BENCH_THREADS)
	$(BUILD)/vgrpo bench dit --threads $(BENCH_THREADS) --torch $(BUILD)/bench-torch.json
	$(BUILD)/vgrpo bench umt5 --threads $(BENCH_THREADS) --torch $(BUILD)/bench-torch.json
	$(BUILD)/vgrpo bench kernels --threads $(BENCH_THREADS)

# The CLIP towers of folder CLIP_DIR (e.g. one of `scripts/fixtures_clip.py full`'s: random weights at real shapes),
# PyTorch eager then vgrpo at the same batch (CLIP_BATCH) and threads, in one window.
CLIP_DIR ?= /tmp/vgrpo-clip-full/b32
CLIP_BATCH ?= 8
.PHONY: bench-clip
bench-clip: all
	@rm -f $(BUILD)/bench-torch-clip.json
	$(BENCH_PY) scripts/bench_torch.py --clip $(CLIP_DIR) --batch $(CLIP_BATCH) --threads $(BENCH_THREADS) --json $(BUILD)/bench-torch-clip.json
	$(BUILD)/vgrpo bench clip --model $(CLIP_DIR) --batch $(CLIP_BATCH) --threads $(BENCH_THREADS) --torch $(BUILD)/bench-torch-clip.json

# The layering check (scripts/check_layout.py): which folder may include which, no file-level cycles inside a
# folder (from the objects in $(BUILD); build first), and a warning list of long cli/ files.
.PHONY: check-layout
check-layout: $(BUILD)/vgrpo
	python3 scripts/check_layout.py --build $(BUILD)

# libFuzzer targets (clang), each run for FUZZ_SECONDS. Every target runs even when one fails (a build error or a
# finding); the failures are listed at the end, and then make fails.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
# The fuzzed parsers and what they need (no OpenMP, BLAS or other heavy code).
FUZZ_LIB_SRC := core/error.c core/fs.c core/tensor.c core/wire.c core/wire_rollout.c core/trajectory.c core/safetensors.c $(wildcard core/st_*.c) $(wildcard core/config*.c) \
  core/log.c core/checksum.c core/json.c core/philox.c core/wire_sync.c trainer/net/ctl_msg.c rollout/worker_msg.c model/dit/wan_params.c model/dit/wan_hash.c model/dit/wan_config.c \
  reward/scorers.c reward/server_requests.c tests/fuzz/worker_ipc_none.c
FUZZ_CC := clang -g -O1 -std=c11 -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined
FUZZ_LIBS := -lyaml -ljansson -lxxhash -lm
fuzz: deps
	@mkdir -p build-fuzz
	@failed=""; for t in $(FUZZ_TARGETS); do \
	  if ! $(FUZZ_CC) -o build-fuzz/$$t tests/fuzz/$$t.c $(FUZZ_LIB_SRC) $(FUZZ_LIBS); then \
	    echo "fuzz: $$t FAILED to build"; failed="$$failed $$t(build)"; continue; \
	  fi; \
	  mkdir -p build-fuzz/corpus-$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  rc=0; build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=build-fuzz/$$t- \
	    build-fuzz/corpus-$$t tests/fuzz/seeds-$$t > build-fuzz/$$t.log 2>&1 || rc=$$?; \
	  tail -n 12 build-fuzz/$$t.log; \
	  if [ $$rc -ne 0 ]; then echo "fuzz: $$t FAILED (exit $$rc); log build-fuzz/$$t.log, crash input build-fuzz/$$t-*"; \
	    failed="$$failed $$t"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed"; exit 1; fi; \
	echo "fuzz: all $(words $(FUZZ_TARGETS)) targets clean ($(FUZZ_SECONDS) s each)"


# The fuzz build without fuzzing (tests/test_fuzz_build.c, in `make test` where clang is installed): every target's
# file compiled, one target linked against $(FUZZ_LIB_SRC), whose symbols every target shares; a few seconds.
.PHONY: fuzz-build
fuzz-build:
	@mkdir -p build-fuzz
	@for t in $(FUZZ_TARGETS); do $(FUZZ_CC) -fsyntax-only tests/fuzz/$$t.c || exit 1; done
	@$(FUZZ_CC) -o build-fuzz/fuzz_worker_msg tests/fuzz/fuzz_worker_msg.c $(FUZZ_LIB_SRC) $(FUZZ_LIBS)
	@echo "fuzz-build: $(words $(FUZZ_TARGETS)) targets compiled, fuzz_worker_msg linked"

clean:
	rm -rf build build-asan build-fuzz

# --- make cuda: build/vgrpo with the CUDA backend, and build/gpu_check (the GPU check that scripts/gpu_check.sh
# runs on a GPU machine). BUILD=DIR builds elsewhere. A folder switched between the plain and the CUDA flavour
# rebuilds all of its objects once (the .flavor-* stamps), since the two link different archives. ---
.PHONY: cuda
cuda:
	@test -x "$(NVCC)" || { echo "make cuda: nvcc not found at $(NVCC) (set CUDA_HOME or NVCC)" >&2; exit 1; }
	@$(MAKE) --no-print-directory VGRPO_CUDA=1 $(BUILD)/vgrpo $(BUILD)/gpu_check

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

ifeq ($(VGRPO_CUDA),1)
FLAVOR_STAMP := $(BUILD)/.flavor-cuda
else ifneq ($(wildcard $(BUILD)/.flavor-cuda),)
FLAVOR_STAMP := $(BUILD)/.flavor-cpu
endif
ifdef FLAVOR_STAMP
$(LIB_OBJ) $(CLI_OBJ) $(TEST_OBJ) $(MPI_TEST_OBJ): $(FLAVOR_STAMP)
$(FLAVOR_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flavor-* && touch $@
endif

# The GPU check links as little as possible: the static CUDA runtime, libgomp statically, libc/libm; cuBLASLt and
# cuDNN are dlopen'ed. Its C objects (the CPU reference included) are built for x86-64-v3 (AVX2/FMA), not
# -march=native, so the binary runs on the GPU machine's processor. The Wan DiT rows (model/dit/check/) bring the
# device model and the fp32 CPU model with what they call; their files' other functions (config.json parsing,
# hashes) would need jansson/xxhash, so every object is built with one section per function and the link drops the
# unused ones (--gc-sections): still libc/libm only.
GPU_CHECK_DIT_SRC := $(wildcard model/dit/check/*.c) $(wildcard model/dit/wan_dev*.c) \
  $(addprefix model/dit/,wan_config.c wan_params.c wan_acts.c wan_forward.c wan_backward.c wan_layers.c wan_lora.c \
  wan_executor.c) \
  sp/shard.c sp/comm.c core/philox.c
# The NCCL row (sp/check/check_nccl.c): the comm table on NCCL with one rank; NCCL itself is dlopen'ed.
GPU_CHECK_DIT_SRC += sp/comm_ranges.c sp/comm_nccl.c $(wildcard sp/check/*.c)
# The GRPO rows (cli/check/check_grpo.c): the rollout engine and the training step on the device
# against the CPU, with what they call (the unused functions of these files go with --gc-sections as above).
GPU_CHECK_GRPO_SRC := cli/check/check_grpo.c rollout/engine.c trainer/step/train_step.c trainer/optim/train_dev.c \
  trainer/step/grpo.c trainer/optim/optim.c model/flow/flow.c model/flow/first_frame.c model/flow/denoise.c \
  model/vae/wan_vae_i2v.c core/trajectory.c core/reduce.c
GPU_CHECK_DIT_SRC += $(GPU_CHECK_GRPO_SRC)
GPU_CHECK_SRC := $(wildcard kernels/cuda/check/*.c) $(CUDA_C_SRC) $(wildcard kernels/cuda/precond/*.c) $(wildcard kernels/cpu/*.c) core/error.c $(GPU_CHECK_DIT_SRC)
GPU_CHECK_OBJ := $(GPU_CHECK_SRC:%.c=$(BUILD)/gpucheck/%.o)
GPU_CHECK_CFLAGS := -O3 -march=x86-64-v3 -std=c11 -ffp-contract=off -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -ffunction-sections -fdata-sections -I. -I$(CUDA_HOME)/include -DVGRPO_CUDA=1

$(BUILD)/gpucheck/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(GPU_CHECK_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/gpu_check: $(GPU_CHECK_OBJ) $(CUDA_CU_OBJ)
	$(CC) -Wl,--gc-sections -o $@ $^ -L$(CUDA_HOME)/lib64 -lcudart_static -Wl,-Bstatic -lgomp -Wl,-Bdynamic -ldl -lrt -lpthread -lm -Wl,-rpath,$(CUDA_HOME)/lib64

# `make gpu-check-emu`: scripts/gpu_check.sh, both stages, over an emulated device (kernels/cuda/emu/: host memory, the
# kernel bodies, k_cpu_ops for GEMM and attention; named k_cuda_ops under -DCK_EMULATE; kernels/cuda/check/emu/
# emulate.c: the rest of k_cuda.h) to test the check's own logic and the script without a GPU or CUDA toolkit; the
# log, the JSON of the rows and the summary land in $(BUILD)/gpu-check/. `make test` links the same table as k_emu_ops.
# The nccl group's NCCL is the fake one (tests/fake_nccl/: one rank without MPI copies on the host). The coloc rows
# run $(BUILD)/vgrpo on the emulated device; `make gpu-check-emu-s3` runs stage 3 (the step-time table) at its tiny size.
GPU_EMU_SRC := $(wildcard kernels/cuda/check/*.c) $(wildcard kernels/cuda/check/emu/*.c) $(wildcard kernels/cuda/emu/*.c) $(wildcard kernels/cuda/precond/*.c) $(wildcard kernels/cpu/*.c) core/error.c $(GPU_CHECK_DIT_SRC)
GPU_EMU_OBJ := $(GPU_EMU_SRC:%.c=$(BUILD)/gpuemu/%.o)
.PHONY: gpu-check-emu
gpu-check-emu: $(BUILD)/gpu_check_emu $(BUILD)/libfake_nccl.so $(BUILD)/vgrpo
	VGRPO_NCCL_LIB=$(CURDIR)/$(BUILD)/libfake_nccl.so VGRPO_BIN=$(BUILD)/vgrpo scripts/gpu_check.sh --emulated --bin $(BUILD)/gpu_check_emu --out $(BUILD)/gpu-check
.PHONY: gpu-check-emu-s3
gpu-check-emu-s3: $(BUILD)/gpu_check_emu $(BUILD)/vgrpo
	VGRPO_BIN=$(BUILD)/vgrpo scripts/gpu_check.sh --stage 3 --emulated --bin $(BUILD)/gpu_check_emu --out $(BUILD)/gpu-check-s3

$(BUILD)/gpuemu/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -I$(CUDA_HOME)/include,$(GPU_CHECK_CFLAGS)) -DCK_EMULATE -MMD -MP -c $< -o $@

$(BUILD)/gpu_check_emu: $(GPU_EMU_OBJ)
	$(CC) -fopenmp -Wl,--gc-sections -o $@ $^ -lm

-include $(CUDA_CU_OBJ:.o=.d) $(GPU_CHECK_OBJ:.o=.d) $(GPU_EMU_OBJ:.o=.d)
# --- end make cuda ---

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(MPI_TEST_OBJ:.o=.d)
