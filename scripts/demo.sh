#!/usr/bin/env bash
# The whole pipeline on the embedded digits set, in one folder, as a user types it.
set -euo pipefail
DIR="${1:-demo}"
mkdir -p "$DIR"
cd "$DIR"
echo "== vitdeploy train (embedded digits set) in $(pwd)"
vitdeploy train
echo
echo "artifacts in $(pwd):"
echo "  checkpoint: $(pwd)/ckpt.pth"
