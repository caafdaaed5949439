#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU check of the CUDA backend, for a machine with a Hopper GPU (run from the repository
# root). Prints one report in under 8 minutes:
#   1. the libraries found and loaded (cuBLASLt, cuDNN: path and version);
#   2. the correctness table of build/gpu_check: every CUDA op against the fp32 CPU reference in the same binary, on
#      fresh random inputs at Wan 2.1 14B shapes (rel-L2, band, worst, bitwise repeat, vs-CPU, ok/FAIL per row), then
#      the 2-block Wan DiT forward+backward on the device against the fp32 CPU model at a small config (rows
#      "wan dit ...": output, parameter gradients, dx, d enc, recompute = store and checkpoint = store, batch mates;
#      a rank-16 LoRA adapter's output and gradients; model/dit/check/), then GRPO on the device (rows "grpo ...", cli/check/check_grpo.c): a 10-step GRPO run of the
#      tiny Wan preset (the rollout engine, the training step and its device AdamW) against the same run on the CPU,
#      the final eval within 2 standard errors of their difference, and rollout/trainer parity exactly 0 (3 samples
#      per rollout forward, 5 transitions per training forward, CFG; without and with a LoRA adapter);
#   3. speed side by side: vgrpo's cuBLASLt bf16 GEMM at 8192^3 and cuDNN attention fwd / fwd+bwd at
#      B1 H40 S32768 D128, against PyTorch's torch.mm and scaled_dot_product_attention (cuDNN backend) in python3;
#   4. "not yet" lines for the checks still to come (DiT block MFU, the GRPO step time at Wan 1.3B).
#
# The check binary: $GPU_CHECK_BIN, else build/gpu_check, else build-cuda/gpu_check (`make cuda` builds it here and
# it travels as a file: it needs only libc/libm, the static CUDA runtime and the GPU driver). If none exists and nvcc
# does, the binary alone is built (make VGRPO_CUDA=1 BUILD=build-gpu build-gpu/gpu_check: no Debian libraries to
# link, but jansson.h to compile model/dit/wan_config.c, whose JSON functions the link then drops).
# Libraries: $VGRPO_CUBLASLT_LIB / $VGRPO_CUDNN_LIB when set; else the newest libcublasLt.so.13 / libcudnn.so.9 among
# python3's nvidia-* wheels (PyTorch's), torch/lib, the CUDA toolkit and the ldconfig cache (cuDNN >= 9.17 is needed
# for the attention backward). Exit status: gpu_check's (0 all rows ok, 1 a row failed, 2 no usable GPU).
# Options: --quick (5 latent frames instead of 21), any other argument goes to gpu_check (e.g. --only gemm).
set -u
cd "$(dirname "$0")/.." || exit 2
T0=$(date +%s)
say() { printf '%s\n' "$*"; }

QUICK=""
PASS=()
for a in "$@"; do
    if [ "$a" = "--quick" ]; then QUICK="--quick"; else PASS+=("$a"); fi
done

# ---- the binary ----
BIN="${GPU_CHECK_BIN:-}"
if [ -z "$BIN" ]; then
    for b in build/gpu_check build-cuda/gpu_check build-gpu/gpu_check; do
        if [ -x "$b" ]; then BIN="$b"; break; fi
    done
fi
if [ -z "$BIN" ]; then
    NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
    if [ -x "$NVCC" ]; then
        say "gpu_check.sh: no prebuilt gpu_check; building it (make VGRPO_CUDA=1 BUILD=build-gpu build-gpu/gpu_check)"
        make -j"$(nproc)" --no-print-directory VGRPO_CUDA=1 BUILD=build-gpu NVCC="$NVCC" \
            CUDA_HOME="$(dirname "$(dirname "$NVCC")")" build-gpu/gpu_check >build-gpu.log 2>&1 ||
            { say "gpu_check.sh: build failed, see build-gpu.log:"; tail -n 20 build-gpu.log; exit 2; }
        BIN=build-gpu/gpu_check
    else
        say "gpu_check.sh: no gpu_check binary (run make cuda first) and no nvcc to build one"
        exit 2
    fi
fi

