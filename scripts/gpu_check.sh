#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU check of the CUDA backend, for a machine with a Hopper GPU (run from anywhere in the
# repository). One short run tells everything, and its LAST 40 LINES are a summary that reads alone (environment,
# rows failed with their first error, the speed table), since a remote run may return only the end of the output.
#
#   scripts/gpu_check.sh [--stage 1|2|all] [--groups G,G..] [--out DIR] [--bin PATH] [--emulated] [--seed N] [--rows R]
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
# beside PyTorch's at the same shapes, and whether the full vgrpo binary starts here. Default: both stages.
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
# names: gpu_check --list-groups, plus torch and cli).
# --emulated: the binary is the emulated device (make gpu-check-emu: build/gpu_check_emu): tiny shapes, no library
# search, no PyTorch or CLI rows; it tests this script and the check's plumbing, nothing about CUDA.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
T0=$(date +%s)

STAGES="1 2" OUT="" BIN="${GPU_CHECK_BIN:-}" EMU=0 SEED=1 ROWS=64 ONLY=""
usage() { echo "usage: scripts/gpu_check.sh [--stage 1|2|all] [--groups G,G..] [--out DIR] [--bin PATH] [--emulated] [--seed N] [--rows R]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --stage) [ $# -ge 2 ] || usage; case "$2" in 1) STAGES=1 ;; 2) STAGES=2 ;; all) STAGES="1 2" ;; *) usage ;; esac; shift ;;
    --out) [ $# -ge 2 ] || usage; OUT="$2"; shift ;;
    --groups) [ $# -ge 2 ] || usage; ONLY=",$2,"; shift ;;
    --bin) [ $# -ge 2 ] || usage; BIN="$2"; shift ;;
    --seed) [ $# -ge 2 ] || usage; SEED="$2"; shift ;;
    --rows) [ $# -ge 2 ] || usage; ROWS="$2"; shift ;;
    --emulated) EMU=1 ;;
    *) usage ;;
    esac
    shift
done

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
2 cli         -   5  20"
# the emulated device: tiny shapes, and twice the caps (its CPU does the GPU's work too)
[ $EMU -eq 1 ] && PLAN=$(printf '%s\n' "$PLAN" | awk '{ if ($3 != "-") $3 = "tiny"; $5 *= 2; print }')
if [ -n "$ONLY" ]; then
    PLAN=$(printf '%s\n' "$PLAN" | awk -v only="$ONLY" 'index(only, "," $2 ",")')
    [ -n "$PLAN" ] || { echo "gpu_check.sh: --groups ${ONLY//,/ }: no such group" >&2; exit 2; }
fi
STAGE1_S=${GPU_CHECK_STAGE1_S:-120}
STAGE2_S=${GPU_CHECK_STAGE2_S:-175}
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
    printf '"speed":[%s]}\n' "$(grep '"type":"speed"' "$JL" | paste -sd, -)"
} >"$JSON"
[ -n "$OUT" ] || rm -f "$JSON"

# ---- the summary: the last 40 lines printed (at most 40, each at most 200 characters) ----
SUMMARY="$WORK/summary.txt"
{
    printf '==================== gpu_check summary: stage %s, %s s, exit %s (%s) ====================\n' \
        "${STAGES// /+}" "$ELAPSED" "$EXIT" "$MEANING"
    awk -v smi="$SMI" -v bin="${BIN:-none}" -v emu=$EMU -v lt="${VGRPO_CUBLASLT_LIB:-}" -v dnn="${VGRPO_CUDNN_LIB:-}" '
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
        if (!env) printf "GPU      (no environment line: the check did not start%s)\nlibs     found by this script: cuBLASLt %s; cuDNN %s\n", smi == "" ? "" : "; nvidia-smi: " smi, lt == "" ? "-" : lt, dnn == "" ? "-" : dnn
        printf "PyTorch  %s\n", torch == "" ? (emu ? "(not run: emulated device)" : "(not run or not found)") : torch
        printf "binary   %s%s\n", bin, emu ? " (EMULATED device: tests the plumbing, not CUDA)" : "" }' "$JL"
    for st in 1 2; do
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
            else skipped = skipped (ns++ ? "; " : "") field($0, "name") " (" field($0, "error") ")" } }
    END {
        printf "rows     %d: %d ok, %d FAIL, %d timeout, %d skip, %d info\n", n, c["ok"], c["FAIL"], c["timeout"], c["skip"], c["info"]
        for (i = 1; i <= ng; i++) print grp[i]
        for (i = 1; i <= nb; i++) print bad[i]
        if (nr) printf "not run  %d groups: %s\n", nr, reason
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
