// classify ENGINE IMAGE... : what `python3 run.py IMAGE...` prints, from C++ on the bundle's raw-pixel engine.
//
//   classify ../model.int8.raw.engine ../reference/images            # "path<TAB>label<TAB>score" per image
//   classify ../model.int8.raw.engine photo.jpg --top 3 --json       # JSON lines, as run.py --json
//   classify ../model.raw.engine photos/ --out emb.npy               # an embedding model (bundle.cfg task=embedding):
//                                                                    # "path<TAB>D-d<TAB>norm N<TAB>first values" per
//                                                                    # image; all vectors saved, names in emb.files.txt
//                                                                    # (an export with --tokens, bundle.cfg tokens=:
//                                                                    # its patch tokens in emb.patch_tokens.npy)
//
// Exit status as run.py: 0 done, 1 failed (nothing classified), 2 bad usage, 3 some images skipped.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "outputs.h"
#include "vitclassify.h"

namespace {

const char* kUsage =
    "usage: classify [--config FILE] [--labels FILE] [--top K] [--batch N] [--json] [--out FILE.npy] [--dla-core N]\n"
    "                [--verbose] ENGINE IMAGE_OR_FOLDER...\n"
    "  ENGINE      the engine ./build_engine.sh built from the raw-pixel ONNX (model*.raw.engine)\n"
    "  --config    the bundle's facts file (default: cpp/bundle.cfg in the engine's folder, else ./cpp/bundle.cfg,\n"
    "              else ./bundle.cfg)\n"
    "  --labels    labels file (default: the one bundle.cfg names, the bundle's labels.txt)\n"
    "  --top K     labels printed per image (default 1)     --batch N  images per call (default 8)\n"
    "  --json      JSON lines as run.py --json              --dla-core N  run a DLA engine on core N\n"
    "  --out F.npy also save every output row (an embedding model: its vector) as one [N, D] float32 .npy,\n"
    "              and the file names in F.files.txt, one a line (as run.py --out)\n"
    "  An embedding model (bundle.cfg task=embedding) prints each image's vector: width, L2 norm, first values;\n"
    "  with patch tokens (bundle.cfg tokens=patch_tokens), --out also saves them as F.patch_tokens.npy\n"
    "  ([N, patches, width] float32, as run.py --out).\n";

struct Args {
  std::string config, labels, engine, out;
  std::vector<std::string> images;
  int top = -1, batch = -1, dla_core = -1;
  bool json = false, verbose = false;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "classify: %s (classify --help for usage)\n", msg.c_str());
  std::exit(2);
}

int positive(const std::string& opt, const char* v, int lo) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < lo || x > 1000000) usage_error(opt + " takes a whole number >= " + std::to_string(lo) + ", not '" + v + "'");
  return static_cast<int>(x);
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&](const std::string& opt) -> const char* {
      if (i + 1 >= argc) usage_error(opt + " needs a value");
      return argv[++i];
    };
    if (s == "-h" || s == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (s == "--config") {
      a.config = value(s);
    } else if (s == "--labels") {
      a.labels = value(s);
    } else if (s == "--top") {
      a.top = positive(s, value(s), 1);
    } else if (s == "--batch") {
      a.batch = positive(s, value(s), 1);
    } else if (s == "--dla-core") {
      a.dla_core = positive(s, value(s), 0);
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--out") {
      a.out = value(s);
      const std::string suffix = ".npy";
      const std::string base = std::filesystem::path(a.out).filename().string();
      if (base.size() <= suffix.size() || base.compare(base.size() - suffix.size(), suffix.size(), suffix) != 0)
        usage_error("--out " + a.out + ": give a file name ending in .npy");
    } else if (s == "--verbose") {
      a.verbose = true;
    } else if (s == "--") {
      for (++i; i < argc; ++i) pos.push_back(argv[i]);
    } else if (s.size() > 1 && s[0] == '-') {
      usage_error("unknown option " + s);
    } else {
      pos.push_back(s);
    }
  }
  if (pos.empty()) usage_error("give the engine and image files or folders");
  a.engine = pos[0];
  a.images.assign(pos.begin() + 1, pos.end());
  if (a.images.empty()) usage_error("give image files or folders after the engine");
  return a;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string json_float(float v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(v));  // parses back to the same value
  return buf;
}

