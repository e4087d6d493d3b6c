// classify ENGINE IMAGE... : what `python3 run.py IMAGE...` prints, from C++ on the bundle's raw-pixel engine.
//
//   classify ../model.int8.raw.engine ../reference/images            # "path<TAB>label<TAB>score" per image
//   classify ../model.int8.raw.engine photo.jpg --top 3 --json       # JSON lines, as run.py --json
//
// Exit status as run.py: 0 done, 1 failed (nothing classified), 2 bad usage, 3 some images skipped.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "vitclassify.h"

namespace {

const char* kUsage =
    "usage: classify [--config FILE] [--labels FILE] [--top K] [--batch N] [--json] [--dla-core N] [--verbose]\n"
    "                ENGINE IMAGE_OR_FOLDER...\n"
    "  ENGINE      the engine ./build_engine.sh built from the raw-pixel ONNX (model*.raw.engine)\n"
    "  --config    the bundle's facts file (default: cpp/bundle.cfg in the engine's folder, else ./cpp/bundle.cfg,\n"
    "              else ./bundle.cfg)\n"
    "  --labels    labels file (default: the one bundle.cfg names, the bundle's labels.txt)\n"
    "  --top K     labels printed per image (default 1)     --batch N  images per call (default 8)\n"
    "  --json      JSON lines as run.py --json              --dla-core N  run a DLA engine on core N\n";

struct Args {
  std::string config, labels, engine;
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
    vitdeploy::Config cfg = vitdeploy::read_config(find_config(args));
    std::vector<std::string> labels = vitdeploy::read_labels(args.labels.empty() ? cfg.labels : args.labels);
    const int top = args.top > 0 ? args.top : cfg.top, batch = args.batch > 0 ? args.batch : cfg.batch;
    std::vector<std::string> files = vitdeploy::list_images(args.images);
    if (files.empty()) usage_error("no images in " + args.images[0]);

    vitdeploy::EngineOptions opt;
    opt.dla_core = args.dla_core;
    opt.verbose = args.verbose;
    std::unique_ptr<vitdeploy::Classifier> model = vitdeploy::Classifier::open(args.engine, opt);
    if (model->input_height() != cfg.input_height || model->input_width() != cfg.input_width)
      throw vitdeploy::Error(args.engine + ": takes " + std::to_string(model->input_width()) + "x" + std::to_string(model->input_height()) +
                             " images, the bundle's model " + std::to_string(cfg.input_width) + "x" + std::to_string(cfg.input_height) +
                             ": an engine of another model?");
    if (static_cast<int>(labels.size()) != model->num_classes())
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
    std::vector<std::vector<vitdeploy::Prediction>> preds = model->classify(images, top, batch);
    for (size_t i = 0; i < ok_files.size(); ++i) {
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
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
