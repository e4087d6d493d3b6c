// vitclassify: the part that needs no GPU (see vitclassify.h). The resampling follows Pillow's
// src/libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc, ImagingResample*_8bpc, clip8, and
// ImagingResampleInner's pass order, which Pillow 13 changed) and, for
// "nearest", Geometry.c's ImagingScaleAffine, which Image.resize(..., NEAREST) runs; the resize/crop geometry
// follows run.py's resize_crop. Same arithmetic, same bytes.
#include "vitclassify.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace fs = std::filesystem;

namespace vitdeploy {

// ---------------------------------------------------------------------------------------- files

std::vector<char> read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(path + ": no such " + what);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open the " + what);
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error(path + ": cannot read the " + what);
  return data;
}

static std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::map<std::string, std::string> read_key_values(const std::string& path) {
  std::vector<char> data = read_file(path, "config file (cpp/bundle.cfg, written by vitdeploy bundle)");
  std::istringstream in(std::string(data.begin(), data.end()));
  std::map<std::string, std::string> kv;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    size_t eq = t.find('=');
    if (eq == std::string::npos) throw Error(path + ":" + std::to_string(n) + ": expected key=value, got '" + t + "'");
    kv[trim(t.substr(0, eq))] = trim(t.substr(eq + 1));
  }
  return kv;
}

static int to_int(const std::string& path, const std::string& key, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 0 || x > 1000000) throw Error(path + ": " + key + "=" + v + " is not a count");
  return static_cast<int>(x);
}

Config read_config(const std::string& path) {
  auto kv = read_key_values(path);
  auto need = [&](const std::string& k) -> std::string {
    auto it = kv.find(k);
    if (it == kv.end()) throw Error(path + ": no " + k + "= line; write the bundle again with vitdeploy bundle");
    return it->second;
  };
  Config c;
  c.input_height = to_int(path, "input_height", need("input_height"));
  c.input_width = to_int(path, "input_width", need("input_width"));
  c.resize_mode = need("resize_mode");
  c.interpolation = need("interpolation");
  if (kv.count("crop_pct")) {
    char* end = nullptr;
    c.crop_pct = std::strtod(kv["crop_pct"].c_str(), &end);
    if (*end != '\0' || !(c.crop_pct > 0.0)) throw Error(path + ": crop_pct=" + kv["crop_pct"] + " is not a positive number");
  }
  if (kv.count("crop_offset")) c.crop_offset = kv["crop_offset"];
  if (c.crop_offset != "round" && c.crop_offset != "floor")
    throw Error(path + ": crop_offset=" + c.crop_offset + " (expected round or floor)");
  if (kv.count("channel_order")) c.channel_order = kv["channel_order"];
  if (kv.count("resample_order")) c.resample_order = kv["resample_order"];
  if (c.resample_order != "horizontal" && c.resample_order != "pillow13")
    throw Error(path + ": resample_order=" + c.resample_order + " (expected horizontal or pillow13)");
  if (kv.count("input_name")) c.input_name = kv["input_name"];
  if (kv.count("task")) c.task = kv["task"];
  if (c.task != "classifier" && c.task != "embedding")
    throw Error(path + ": task=" + c.task + " (expected classifier or embedding)");
  if (kv.count("output")) c.output = kv["output"];
  if (kv.count("tokens")) c.tokens = kv["tokens"];
  if (kv.count("embedding_dim")) c.embedding_dim = to_int(path, "embedding_dim", kv["embedding_dim"]);
  if (kv.count("num_classes")) c.num_classes = to_int(path, "num_classes", kv["num_classes"]);
  if (kv.count("batch")) c.batch = to_int(path, "batch", kv["batch"]);
  if (kv.count("top")) c.top = to_int(path, "top", kv["top"]);
  fs::path dir = fs::path(path).parent_path();
  if (kv.count("labels")) c.labels = (dir / kv["labels"]).lexically_normal().string();
  if (kv.count("engine")) c.engine = (dir / kv["engine"]).lexically_normal().string();
  if (c.input_height < 1 || c.input_width < 1) throw Error(path + ": the input size must be positive");
  if (c.resize_mode != "shorter" && c.resize_mode != "squash" && c.resize_mode != "squash_crop")
    throw Error(path + ": resize_mode=" + c.resize_mode + " (expected shorter, squash or squash_crop)");
  static const char* filters[] = {"nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"};
  if (std::find(std::begin(filters), std::end(filters), c.interpolation) == std::end(filters))
    throw Error(path + ": interpolation=" + c.interpolation + " is not one of Pillow's filters");
  return c;
}