// libpng and libjpeg print their own messages for a broken file ("libpng error: ...") before OpenCV reports
// it; this program says it in one line instead, so their stderr is closed while an image decodes.
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = dup(2);
    int null = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) dup2(null, 2);
    if (null >= 0) close(null);
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      dup2(saved_, 2);
      close(saved_);
    }
  }

 private:
  int saved_ = -1;
};

// A file name as run.py's safe() prints it: ASCII control characters escaped (\n, \t, \r, \xNN), one inert line.
std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n') {
      o += "\\n";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
}

// The length of the valid UTF-8 sequence at s[i] (its code point in *cp), or 0 where s[i] begins none (Unicode's
// table 3-7: no overlong form, no surrogate, nothing past U+10FFFF; Python's decoder judges alike).
size_t utf8_at(const std::string& s, size_t i, unsigned* cp) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = b(0);
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (b(1) < lo || b(1) > hi) return 0;
  unsigned v = c & (0xff >> (n + 1));
  for (size_t k = 1; k < n; ++k) {
    if (k > 1 && (b(k) < 0x80 || b(k) > 0xbf)) return 0;
    v = (v << 6) | (b(k) & 0x3f);
  }
  *cp = v;
  return n;
}

// One line of F.files.txt: vitdeploy's core/file_list.py rule, as run.py's list_line() writes it. A backslash as \\,
// LF/CR/tab as \n \r \t, other ASCII controls and bytes that are not UTF-8 as \xNN, C1 controls, bidi marks,
// separators and the BOM as \uXXXX: one line means one name ("a<LF>b.png" is a\nb.png, a name spelled a\nb.png is
// a\\nb.png).
std::string list_line(const std::string& s) {
  std::string o;
  char buf[12];
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '\\') {
        o += "\\\\";
      } else if (c == '\n') {
        o += "\\n";
      } else if (c == '\r') {
        o += "\\r";
      } else if (c == '\t') {
        o += "\\t";
      } else if (c < 0x20 || c == 0x7f) {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        o += buf;
      } else {
        o += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    unsigned cp = 0;
    const size_t n = utf8_at(s, i, &cp);
    if (n == 0) {  // not UTF-8: the byte itself
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      o += buf;
      ++i;
      continue;
    }
    if (cp <= 0x9f || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
        (cp >= 0x2066 && cp <= 0x2069) || cp == 0xfeff) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      o += buf;
    } else {
      o.append(s, i, n);
    }
    i += n;
  }
  return o;
}

constexpr int kHeadValues = 8;  // values of each vector printed as text, as run.py's HEAD_VALUES

// run.py's line for one vector: path, width, L2 norm, the first values ("%.4f", as Python's format).
void print_vector(const std::string& path, const float* v, int n, bool json) {
  const double norm = vitdeploy::l2_norm(v, n);
  if (json) {
    std::string line = "{\"path\": " + json_string(path) + ", \"dim\": " + std::to_string(n) + ", \"norm\": ";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", norm);
    line += std::string(buf) + ", \"embedding\": [";
    for (int j = 0; j < n; ++j) line += std::string(j ? ", " : "") + json_float(v[j]);
    std::printf("%s]}\n", line.c_str());
    return;
  }
  std::printf("%s\t%d-d\tnorm %.4f\t", escaped(path).c_str(), n, norm);
  for (int j = 0; j < n && j < kHeadValues; ++j) std::printf("%s%.4f", j ? " " : "", static_cast<double>(v[j]));
  std::printf("%s\n", n > kHeadValues ? " ..." : "");
}

