// Test-only stand-in for vitclassify_trt.cpp: Classifier::open() without TensorRT or CUDA, so that the example
// program (argument parsing, bundle.cfg, labels, decoding, resizing, cropping, batch splitting and padding,
// softmax, printing) builds and runs on a machine without a GPU. It is not a model of TensorRT: the "engine" is a
// key=value file the test writes (stub=1, min, max, height, width, classes, dump, table, and for an engine with patch
// tokens patches and token_width), and it answers with the logits the test computed with ONNX Runtime for each exact
// image it was given (table: per image, height*width*3 uint8 bytes, then classes float32, then patches*token_width
// float32 of patch tokens where the stub has them), so an image whose bytes differ from run.py's is an error, and
// every batch it receives is written to dump/ (call_<k>_<n>.u8) for the test to compare with run.py's. Asked for a
// patch-token output (EngineOptions::tokens) it does not have, it refuses as the TensorRT classifier does.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "vitclassify.h"

namespace vitdeploy {
namespace {

class StubClassifier : public Classifier {
 public:
  StubClassifier(const std::string& path, const EngineOptions& opt) {
    read_file(path, "engine file (build it with ./build_engine.sh)");  // the library's own missing-file error
    auto kv = read_key_values(path);
    if (kv["stub"] != "1") throw Error(path + ": not a stub engine (this program was built with the test stub)");
    min_ = std::stoi(kv["min"]), max_ = std::stoi(kv["max"]);
    h_ = std::stoi(kv["height"]), w_ = std::stoi(kv["width"]), c_ = std::stoi(kv["classes"]);
    dump_ = kv["dump"];
    const int patches = kv["patches"].empty() ? 0 : std::stoi(kv["patches"]);
    const int token_width = kv["token_width"].empty() ? 0 : std::stoi(kv["token_width"]);
    const size_t per = static_cast<size_t>(patches) * token_width;  // tokens per image in the table
    if (!opt.tokens.empty()) {
      if (per == 0) throw Error(path + ": no output " + opt.tokens + ", though bundle.cfg names it: rebuild the engine");
      p_ = patches, tw_ = token_width;
    }
    if (!kv["table"].empty()) {
      std::vector<char> t = read_file(kv["table"], "stub table");
      const size_t img = static_cast<size_t>(h_) * w_ * 3, row = img + sizeof(float) * (c_ + per);
      for (size_t off = 0; off + row <= t.size(); off += row) {
        std::vector<float> z(c_ + per);
        std::memcpy(z.data(), &t[off + img], sizeof(float) * (c_ + per));
        table_[std::string(&t[off], img)] = z;
      }
    }
  }
  int min_batch() const override { return min_; }
  int max_batch() const override { return max_; }
  int input_height() const override { return h_; }
  int input_width() const override { return w_; }
  int num_classes() const override { return c_; }
  int token_patches() const override { return p_; }
  int token_width() const override { return tw_; }
  void run(const uint8_t* pixels, int n, float* logits) override { run_with_tokens(pixels, n, logits, nullptr); }
  void run_with_tokens(const uint8_t* pixels, int n, float* logits, float* tokens) override {
    if (n < min_ || n > max_) throw Error("stub: batch " + std::to_string(n) + " outside the profile");
    const size_t img = static_cast<size_t>(h_) * w_ * 3;
    if (!dump_.empty()) {
      std::string f = dump_ + "/call_" + std::to_string(calls_) + "_" + std::to_string(n) + ".u8";
      FILE* fp = std::fopen(f.c_str(), "wb");
      if (!fp || std::fwrite(pixels, 1, img * n, fp) != img * n) throw Error("stub: cannot write " + f);
      std::fclose(fp);
    }
    ++calls_;
    for (int i = 0; i < n; ++i) {
      std::string key(reinterpret_cast<const char*>(pixels) + img * i, img);
      auto it = table_.find(key);
      const size_t per = static_cast<size_t>(p_) * tw_;
      if (it != table_.end()) {
        std::memcpy(logits + static_cast<size_t>(i) * c_, it->second.data(), sizeof(float) * c_);
        if (tokens != nullptr && per) std::memcpy(tokens + i * per, it->second.data() + c_, sizeof(float) * per);
      } else {
        bool zero = key.find_first_not_of('\0') == std::string::npos;  // padding
        if (!zero && !table_.empty()) throw Error("stub: an image whose pixels differ from every run.py batch row");
        std::fill(logits + static_cast<size_t>(i) * c_, logits + static_cast<size_t>(i + 1) * c_, 0.0f);
        if (tokens != nullptr && per) std::fill(tokens + i * per, tokens + (i + 1) * per, 0.0f);
      }
    }
  }

 private:
  int min_ = 1, max_ = 1, h_ = 0, w_ = 0, c_ = 0, calls_ = 0, p_ = 0, tw_ = 0;
  std::string dump_;
  std::map<std::string, std::vector<float>> table_;
};

}  // namespace

std::unique_ptr<Classifier> Classifier::open(const std::string& engine_path, const EngineOptions& options) {
  return std::make_unique<StubClassifier>(engine_path, options);
}

}  // namespace vitdeploy
