#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU check of the CUDA backend, for a machine with a Hopper GPU (run from anywhere in the
# repository). One short run tells everything, and its LAST 40 LINES are a summary that reads alone (environment,
# rows failed with their first error, the speed table), since a remote run may return only the end of the output.
#
#   scripts/gpu_check.sh [--stage 1|2|3|all] [--groups G,G..] [--out DIR] [--bin PATH] [--emulated] [--seed N] [--rows R]
#                        [--s3-size real|tiny]
#
# Stage 1 (about 2 minutes; small shapes with Wan's head dim: dim 1024 = 8 x 128, 960 tokens): the smallest checks
# that show the path works at all — the GPU, driver and libraries (versions, paths) and a memory round trip; every
# layer and flow kernel; one GEMM of each kind and epilogue; attention forward and backward, self and cross; batch
# invariance (GEMM rows at M = 1, 2, 8, S/2 vs M = S; attention sample alone vs in batches of 2 and 8); one Wan DiT
# block forward+backward vs the fp32 CPU model; the NCCL comm with one rank (libnccl.so.2 from $VGRPO_NCCL_LIB, else
# the first found like the libraries below; its rows skip, saying so, without one) and the exact reduction's block
# sum. Every row runs its op twice and checks the bits repeat.
# Stage 2: the rest — the op rows at Wan 2.1 14B widths and 7800 tokens (5 latent frames), AdamW over 64 Mi
# parameters, the 2-block Wan DiT rows (Wan 2.1, TI2V, LoRA rank 16), 10 GRPO steps on the device vs the CPU and
# rollout/trainer parity (with and without LoRA), speed (cuBLASLt GEMM 8192^3, cuDNN attention B1 H40 S32768 D128)
# beside PyTorch's at the same shapes, and whether the full vgrpo binary starts here; the tiny recipe colocated on ONE
# GPU (group coloc: one trainer rank and one rollout worker sharing it, parallel.share_gpus true): its metrics (all but
# time/ and weight_sync/) equal the one-process (mode local) device run's, every weight sync went by CUDA IPC with the
# worker's hash matching the trainer's, and vgrpo parity colocated is exactly 0; and (group vae_umt5) the VAE decode and
# umT5 on the GPU vs the CPU at small configs (a row says "not built" while its model runs on the CPU only).
# The coloc rows run the full vgrpo CLI ($VGRPO_BIN, else build-cuda/vgrpo; build/vgrpo with --emulated) and skip,
# saying why, where it cannot start. Default: stages 1 and 2.
# Stage 3 (optional, only with --stage 3, outside the two stages' budget: $GPU_CHECK_STAGE3_S, default 560 s, so one
# command still fits a 10-minute limit): the step-time table of a random-initialised Wan 2.1-1.3B (vgrpo init-model
# --random) at 480x832 with 5 and 33 frames, G = 4 (one prompt per step, 2 GRPO steps, the second timed), colocated on
# one GPU as above: rollout, decode, reward, train and sync seconds, samples/s, peak device memory (nvidia-smi's
# largest memory.used while it runs) and the MFU of the train part (model FLOPs: per row forward, 30 blocks of
# 12SD^2 + 4S^2D + 4SLD + 4LD^2 + 4SDF plus the patch, text and output GEMMs; x 3 for forward + backward; 2 rows per
# transition with CFG) against the measured bf16 GEMM peak (group peak: vgrpo bench gemm --device cuda --quick). The
# runs use model.text_encoder word_embed, model.decoder latent_rgb and algorithm.beta 0 (no umT5, VAE or reference copy
# on a random model): the decode column is the CPU Wan 2.1 VAE's (vgrpo bench vae --quick: s per latent frame x latent
# frames x G), since the VAE runs on the CPU only. --s3-size tiny: the same at the tiny preset (32x32, 4 denoising
# steps; the emulated device's default, for its test); real (the default elsewhere): the sizes above.
#
# Each row group (gpu_check --group G) runs as its own process under its own time-out, so a crash, a CUDA sticky
# error or a hang in one group costs only that group (a row "group G" says crashed / timeout, after which row). The
# time-outs come from each stage's budget (stage 1 120 s, stage 2 175 s; $GPU_CHECK_STAGE1_S / $GPU_CHECK_STAGE2_S):
# a group may use what is left of its stage minus a reserve for each group after it, so both stages together stay
# under 300 s (295 s plus the summary).
#
# --out DIR: everything printed also goes to DIR/gpu_check.log, the rows to DIR/gpu_check.json (per row: name, stage,
# group, status ok/FAIL/skip/timeout/info, figures, first error; plus the environment, the groups with their times
# and exit statuses, the speed figures) and the summary to DIR/gpu_check.summary.
# Exit status: 0 every row ok (skips allowed), 1 a row failed or a group crashed or timed out, 2 could not run (no
# binary, no usable GPU).
#
# The binary: --bin, else $GPU_CHECK_BIN, else build-cuda/gpu_check, build/gpu_check. It is built on a machine
# without a GPU (`make cuda BUILD=build-cuda`) and copied over: it needs only libc/libm and, at run time, the NVIDIA
# driver (libcuda.so.1); cuBLASLt and cuDNN are dlopen'ed from $VGRPO_CUBLASLT_LIB / $VGRPO_CUDNN_LIB when set, else
# the newest libcublasLt.so.13 / libcudnn.so.9 among python3's nvidia-* wheels (PyTorch's), torch/lib, the CUDA
# toolkit and the ldconfig cache. The full CLI ($VGRPO_BIN, else build-cuda/vgrpo) links Debian libraries (libzmq,
# ffmpeg, ...); where they are missing its row says which and is skipped: every GPU row above runs in gpu_check.
# --groups: only these groups of the stages chosen (a rerun after a fix, e.g. --stage 1 --groups attention,invariance;
# names: gpu_check --list-groups, plus torch, cli, coloc and vae_umt5 (stage 2), peak and steptime (stage 3)).
# --emulated: the binary is the emulated device (make gpu-check-emu: build/gpu_check_emu): tiny shapes, no library
# search, no PyTorch or CLI speed rows (the coloc rows run build/vgrpo on the emulated device); it tests this script
# and the check's plumbing, nothing about CUDA. -h, --help: this text.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
T0=$(date +%s)

STAGES="1 2" OUT="" BIN="${GPU_CHECK_BIN:-}" EMU=0 SEED=1 ROWS=64 ONLY="" S3SIZE=""
usage() { echo "usage: scripts/gpu_check.sh [--stage 1|2|3|all] [--groups G,G..] [--out DIR] [--bin PATH] [--emulated] [--seed N] [--rows R] [--s3-size real|tiny]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --stage) [ $# -ge 2 ] || usage; case "$2" in 1) STAGES=1 ;; 2) STAGES=2 ;; 3) STAGES=3 ;; all) STAGES="1 2" ;; *) usage ;; esac; shift ;;
    --s3-size) [ $# -ge 2 ] || usage; case "$2" in real|tiny) S3SIZE="$2" ;; *) usage ;; esac; shift ;;
    --out) [ $# -ge 2 ] || usage; OUT="$2"; shift ;;
    --groups) [ $# -ge 2 ] || usage; ONLY=",$2,"; shift ;;
    --bin) [ $# -ge 2 ] || usage; BIN="$2"; shift ;;
    --seed) [ $# -ge 2 ] || usage; SEED="$2"; shift ;;
    --rows) [ $# -ge 2 ] || usage; ROWS="$2"; shift ;;
    --emulated) EMU=1 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
    esac
    shift
done
[ -n "$S3SIZE" ] || { if [ $EMU -eq 1 ]; then S3SIZE=tiny; else S3SIZE=real; fi; }

