#!/usr/bin/env bash
# Build the TensorRT engine for this bundle ON THE DEVICE that will run it: an engine is tied to the
# TensorRT version and GPU that built it. Uses `vitdeploy build-engine` where vitdeploy is installed,
# else trtexec (JetPack ships it in /usr/src/tensorrt/bin). Written by `vitdeploy bundle`.
#
#   ./build_engine.sh                     # @@PRECISION@@ engine from the raw-pixel variant → run.py uses it
#   ./build_engine.sh --precision fp16    # another precision in this bundle (@@AVAILABLE@@)
#   ./build_engine.sh --normalized        # from the plain export (float32 NCHW, normalised input)
#   ./build_engine.sh --triton            # and install it as triton/@@NAME@@/1/model.plan (platform tensorrt_plan)
#   ./build_engine.sh --deepstream        # the DeepStream variant → deepstream/model.ds.engine
#   ./build_engine.sh --dla 0             # on DLA core 0 with GPU fallback (static batch = opt)
#   ./build_engine.sh --batch 1:8:32      # batch profile min:opt:max (default @@MIN@@:@@OPT@@:@@MAX@@)
#   ./build_engine.sh --trtexec           # use trtexec even where vitdeploy is installed
#   ./build_engine.sh --dry-run           # print the command, build nothing
#   ./build_engine.sh --dry-run --trt 8.5 # ... as on TensorRT 8.5 (also: TRT_VERSION=8.5 ./build_engine.sh)
#
# Which ONNX: this bundle carries, per TensorRT line, a model that line builds as intended (made for: @@TARGET@@).
# The script finds the TensorRT version (--trt, TRT_VERSION, python3 -c 'import tensorrt', trtexec's banner) and
# builds that line's file; manifest.json "tensorrt" and README.md list them.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")"

PRECISION=@@PRECISION@@
AVAILABLE="@@AVAILABLE@@"
H=@@H@@
W=@@W@@
MIN=@@MIN@@
OPT=@@OPT@@
MAX=@@MAX@@
NAME=@@NAME@@
TRITON_SOURCE=@@TRITON_SOURCE@@
VARIANT=raw
TRITON=0
DEEPSTREAM=0
DLA=""
USE_TRTEXEC=0
DRY_RUN=0
BUNDLE_TARGET=@@TARGET@@

# TensorRT line:precision -> what that line builds as intended: RAW_ONNX RAW_ENGINE ONNX ENGINE. Rendered from
# manifest.json's bundle.tensorrt.engines, the entry run.py reads to find the engine this script writes.
line_entry() {
  case "$1" in
@@MATRIX@@
    *) ;;
  esac
}

die() { echo "build_engine.sh: $*" >&2; exit 1; }

# A bundle reads and writes only itself (the rule run.py and `vitdeploy info` apply to manifest.json's entries):
# a file it reads is a relative path inside this folder, a regular file, at most MAX_READ bytes; a file it writes
# is inside this folder and not a symlink, and is written to a new temporary file, then renamed into place.
MAX_READ=$((8 * 1024 * 1024 * 1024))
HERE="$(pwd -P)"
inside() {  # the folder that would hold $1, resolved, is this bundle or below it
  local dir
  dir="$(cd "$(dirname -- "$1")" 2>/dev/null && pwd -P)" || return 1
  case "$dir/" in "$HERE/"*) return 0 ;; *) return 1 ;; esac
}
entry_ok() {
  case "$1" in
    /*|../*|*/../*|*/..|..|"") die "$1: not a path inside this bundle (an absolute or ../ path): copy the bundle again" ;;
  esac
  inside "$1" || die "$1: not inside this bundle: copy the bundle again"
  if [ -L "$1" ]; then
    local target
    target="$(readlink -f -- "$1")" || die "$1: a broken symlink: copy the bundle again"
    case "$target" in "$HERE/"*) ;; *) die "$1: a symlink out of this bundle: copy the bundle again" ;; esac
  fi
  [ -e "$1" ] || die "$1 is missing from this bundle"
  [ -f "$1" ] || die "$1: not a regular file: copy the bundle again"
  local size
  size="$(stat -c %s -- "$1" 2>/dev/null || wc -c < "$1")"
  [ "$size" -le "$MAX_READ" ] || die "$1: $size bytes, more than a bundle file may hold ($MAX_READ): copy the bundle again"
}
dest_ok() {
  [ ! -L "$1" ] || die "$1 is a symlink: this script writes only files of this bundle; remove it and run again"
  inside "$1" || die "$1: its folder is not inside this bundle (a symlinked folder?); remove it and run again"
  [ ! -e "$1" ] || [ -f "$1" ] || die "$1: not a regular file; remove it and run again"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --precision) PRECISION="${2:?--precision needs fp32, fp16 or int8}"; shift 2 ;;
    --normalized) VARIANT=normalized; shift ;;
    --triton) TRITON=1; shift ;;
    --deepstream) DEEPSTREAM=1; shift ;;
    --dla) DLA="${2:?--dla needs a core number}"; shift 2
           case "$DLA" in *[!0-9]*|"") die "--dla $DLA: give a DLA core number such as 0 or 1" ;; esac ;;
    --batch) IFS=: read -r MIN OPT MAX <<< "${2:?--batch needs MIN:OPT:MAX}"; shift 2 ;;
    --trtexec) USE_TRTEXEC=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --trt) TRT_VERSION="${2:?--trt needs a TensorRT version such as 8.5 or 10.3}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