# ---- the libraries ----
PY="$(command -v python3 || true)"
candidates() { # $1: file name
    local dirs=()
    if [ -n "$PY" ]; then
        while IFS= read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <("$PY" - <<'PYEOF' 2>/dev/null
import importlib, os
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
    "$PY" -c "import ctypes,sys
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
if [ -z "${VGRPO_CUBLASLT_LIB:-}" ]; then
    read -r V P < <(pick libcublasLt.so.13 cublasLtGetVersion)
    [ -n "${P:-}" ] && export VGRPO_CUBLASLT_LIB="$P"
fi
if [ -z "${VGRPO_CUDNN_LIB:-}" ]; then
    read -r V P < <(pick libcudnn.so.9 cudnnGetVersion)
    [ -n "${P:-}" ] && export VGRPO_CUDNN_LIB="$P"
fi
for L in "${VGRPO_CUBLASLT_LIB:-}" "${VGRPO_CUDNN_LIB:-}"; do
    # cuDNN loads its engine libraries (libcudnn_*.so.9) from the search path: put each library's folder first
    [ -n "$L" ] && export LD_LIBRARY_PATH="$(dirname "$L")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
say "gpu_check.sh: binary $BIN; cuBLASLt ${VGRPO_CUBLASLT_LIB:-not found}; cuDNN ${VGRPO_CUDNN_LIB:-not found}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv,noheader 2>/dev/null | sed 's/^/gpu_check.sh: nvidia-smi: /'

# ---- correctness, then speed (separate runs, so a slow correctness pass cannot cost the speed figures) ----
LOG=$(mktemp)
timeout 330 "$BIN" $QUICK --no-perf "${PASS[@]}"
RC=$?
[ $RC -eq 124 ] && say "gpu_check.sh: the correctness pass ran past 330 s and was stopped"
if [ $RC -ne 2 ]; then
    timeout 100 "$BIN" --perf-only "${PASS[@]}" | tee "$LOG" | grep -v '^PERF ' | sed -n '/^Speed/,$p' | grep '^perf'
    [ "${PIPESTATUS[0]}" -eq 124 ] && say "gpu_check.sh: the speed pass ran past 100 s and was stopped"
fi

# ---- PyTorch at the same shapes ----
TLOG=$(mktemp)
if [ $RC -ne 2 ] && [ -n "$PY" ]; then
    timeout 150 "$PY" - >"$TLOG" 2>&1 <<'PYEOF'
import time
try:
    import torch
    import torch.nn.functional as F
except Exception as e:
    print("TORCHERR cannot import torch: %s" % e)
    raise SystemExit(0)
print("TORCHINFO torch %s, CUDA %s, cuDNN %s, %s" % (torch.__version__, torch.version.cuda,
      torch.backends.cudnn.version(), torch.cuda.get_device_name(0)))

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
print("TORCH gemm_nn %.1f" % (2 * n ** 3 / t / 1e12))
t = timed(lambda: torch.mm(x, y.t()), 3, 20)
print("TORCH gemm_nt %.1f" % (2 * n ** 3 / t / 1e12))
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
        print("TORCH attn_fwd %.1f" % (fwd / t / 1e12))
        def fb():
            o = F.scaled_dot_product_attention(q, k, v)
            o.backward(do)
        t = timed(fb, 2, 10)
        print("TORCH attn_fwdbwd %.1f" % (3.5 * fwd / t / 1e12))
except Exception as e:
    print("TORCHERR sdpa (cuDNN backend): %s" % str(e).splitlines()[0][:200])
PYEOF
fi
grep '^TORCHINFO\|^TORCHERR' "$TLOG" | sed 's/^TORCHINFO /gpu_check.sh: PyTorch: /; s/^TORCHERR /gpu_check.sh: PyTorch: /'
[ -s "$TLOG" ] && ! grep -q '^TORCH' "$TLOG" && { say "gpu_check.sh: the PyTorch run printed:"; tail -n 5 "$TLOG"; }

# ---- the side-by-side speed table ----
val() { awk -v k="$2" -v p="$3" 'BEGIN {v = "-"} $1 == p && $2 == k {v = $3 ($4 ? " (" $4 ")" : ""); exit} END {print v}' "$1"; }
if [ $RC -eq 2 ]; then
    say "gpu_check.sh: no usable GPU, so no speed figures"
    rm -f "$LOG" "$TLOG"
    exit 2
fi
say ""
printf '%-46s %-28s %s\n' "speed (TFLOP/s, bf16)" "vgrpo: cuBLASLt / cuDNN" "PyTorch: torch.mm / SDPA cuDNN"
printf '%-46s %-28s %s\n' "GEMM 8192^3, C = A B (NN)" "$(val "$LOG" gemm_nn PERF)" "$(val "$TLOG" gemm_nn TORCH)"
printf '%-46s %-28s %s\n' "GEMM 8192^3, C = A B^T (NT, linear layer)" "$(val "$LOG" gemm_nt PERF)" "$(val "$TLOG" gemm_nt TORCH)"
printf '%-46s %-28s %s\n' "attention fwd B1 H40 S32768 D128 (4BHS^2D)" "$(val "$LOG" attn_fwd PERF)" "$(val "$TLOG" attn_fwd TORCH)"
printf '%-46s %-28s %s\n' "attention fwd+bwd (3.5 x fwd FLOPs)" "$(val "$LOG" attn_fwdbwd PERF)" "$(val "$TLOG" attn_fwdbwd TORCH)"
say "(vgrpo: heads as [B, S, H, D], deterministic engines only; PyTorch: [B, H, S, D] contiguous, its default engine)"

# ---- the next phase's checks ----
# The 2-block DiT forward+backward vs the CPU is in the table above (rows "wan dit ..."), and so are the 10-step
# tiny GRPO run on the GPU vs the CPU and the rollout/trainer parity on the GPU (rows "grpo ...").
say ""
say "not yet: one Wan-14B block forward+backward on the GPU, ms and MFU (the 2-block DiT rows above check correctness)"
say "not yet: one GRPO step at Wan 1.3B size on the GPU, step time (the grpo rows above run the tiny preset)"
rm -f "$LOG" "$TLOG"
say "gpu_check.sh: done in $(($(date +%s) - T0)) s, exit $RC"
exit $RC