if [ -n "$OUT" ]; then
    mkdir -p "$OUT" || { echo "gpu_check.sh: cannot create $OUT" >&2; exit 2; }
    WORK="$OUT"
    rm -f "$OUT/gpu_check.log" "$OUT/gpu_check.json" "$OUT/gpu_check.summary" "$OUT/rows.jsonl"
    exec > >(tee -a "$OUT/gpu_check.log") 2>&1
    TEE_PID=$!
else
    WORK=$(mktemp -d) || exit 2
    trap 'rm -rf "$WORK"' EXIT
fi
JL="$WORK/rows.jsonl"         # every JSON line: the binary's rows, env and speed lines, and this script's
GL="$WORK/groups.tsv"         # stage, group, status, seconds, rc, time-out
: >"$JL"
: >"$GL"
say() { printf 'gpu_check.sh: %s\n' "$*"; }
jstr() { # a JSON string of $1
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=$(printf '%s' "$s" | tr '\000-\037' ' ')
    printf '"%s"' "$s"
}
jopt() { if [ -n "$1" ]; then jstr "$1"; else printf null; fi; } # a JSON string, or null when empty
row() { # stage group name status error [note]: a row written by this script
    printf '{"type":"row","stage":%s,"group":%s,"name":%s,"status":%s,"shape":"","dtype":null,"figures":null,"vs":null,"note":%s,"error":%s}\n' \
        "$1" "$(jstr "$2")" "$(jstr "$3")" "$(jstr "$4")" "$(jopt "${6:-}")" "$(jopt "$5")" >>"$JL"
}

# ---- the binary ----
if [ -z "$BIN" ]; then
    for b in build-cuda/gpu_check build/gpu_check; do
        if [ -x "$b" ]; then BIN="$b"; break; fi
    done
fi
NOBIN=""
[ -z "$BIN" ] && NOBIN="no gpu_check binary: build one with \`make cuda BUILD=build-cuda\` (on any machine with nvcc) and carry build-cuda/gpu_check"
[ -n "$BIN" ] && [ ! -x "$BIN" ] && NOBIN="$BIN is not an executable file"

# ---- the libraries (not for the emulated device) ----
PY="$(command -v python3 || true)"
candidates() { # $1: file name
    local dirs=()
    if [ -n "$PY" ]; then
        while IFS= read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(timeout 20 "$PY" - <<'PYEOF' 2>/dev/null
import importlib
for mod in ("nvidia", "torch"):
    try:
        m = importlib.import_module(mod)
    except Exception:
        continue
    for p in getattr(m, "__path__", []):
        print(p)
PYEOF
        )
    fi
    dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
    for d in "${dirs[@]}"; do [ -d "$d" ] && find -L "$d" -maxdepth 5 -name "$1" 2>/dev/null; done
    ldconfig -p 2>/dev/null | awk -v f="$1" '$1 == f {print $NF}'
}
libversion() { # $1: path, $2: symbol
    [ -n "$PY" ] || { echo 0; return; }
    timeout 20 "$PY" -c "import ctypes,sys
try:
    print(int(getattr(ctypes.CDLL(sys.argv[1]), sys.argv[2])()))
except Exception:
    print(0)" "$1" "$2" 2>/dev/null || echo 0
}
pick() { # $1: file name, $2: version symbol -> "version path" of the newest
    local best=0 bestp="" p v
    while IFS= read -r p; do
        [ -e "$p" ] || continue
        v=$(libversion "$p" "$2")
        if [ "${v:-0}" -gt "$best" ] 2>/dev/null; then best=$v; bestp=$p; fi
    done < <(candidates "$1" | awk '!seen[$0]++')
    echo "$best $bestp"
}
SMI=""
if [ $EMU -eq 0 ] && [ -z "$NOBIN" ]; then
    if [ -z "${VGRPO_CUBLASLT_LIB:-}" ]; then
        read -r _ P < <(pick libcublasLt.so.13 cublasLtGetVersion)
        [ -n "${P:-}" ] && export VGRPO_CUBLASLT_LIB="$P"
    fi
    if [ -z "${VGRPO_CUDNN_LIB:-}" ]; then
        read -r _ P < <(pick libcudnn.so.9 cudnnGetVersion)
        [ -n "${P:-}" ] && export VGRPO_CUDNN_LIB="$P"
    fi
    if [ -z "${VGRPO_NCCL_LIB:-}" ]; then # the nccl group's (sp/comm_nccl.c dlopens it): the first one found
        P=$(candidates libnccl.so.2 | awk '!seen[$0]++' | head -n 1)
        [ -n "${P:-}" ] && export VGRPO_NCCL_LIB="$P"
    fi
    for L in "${VGRPO_CUBLASLT_LIB:-}" "${VGRPO_CUDNN_LIB:-}"; do
        # cuDNN loads its engine libraries (libcudnn_*.so.9) and NVRTC from the search path: each folder first
        [ -n "$L" ] && export LD_LIBRARY_PATH="$(dirname "$L")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    command -v nvidia-smi >/dev/null &&
        SMI=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | head -n 1)
fi
say "binary ${BIN:-none}; cuBLASLt ${VGRPO_CUBLASLT_LIB:-not searched or not found}; cuDNN ${VGRPO_CUDNN_LIB:-not searched or not found}; NCCL ${VGRPO_NCCL_LIB:-not searched or not found}"
[ -n "$SMI" ] && say "nvidia-smi: $SMI"

# ---- the groups: stage, group, shapes, reserve (seconds kept for it while earlier groups run), cap (its longest
# time-out) ----
S1=small S2=quick
[ $EMU -eq 1 ] && [ "$ROWS" = 64 ] && ROWS=16
PLAN="1 env       $S1 5  30
1 layers      $S1 8  30
1 flow        $S1 6  20
1 gemm        $S1 10 40
1 attention   $S1 15 60
1 invariance  $S1 12 45
1 block       $S1 10 40
1 nccl        $S1 5  20
2 layers      $S2 12 40
2 flow        $S2 10 30
2 gemm        $S2 12 40
2 attention   $S2 15 60
2 dit         $S2 10 40
2 grpo        $S2 15 60
2 perf        $S2 15 45
2 torch       -   15 45
2 cli         -   5  20
2 coloc       -   15 60
2 vae_umt5    -   5  30
3 peak        -   10 90
3 steptime    -   60 540"
# the emulated device: tiny shapes, and twice the caps (its CPU does the GPU's work too)
[ $EMU -eq 1 ] && PLAN=$(printf '%s\n' "$PLAN" | awk '{ if ($3 != "-") $3 = "tiny"; $5 *= 2; print }')
if [ -n "$ONLY" ]; then
    PLAN=$(printf '%s\n' "$PLAN" | awk -v only="$ONLY" 'index(only, "," $2 ",")')
    [ -n "$(printf '%s\n' "$PLAN" | awk -v s=" $STAGES " 'NF && index(s, " " $1 " ")')" ] ||
        { echo "gpu_check.sh: --groups ${ONLY//,/ }: no such group in stage ${STAGES// /, } (stage 3's: --stage 3)" >&2; exit 2; }
fi
STAGE1_S=${GPU_CHECK_STAGE1_S:-120}
STAGE2_S=${GPU_CHECK_STAGE2_S:-175}
STAGE3_S=${GPU_CHECK_STAGE3_S:-560}
NOGPU=""          # the reason the env group gave for "could not run"

last_row_name() { # the name of the last row in $1 (a JSON lines file)
    grep '"type":"row"' "$1" 2>/dev/null | tail -n 1 | sed -n 's/.*"name":"\(\([^"\\]\|\\.\)*\)".*/\1/p'
}
sig_name() { kill -l "$1" 2>/dev/null || echo "$1"; }