case " $AVAILABLE " in *" $PRECISION "*) ;; *) die "no $PRECISION model in this bundle (it has: $AVAILABLE)" ;; esac
[ "$MIN" -le "$OPT" ] && [ "$OPT" -le "$MAX" ] 2>/dev/null || die "batch profile must be MIN ≤ OPT ≤ MAX, got $MIN:$OPT:$MAX"

TRTEXEC="$(command -v trtexec || true)"
[ -z "$TRTEXEC" ] && [ -x /usr/src/tensorrt/bin/trtexec ] && TRTEXEC=/usr/src/tensorrt/bin/trtexec
if [ "$DRY_RUN" = 0 ] && [ -z "$TRTEXEC" ] && { [ "$USE_TRTEXEC" = 1 ] || ! command -v vitdeploy >/dev/null 2>&1; }; then
  die "neither vitdeploy nor trtexec found: install JetPack's TensorRT (trtexec is in /usr/src/tensorrt/bin) or pip install vitdeploy"
fi
# TensorRT version: --trt/TRT_VERSION, else the Python bindings, else the banner trtexec prints (v8502 = 8.5.2, v100300 = 10.3.0)
[ -n "${TRT_VERSION:-}" ] || { [ -n "${TRT_MAJOR:-}" ] && TRT_VERSION="$TRT_MAJOR.0"; } || true
[ -n "${TRT_VERSION:-}" ] || TRT_VERSION="$(python3 -c 'import tensorrt; print(tensorrt.__version__)' 2>/dev/null || true)"
if [ -z "${TRT_VERSION:-}" ] && [ -n "$TRTEXEC" ]; then
  V="$("$TRTEXEC" --help 2>&1 | sed -n 's/.*TensorRT v\([0-9][0-9]*\).*/\1/p' | head -n 1)"
  case "${#V}" in
    4) TRT_VERSION="${V:0:1}.${V:1:1}.$((10#${V:2:2}))" ;;
    6) TRT_VERSION="$((10#${V:0:2})).$((10#${V:2:2})).$((10#${V:4:2}))" ;;
  esac
fi
if [ -z "${TRT_VERSION:-}" ]; then
  TRT_VERSION=10.0; echo "build_engine.sh: cannot tell the TensorRT version; assuming 10 (pass --trt X.Y)" >&2
