// vitclassify: the engine (see vitclassify.h). TensorRT's name-based I/O API, present with the same signatures
// from 8.5 to 11, read in NVIDIA's public headers (tensorrt-include/<version>/NvInferRuntime.h, line numbers for
// 8.6 / 10.3 / 10.16 / 11.1):
//   IRuntime::deserializeCudaEngine(void const*, size_t)  786 / 1483 / 1967 / 1963   (null for a foreign engine)
//   IRuntime::setDLACore(int32_t)                          694 / 1401 / 1881 / 1877
//   ICudaEngine::getProfileShape(name, profile, selector)  2226 / 2984 / 3678 / 3454
//   ICudaEngine::getNbIOTensors / getIOTensorName          2427,2439 / 3121,3133 / 3818,3830 / 3554,3566
//   IExecutionContext::setInputShape                       2861 / 3745 / 4497 / 4134
//   IExecutionContext::setTensorAddress                    3250 / 4009 / 4764 / 4384
//   IExecutionContext::enqueueV3(cudaStream_t)             3465 / 4270 / 5025 / 4645
//   ICudaEngine::createExecutionContext()                  1763 / 2621 / 3271 / 3087  (10+: a defaulted argument)
// Objects are released with delete (destroy() is gone since 10). The one difference that matters here is Dims:
// Dims32 with int32_t extents in 8.6 (NvInferRuntimeBase.h:183-199), Dims64 with int64_t from 10
// (10.3 NvInferRuntimeBase.h:201-217, 11.1 :221-237); the code reads extents through int64_t and writes ints,
// which fits both, so no #if on NV_TENSORRT_MAJOR is needed beyond the 8.5 floor below.
#include "vitclassify.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include <NvInfer.h>
#include <NvInferVersion.h>
#include <cuda_runtime_api.h>

#if !defined(NV_TENSORRT_MAJOR) || NV_TENSORRT_MAJOR < 8 || (NV_TENSORRT_MAJOR == 8 && NV_TENSORRT_MINOR < 5)
#error "vitclassify needs TensorRT 8.5 or newer (the name-based I/O API and uint8 network inputs)"
#endif

namespace vitdeploy {
namespace {

class Logger : public nvinfer1::ILogger {
 public:
  explicit Logger(bool verbose) : verbose_(verbose) {}
  void log(Severity severity, char const* msg) noexcept override {
    if (verbose_ && severity <= Severity::kWARNING) std::fprintf(stderr, "TensorRT: %s\n", msg);
  }

 private:
  bool verbose_;
};

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(rc));
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void reserve(size_t n) {
    if (n <= bytes) return;
    if (ptr) cuda_check(cudaFree(ptr), "cudaFree");
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMalloc(&ptr, n), "cudaMalloc");
    bytes = n;
  }
};