run_torch() { # $1 stage, $2 time-out: PyTorch's speed at the perf rows' shapes
    local out="$WORK/torch.out" rc
    if [ $EMU -eq 1 ]; then row "$1" torch "torch speed" skip "the emulated device: no PyTorch comparison"; return 3; fi
    if [ -z "$PY" ]; then row "$1" torch "torch speed" skip "no python3 on this machine"; return 3; fi
    timeout --kill-after=2 "$2" "$PY" - >"$out" 2>&1 <<'PYEOF'
import time
try:
    import torch
    import torch.nn.functional as F
except Exception as e:
    print("TORCHERR cannot import torch: %s" % e)
    raise SystemExit(0)
print("TORCHINFO torch %s, CUDA %s, cuDNN %s, %s" % (torch.__version__, torch.version.cuda,
      torch.backends.cudnn.version(), torch.cuda.get_device_name(0)), flush=True)

def timed(fn, warm, iters):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1000.0 / iters

n = 8192
x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
t = timed(lambda: torch.mm(x, y), 3, 20)
print("TORCH gemm_nn %.1f %.3f" % (2 * n ** 3 / t / 1e12, t * 1e3), flush=True)
t = timed(lambda: torch.mm(x, y.t()), 3, 20)
print("TORCH gemm_nt %.1f %.3f" % (2 * n ** 3 / t / 1e12, t * 1e3), flush=True)
del x, y
B, H, S, D = 1, 40, 32768, 128
fwd = 4.0 * B * H * S * S * D
try:
    from torch.nn.attention import sdpa_kernel, SDPBackend
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        with torch.no_grad():
            t = timed(lambda: F.scaled_dot_product_attention(q, k, v), 2, 10)
        print("TORCH attn_fwd %.1f %.3f" % (fwd / t / 1e12, t * 1e3), flush=True)
        def fb():
            o = F.scaled_dot_product_attention(q, k, v)
            o.backward(do)
        t = timed(fb, 2, 10)
        print("TORCH attn_fwdbwd %.1f %.3f" % (3.5 * fwd / t / 1e12, t * 1e3), flush=True)
except Exception as e:
    print("TORCHERR sdpa (cuDNN backend): %s" % str(e).splitlines()[0][:200])
PYEOF
    rc=$?
    sed 's/^/  torch: /' "$out"
    local info err
    info=$(sed -n 's/^TORCHINFO //p' "$out" | head -n 1)
    err=$(sed -n 's/^TORCHERR //p' "$out" | head -n 1)
    [ -n "$info" ] && printf '{"type":"torch","info":%s}\n' "$(jstr "$info")" >>"$JL"
    awk '$1 == "TORCH" {printf "{\"type\":\"speed\",\"source\":\"torch\",\"stage\":%s,\"key\":\"%s\",\"tflops\":%s,\"ms\":%s}\n", st, $2, $3, $4}' \
        st="$1" "$out" >>"$JL"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        row "$1" torch "torch speed" timeout "ran past its ${2} s and was stopped"; return 1
    elif [ -n "$err" ] && [ -z "$info" ]; then
        row "$1" torch "torch speed" skip "$err"; return 3
    elif [ -n "$err" ]; then
        row "$1" torch "torch speed" skip "$err" "the GEMM figures above were measured"; return 3
    elif [ $rc -ne 0 ]; then
        row "$1" torch "torch speed" skip "python3 exited $rc: $(tail -n 1 "$out")"; return 3
    else
        row "$1" torch "torch speed" ok "" "$info"
    fi
    return 0
}

run_cli() { # $1 stage, $2 time-out: does the full vgrpo binary start here, and its DiT bench
    local vb="${VGRPO_BIN:-build-cuda/vgrpo}" miss out="$WORK/cli.out" rc
    if [ $EMU -eq 1 ]; then row "$1" cli "vgrpo cli" skip "the emulated device: no vgrpo CLI row"; return 3; fi
    if [ ! -x "$vb" ]; then row "$1" cli "vgrpo cli" skip "no $vb here (carry build-cuda/vgrpo to check the CLI)"; return 3; fi
    miss=$(ldd "$vb" 2>/dev/null | awk '/not found/ {printf "%s%s", sep, $1; sep=", "}')
    if [ -n "$miss" ]; then
        row "$1" cli "vgrpo cli" skip "$vb needs libraries this machine lacks: $miss (every GPU row above runs in gpu_check without them)"
        return 3
    fi
    timeout --kill-after=2 "$2" "$vb" bench dit --device cuda --quick >"$out" 2>&1
    rc=$?
    sed 's/^/  vgrpo: /' "$out"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        row "$1" cli "vgrpo bench dit --device cuda --quick" timeout "ran past its ${2} s and was stopped"; return 1
    elif [ $rc -ne 0 ]; then
        row "$1" cli "vgrpo bench dit --device cuda --quick" FAIL "exit $rc: $(grep -v '^\s*$' "$out" | tail -n 1)"; return 1
    fi
    row "$1" cli "vgrpo bench dit --device cuda --quick" ok "" "$(grep -i 'mfu' "$out" | tail -n 1)"
    return 0
}

# ---- the script's own rows (coloc, vae_umt5, peak, steptime): the full vgrpo CLI ----
# The CLI: $VGRPO_BIN, else build-cuda/vgrpo (build/vgrpo on the emulated device, run with VGRPO_EMULATE_DEVICE=1).
# Prints it, or why it cannot start here (status 1).
cli_bin() {
    local vb miss
    if [ $EMU -eq 1 ]; then vb="${VGRPO_BIN:-build/vgrpo}"; else vb="${VGRPO_BIN:-build-cuda/vgrpo}"; fi
    if [ ! -x "$vb" ]; then echo "no $vb here (carry build-cuda/vgrpo, or set VGRPO_BIN)"; return 1; fi
    miss=$(ldd "$vb" 2>/dev/null | awk '/not found/ {printf "%s%s", sep, $1; sep=", "}')
    if [ -n "$miss" ]; then echo "$vb needs libraries this machine lacks: $miss"; return 1; fi
    echo "$vb"
}
VENV=(env)
[ $EMU -eq 1 ] && VENV=(env VGRPO_EMULATE_DEVICE=1 "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
left() { local l=$(($1 - $(date +%s))); [ $l -lt 1 ] && l=1; echo $l; } # seconds until $1 (epoch s), at least 1
cli() { # $1 end (epoch s), $2 log file, then the CLI's arguments: its exit status (124/137: stopped at the end)
    local end=$1 log=$2
    shift 2
    timeout --kill-after=2 "$(left "$end")" "${VENV[@]}" "$VB" "$@" >"$log" 2>&1
    local rc=$?
    tail -n 4 "$log" | cut -c1-200 | sed 's/^/  vgrpo: /'
    return $rc
}
lastline() { grep -v '^\s*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-160; }
why_failed() { # $1 what, $2 exit status, $3 log: the row's error
    case $2 in
    124 | 137) echo "$1 ran past the group's time-out and was stopped" ;;
    *) echo "$1 exited $2: $(lastline "$3")" ;;
    esac
}
strip_timing() { sed -e 's/"\(time\|weight_sync\)\/[^"]*":[^,}]*,\{0,1\}//g' -e 's/,}/}/' "$1"; }
metric() { # $1 metrics line, $2 key: its number, or empty
    printf '%s\n' "$1" | grep -o "\"$2\":[-0-9.eE+]*" | head -n 1 | cut -d: -f2
}