std::string sidecar_name(const std::string& out) { return out.substr(0, out.size() - 4) + ".files.txt"; }
// The patch tokens beside --out's array, as run.py's tokens_name: emb.npy -> emb.patch_tokens.npy.
std::string tokens_name(const std::string& out) { return out.substr(0, out.size() - 4) + ".patch_tokens.npy"; }

// --out and its file list go through the rule of outputs.h (vitdeploy's and run.py's own): refused, before any
// work, when either is an input, a link to one, or one of the bundle's own files (the manifest.json beside the
// config's cpp/ folder lists them).
void check_outputs(const Args& a, const std::string& config, const std::string& labels) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(config).parent_path().empty() ? fs::path("..") : fs::path(config).parent_path() / "..";
  std::vector<std::pair<std::string, std::string>> listed = {{"manifest.json", (root / "manifest.json").string()}};
  std::ifstream f(root / "manifest.json", std::ios::binary);
  if (f) {
    std::ostringstream text;
    text << f.rdbuf();
    try {
      listed = vitdeploy::outputs::bundle_listed(root.string(), text.str());
    } catch (const std::runtime_error& e) {
      throw vitdeploy::Error((root / "manifest.json").string() + ": not valid JSON (" + e.what() + "): copy the bundle again");
    }
  }
  std::vector<std::string> inputs = {a.engine, config};
  if (!labels.empty()) inputs.push_back(labels);
  inputs.insert(inputs.end(), a.images.begin(), a.images.end());
  for (const std::string& dest : {a.out, sidecar_name(a.out)}) {
    const std::string why = vitdeploy::outputs::out_refusal(dest, inputs, listed);
    if (!why.empty())
      usage_error("--out " + a.out + ": " + why + ": save it elsewhere (the bundle's files and the images are never written over)");
  }
}

