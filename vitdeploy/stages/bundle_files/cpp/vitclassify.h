// vitclassify: classify images (or embed them) with the bundle's raw-pixel TensorRT engine from C++.
//
// Written by `vitdeploy bundle` into the bundle's cpp/ folder. Two translation units:
//   vitclassify.cpp      everything that needs no GPU: bundle.cfg and labels.txt, image decoding (OpenCV),
//                        Pillow's resampling (the same bytes as run.py), crop, batch packing, softmax, top-k,
//                        an embedding's L2 norm and the .npy file its vectors are saved to;
//   vitclassify_trt.cpp  the engine: TensorRT 8.5 ... 11 through the name-based API, CUDA runtime calls.
// The raw-pixel engine takes uint8 [batch, H, W, 3] RGB; scaling, mean/std and layout are inside the graph,
// so the only preprocessing here is decode, resize and crop, done exactly as run.py does it with Pillow.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace vitdeploy {

// Every failure the library reports: one line that names the problem and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The manifest facts the C++ side needs, from the bundle's cpp/bundle.cfg (key=value lines, # comments).
struct Config {
  int input_height = 0;
  int input_width = 0;
  std::string resize_mode = "shorter";   // "shorter": shorter side to size/crop_pct, centre crop; "squash"
  double crop_pct = 0.875;
  std::string crop_offset = "round";    // "floor": transformers' centre crop (offset rounded down)
  std::string interpolation = "bicubic";  // Pillow's filter: nearest, box, bilinear, hamming, bicubic, lanczos
  std::string channel_order = "RGB";     // of the source model; the raw-pixel engine always takes RGB
  // Pillow's pass order for a two-pass resize: "horizontal" (Pillow <= 12: always horizontal, then vertical) or
  // "pillow13" (Pillow 13: vertical first when the height shrinks by more than twice as many pixels as the width).
  // The passes round to uint8 in between, so the order changes some pixels by one level.
  std::string resample_order = "horizontal";
  std::string input_name = "images";
  // "classifier" (logits over labels; the default, and what a bundle.cfg without a task line is) or "embedding"
  // (a vector per image, no labels): the manifest's task, which decides what the example prints and saves.
  std::string task = "classifier";
  std::string output;     // the engine output to read ("embedding"; empty: the first output)
  std::string tokens;     // the patch-token output saved beside --out (an export with --tokens: "patch_tokens")
  int embedding_dim = 0;  // an embedding model's vector width (0: not said)
  int num_classes = 0;
  std::string labels;   // path, resolved against the config's folder
  std::string engine;   // default engine path, resolved against the config's folder
  int batch = 8;        // images per call, as run.py --batch
  int top = 1;          // labels printed per image, as run.py --top
  bool is_embedding() const { return task == "embedding"; }
};

Config read_config(const std::string& path);
std::vector<std::string> read_labels(const std::string& path);
std::map<std::string, std::string> read_key_values(const std::string& path);

// An 8-bit RGB image, row-major HWC.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

// Decode a file into RGB as run.py's to_rgb does (16-bit grey scaled to 0-255, alpha dropped, EXIF orientation
// applied by OpenCV). Throws Error naming the file when it cannot be read or decoded.
Image load_rgb(const std::string& path);
// Pillow's Image.resize(size, filter) for an RGB image (libImaging/Resample.c; nearest: Geometry.c's affine).
Image pil_resize(const Image& in, int width, int height, const std::string& interpolation,
                 const std::string& resample_order = "horizontal");
// run.py's resize_crop: the resized, centre-cropped image of the config's input size.
Image resize_crop(const Image& in, const Config& cfg);
// load_rgb + resize_crop.
Image load_resized(const std::string& path, const Config& cfg);

// How n images are run on an engine whose profile takes min..max: chunks of at most min(batch, max)
// images, each padded up to min (a DLA engine has one fixed batch: min == max).
struct Chunk {
  int first = 0;   // index of the first image
  int count = 0;   // real images in the chunk
  int padded = 0;  // batch actually run (count plus zero-filled padding)
};
std::vector<Chunk> plan_batches(int n, int batch, int min_batch, int max_batch);
// Images of one size → one contiguous uint8 NHWC buffer of `padded` images (the padding is zeros).
std::vector<uint8_t> pack(const std::vector<Image>& images, int first, int count, int padded);

