#!/usr/bin/env bash
# Installs the Debian packages vgrpo builds, tests and runs with. Idempotent and quiet:
# packages already present are skipped, so `make test` can call it every time at little cost.
# Runs apt-get directly as root, through sudo otherwise.
set -euo pipefail

pkgs=(
  build-essential pkg-config
  libopenblas-openmp-dev     # sgemm for the fp32 CPU path (OpenMP build: shares threads with our OpenMP regions)
  libyaml-dev                # recipes and configs
  libjansson-dev             # JSON: safetensors headers, configs, wire headers, metrics
  libxxhash-dev              # xxh64 checksums (weight sync, fixtures)
  libutf8proc-dev            # Unicode NFC and categories (the CLIP tokenizer)
  libzmq3-dev                # process channels
  libavcodec-dev libavformat-dev libswscale-dev libavutil-dev   # mp4 writer
  libpng-dev                 # PNG contact sheets
  libopenmpi-dev openmpi-bin # trainer ranks
  ffmpeg                     # ffprobe, for the video tests
  python3 python3-zmq python3-numpy   # Python protocol peer and its tests
  clang libclang-rt-14-dev   # libFuzzer for `make fuzz`
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