std::string find_config(const Args& a) {
  namespace fs = std::filesystem;
  if (!a.config.empty()) return a.config;
  std::error_code ec;
  const fs::path beside = fs::path(a.engine).parent_path() / "cpp" / "bundle.cfg";
  for (const fs::path& p : {beside, fs::path("cpp") / "bundle.cfg", fs::path("bundle.cfg")})
    if (fs::exists(p, ec)) return p.string();
  throw vitdeploy::Error("no bundle.cfg in " + (beside.parent_path().empty() ? std::string("cpp") : beside.parent_path().string()) +
                         ", ./cpp or here: pass --config BUNDLE/cpp/bundle.cfg");
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    const std::string config = find_config(args);
    vitdeploy::Config cfg = vitdeploy::read_config(config);
    const bool embedding = cfg.is_embedding();  // the manifest's task: a vector per image, no labels
    std::vector<std::string> labels;
    if (!embedding) labels = vitdeploy::read_labels(args.labels.empty() ? cfg.labels : args.labels);
    const int top = args.top > 0 ? args.top : cfg.top, batch = args.batch > 0 ? args.batch : cfg.batch;
    std::vector<std::string> files = vitdeploy::list_images(args.images);
    if (files.empty()) usage_error("no images in " + args.images[0]);
    if (!args.out.empty()) {
      std::error_code ec;
      const std::filesystem::path dir = std::filesystem::path(args.out).parent_path();
      if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) usage_error("--out " + args.out + ": no folder " + dir.string());
      check_outputs(args, config, embedding ? std::string() : (args.labels.empty() ? cfg.labels : args.labels));
    }

    vitdeploy::EngineOptions opt;
    opt.dla_core = args.dla_core;
    opt.verbose = args.verbose;
    opt.output = cfg.output;
    // the patch tokens are read where they are saved: an embedding model exported with --tokens, and --out given
    const bool tokens_too = embedding && !cfg.tokens.empty() && !args.out.empty();
    if (tokens_too) opt.tokens = cfg.tokens;
    std::unique_ptr<vitdeploy::Classifier> model = vitdeploy::Classifier::open(args.engine, opt);
    if (model->input_height() != cfg.input_height || model->input_width() != cfg.input_width)
      throw vitdeploy::Error(args.engine + ": takes " + std::to_string(model->input_width()) + "x" + std::to_string(model->input_height()) +
                             " images, the bundle's model " + std::to_string(cfg.input_width) + "x" + std::to_string(cfg.input_height) +
                             ": an engine of another model?");
    if (embedding && cfg.embedding_dim > 0 && model->num_classes() != cfg.embedding_dim)
      throw vitdeploy::Error(args.engine + ": " + std::to_string(model->num_classes()) + " values per image, but the bundle's "
                             "model is a " + std::to_string(cfg.embedding_dim) + "-d embedding: an engine of another model?");
    if (!embedding && static_cast<int>(labels.size()) != model->num_classes())
      throw vitdeploy::Error(args.engine + ": " + std::to_string(model->num_classes()) + " classes, but " +
                             std::to_string(labels.size()) + " labels: an engine of another model?");

    int status = 0;
    std::vector<std::string> ok_files;
    std::vector<vitdeploy::Image> images;
    for (const std::string& f : files) {
      try {
        vitdeploy::Image img;
        {
          QuietStderr quiet;
          img = vitdeploy::load_resized(f, cfg);
        }
        images.push_back(std::move(img));
        ok_files.push_back(f);
      } catch (const std::exception& e) {  // name the file and go on with the others, as run.py
        std::fprintf(stderr, "skipped %s: %s\n", f.c_str(), e.what());
        status = 3;
      }
    }
    if (images.empty()) return 1;
    const int width = model->num_classes();
    std::vector<float> tokens;
    const std::vector<float> z = tokens_too ? model->embed_with_tokens(images, tokens, batch) : model->logits(images, batch);
    if (embedding) {
      for (size_t i = 0; i < ok_files.size(); ++i) print_vector(ok_files[i], &z[i * width], width, args.json);
    }
    std::vector<std::vector<vitdeploy::Prediction>> preds;
    if (!embedding)
      for (size_t i = 0; i < images.size(); ++i) preds.push_back(vitdeploy::top_k(vitdeploy::softmax(&z[i * width], width), top));
    for (size_t i = 0; i < preds.size(); ++i) {
      const auto& p = preds[i];
      if (args.json) {
        std::string line = "{\"path\": " + json_string(ok_files[i]) + ", \"label\": " + json_string(labels[p[0].index]) +
                           ", \"index\": " + std::to_string(p[0].index) + ", \"score\": " + json_float(p[0].score) + ", \"top\": [";
        for (size_t j = 0; j < p.size(); ++j)
          line += std::string(j ? ", " : "") + "{\"label\": " + json_string(labels[p[j].index]) + ", \"score\": " + json_float(p[j].score) + "}";
        std::printf("%s]}\n", line.c_str());
      } else {
        std::printf("%s", ok_files[i].c_str());
        for (const auto& q : p) std::printf("\t%s\t%.4f", labels[q.index].c_str(), static_cast<double>(q.score));
        std::printf("\n");
      }
    }
    std::fflush(stdout);
    if (!args.out.empty()) {  // as run.py --out: the rows of the images read, and their names
      vitdeploy::write_npy(args.out, z, static_cast<int>(ok_files.size()), width);
      std::string names;
      for (const std::string& f : ok_files) names += list_line(f) + "\n";
      vitdeploy::write_text_file(sidecar_name(args.out), names);
      std::fprintf(stderr, "saved %zu rows to %s and their files to %s\n", ok_files.size(), escaped(args.out).c_str(),
                   escaped(sidecar_name(args.out)).c_str());
      if (tokens_too) {
        vitdeploy::write_npy(tokens_name(args.out), tokens,
                             {static_cast<int>(ok_files.size()), model->token_patches(), model->token_width()});
        std::fprintf(stderr, "saved their patch tokens to %s\n", escaped(tokens_name(args.out)).c_str());
      }
    }
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