# The tiny recipe colocated on one GPU (one trainer rank and one rollout worker sharing it) against the one-process
# device run: 3 GRPO steps of 2 prompts x 4 samples, 6 denoising steps; then vgrpo parity colocated.
run_coloc() { # $1 stage, $2 time-out
    local st=$1 end=$(($(date +%s) + $2)) d="$WORK/coloc" r1 r2 r3 bad=0
    local n1="coloc 1 GPU metrics = local" n2="coloc 1 GPU weight sync by IPC" n3="coloc 1 GPU parity"
    if ! VB=$(cli_bin); then
        for n in "$n1" "$n2" "$n3"; do row "$st" coloc "$n" skip "$VB"; done
        return 3
    fi
    rm -rf "$d"
    mkdir -p "$d"
    local A=(--set model.device=cuda --set "model.path=$d/model" --set model.init_preset=tiny
        --set rollout.num_steps=6 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4
        --set rollout.batch_size=3 --set algorithm.micro_batch_size=5 --set data.eval_samples_per_prompt=1
        --set logging.eval_every=0 --set optim.total_steps=3 --set checkpoint.every=-1)
    local C=(--set mode=colocated --set parallel.share_gpus=true)
    cli $end "$d/local.log" run recipes/tiny-cpu.yaml "${A[@]}" --set "logging.run_dir=$d/local"; r1=$?
    if [ $r1 -eq 0 ]; then cli $end "$d/coloc.log" run recipes/tiny-cpu.yaml "${A[@]}" "${C[@]}" --set "logging.run_dir=$d/coloc"; r2=$?; else r2=-1; fi
    local ml="$d/local/metrics.jsonl" mc="$d/coloc/metrics.jsonl" wl="$d/coloc/logs/worker-0.log" note
    # 1: the metrics, timing and weight-sync figures left out
    if [ $r1 -ne 0 ]; then
        row "$st" coloc "$n1" "$( [ $r1 -eq 124 ] || [ $r1 -eq 137 ] && echo timeout || echo FAIL)" "$(why_failed "the local device run" $r1 "$d/local.log")"; bad=1
    elif [ $r2 -ne 0 ]; then
        row "$st" coloc "$n1" "$( [ $r2 -eq 124 ] || [ $r2 -eq 137 ] && echo timeout || echo FAIL)" "$(why_failed "the colocated run" $r2 "$d/coloc.log")"; bad=1
    else
        local na nb k
        na=$(wc -l <"$ml") nb=$(wc -l <"$mc")
        k=$(cmp <(strip_timing "$ml") <(strip_timing "$mc") 2>&1 | sed -n 's/.* line \([0-9]*\).*/\1/p')
        if [ "$na" -ge 3 ] && [ "$na" = "$nb" ] && [ -z "$k" ] && cmp -s <(strip_timing "$ml") <(strip_timing "$mc"); then
            row "$st" coloc "$n1" ok "" "$na metrics rows equal (all but time/ and weight_sync/): tiny recipe, 3 steps, 1 trainer rank + 1 rollout worker sharing one GPU vs mode local"
        else
            [ -n "$k" ] || k=$((na < nb ? na + 1 : nb + 1))
            local diffs
            diffs=$(diff <(strip_timing "$ml" | sed -n "${k}p" | tr , '\n') <(strip_timing "$mc" | sed -n "${k}p" | tr , '\n') | grep '^[<>]' | head -n 2 | tr '\n' ' ')
            row "$st" coloc "$n1" FAIL "metrics row $k differs ($na local rows, $nb colocated): ${diffs:-one file is shorter}"; bad=1
        fi
    fi
    # 2: every sync by IPC, the worker's hash equal to the trainer's (weight_sync/hash_match: the trainer compared the
    # worker's acknowledged xxh64 with its own)
    if [ $r2 -ne 0 ]; then
        row "$st" coloc "$n2" skip "no colocated run (see the row above)"
    else
        local ipc other hm hbad hash gbs
        ipc=$(grep -c 'applied (by IPC' "$wl" 2>/dev/null) other=$(grep -c 'applied (\(in buckets\|per tensor\)' "$wl" 2>/dev/null)
        hm=$(grep -o '"weight_sync/hash_match":[0-9]*' "$mc" | wc -l) hbad=$(grep -o '"weight_sync/hash_match":[0-9]*' "$mc" | grep -vc ':1$')
        hash=$(grep 'applied (by IPC' "$wl" 2>/dev/null | tail -n 1 | sed -n 's/.*xxh64 \([0-9a-f]*\).*/\1/p')
        gbs=$(grep -o '"weight_sync/gb_per_s":[-0-9.eE+]*' "$mc" | cut -d: -f2 | awk '{s += $1; n++} END {if (n) printf "%.3g", s / n}')
        note="${ipc:-0} syncs applied by IPC (worker log), $hm hash checks in the metrics; last model xxh64 ${hash:--}; mean ${gbs:--} GB/s"
        if [ "${ipc:-0}" -ge 3 ] && [ "${other:-0}" -eq 0 ] && [ "$hm" -ge 3 ] && [ "$hbad" -eq 0 ]; then
            row "$st" coloc "$n2" ok "" "$note"
        else
            row "$st" coloc "$n2" FAIL "want 3 syncs by IPC, all hashes matched: ${other:-0} went in buckets or per tensor, $hbad hash mismatches; $note"; bad=1
        fi
    fi
    # 3: vgrpo parity, colocated on the one GPU: exactly 0
    cli $end "$d/parity.log" parity recipes/tiny-cpu.yaml "${A[@]}" "${C[@]}" --set "logging.run_dir=$d/parity"; r3=$?
    local pl
    pl=$(grep -m1 '^parity: max' "$d/parity.log")
    if [ $r3 -eq 124 ] || [ $r3 -eq 137 ]; then
        row "$st" coloc "$n3" timeout "$(why_failed "vgrpo parity" $r3 "$d/parity.log")"; bad=1
    elif [ -n "$pl" ] && printf '%s' "$pl" | grep -q '| = 0 (tolerance 0), max |v_trainer - v_rollout| = 0 (tolerance 0): PASS'; then
        row "$st" coloc "$n3" ok "" "max |dlogp| = 0, max |dv| = 0 (vgrpo parity, colocated, share_gpus)"
    else
        row "$st" coloc "$n3" FAIL "${pl:-$(why_failed "vgrpo parity" $r3 "$d/parity.log")}"; bad=1
    fi
    [ $bad -eq 0 ] && return 0
    grep '"group":"coloc"' "$JL" | grep -q '"status":"timeout"' && return 4
    return 1
}