fi
IFS=. read -r TRT_MAJOR TRT_MINOR TRT_PATCH _ <<< "$TRT_VERSION.0.0"
case "$TRT_MAJOR$TRT_MINOR" in *[!0-9]*|"") die "--trt $TRT_VERSION: give a TensorRT version such as 8.5, 8.6, 10.3 or 11.4" ;; esac
TRT_MINOR=$((10#${TRT_MINOR:-0})); TRT_PATCH=$((10#${TRT_PATCH:-0}))
# the line: 8.0-8.5 -> trt8.5 (no LayerNormalization importer), 8.6, 9/10 -> trt10, 11+ -> trt11
if [ "$TRT_MAJOR" -le 8 ]; then
  if [ "$TRT_MINOR" -le 5 ]; then LINE=trt8.5; else LINE=trt8.6; fi
elif [ "$TRT_MAJOR" -le 10 ]; then LINE=trt10
else LINE=trt11; fi
ENTRY="$(line_entry "$LINE:$PRECISION")"
read -r RAW_ONNX RAW_ENGINE PLAIN_ONNX PLAIN_ENGINE _ <<< "$ENTRY" || true
BASE="${PLAIN_ONNX%.onnx}"
[ -n "$ENTRY" ] || die "no $PRECISION model in this bundle builds as intended on TensorRT $TRT_VERSION (made for: $BUNDLE_TARGET; see README.md): re-bundle with --target for this device, or pass --precision"

if [ "$DEEPSTREAM" = 1 ]; then
  [ "$PRECISION" = @@PRECISION@@ ] || die "the DeepStream variant is the @@PRECISION@@ model; re-bundle with --precision $PRECISION"
  # the DeepStream form of the model this TensorRT builds (the config names model.ds.engine whichever it is)
  if [ "$RAW_ONNX" = "$TRITON_SOURCE" ]; then ONNX=deepstream/model.ds.onnx; else ONNX=deepstream/$BASE.ds.onnx; fi
  ENGINE=deepstream/model.ds.engine
  INPUT=images; SHAPE="3x${H}x${W}"
elif [ "$VARIANT" = raw ]; then
  ONNX=$RAW_ONNX; ENGINE=$RAW_ENGINE
  INPUT=images; SHAPE="${H}x${W}x3"
else
  ONNX=$PLAIN_ONNX; ENGINE=$PLAIN_ENGINE
  INPUT=pixel_values; SHAPE="3x${H}x${W}"
fi
if [ "$TRITON" = 1 ] && { [ "$VARIANT" != raw ] || [ "$DEEPSTREAM" = 1 ] || [ "$PRECISION" != @@PRECISION@@ ]; }; then
  die "Triton serves $TRITON_SOURCE; build it with: ./build_engine.sh --triton (without --precision/--normalized/--deepstream)"
fi
entry_ok "$ONNX"
for f in "$ENGINE" "$ENGINE.dla" timing.cache; do dest_ok "$f"; done
if [ "$TRITON" = 1 ]; then for f in "triton/$NAME/1/model.plan" "triton/$NAME/config.pbtxt"; do dest_ok "$f"; done; fi
if [ -n "$DLA" ]; then   # DLA takes no dynamic shapes and runs FP16 or INT8 only
  [ "$PRECISION" != fp32 ] || die "DLA runs FP16 or INT8: pass --precision fp16 or int8 (this bundle has: $AVAILABLE)"
  MIN=$OPT; MAX=$OPT
fi

if [ "$USE_TRTEXEC" = 0 ] && command -v vitdeploy >/dev/null 2>&1; then
  # vitdeploy writes the engine atomically, with its .json sidecar (TensorRT version, GPU) beside it
  TMP="$ENGINE"   # no trap: a failed build must not delete the previous good engine
  CMD=(vitdeploy build-engine "$ONNX" --out "$ENGINE" --min-batch "$MIN" --opt-batch "$OPT" --max-batch "$MAX"
       --timing-cache timing.cache)
  [ -n "$DLA" ] && CMD+=(--dla-core "$DLA")
else
  if [ "$DRY_RUN" = 1 ]; then TMP="$ENGINE.tmp.XXXXXX"; else
    TMP="$(mktemp "$ENGINE.tmp.XXXXXX")" || die "cannot create a temporary file beside $ENGINE"
    trap 'rm -f "$TMP"' EXIT
  fi
  if [ -z "$TRTEXEC" ]; then
    [ "$DRY_RUN" = 1 ] || die "neither vitdeploy nor trtexec found: install JetPack's TensorRT (trtexec is in /usr/src/tensorrt/bin) or pip install vitdeploy"
    TRTEXEC=trtexec
  fi
  # DLA exists on 8.x, 10.0-10.7 and 11.4.1+ (JetPack 7.2.2+); NVIDIA: 10.7 was the last 10.x with DLA, 11.0-11.3 have none
  if [ -n "$DLA" ]; then
    if { [ "$TRT_MAJOR" = 10 ] && [ "$TRT_MINOR" -ge 8 ]; } || { [ "$TRT_MAJOR" -ge 11 ] && { [ "$TRT_MINOR" -lt 4 ] || { [ "$TRT_MINOR" = 4 ] && [ "$TRT_PATCH" -lt 1 ]; }; }; }; then
      die "TensorRT $TRT_VERSION has no DLA (10.7 was the last 10.x with it; 11.4.1+ on JetPack 7.2.2+): build without --dla"
    fi
  fi
  # trtexec's build-only option: 8.5 knows only --buildOnly (an unknown option is fatal); 8.6+ --skipInference
  if [ "$TRT_MAJOR" = 8 ] && [ "$TRT_MINOR" -le 5 ]; then BUILD_ONLY=--buildOnly; else BUILD_ONLY=--skipInference; fi
  CMD=("$TRTEXEC" --onnx="$ONNX" --saveEngine="$TMP" "$BUILD_ONLY" --timingCacheFile=timing.cache
       --minShapes="$INPUT:${MIN}x$SHAPE" --optShapes="$INPUT:${OPT}x$SHAPE" --maxShapes="$INPUT:${MAX}x$SHAPE")
  # precision lives in the ONNX graph: TensorRT 8 needs the builder flags to honour it, 9/10 build it
  # strongly typed, 11 builds every network strongly typed (and has no precision flags). DLA on 8-10 is
  # built weakly typed with the flags, as NVIDIA documents for DLA.
  if [ "$TRT_MAJOR" -le 8 ] || { [ -n "$DLA" ] && [ "$TRT_MAJOR" -le 10 ]; }; then
    case "$PRECISION" in fp16) CMD+=(--fp16) ;; int8) CMD+=(--int8 --fp16) ;; esac
  elif [ "$TRT_MAJOR" -le 10 ]; then
    case "$PRECISION" in fp16|int8) CMD+=(--stronglyTyped) ;; esac
  fi
  [ -n "$DLA" ] && CMD+=(--useDLACore="$DLA" --allowGPUFallback)