uint16_t as_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class TrtClassifier : public Classifier {
 public:
  TrtClassifier(const std::string& path, const EngineOptions& opt) : logger_(opt.verbose) {
    std::vector<char> blob = read_file(path, "engine file (build it with ./build_engine.sh)");
    runtime_.reset(nvinfer1::createInferRuntime(logger_));
    if (!runtime_) throw Error("TensorRT: createInferRuntime failed (is libnvinfer installed and matching its headers?)");
    if (opt.dla_core >= 0) runtime_->setDLACore(opt.dla_core);  // before deserializing, as trtexec --useDLACore
    engine_.reset(runtime_->deserializeCudaEngine(blob.data(), blob.size()));
    if (!engine_)
      throw Error(path + ": TensorRT " + std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) +
                  " cannot load this engine (built by another TensorRT version or GPU?): rebuild it with ./build_engine.sh");
    for (int32_t i = 0; i < engine_->getNbIOTensors(); ++i) {
      const char* name = engine_->getIOTensorName(i);
      if (engine_->getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT) {
        if (!input_.empty()) throw Error(path + ": an engine with more than one input is not the bundle's raw-pixel model");
        input_ = name;
      } else {
        outputs_.push_back(name);
      }
    }
    if (input_.empty() || outputs_.empty()) throw Error(path + ": the engine has no input or no output");
    // the output to read: the one bundle.cfg names (an embedding engine built with --tokens also has patch_tokens)
    if (!opt.output.empty()) {
      auto it = std::find(outputs_.begin(), outputs_.end(), opt.output);
      if (it == outputs_.end()) throw Error(path + ": no output " + opt.output + ": an engine of another model?");
      out_ = static_cast<size_t>(it - outputs_.begin());
    }
    if (!opt.tokens.empty()) {  // the patch tokens, read too (an export with --tokens): [batch, patches, width]
      auto it = std::find(outputs_.begin(), outputs_.end(), opt.tokens);
      if (it == outputs_.end())
        throw Error(path + ": no output " + opt.tokens + ", though bundle.cfg names it: rebuild the engine from this bundle's "
                    "model with ./build_engine.sh");
      tok_ = static_cast<size_t>(it - outputs_.begin());
      const nvinfer1::DataType tt = engine_->getTensorDataType(opt.tokens.c_str());
      if (tt != nvinfer1::DataType::kFLOAT && tt != nvinfer1::DataType::kHALF)
        throw Error(path + ": output " + opt.tokens + " is neither float32 nor float16");
    }
    nvinfer1::Dims d = engine_->getTensorShape(input_.c_str());
    if (engine_->getTensorDataType(input_.c_str()) != nvinfer1::DataType::kUINT8 || d.nbDims != 4 || d.d[3] != 3)
      throw Error(path + ": input " + input_ + " is not uint8 [batch, H, W, 3]: build the engine from the raw-pixel ONNX (model*.raw.onnx)");
    height_ = static_cast<int>(d.d[1]);
    width_ = static_cast<int>(d.d[2]);
    const nvinfer1::DataType out_type = engine_->getTensorDataType(outputs_[out_].c_str());
    if (out_type != nvinfer1::DataType::kFLOAT && out_type != nvinfer1::DataType::kHALF)
      throw Error(path + ": output " + outputs_[out_] + " is neither float32 nor float16");
    if (static_cast<int64_t>(d.d[0]) >= 0) {  // a static batch (a DLA engine): exactly that many images per call
      min_ = max_ = static_cast<int>(d.d[0]);
    } else {
      if (engine_->getNbOptimizationProfiles() < 1) throw Error(path + ": a dynamic batch without an optimization profile");
      min_ = static_cast<int>(engine_->getProfileShape(input_.c_str(), 0, nvinfer1::OptProfileSelector::kMIN).d[0]);
      max_ = static_cast<int>(engine_->getProfileShape(input_.c_str(), 0, nvinfer1::OptProfileSelector::kMAX).d[0]);
    }
    if (min_ < 1 || max_ < min_) throw Error(path + ": unusable batch profile " + std::to_string(min_) + ".." + std::to_string(max_));
    context_.reset(engine_->createExecutionContext());
    if (!context_) throw Error(path + ": TensorRT could not create an execution context (out of GPU memory?)");
    cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate");
    out_bufs_.resize(outputs_.size());
    // the class count (an embedding's width): the output's last extent at the smallest batch
    nvinfer1::Dims in = d;
    in.d[0] = min_;
    if (!context_->setInputShape(input_.c_str(), in)) throw Error(path + ": setInputShape failed for batch " + std::to_string(min_));
    nvinfer1::Dims od = context_->getTensorShape(outputs_[out_].c_str());
    if (od.nbDims != 2 || od.d[1] < 1) throw Error(path + ": output " + outputs_[out_] + " is not [batch, values]");
    classes_ = static_cast<int>(od.d[1]);
    if (tok_ != kNone) {
      nvinfer1::Dims td = context_->getTensorShape(outputs_[tok_].c_str());
      if (td.nbDims != 3 || td.d[1] < 1 || td.d[2] < 1)
        throw Error(path + ": output " + outputs_[tok_] + " is not [batch, patches, width]");
      patches_ = static_cast<int>(td.d[1]);
      tok_width_ = static_cast<int>(td.d[2]);
    }
  }

  ~TrtClassifier() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  int min_batch() const override { return min_; }
  int max_batch() const override { return max_; }
  int input_height() const override { return height_; }
  int input_width() const override { return width_; }
  int num_classes() const override { return classes_; }
  int token_patches() const override { return patches_; }
  int token_width() const override { return tok_width_; }

  void run(const uint8_t* pixels, int n, float* logits) override { run_with_tokens(pixels, n, logits, nullptr); }

  void run_with_tokens(const uint8_t* pixels, int n, float* logits, float* tokens) override {
    if (n < min_ || n > max_)
      throw Error("batch " + std::to_string(n) + " outside the engine's profile " + std::to_string(min_) + ".." + std::to_string(max_));
    nvinfer1::Dims in = engine_->getTensorShape(input_.c_str());
    in.d[0] = n;
    if (!context_->setInputShape(input_.c_str(), in)) throw Error("TensorRT setInputShape failed for batch " + std::to_string(n));
    const size_t in_bytes = static_cast<size_t>(n) * height_ * width_ * 3;
    in_buf_.reserve(in_bytes);
    cuda_check(cudaMemcpyAsync(in_buf_.ptr, pixels, in_bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to the GPU)");
    if (!context_->setTensorAddress(input_.c_str(), in_buf_.ptr)) throw Error("TensorRT setTensorAddress failed for " + input_);
    std::vector<size_t> out_bytes(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
      nvinfer1::Dims od = context_->getTensorShape(outputs_[i].c_str());
      size_t count = 1;
      for (int32_t j = 0; j < od.nbDims; ++j) {
        if (od.d[j] < 0) throw Error("TensorRT left output " + outputs_[i] + " with an unknown extent");
        count *= static_cast<size_t>(od.d[j]);
      }
      out_bytes[i] = count * element_size(engine_->getTensorDataType(outputs_[i].c_str()));
      out_bufs_[i].reserve(std::max<size_t>(out_bytes[i], 1));
      if (!context_->setTensorAddress(outputs_[i].c_str(), out_bufs_[i].ptr)) throw Error("TensorRT setTensorAddress failed for " + outputs_[i]);
    }
    if (!context_->enqueueV3(stream_)) throw Error("TensorRT enqueueV3 failed");
    const bool half = engine_->getTensorDataType(outputs_[out_].c_str()) == nvinfer1::DataType::kHALF;
    std::vector<uint8_t> host(out_bytes[out_]);
    cuda_check(cudaMemcpyAsync(host.data(), out_bufs_[out_].ptr, out_bytes[out_], cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (from the GPU)");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    const size_t values = static_cast<size_t>(n) * classes_;
    if (out_bytes[out_] != values * (half ? 2 : 4)) throw Error("output " + outputs_[out_] + " is not [batch, " + std::to_string(classes_) + "]");
    for (size_t i = 0; i < values; ++i)
      logits[i] = half ? half_to_float(as_u16(&host[i * 2])) : [&] { float f; std::memcpy(&f, &host[i * 4], 4); return f; }();
    if (tokens != nullptr && tok_ != kNone) {  // the patch tokens, copied back only when asked for
      const bool thalf = engine_->getTensorDataType(outputs_[tok_].c_str()) == nvinfer1::DataType::kHALF;
      const size_t tvalues = static_cast<size_t>(n) * patches_ * tok_width_;
      if (out_bytes[tok_] != tvalues * (thalf ? 2 : 4))
        throw Error("output " + outputs_[tok_] + " is not [batch, " + std::to_string(patches_) + ", " + std::to_string(tok_width_) + "]");
      std::vector<uint8_t> th(out_bytes[tok_]);
      cuda_check(cudaMemcpyAsync(th.data(), out_bufs_[tok_].ptr, out_bytes[tok_], cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync (from the GPU)");
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      for (size_t i = 0; i < tvalues; ++i)
        tokens[i] = thalf ? half_to_float(as_u16(&th[i * 2])) : [&] { float f; std::memcpy(&f, &th[i * 4], 4); return f; }();
    }
  }

 private:
  static size_t element_size(nvinfer1::DataType t) {
    switch (t) {
      case nvinfer1::DataType::kFLOAT:
      case nvinfer1::DataType::kINT32:
        return 4;
      case nvinfer1::DataType::kHALF:
        return 2;
      default:
        return 8;  // generous for the rest (int64 and wider); only the output read (out_) is copied back
    }
  }

  Logger logger_;
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  cudaStream_t stream_ = nullptr;
  std::string input_;
  std::vector<std::string> outputs_;
  size_t out_ = 0;  // index in outputs_ of the output read
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t tok_ = kNone;  // index in outputs_ of the patch tokens read too (kNone: not read)
  int patches_ = 0, tok_width_ = 0;
  DeviceBuffer in_buf_;
  std::vector<DeviceBuffer> out_bufs_;
  int min_ = 1, max_ = 1, height_ = 0, width_ = 0, classes_ = 0;
};

}  // namespace

std::unique_ptr<Classifier> Classifier::open(const std::string& engine_path, const EngineOptions& options) {
  return std::make_unique<TrtClassifier>(engine_path, options);
}

}  // namespace vitdeploy