# The issue's VAE decode and umT5 rows: the GPU's against the CPU's at small configs.
# VAE: `vgrpo vae-decode --device cuda --vs-cpu` on the repository's Wan 2.1 and Wan 2.2 VAE fixtures (random weights,
# tests/fixtures/vae_wan2{1,2}: 3 latent frames, 3 x 5 and 2 x 3 latent pixels, every layer kind of the decoder),
# the bf16 device decode against the fp32 CPU decode: the largest difference within VAE_REL_TOL of the video's range
# and the mean within VAE_MEAN_TOL (tests/test_vae_dev.c's bands: bf16 storage through ~20 layers).
VAE_REL_TOL=0.08 VAE_MEAN_TOL=0.01
run_vae_row() { # $1 stage, $2 end (epoch s): 0 ok, 1 FAIL, 3 skip, 4 timeout
    local st=$1 end=$2 d="$WORK/vae" n="vae decode gpu vs cpu" r notes="" bad=0 v l rel mean
    if ! VB=$(cli_bin); then row "$st" vae_umt5 "$n" skip "$VB"; return 3; fi
    mkdir -p "$d"
    for v in wan21 wan22; do
        cli $end "$d/$v.log" vae-decode --vae "tests/fixtures/vae_$v" --latents "tests/fixtures/vae_${v}_io.safetensors" \
            --name latents_t3 --out "$d/$v.safetensors" --device cuda --vs-cpu; r=$?
        if [ $r -ne 0 ]; then
            row "$st" vae_umt5 "$n" "$( [ $r -eq 124 ] || [ $r -eq 137 ] && echo timeout || echo FAIL)" \
                "$(why_failed "vae-decode of the $v fixture" $r "$d/$v.log")"
            [ $r -eq 124 ] || [ $r -eq 137 ] && return 4
            return 1
        fi
        l=$(grep -m1 ' vs cpu: max |device - cpu|' "$d/$v.log")
        rel=$(printf '%s' "$l" | sed -n 's/.* relative \([-0-9.eE+naif]*\), mean relative \([-0-9.eE+naif]*\) .*/\1/p')
        mean=$(printf '%s' "$l" | sed -n 's/.* mean relative \([-0-9.eE+naif]*\) .*/\1/p')
        notes="$notes${notes:+; }$v: ${l#vae-decode: }"
        awk -v a="$rel" -v b="$mean" -v ta=$VAE_REL_TOL -v tb=$VAE_MEAN_TOL 'BEGIN {exit !(a != "" && b != "" && a + 0 <= ta && b + 0 <= tb)}' || bad=1
    done
    if [ $bad -eq 0 ]; then
        row "$st" vae_umt5 "$n" ok "" "$notes (tolerance: relative $VAE_REL_TOL, mean $VAE_MEAN_TOL)"
        return 0
    fi
    row "$st" vae_umt5 "$n" FAIL "beyond relative $VAE_REL_TOL or mean $VAE_MEAN_TOL: $notes"
    return 1
}

# umT5: vgrpo bench umt5 --device cuda (bench/bench_text_vae.c): a random umT5 (d_model 512, 4 layers, 8 heads;
# emulated: 64 tokens) encodes a padded batch of 2 prompts on the device and on the CPU; its line says the error against
# the bf16 tolerance.
run_umt5_row() { # $1 stage, $2 end (epoch s): 0 ok, 1 FAIL, 3 skip, 4 timeout
    local st=$1 end=$2 d="$WORK/vae_umt5" r pl u="umt5 gpu vs cpu"
    if ! VB=$(cli_bin); then row "$st" vae_umt5 "$u" skip "$VB"; return 3; fi
    mkdir -p "$d"
    cli $end "$d/umt5.log" bench umt5 --device cuda; r=$?
    pl=$(grep -m1 '^umt5 device vs cpu:' "$d/umt5.log" | cut -c1-200)
    if [ $r -eq 124 ] || [ $r -eq 137 ]; then
        row "$st" vae_umt5 "$u" timeout "$(why_failed "vgrpo bench umt5 --device cuda" $r "$d/umt5.log")"; return 4
    elif [ $r -eq 0 ] && printf '%s' "$pl" | grep -q ': PASS$'; then
        row "$st" vae_umt5 "$u" ok "" "${pl#umt5 device vs cpu: }; $(grep -m1 't5_forward (bf16)' "$d/umt5.log" | tr -s ' ')"
        return 0
    fi
    row "$st" vae_umt5 "$u" FAIL "${pl:-$(why_failed "vgrpo bench umt5 --device cuda" $r "$d/umt5.log")}"
    return 1
}

run_vae_umt5() { # $1 stage, $2 time-out: the worse of the two rows (FAIL, timeout, skip, ok)
    local end=$(($(date +%s) + $2)) rv ru
    run_vae_row "$1" $end; rv=$?
    run_umt5_row "$1" $end; ru=$?
    [ $rv -eq 1 ] || [ $ru -eq 1 ] && return 1
    [ $rv -eq 4 ] || [ $ru -eq 4 ] && return 4
    [ $rv -eq 3 ] || [ $ru -eq 3 ] && return 3
    return 0
}

# Stage 3: the measured bf16 GEMM peak, every MFU figure's 100%.
PEAK_TF=""
run_peak() { # $1 stage, $2 time-out
    local st=$1 end=$(($(date +%s) + $2)) d="$WORK/s3" r
    if ! VB=$(cli_bin); then row "$st" peak "peak bf16 GEMM" skip "$VB"; return 3; fi
    mkdir -p "$d"
    cli $end "$d/peak.log" bench gemm --device cuda --quick; r=$?
    PEAK_TF=$(sed -n 's/^measured bf16 GEMM peak (the \(.*\) row): \([0-9.]*\) TFLOP\/s.*/\2/p' "$d/peak.log" | head -n 1)
    if [ $r -ne 0 ] || [ -z "$PEAK_TF" ]; then
        row "$st" peak "peak bf16 GEMM" "$( [ $r -eq 124 ] || [ $r -eq 137 ] && echo timeout || echo FAIL)" "$(why_failed "vgrpo bench gemm --device cuda --quick" $r "$d/peak.log")"
        PEAK_TF=""
        return 1
    fi
    row "$st" peak "peak bf16 GEMM" ok "" "$(grep -m1 '^measured bf16 GEMM peak' "$d/peak.log")"
    return 0
}