struct Prediction {
  int index = 0;
  float score = 0.0f;
};
// Softmax of one row of logits in float32, as run.py computes it with numpy.
std::vector<float> softmax(const float* logits, int n);
// The L2 norm of one vector, summed in double (as run.py's numpy.linalg.norm of the float64 row).
double l2_norm(const float* v, int n);
// Write rows x cols float32 values as a NumPy .npy file (format 1.0, little-endian '<f4', C order), through a
// temporary file beside it renamed into place; numpy.load reads it. Throws Error naming the file on failure.
void write_npy(const std::string& path, const std::vector<float>& values, int rows, int cols);
// The same for an array of any shape (the patch tokens: [N, patches, width]).
void write_npy(const std::string& path, const std::vector<float>& values, const std::vector<int>& shape);
// Write text to a file through a temporary file beside it renamed into place (the --out sidecar).
void write_text_file(const std::string& path, const std::string& text);
// The k best classes, highest score first.
std::vector<Prediction> top_k(const std::vector<float>& probs, int k);

// Files to classify from command-line arguments, as run.py's list_images: folders are searched recursively
// for image extensions (sorted, hidden entries skipped); a file is taken as it is.
std::vector<std::string> list_images(const std::vector<std::string>& args);
// A path as Python's str(pathlib.Path(p)) prints it (repeated slashes, "." parts and a trailing slash dropped).
std::string python_path(const std::string& p);
// Read a whole file; throws Error naming it when it is missing or unreadable.
std::vector<char> read_file(const std::string& path, const std::string& what);

struct EngineOptions {
  int dla_core = -1;     // set on the runtime before deserializing a DLA engine, as trtexec --useDLACore does
  bool verbose = false;  // TensorRT's warnings and errors on stderr
  std::string output;    // the output to read by name (bundle.cfg's output=; an engine with patch_tokens has two)
  std::string tokens;    // the patch-token output to read too (bundle.cfg's tokens=; empty: none)
};

// A raw-pixel engine. open() is defined in vitclassify_trt.cpp (TensorRT and CUDA).
class Classifier {
 public:
  static std::unique_ptr<Classifier> open(const std::string& engine_path, const EngineOptions& options = {});
  virtual ~Classifier() = default;
  virtual int min_batch() const = 0;
  virtual int max_batch() const = 0;
  virtual int input_height() const = 0;
  virtual int input_width() const = 0;
  // Values per image of the output read: a classifier's classes, an embedding model's vector width.
  virtual int num_classes() const = 0;
  // Run exactly n images (min_batch <= n <= max_batch), uint8 NHWC → n * num_classes() float logits (or vectors).
  virtual void run(const uint8_t* pixels, int n, float* logits) = 0;
  // The patch tokens' [patches, width] per image where EngineOptions::tokens was read (0 and 0: none).
  virtual int token_patches() const { return 0; }
  virtual int token_width() const { return 0; }
  // run() that also writes n * token_patches() * token_width() floats of patch tokens (where the engine has them).
  virtual void run_with_tokens(const uint8_t* pixels, int n, float* logits, float* tokens) {
    (void)tokens;
    run(pixels, n, logits);
  }

  // Logits of any number of images of the engine's input size: split and padded per plan_batches().
  std::vector<float> logits(const std::vector<Image>& images, int batch = 8);
  // An embedding model's vectors (n * num_classes() floats), computed as logits() is.
  std::vector<float> embed(const std::vector<Image>& images, int batch = 8) { return logits(images, batch); }
  // The vectors and, in ``tokens``, the patch tokens (n * token_patches() * token_width() floats), as logits().
  std::vector<float> embed_with_tokens(const std::vector<Image>& images, std::vector<float>& tokens, int batch = 8);
  // Softmax and the k best classes of each image.
  std::vector<std::vector<Prediction>> classify(const std::vector<Image>& images, int k = 1, int batch = 8);
};

}  // namespace vitdeploy
