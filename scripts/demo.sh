#!/usr/bin/env bash
# The whole pipeline on the embedded digits set, in one folder, as a user types it.
set -euo pipefail
DIR="${1:-demo}"
CALIB_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/calibration"
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
echo "== vitdeploy calibrate: INT8 Q/DQ from calibration/ (real digit images); the guard keeps layers in float until"
echo "   the top-1 drop against FP32 on digits/val is <= 0.5 points and agreement >= 99%"
[ -d calibration ] || cp -r "$CALIB_SRC" calibration
vitdeploy calibrate model.onnx --eval digits/val --max-drop 0.5 --min-agreement 0.99
echo
echo "== vitdeploy convert-fp16: FP16 with LayerNorm, Softmax and reductions in float32"
vitdeploy convert-fp16 model.onnx
echo
echo "== vitdeploy verify: FP32, FP16 and INT8 ONNX side by side (on the CPU: OpenVINO where installed, else ONNX Runtime)"
vitdeploy verify model.onnx model.fp16.onnx model.int8.onnx --images digits/val --json verify-precision.json
echo
echo "artifacts in $(pwd):"
echo "  checkpoint: $(pwd)/ckpt.pth"
echo "  ONNX:       $(pwd)/model.onnx (verify: $(pwd)/verify.json)"
echo "  INT8 ONNX:  $(pwd)/model.int8.onnx (ranges: model.int8.calib.json), FP16 ONNX: $(pwd)/model.fp16.onnx (verify: verify-precision.json)"
# --- the TensorRT engine (issue 5)
echo
echo "== vitdeploy build-engine: model.int8.onnx (already INT8: built as it is) → model.int8.engine where TensorRT"
echo "   and a GPU are; elsewhere exit 3 with the commands that finish the job on the target"
rc=0; vitdeploy build-engine model.int8.onnx || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || exit "$rc"
# --- where the model looks, and the verify report with plots (issue 9)
echo
echo "== vitdeploy explain: attention maps for a few digits"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
[ -f model.onnx ] || vitdeploy export ckpt.pth
EXPLAIN=()
for c in 0 3 5 8; do files=(digits/val/$c/*.png); EXPLAIN+=("${files[0]}"); done
COMPARE=()  # do the quantized copies still look at the same strokes?
for f in model.fp16.onnx model.int8.onnx; do [ -f "$f" ] && COMPARE+=(--compare "$f"); done
vitdeploy explain "${EXPLAIN[@]}" --model ckpt.pth -o attention ${COMPARE[@]+"${COMPARE[@]}"}
echo
echo "== vitdeploy verify --report"
CANDIDATES=(model.onnx)
for f in model.fp16.onnx model.int8.onnx; do [ -f "$f" ] && CANDIDATES+=("$f"); done
vitdeploy verify ckpt.pth "${CANDIDATES[@]}" --images digits/val --report report \
  || echo "(verify exited $?: report/index.html shows where the candidates differ)"
echo
echo "attention maps: $(pwd)/attention/"
echo "verify report:  $(pwd)/report/index.html"
# --- the device bundle and doctor (issue 7)
echo
echo "== vitdeploy doctor: what this machine can do"
vitdeploy doctor
echo
echo "== vitdeploy bundle: ONNX + raw-pixel variants, labels, run.py, build_engine.sh, Triton, DeepStream"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
vitdeploy bundle --force --check-images digits/val --references 32
python3 bundle/run.py --check
THREES=(digits/val/3/*.png)
python3 bundle/run.py "${THREES[@]:0:3}"
bundle/build_engine.sh --dry-run
echo "bundle:         $(pwd)/bundle/ (copy it to the Jetson: ./build_engine.sh && python3 run.py --check)"
echo "C++ example:    $(pwd)/bundle/cpp/ (on the Jetson: cmake -S cpp -B cpp/build && cmake --build cpp/build; see bundle/README.md)"
# --- everyday inference and speed (issue 6)
echo
echo "== vitdeploy infer: the digits val images with the newest usable artifact here (INT8 ONNX on a CPU)"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
vitdeploy infer digits/val -o predictions.csv
echo
echo "== vitdeploy benchmark: the checkpoint and the ONNX models side by side"
BENCH=(ckpt.pth)
for f in model.onnx model.fp16.onnx model.int8.onnx; do [ -f "$f" ] && BENCH+=("$f"); done
vitdeploy benchmark "${BENCH[@]}" --batch-sizes 1,32 --seconds 2 --json benchmark.json
echo "predictions:    $(pwd)/predictions.csv, speed: $(pwd)/benchmark.json"
# --- the digits ViT as an embedding model (issue 36): its pre-logits features, judged by cosine and kNN
echo
echo "== vitdeploy export --embedding: the same ViT as an embedding model (output embedding [batch, 96], L2-normalised)"
[ -d digits/val ] || vitdeploy datasets digits digits > /dev/null
vitdeploy export ckpt.pth --embedding --normalize -o embed.onnx -i digits/val
vitdeploy convert-fp16 embed.onnx
echo
echo "== vitdeploy calibrate --min-cosine: INT8 held to a mean per-image cosine of 0.99 to FP32 (with the p1 and"
echo "   nearest-neighbour gates of the INT8 budget) on digits/val"
vitdeploy calibrate embed.onnx --eval digits/val --min-cosine 0.99
echo
echo "== vitdeploy verify: per-image cosine, nearest-neighbour agreement and kNN top-1 (k=20, T=0.07) beside FP32's"
vitdeploy verify embed.onnx embed.fp16.onnx embed.int8.onnx --images digits/val --json verify-embedding.json \
  || echo "(verify exited $?: a candidate is outside its budget; verify-embedding.json has every figure)"
echo
echo "== vitdeploy infer --gallery: each val image labelled by its 20 nearest train images (DINOv2's weighted kNN)"
[ -d digits/train ] || vitdeploy datasets digits digits > /dev/null
vitdeploy infer digits/val -m embed.onnx --gallery digits/train -o knn-labels.csv
vitdeploy infer digits/val -m embed.onnx -o embeddings.npy
echo "embeddings:     $(pwd)/embeddings.npy (+ embeddings.files.txt), kNN labels: $(pwd)/knn-labels.csv"