# Stage 3: the step-time table (--s3-size: real, the 1.3B at 480x832; tiny, the tiny preset at 32x32).
run_steptime() { # $1 stage, $2 time-out
    local st=$1 end=$(($(date +%s) + $2)) d="$WORK/s3" r bad=0 recipe H W NS TL F
    if ! VB=$(cli_bin); then
        for F in 5 33; do row "$st" steptime "steptime F$F" skip "$VB"; done
        return 3
    fi
    mkdir -p "$d"
    printf 'a red ball on a green lawn\n' >"$d/prompts.txt"
    if [ "$S3SIZE" = real ]; then
        recipe=recipes/wan2.1-t2v-1.3b-1gpu.yaml H=480 W=832 NS=20 TL=512
        if [ ! -f "$d/model/model_index.json" ]; then
            cli $end "$d/init.log" init-model --preset wan2.1-t2v-1.3b --random --out "$d/model"; r=$?
            if [ $r -ne 0 ]; then
                for F in 5 33; do row "$st" steptime "steptime F$F" FAIL "$(why_failed "vgrpo init-model --preset wan2.1-t2v-1.3b --random" $r "$d/init.log")"; done
                return 1
            fi
        fi
    else
        recipe=recipes/tiny-cpu.yaml H=32 W=32 NS=4 TL=8
    fi
    # the CPU Wan 2.1 VAE's decode of one latent frame at 480x832 (real size only; the runs decode with latent_rgb)
    local vae_s=""
    if [ "$S3SIZE" = real ]; then
        local vend=$(($(date +%s) + 60))
        [ $vend -gt "$end" ] && vend=$end
        cli $vend "$d/vae.log" bench vae --quick
        vae_s=$(awk '/^vgrpo vae_decode \(1 latent frame\)/ {print $(NF - 3); exit}' "$d/vae.log")
    fi
    local cfgj="$d/model/transformer/config.json"
    for F in 5 33; do
        local name="steptime F$F ${H}x${W} G4" rd="$d/run-f$F" smi_pid="" peak_mib="" log="$d/run-f$F.log"
        rm -rf "$rd"
        if [ -n "$SMI" ]; then
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$d/smi-f$F.txt" 2>/dev/null &
            smi_pid=$!
        fi
        cli $end "$log" run "$recipe" --set model.device=cuda --set "model.path=$d/model" \
            $([ "$S3SIZE" = tiny ] && echo --set model.init_preset=tiny) \
            --set model.text_encoder=word_embed --set model.decoder=latent_rgb --set algorithm.beta=0 \
            --set mode=colocated --set parallel.share_gpus=true --set "data.prompt_file=$d/prompts.txt" \
            --set "data.eval_prompt_file=$d/prompts.txt" --set data.eval_samples_per_prompt=1 \
            --set rollout.height=$H --set rollout.width=$W --set rollout.frames=$F --set rollout.num_steps=$NS \
            --set rollout.text_len=$TL --set rollout.prompts_per_step=1 --set rollout.samples_per_prompt=4 \
            --set rollout.batch_size=4 --set optim.total_steps=2 --set checkpoint.every=-1 \
            --set logging.eval_every=0 --set "logging.run_dir=$rd"
        r=$?
        if [ -n "$smi_pid" ]; then
            kill "$smi_pid" 2>/dev/null
            wait "$smi_pid" 2>/dev/null
            peak_mib=$(sort -n "$d/smi-f$F.txt" | tail -n 1)
        fi
        local m
        m=$(grep '"time/train_s"' "$rd/metrics.jsonl" 2>/dev/null | tail -n 1)
        if [ $r -ne 0 ] || [ -z "$m" ]; then
            row "$st" steptime "$name" "$( [ $r -eq 124 ] || [ $r -eq 137 ] && echo timeout || echo FAIL)" "$(why_failed "the colocated run" $r "$log")"
            bad=1
            continue
        fi
        # the train part's model FLOPs: per row forward (bench/bench_device.c's count; patch 1x2x2 and VAE factor 8, as
        # both presets), x 3, 2 rows per transition (CFG)
        local cfgv
        cfgv=$(tr -d ' \n' <"$cfgj")
        local tr_n
        tr_n=$(metric "$m" transitions)
        local fig
        fig=$(awk -v c="$cfgv" -v F=$F -v H=$H -v W=$W -v L=$TL -v n="$tr_n" -v t="$(metric "$m" time/train_s)" -v pk="${PEAK_TF:-0}" '
            function k(name,   s) { if (!match(c, "\"" name "\":[0-9]+")) return 0; s = substr(c, RSTART, RLENGTH); sub(/.*:/, "", s); return s + 0 }
            BEGIN {
                D = k("num_attention_heads") * k("attention_head_dim"); FF = k("ffn_dim"); NL = k("num_layers"); TD = k("text_dim")
                C = k("in_channels"); Co = k("out_channels"); lf = int((F - 1) / 4) + 1; S = lf * (H / 16) * (W / 16)
                blk = 12 * S * D * D + 4 * S * S * D + 4 * S * L * D + 4 * L * D * D + 4 * S * D * FF
                fwd = NL * blk + 2 * S * D * C * 4 + 2 * S * D * Co * 4 + 2 * L * (TD * D + D * D)
                fl = n * 2 * 3 * fwd
                tf = t > 0 ? fl / t / 1e12 : 0
                printf "%d %.4g %.4g %s\n", S, tf, (pk > 0 ? 100 * tf / pk : -1), lf }')
        local S TF MFU LF
        read -r S TF MFU LF <<<"$fig"
        local dec="-"
        [ -n "$vae_s" ] && dec=$(awk -v a="$vae_s" -v b="$LF" 'BEGIN {printf "%.3g", a * b * 4}')
        local ro rw tt sy stp sps
        ro=$(metric "$m" time/rollout_s) rw=$(metric "$m" time/reward_s) tt=$(metric "$m" time/train_s)
        sy=$(metric "$m" time/sync_s) stp=$(metric "$m" time/step_s) sps=$(metric "$m" time/samples_per_s)
        local mem="-"
        [ -n "$peak_mib" ] && mem=$(awk -v a="$peak_mib" 'BEGIN {printf "%.1f", a / 1024}')
        local mfu="-"
        awk -v x="$MFU" 'BEGIN {exit !(x >= 0)}' && mfu=$(printf '%.1f' "$MFU")
        printf '{"type":"steptime","stage":%s,"size":"%s","height":%s,"width":%s,"frames":%s,"tokens":%s,"G":4,"rollout_s":%s,"decode_s":%s,"reward_s":%s,"train_s":%s,"sync_s":%s,"step_s":%s,"samples_per_s":%s,"peak_mem_gib":%s,"train_tflops":%s,"mfu_pct":%s,"peak_tflops":%s}\n' \
            "$st" "$S3SIZE" $H $W $F "$S" "${ro:-null}" "$([ "$dec" = - ] && echo null || echo "$dec")" "${rw:-null}" "${tt:-null}" \
            "${sy:-null}" "${stp:-null}" "${sps:-null}" "$([ "$mem" = - ] && echo null || echo "$mem")" "$TF" \
            "$([ "$mfu" = - ] && echo null || echo "$mfu")" "${PEAK_TF:-null}" >>"$JL"
        row "$st" steptime "$name" ok "" "$(awk -v S="$S" -v ro="$ro" -v dec="$dec" -v rw="$rw" -v tt="$tt" -v sy="$sy" -v sps="$sps" \
            'BEGIN {printf "%s tokens: rollout %.3g s, decode %s s, reward %.3g s, train %.3g s, sync %.3g s; %.3g samples/s", S, ro, dec, rw, tt, sy, sps}'); peak $mem GiB; train $TF TFLOP/s, MFU $mfu % (of ${PEAK_TF:--} TFLOP/s)"
    done
    return $bad
}

run_group() { # $1 stage, $2 group, $3 shapes, $4 time-out (s)
    local st=$1 g=$2 sh=$3 to=$4 part="$WORK/part.jsonl" out="$WORK/part.out" rc t=$(date +%s) status last
    : >"$part"
    printf '\n---- stage %s, group %s (%s shapes, time-out %s s) ----\n' "$st" "$g" "$sh" "$to"
    timeout --kill-after=2 "$to" "$BIN" --group "$g" --shapes "$sh" --rows "$ROWS" --seed "$SEED" --stage "$st" \
        --json "$part" >"$out" 2>&1
    rc=$?
    cat "$out"
    cat "$part" >>"$JL"
    last=$(last_row_name "$part")
    local after=" before its first row"
    [ -n "$last" ] && after=" after row '$last'"
    status=ok
    # 124: stopped at its time-out (137: killed 2 s after that; 137 well before it is a kill from elsewhere, e.g. the
    # kernel's out-of-memory killer, reported as a crash below)
    if [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $(($(date +%s) - t)) -ge "$to" ]; }; then
        status=timeout
        row "$st" "$g" "group $g" timeout "ran past its time-out of $to s and was stopped$after"
    elif [ $rc -eq 2 ]; then
        status=FAIL
        NOGPU=$(grep -m1 'cannot run here' "$out" | sed 's/^gpu_check: //')
        [ -z "$NOGPU" ] && NOGPU="exit 2: $(grep -v '^\s*$' "$out" | tail -n 1)"
        row "$st" "$g" "group $g" FAIL "could not run: $NOGPU"
    elif [ $rc -gt 128 ]; then
        status=FAIL
        row "$st" "$g" "group $g" FAIL "crashed (signal $(sig_name $((rc - 128))))$after; last output: $(grep -v '^\s*$' "$out" | tail -n 1 | cut -c1-160)"
    elif [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
        status=FAIL
        row "$st" "$g" "group $g" FAIL "exit $rc$after; last output: $(grep -v '^\s*$' "$out" | tail -n 1 | cut -c1-160)"
    elif [ $rc -eq 1 ]; then
        status=FAIL
    elif [ -z "$last" ]; then
        status=FAIL
        row "$st" "$g" "group $g" FAIL "exit 0 but no rows written (was it built with the group $g?)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$st" "$g" "$status" "$(($(date +%s) - t))" "$rc" "$to" >>"$GL"
}

# The time-out of the group at line $1 of the stage's plan: what is left of the stage, less the reserves of the
# groups after it, at most its cap; at least its own reserve when the stage still has that much, and never under 2 s.
timeout_for() { # $1 index in the stage, $2 the stage's plan lines, $3 stage end (epoch s)
    local left=$(($3 - $(date +%s))) later mine
    later=$(printf '%s\n' "$2" | awk -v i="$1" 'NR > i {s += $4} END {print s + 0}')
    mine=$(printf '%s\n' "$2" | awk -v i="$1" 'NR == i {print $4}')
    local t=$((left - later)) cap
    cap=$(printf '%s\n' "$2" | awk -v i="$1" 'NR == i {print $5}')
    [ $t -gt "$cap" ] && t=$cap
    if [ $t -lt "$mine" ]; then
        local n=$(printf '%s\n' "$2" | awk -v i="$1" 'NR >= i' | wc -l)
        t=$((left / n))
        [ $t -gt "$mine" ] && t=$mine
    fi
    [ $t -lt 2 ] && t=2
    echo $t
}

if [ -n "$NOBIN" ]; then
    say "$NOBIN"
    row 1 env "gpu_check binary" FAIL "$NOBIN"
    NOGPU="$NOBIN"
else
    for st in $STAGES; do
        plan=$(printf '%s\n' "$PLAN" | awk -v s="$st" '$1 == s')
        budget=$STAGE1_S
        [ "$st" = 2 ] && budget=$STAGE2_S
        [ "$st" = 3 ] && budget=$STAGE3_S
        end=$(($(date +%s) + budget))
        if [ "$st" = 2 ] && [ "$STAGES" = "1 2" ]; then end=$((T0 + STAGE1_S + STAGE2_S)); fi
        i=0
        while read -r _ g sh _ _; do
            i=$((i + 1))
            if [ -n "$NOGPU" ]; then row "$st" "$g" "group $g" skip "not run: $NOGPU"; continue; fi
            to=$(timeout_for $i "$plan" $end)
            if [ $(($(date +%s) + 1)) -ge $end ]; then
                row "$st" "$g" "group $g" skip "not run: stage $st's $budget s were spent"
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$st" "$g" skip 0 - 0 >>"$GL"
                continue
            fi
            case "$g" in
            torch) t=$(date +%s); printf '\n---- stage %s, PyTorch speed (time-out %s s) ----\n' "$st" "$to"
                   run_torch "$st" "$to"; r=$?
                   printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$st" torch "$(case $r in 0) echo ok ;; 3) echo skip ;; *) echo timeout ;; esac)" "$(($(date +%s) - t))" $r "$to" >>"$GL" ;;
            cli) t=$(date +%s); printf '\n---- stage %s, the vgrpo CLI (time-out %s s) ----\n' "$st" "$to"
                 run_cli "$st" "$to"; r=$?
                 printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$st" cli "$(case $r in 0) echo ok ;; 3) echo skip ;; *) echo FAIL ;; esac)" "$(($(date +%s) - t))" $r "$to" >>"$GL" ;;
            coloc|vae_umt5|peak|steptime) t=$(date +%s); printf '\n---- stage %s, %s (time-out %s s) ----\n' "$st" "$g" "$to"
                 "run_$g" "$st" "$to"; r=$?
                 printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$st" "$g" "$(case $r in 0) echo ok ;; 3) echo skip ;; 4) echo timeout ;; *) echo FAIL ;; esac)" "$(($(date +%s) - t))" $r "$to" >>"$GL" ;;
            *) run_group "$st" "$g" "$sh" "$to" ;;
            esac
        done <<<"$plan"
    done
