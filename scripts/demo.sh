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