fi

echo "+ ${CMD[*]}"
[ "$DRY_RUN" = 1 ] && exit 0
"${CMD[@]}"
[ -s "$TMP" ] || die "no engine was written"
[ "$TMP" = "$ENGINE" ] || mv -f "$TMP" "$ENGINE"
trap - EXIT
# run.py sets the runtime's DLA core from this before loading a DLA engine (vitdeploy's sidecar says it too)
if [ -n "$DLA" ]; then
  T="$(mktemp "$ENGINE.dla.XXXXXX")" && printf '%s\n' "$DLA" > "$T" && mv -f "$T" "$ENGINE.dla" \
    || { rm -f "$T"; die "cannot write $ENGINE.dla"; }
else rm -f "$ENGINE.dla"; fi
echo "wrote $ENGINE"

if [ "$TRITON" = 1 ]; then
  T="$(mktemp "triton/$NAME/1/model.plan.XXXXXX")" && cp "$ENGINE" "$T" && mv -f "$T" "triton/$NAME/1/model.plan" \
    || { rm -f "$T"; die "cannot write triton/$NAME/1/model.plan"; }
  sed -i.bak 's/^platform: "onnxruntime_onnx"$/platform: "tensorrt_plan"/' "triton/$NAME/config.pbtxt" && rm -f "triton/$NAME/config.pbtxt.bak"
  echo "installed triton/$NAME/1/model.plan (config.pbtxt: platform tensorrt_plan)"
fi
if [ "$ONNX" = "$TRITON_SOURCE" ]; then CHECK=""; else CHECK=" --model $ONNX"; fi
echo "check it against the bundle's reference logits: python3 run.py --check$CHECK"