fi

# ---- exit status ----
ELAPSED=$(($(date +%s) - T0))
if [ -n "$NOGPU" ]; then
    EXIT=2 MEANING="could not run: $NOGPU"
elif grep '"type":"row"' "$JL" | grep -q '"status":"\(FAIL\|timeout\)"'; then
    EXIT=1 MEANING="a row failed"
else
    EXIT=0 MEANING="every row ok"
fi

# ---- the JSON of the run ----
JSON="$WORK/gpu_check.json"
{
    printf '{"tool":"scripts/gpu_check.sh","stages":%s,"emulated":%s,"seconds":%s,"exit":%s,"exit_meaning":%s,\n' \
        "$(jstr "${STAGES// /,}")" "$([ $EMU -eq 1 ] && echo true || echo false)" "$ELAPSED" "$EXIT" "$(jstr "$MEANING")"
    printf '"binary":%s,"cublaslt_lib":%s,"cudnn_lib":%s,"nvidia_smi":%s,\n' "$(jstr "${BIN:-}")" \
        "$(jstr "${VGRPO_CUBLASLT_LIB:-}")" "$(jstr "${VGRPO_CUDNN_LIB:-}")" "$(jstr "$SMI")"
    printf '"env":%s,\n' "$(grep -m1 '"type":"env"' "$JL" || echo null)"
    printf '"torch":%s,\n' "$(grep -m1 '"type":"torch"' "$JL" || echo null)"
    printf '"groups":[%s],\n' "$(awk -F'\t' '{printf "%s{\"stage\":%s,\"group\":\"%s\",\"status\":\"%s\",\"seconds\":%s,\"rc\":\"%s\",\"timeout_s\":%s}", (NR > 1 ? "," : ""), $1, $2, $3, $4, $5, $6}' "$GL")"
    printf '"rows":[\n%s\n],\n' "$(grep '"type":"row"' "$JL" | paste -sd, -)"
    printf '"speed":[%s],\n' "$(grep '"type":"speed"' "$JL" | paste -sd, -)"
    printf '"steptime":[%s]}\n' "$(grep '"type":"steptime"' "$JL" | paste -sd, -)"
} >"$JSON"
[ -n "$OUT" ] || rm -f "$JSON"

# ---- the summary: the last 40 lines printed (at most 40, each at most 200 characters) ----
SUMMARY="$WORK/summary.txt"
{
    printf '==================== gpu_check summary: stage %s, %s s, exit %s (%s) ====================\n' \
        "${STAGES// /+}" "$ELAPSED" "$EXIT" "$MEANING"
    awk -v smi="$SMI" -v s3=$([ "$STAGES" = 3 ] && echo 1 || echo 0) -v bin="${BIN:-none}" -v emu=$EMU -v lt="${VGRPO_CUBLASLT_LIB:-}" -v dnn="${VGRPO_CUDNN_LIB:-}" '
    function field(s, k,   m) {   # the string value of key k in the JSON line s
        if (!match(s, "\"" k "\":\"([^\"\\\\]|\\\\.)*\"")) return ""
        m = substr(s, RSTART + length(k) + 4, RLENGTH - length(k) - 5)
        gsub(/\\"/, "\"", m); gsub(/\\\\/, "\\", m)
        return m
    }
    function num(s, k) { if (!match(s, "\"" k "\":[-0-9.eE+]+")) return ""; return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3) }
    /"type":"env"/ && !env { env = 1
        printf "GPU      %s, cc %s, %s SMs, %s GiB; driver %s (nvidia-smi: %s); CUDA runtime %s (static)\n", field($0, "gpu"), field($0, "cc"), num($0, "sm_count"), num($0, "mem_gib"), num($0, "driver"), smi == "" ? "-" : smi, num($0, "runtime")
        printf "cuBLASLt %s from %s\n", num($0, "cublaslt_version"), field($0, "cublaslt_path")
        printf "cuDNN    %s from %s\n", num($0, "cudnn_version"), field($0, "cudnn_path") }
    /"type":"torch"/ { torch = field($0, "info") }
    END {
        if (!env && s3) printf "GPU      (stage 3 alone runs no env group%s)\n", smi == "" ? "" : "; nvidia-smi: " smi
        else if (!env) printf "GPU      (no environment line: the check did not start%s)\nlibs     found by this script: cuBLASLt %s; cuDNN %s\n", smi == "" ? "" : "; nvidia-smi: " smi, lt == "" ? "-" : lt, dnn == "" ? "-" : dnn
        printf "PyTorch  %s\n", torch == "" ? (emu ? "(not run: emulated device)" : "(not run or not found)") : torch
        printf "binary   %s%s\n", bin, emu ? " (EMULATED device: tests the plumbing, not CUDA)" : "" }' "$JL"
    for st in 1 2 3; do
        awk -F'\t' -v s=$st '$1 == s {l = l sep $2 " " $3 " " $4 "s"; sep = ", "} END {if (l != "") printf "stage %s  %s\n", s, l}' "$GL"
    done
} >"$SUMMARY"
FIXED=$(wc -l <"$SUMMARY")
{
    awk '
    function field(s, k,   m) {
        if (!match(s, "\"" k "\":\"([^\"\\\\]|\\\\.)*\"")) return ""
        m = substr(s, RSTART + length(k) + 4, RLENGTH - length(k) - 5)
        gsub(/\\"/, "\"", m); gsub(/\\\\/, "\\", m)
        return m
    }
    function stg(s) { return match(s, "\"stage\":[0-9]+") ? substr(s, RSTART + 8, RLENGTH - 8) : "?" }
    /"type":"row"/ { n++; st = field($0, "status"); c[st]++
        if (st == "FAIL" || st == "timeout") {
            line = sprintf("%s [%s %s] %s: %s", st == "FAIL" ? "FAIL" : "TIMEOUT", stg($0), field($0, "group"), field($0, "name"), field($0, "error"))
            if (field($0, "name") ~ /^group /) grp[++ng] = line; else bad[++nb] = line }
        if (st == "skip") {
            if (field($0, "name") ~ /^group / && field($0, "error") ~ /^not run: /) { nr++; reason = substr(field($0, "error"), 10) }
            else if (field($0, "error") ~ /^not built: /) notbuilt = notbuilt (nb2++ ? "; " : "") field($0, "name") " (" substr(field($0, "error"), 12) ")"
            else skipped = skipped (ns++ ? "; " : "") field($0, "name") " (" field($0, "error") ")" } }
    END {
        printf "rows     %d: %d ok, %d FAIL, %d timeout, %d skip, %d info\n", n, c["ok"], c["FAIL"], c["timeout"], c["skip"], c["info"]
        for (i = 1; i <= ng; i++) print grp[i]
        for (i = 1; i <= nb; i++) print bad[i]
        if (nr) printf "not run  %d groups: %s\n", nr, reason
        if (nb2) printf "not built %s\n", notbuilt
        if (ns) printf "skipped  %s\n", skipped }' "$JL"
} >"$WORK/rows.txt"
SPEED="$WORK/speed.txt"
awk '
    function field(s, k) { if (!match(s, "\"" k "\":\"[^\"]*\"")) return ""; return substr(s, RSTART + length(k) + 4, RLENGTH - length(k) - 5) }
    function num(s, k) { if (!match(s, "\"" k "\":[-0-9.eE+]+")) return ""; return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3) }
    /"type":"speed"/ { v[field($0, "source") "/" field($0, "key")] = num($0, "tflops"); any = 1 }
    END {
        split("gemm_nn gemm_nt attn_fwd attn_fwdbwd", k, " ")
        lab["gemm_nn"] = "GEMM 8192^3 C = A B (NN)"; lab["gemm_nt"] = "GEMM 8192^3 C = A B^T (NT, linear)"
        lab["attn_fwd"] = "attention fwd B1 H40 S32768 D128"; lab["attn_fwdbwd"] = "attention fwd+bwd (3.5 x fwd FLOPs)"
        printf "%-40s %-22s %-22s %s\n", "speed (TFLOP/s, bf16)", "vgrpo cuBLASLt/cuDNN", "PyTorch mm/SDPA cuDNN", "vgrpo/PyTorch"
        for (i = 1; i <= 4; i++) {
            a = v["vgrpo/" k[i]]; b = v["torch/" k[i]]
            printf "%-40s %-22s %-22s %s\n", lab[k[i]], a == "" ? "-" : a, b == "" ? "-" : b, (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2f", a / b) : "-" } }' "$JL" >"$SPEED"
# stage 3's step-time table (only when it ran)
awk '
    function num(s, k) { if (!match(s, "\"" k "\":[-0-9.eE+]+")) return "-"; return substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3) }
    function f(x) { return x == "-" ? "-" : sprintf("%.3g", x) }
    /"type":"steptime"/ {
        if (!n++) printf "%-22s %6s %8s %7s %7s %8s %7s %8s %9s %8s %8s %6s\n", "step time (s), G 4", "tokens", "rollout", "decode", "reward", "train", "sync", "step", "samples/s", "peak GiB", "TFLOP/s", "MFU %"
        printf "%-22s %6s %8s %7s %7s %8s %7s %8s %9s %8s %8s %6s\n", "F" num($0, "frames") " " num($0, "height") "x" num($0, "width") " " (index($0, "\"size\":\"tiny\"") ? "tiny" : "1.3B"), num($0, "tokens"),
            f(num($0, "rollout_s")), f(num($0, "decode_s")), f(num($0, "reward_s")), f(num($0, "train_s")), f(num($0, "sync_s")), f(num($0, "step_s")),
            f(num($0, "samples_per_s")), num($0, "peak_mem_gib"), f(num($0, "train_tflops")), num($0, "mfu_pct") }' "$JL" >>"$SPEED"
TAIL=2   # the "files" line and the last line
ROOM=$((40 - FIXED - $(wc -l <"$SPEED") - TAIL))
NR_ROWS=$(wc -l <"$WORK/rows.txt")
if [ "$NR_ROWS" -le "$ROOM" ]; then
    cat "$WORK/rows.txt" >>"$SUMMARY"
else
    head -n $((ROOM - 1)) "$WORK/rows.txt" >>"$SUMMARY"
    echo "... and $((NR_ROWS - ROOM + 1)) more lines of failed or skipped rows: see gpu_check.json / the log above" >>"$SUMMARY"
fi
cat "$SPEED" >>"$SUMMARY"
if [ -n "$OUT" ]; then
    echo "files    $OUT/gpu_check.log, $OUT/gpu_check.json (rows: name, stage, status, figures, error), $OUT/gpu_check.summary" >>"$SUMMARY"
else
    echo "files    none (--out DIR keeps the log, the JSON of the rows and this summary)" >>"$SUMMARY"
fi
echo "gpu_check.sh: exit $EXIT ($MEANING) after $ELAPSED s" >>"$SUMMARY"
cut -c1-200 "$SUMMARY" >"$SUMMARY.cut"
echo
cat "$SUMMARY.cut"
[ -n "$OUT" ] && cp "$SUMMARY.cut" "$OUT/gpu_check.summary"
rm -f "$SUMMARY" "$SUMMARY.cut" "$SPEED" "$WORK/rows.txt" "$WORK/part.jsonl" "$WORK/part.out" "$WORK/torch.out" \
    "$WORK/cli.out" "$JL" "$GL"
if [ -n "$OUT" ]; then # let tee write the log's end before the exit status is seen
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
fi
exit $EXIT