std::vector<std::string> read_labels(const std::string& path) {
  std::vector<char> data = read_file(path, "labels file");
  std::vector<std::string> labels;
  std::string cur;
  for (char ch : data) {
    if (ch == '\n') {
      labels.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) labels.push_back(cur);
  for (auto& l : labels)
    if (!l.empty() && l.back() == '\r') l.pop_back();
  if (labels.empty()) throw Error(path + ": no labels in it");
  return labels;
}

// ---------------------------------------------------------------------------------------- decoding

Image load_rgb(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error("no such file");
  cv::Mat m;
  try {
    // ANYCOLOR|ANYDEPTH: grey stays grey, 16-bit stays 16-bit (scaled below as run.py does), alpha is dropped
    // (as Pillow's convert("RGB") drops it) and the EXIF orientation is applied (run.py: exif_transpose).
    m = cv::imread(path, cv::IMREAD_ANYCOLOR | cv::IMREAD_ANYDEPTH);
  } catch (const cv::Exception& e) {
    throw Error(std::string("cannot decode it: ") + e.what());
  }
  if (m.empty()) throw Error("cannot decode it (not an image OpenCV reads)");
  const int ch = m.channels();
  if (ch != 1 && ch != 3 && ch != 4) throw Error("unsupported channel count " + std::to_string(ch));
  Image out;
  out.width = m.cols;
  out.height = m.rows;
  out.rgb.resize(static_cast<size_t>(m.cols) * m.rows * 3);
  const int depth = m.depth();
  if (depth != CV_8U && depth != CV_16U) throw Error("unsupported sample type (only 8- and 16-bit images)");
  std::vector<uint8_t> grey16;
  if (depth == CV_16U && ch == 1) {
    // run.py: mode I;16 → round(v / 65535 * 255) (numpy rounds half to even; no sample lands on a half)
    grey16.resize(static_cast<size_t>(m.cols) * m.rows);
    for (int y = 0; y < m.rows; ++y) {
      const uint16_t* row = m.ptr<uint16_t>(y);
      for (int x = 0; x < m.cols; ++x)
        grey16[static_cast<size_t>(y) * m.cols + x] =
            static_cast<uint8_t>(std::nearbyint(static_cast<double>(row[x]) / 65535.0 * 255.0));
    }
  }
  for (int y = 0; y < m.rows; ++y) {
    uint8_t* o = &out.rgb[static_cast<size_t>(y) * m.cols * 3];
    for (int x = 0; x < m.cols; ++x, o += 3) {
      if (ch == 1) {
        uint8_t v = depth == CV_8U ? m.ptr<uint8_t>(y)[x] : grey16[static_cast<size_t>(y) * m.cols + x];
        o[0] = o[1] = o[2] = v;
      } else if (depth == CV_8U) {  // OpenCV gives BGR(A)
        const uint8_t* p = m.ptr<uint8_t>(y) + static_cast<size_t>(x) * ch;
        o[0] = p[2], o[1] = p[1], o[2] = p[0];
      } else {  // 16-bit colour: Pillow's PNG reader keeps the high byte (rawmode RGB;16B)
        const uint16_t* p = m.ptr<uint16_t>(y) + static_cast<size_t>(x) * ch;
        o[0] = static_cast<uint8_t>(p[2] >> 8), o[1] = static_cast<uint8_t>(p[1] >> 8), o[2] = static_cast<uint8_t>(p[0] >> 8);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------- Pillow's resample

namespace {

struct Filter {
  double (*fn)(double);
  double support;
};

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }
double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}
double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * M_PI;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // float constants, as in Resample.c
}
double bicubic_filter(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}
double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}
double lanczos_filter(double x) {
  if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
  return 0.0;
}

Filter filter_named(const std::string& name) {
  if (name == "box") return {box_filter, 0.5};
  if (name == "bilinear") return {bilinear_filter, 1.0};
  if (name == "hamming") return {hamming_filter, 1.0};
  if (name == "bicubic") return {bicubic_filter, 2.0};
  if (name == "lanczos") return {lanczos_filter, 3.0};
  throw Error("unknown resampling filter " + name);
}

constexpr int PRECISION_BITS = 32 - 8 - 2;

inline uint8_t clip8(int in) {  // Resample.c's clip8: the lookup table clamps in >> PRECISION_BITS to 0..255
  int v = in >> PRECISION_BITS;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// precompute_coeffs + normalize_coeffs_8bpc for the box (0, in_size): per output pixel, its first input pixel,
// its count and the fixed-point weights.
struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // xmin, count per output pixel
  std::vector<int32_t> k;   // out_size * ksize
};

Coeffs precompute_coeffs(int in_size, int out_size, const Filter& f) {
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  double scale = static_cast<double>(in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = f.support * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> kk(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    int x = 0;
    for (; x < xmax; ++x) {
      double w = f.fn((x + xmin - center + 0.5) * ss);
      kk[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; ++x)
      if (ww != 0.0) kk[x] /= ww;
    for (; x < c.ksize; ++x) kk[x] = 0;
    for (x = 0; x < c.ksize; ++x) {
      double v = kk[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << PRECISION_BITS)) : static_cast<int32_t>(0.5 + v * (1 << PRECISION_BITS));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

Image resample_horizontal(const Image& in, int out_w, const Filter& f) {
  Coeffs c = precompute_coeffs(in.width, out_w, f);
  Image out;
  out.width = out_w;
  out.height = in.height;
  out.rgb.resize(static_cast<size_t>(out_w) * in.height * 3);
  for (int yy = 0; yy < in.height; ++yy) {
    const uint8_t* row = &in.rgb[static_cast<size_t>(yy) * in.width * 3];
    for (int xx = 0; xx < out_w; ++xx) {
      int xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
      int ss0 = 1 << (PRECISION_BITS - 1), ss1 = ss0, ss2 = ss0;
      for (int x = 0; x < xmax; ++x) {
        const uint8_t* p = row + static_cast<size_t>(x + xmin) * 3;
        ss0 += p[0] * k[x];
        ss1 += p[1] * k[x];
        ss2 += p[2] * k[x];
      }
      uint8_t* o = &out.rgb[(static_cast<size_t>(yy) * out_w + xx) * 3];
      o[0] = clip8(ss0), o[1] = clip8(ss1), o[2] = clip8(ss2);
    }
  }
  return out;
}

Image resample_vertical(const Image& in, int out_h, const Filter& f) {
  Coeffs c = precompute_coeffs(in.height, out_h, f);
  Image out;
  out.width = in.width;
  out.height = out_h;
  out.rgb.resize(static_cast<size_t>(in.width) * out_h * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &c.k[static_cast<size_t>(yy) * c.ksize];
    int ymin = c.bounds[yy * 2], ymax = c.bounds[yy * 2 + 1];
    for (int xx = 0; xx < in.width; ++xx) {
      int ss0 = 1 << (PRECISION_BITS - 1), ss1 = ss0, ss2 = ss0;
      for (int y = 0; y < ymax; ++y) {
        const uint8_t* p = &in.rgb[(y + ymin) * stride + static_cast<size_t>(xx) * 3];
        ss0 += p[0] * k[y];
        ss1 += p[1] * k[y];
        ss2 += p[2] * k[y];
      }
      uint8_t* o = &out.rgb[(static_cast<size_t>(yy) * in.width + xx) * 3];
      o[0] = clip8(ss0), o[1] = clip8(ss1), o[2] = clip8(ss2);
    }
  }
  return out;
}

// Image.resize(..., NEAREST) → ImagingTransform(AFFINE) → ImagingScaleAffine: positions accumulated in double.
inline int coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }

Image nearest_resize(const Image& in, int out_w, int out_h) {
  double a0 = static_cast<double>(static_cast<float>(in.width)) / out_w;
  double a4 = static_cast<double>(static_cast<float>(in.height)) / out_h;
  Image out;
  out.width = out_w;
  out.height = out_h;
  out.rgb.assign(static_cast<size_t>(out_w) * out_h * 3, 0);
  std::vector<int> xin(out_w, -1);
  double xo = 0.0 + a0 * 0.5, yo = 0.0 + a4 * 0.5;
  for (int x = 0; x < out_w; ++x) {
    int xi = coord(xo);
    if (xi >= 0 && xi < in.width) xin[x] = xi;
    xo += a0;
  }
  for (int y = 0; y < out_h; ++y) {
    int yi = coord(yo);
    if (yi >= 0 && yi < in.height)
      for (int x = 0; x < out_w; ++x)
        if (xin[x] >= 0)
          std::memcpy(&out.rgb[(static_cast<size_t>(y) * out_w + x) * 3],
                      &in.rgb[(static_cast<size_t>(yi) * in.width + xin[x]) * 3], 3);
    yo += a4;
  }
  return out;
}

Image crop(const Image& in, int left, int top, int w, int h) {
  Image out;
  out.width = w;
  out.height = h;
  out.rgb.assign(static_cast<size_t>(w) * h * 3, 0);  // Pillow fills outside the image with zeros
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      int sx = left + x, sy = top + y;
      if (sx < 0 || sy < 0 || sx >= in.width || sy >= in.height) continue;
      std::memcpy(&out.rgb[(static_cast<size_t>(y) * w + x) * 3], &in.rgb[(static_cast<size_t>(sy) * in.width + sx) * 3], 3);
    }
  return out;
}

}  // namespace

Image pil_resize(const Image& in, int width, int height, const std::string& interpolation,
                 const std::string& resample_order) {
  if (width < 1 || height < 1) throw Error("resize to an empty size");
  if (in.width == width && in.height == height) return in;  // Pillow copies
  if (interpolation == "nearest") return nearest_resize(in, width, height);
  Filter f = filter_named(interpolation);
  // ImagingResampleInner: two passes, each rounded to uint8; a pass of unchanged size is skipped. Pillow 13 runs
  // the vertical pass first "if height is being scaled down more than twice the amount the width is".
  const bool horizontal_first = resample_order != "pillow13" ||
                                !((in.height - height) > 0 && (in.height - height) > (in.width - width) * 2);
  if (horizontal_first) {
    Image tmp = in.width != width ? resample_horizontal(in, width, f) : in;
    return in.height != height ? resample_vertical(tmp, height, f) : tmp;
  }
  Image tmp = in.height != height ? resample_vertical(in, height, f) : in;
  return in.width != width ? resample_horizontal(tmp, width, f) : tmp;
}

Image resize_crop(const Image& img_in, const Config& cfg) {
  const int h = cfg.input_height, w = cfg.input_width;
  if (cfg.resize_mode == "squash")
    return (img_in.width != w || img_in.height != h) ? pil_resize(img_in, w, h, cfg.interpolation, cfg.resample_order) : img_in;
  const int rh = static_cast<int>(std::floor(h / cfg.crop_pct)), rw = static_cast<int>(std::floor(w / cfg.crop_pct));
  const int iw = img_in.width, ih = img_in.height;
  int nw, nh;
  if (cfg.resize_mode == "squash_crop") {  // resize to a size, then centre crop (transformers' DeiT/BEiT)
    nw = rw, nh = rh;
  } else if (rh == rw) {
    int shorter = iw <= ih ? iw : ih, longer = iw <= ih ? ih : iw;
    // Python: int(rh * long / short), a true division truncated
    int new_short = rh, new_long = static_cast<int>(static_cast<double>(rh * static_cast<long long>(longer)) / shorter);
    if (iw <= ih) nw = new_short, nh = new_long;
    else nw = new_long, nh = new_short;
  } else {  // timm's ResizeKeepRatio: the side that fits first sets the ratio
    double ratio = std::min(static_cast<double>(ih) / rh, static_cast<double>(iw) / rw);
    nw = static_cast<int>(std::nearbyint(iw / ratio));  // Python's round: half to even
    nh = static_cast<int>(std::nearbyint(ih / ratio));
  }
  Image img = (nw != iw || nh != ih) ? pil_resize(img_in, nw, nh, cfg.interpolation, cfg.resample_order) : img_in;
  int top = static_cast<int>(std::nearbyint((nh - h) / 2.0)), left = static_cast<int>(std::nearbyint((nw - w) / 2.0));
  if (cfg.crop_offset == "floor")  // Python's (nh - h) // 2: transformers' centre crop rounds the offset down
    top = static_cast<int>(std::floor((nh - h) / 2.0)), left = static_cast<int>(std::floor((nw - w) / 2.0));
  if (nh < h || nw < w) {
    img = pil_resize(img, std::max(nw, w), std::max(nh, h), cfg.interpolation, cfg.resample_order);
    top = std::max(top, 0), left = std::max(left, 0);
  }
  return crop(img, left, top, w, h);
}

Image load_resized(const std::string& path, const Config& cfg) { return resize_crop(load_rgb(path), cfg); }

// ---------------------------------------------------------------------------------------- batches, scores

std::vector<Chunk> plan_batches(int n, int batch, int min_batch, int max_batch) {
  if (min_batch < 1 || max_batch < min_batch) throw Error("invalid batch profile " + std::to_string(min_batch) + ".." + std::to_string(max_batch));
  int step = std::max(1, std::min(batch, max_batch));
  std::vector<Chunk> out;
  for (int i = 0; i < n; i += step) {
    Chunk c;
    c.first = i;
    c.count = std::min(step, n - i);
    c.padded = std::max(c.count, min_batch);
    out.push_back(c);
  }
  return out;
}

std::vector<uint8_t> pack(const std::vector<Image>& images, int first, int count, int padded) {
  if (count < 1 || first < 0 || first + count > static_cast<int>(images.size()) || padded < count)
    throw Error("pack: bad image range");
  const Image& ref = images[first];
  const size_t one = static_cast<size_t>(ref.width) * ref.height * 3;
  std::vector<uint8_t> out(one * padded, 0);
  for (int i = 0; i < count; ++i) {
    const Image& im = images[first + i];
    if (im.width != ref.width || im.height != ref.height) throw Error("pack: images of different sizes");
    std::memcpy(&out[one * i], im.rgb.data(), one);
  }
  return out;
}

std::vector<float> softmax(const float* z, int n) {
  float mx = z[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, z[i]);
  std::vector<float> e(n);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += (e[i] = std::exp(z[i] - mx));
  for (float& v : e) v /= sum;
  return e;
}

double l2_norm(const float* v, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(v[i]) * static_cast<double>(v[i]);
  return std::sqrt(s);
}

// A new temporary file beside `path` (mkstemp: created, never opened through a link left there), given the mode a new
// file gets (0666 less the umask), then renamed over `path`: a link at `path` is replaced, never written through.
static void write_replacing(const std::string& path, const std::string& bytes) {
  const fs::path dest(path);
  std::string name = (dest.parent_path() / ("." + dest.filename().string() + ".XXXXXX")).string();
  std::vector<char> templ(name.begin(), name.end());
  templ.push_back('\0');
  const int fd = ::mkstemp(templ.data());
  if (fd < 0) throw Error(path + ": cannot write it (does its folder exist?)");
  const fs::path tmp(templ.data());
  const mode_t mask = ::umask(0);
  ::umask(mask);
  bool ok = ::fchmod(fd, 0666 & ~mask) == 0;
  for (size_t done = 0; ok && done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error(path + ": cannot write it (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, dest, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(path + ": cannot put it in place (" + ec.message() + ")");
  }
}

void write_npy(const std::string& path, const std::vector<float>& values, int rows, int cols) {
  write_npy(path, values, std::vector<int>{rows, cols});
}

void write_npy(const std::string& path, const std::vector<float>& values, const std::vector<int>& shape) {
  const uint16_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) throw Error("write_npy: a big-endian host writes no '<f4' file");
  size_t count = 1;
  std::string dims;
  for (int d : shape) {
    count *= static_cast<size_t>(d);
    dims += std::to_string(d) + ", ";  // Python's repr of a tuple: "(3, )" reads as (3,), "(2, 4, )" as (2, 4)
  }
  if (shape.empty() || values.size() != count) throw Error("write_npy: values do not fill the shape");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims.substr(0, dims.size() - 2) +
                       (shape.size() == 1 ? "," : "") + "), }";
  // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in '\n'
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>((header.size() >> 8) & 0xff);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  write_replacing(path, bytes);
}

void write_text_file(const std::string& path, const std::string& text) { write_replacing(path, text); }

std::vector<Prediction> top_k(const std::vector<float>& probs, int k) {
  std::vector<int> idx(probs.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  std::vector<Prediction> out;
  for (int i = 0; i < k && i < static_cast<int>(idx.size()); ++i) out.push_back({idx[i], probs[idx[i]]});
  return out;
}

std::vector<float> Classifier::logits(const std::vector<Image>& images, int batch) {
  const int n = static_cast<int>(images.size()), classes = num_classes();
  for (const Image& im : images)
    if (im.width != input_width() || im.height != input_height())
      throw Error("an image of " + std::to_string(im.width) + "x" + std::to_string(im.height) + " for an engine that takes " +
                  std::to_string(input_width()) + "x" + std::to_string(input_height()) + ": resize_crop() it first");
  std::vector<float> out(static_cast<size_t>(n) * classes);
  std::vector<float> buf;
  for (const Chunk& c : plan_batches(n, batch, min_batch(), max_batch())) {
    std::vector<uint8_t> x = pack(images, c.first, c.count, c.padded);
    buf.assign(static_cast<size_t>(c.padded) * classes, 0.0f);
    run(x.data(), c.padded, buf.data());
    std::copy(buf.begin(), buf.begin() + static_cast<long>(c.count) * classes, out.begin() + static_cast<long>(c.first) * classes);
  }
  return out;
}

std::vector<float> Classifier::embed_with_tokens(const std::vector<Image>& images, std::vector<float>& tokens, int batch) {
  const int n = static_cast<int>(images.size()), width = num_classes();
  const size_t per = static_cast<size_t>(token_patches()) * static_cast<size_t>(token_width());
  if (per == 0) throw Error("the engine was opened without its patch-token output (EngineOptions::tokens)");
  for (const Image& im : images)
    if (im.width != input_width() || im.height != input_height())
      throw Error("an image of " + std::to_string(im.width) + "x" + std::to_string(im.height) + " for an engine that takes " +
                  std::to_string(input_width()) + "x" + std::to_string(input_height()) + ": resize_crop() it first");
  std::vector<float> out(static_cast<size_t>(n) * width);
  tokens.assign(static_cast<size_t>(n) * per, 0.0f);
  std::vector<float> buf, tbuf;
  for (const Chunk& c : plan_batches(n, batch, min_batch(), max_batch())) {
    std::vector<uint8_t> x = pack(images, c.first, c.count, c.padded);
    buf.assign(static_cast<size_t>(c.padded) * width, 0.0f);
    tbuf.assign(static_cast<size_t>(c.padded) * per, 0.0f);
    run_with_tokens(x.data(), c.padded, buf.data(), tbuf.data());
    std::copy(buf.begin(), buf.begin() + static_cast<long>(c.count) * width, out.begin() + static_cast<long>(c.first) * width);
    std::copy(tbuf.begin(), tbuf.begin() + static_cast<long>(c.count * per),
              tokens.begin() + static_cast<long>(c.first * per));
  }
  return out;
}

std::vector<std::vector<Prediction>> Classifier::classify(const std::vector<Image>& images, int k, int batch) {
  std::vector<float> z = logits(images, batch);
  const int classes = num_classes();
  std::vector<std::vector<Prediction>> out;
  for (size_t i = 0; i < images.size(); ++i) out.push_back(top_k(softmax(&z[i * classes], classes), k));
  return out;
}

// ---------------------------------------------------------------------------------------- paths

std::string python_path(const std::string& p) {
  if (p.empty()) return ".";
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : p + "/") {
    if (ch == '/') {
      if (!cur.empty() && cur != ".") parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  std::string out = p[0] == '/' ? "/" : "";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "/" : "") + parts[i];
  return out.empty() ? "." : out;
}

static std::vector<std::string> split_parts(const std::string& p) {
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : p) {
    if (ch == '/') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::vector<std::string> list_images(const std::vector<std::string>& args) {
  static const char* exts[] = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"};
  std::vector<std::string> out;
  for (const std::string& a : args) {
    std::string p = python_path(a);
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {  // run.py skips anything under a hidden part
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file(ec)) continue;
      std::string ext = it->path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      if (std::find(std::begin(exts), std::end(exts), ext) == std::end(exts)) continue;
      found.push_back(python_path(it->path().string()));
    }
    // pathlib orders paths by their parts, not by the whole string
    std::sort(found.begin(), found.end(), [](const std::string& x, const std::string& y) { return split_parts(x) < split_parts(y); });
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

}  // namespace vitdeploy
