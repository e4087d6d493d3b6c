#!/usr/bin/env bash
# The whole pipeline on the embedded digits set, in one folder, as a user types it.
set -euo pipefail
DIR="${1:-demo}"
mkdir -p "$DIR"
cd "$DIR"
echo "== vitdeploy train (embedded digits set) in $(pwd)"
vitdeploy train
echo
echo "== vitdeploy export: ONNX with a dynamic batch, parity-checked against PyTorch at batch 1, 7, 32"
vitdeploy export ckpt.pth
echo
echo "== vitdeploy verify: model.onnx against ckpt.pth on the digits val images"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
vitdeploy verify ckpt.pth model.onnx --images digits/val --json verify.json
echo
echo "artifacts in $(pwd):"
echo "  checkpoint: $(pwd)/ckpt.pth"
echo "  ONNX:       $(pwd)/model.onnx (verify: $(pwd)/verify.json)"
# --- where the model looks, and the verify report with plots (issue 9)
echo
echo "== vitdeploy explain: attention maps for a few digits"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
[ -f model.onnx ] || vitdeploy export ckpt.pth
EXPLAIN=()
for c in 0 3 5 8; do files=(digits/val/$c/*.png); EXPLAIN+=("${files[0]}"); done
vitdeploy explain "${EXPLAIN[@]}" --model ckpt.pth -o attention
echo
echo "== vitdeploy verify --report"
CANDIDATES=(model.onnx)
for f in model.fp16.onnx model.int8.onnx; do [ -f "$f" ] && CANDIDATES+=("$f"); done
vitdeploy verify ckpt.pth "${CANDIDATES[@]}" --images digits/val --report report \
  || echo "(verify exited $?: report/index.html shows where the candidates differ)"
echo
echo "attention maps: $(pwd)/attention/"
echo "verify report:  $(pwd)/report/index.html"
