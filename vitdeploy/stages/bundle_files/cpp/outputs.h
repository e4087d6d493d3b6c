// The rule every file the example writes (--out and its .files.txt) follows: the same as vitdeploy's own outputs
// (core/outputs.py output_refusal, core/fileio.py check_output) and run.py's out_refusal, copied here because the
// example cannot import vitdeploy; tests/test_output_rule.py holds the three to the same cases.
//
// An output may not be
//   - an input (the engine, the config, the labels file, an image), nor a symlink or hard link to one;
//   - an existing file inside an input folder;
//   - one of the bundle's own files (manifest.json and every file it lists), by its name or through a link.
// It is written to a new temporary file beside it and renamed into place (write_replacing), so a link at the
// destination is replaced, never written through.
#pragma once

#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vitdeploy {
namespace outputs {

inline bool stat_of(const std::string& p, struct stat* st) { return ::stat(p.c_str(), st) == 0; }

inline bool same_file(const std::string& a, const std::string& b) {
  struct stat x {}, y {};
  return stat_of(a, &x) && stat_of(b, &y) && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

inline std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

// Where a path's name sits: its folder resolved, its last part as given (a link there is not followed).
inline std::string spot(const std::string& p) {
  std::error_code ec;
  std::filesystem::path a = std::filesystem::absolute(p, ec).lexically_normal();
  const std::string dir = a.parent_path().string(), real = real_path(dir);
  return (real.empty() ? dir : real) + "/" + a.filename().string();
}

// Why `out` may not be written ("" when it may). `listed`: (name as the manifest gives it, path) of each bundle file.
inline std::string out_refusal(const std::string& out, const std::vector<std::string>& inputs,
                               const std::vector<std::pair<std::string, std::string>>& listed) {
  struct stat so {}, si {};
  const bool out_exists = stat_of(out, &so);
  for (const std::string& i : inputs)
    if (stat_of(i, &si) && same_file(out, i)) return out + " is the input " + i;
  for (const std::string& i : inputs) {
    if (!stat_of(i, &si) || !S_ISDIR(si.st_mode) || !out_exists || S_ISDIR(so.st_mode)) continue;
    std::string folder = real_path(i);
    const std::string r = real_path(out);
    if (folder.empty() || r.empty()) continue;
    if (folder.back() != '/') folder += '/';
    if (r.compare(0, folder.size(), folder) == 0) return out + " is a file of the input folder " + i;
  }
  for (const auto& f : listed)
    if (spot(out) == spot(f.second) || (stat_of(f.second, &si) && same_file(out, f.second)))
      return out + " is the bundle's own " + f.first;
  return "";
}

// --- manifest.json: the names of the bundle's own files (a JSON reader just large enough for them) -------------

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
  const Json* get(const std::string& key) const {
    if (kind != kObject) return nullptr;
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& d) : d_(d) {}
  Json document() {
    Json v = value(0);
    space();
    if (i_ != d_.size()) fail("text after the document");
    return v;
  }

 private:
  const std::string& d_;
  size_t i_ = 0;
  [[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + " at byte " + std::to_string(i_)); }
  void space() {
    while (i_ < d_.size() && (d_[i_] == ' ' || d_[i_] == '\n' || d_[i_] == '\r' || d_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    space();
    if (i_ < d_.size() && d_[i_] == c) return ++i_, true;
    return false;
  }
  static void utf8(std::string& o, unsigned long c) {
    if (c < 0x80) {
      o += static_cast<char>(c);
    } else if (c < 0x800) {
      o += static_cast<char>(0xC0 | (c >> 6));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      o += static_cast<char>(0xE0 | (c >> 12));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (c >> 18));
      o += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  unsigned long hex4() {
    if (i_ + 4 > d_.size()) fail("a short \\u escape");
    const std::string h = d_.substr(i_, 4);
    char* end = nullptr;
    const unsigned long c = std::strtoul(h.c_str(), &end, 16);
    if (end != h.c_str() + 4) fail("a bad \\u escape");
    i_ += 4;
    return c;
  }
  std::string string() {
    if (!eat('"')) fail("expected a string");
    std::string o;
    while (true) {
      if (i_ >= d_.size()) fail("an unterminated string");
      const char c = d_[i_++];
      if (c == '"') return o;
      if (c != '\\') {
        o += c;
        continue;
      }
      if (i_ >= d_.size()) fail("an unterminated string");
      const char e = d_[i_++];
      switch (e) {
        case '"': case '\\': case '/': o += e; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          unsigned long u = hex4();
          if (u >= 0xDC80 && u <= 0xDCFF) {  // Python's surrogateescape: a byte of a name that is not UTF-8
            o += static_cast<char>(u - 0xDC00);
          } else if (u >= 0xD800 && u <= 0xDBFF && i_ + 6 <= d_.size() && d_[i_] == '\\' && d_[i_ + 1] == 'u') {
            i_ += 2;
            const unsigned long lo = hex4();
            utf8(o, 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00));
          } else {
            utf8(o, u);
          }
          break;
        }
        default: fail("a bad escape");
      }
    }
  }
  Json value(int depth) {
    if (depth > 64) fail("nesting deeper than a manifest's");
    space();
    Json v;
    if (i_ >= d_.size()) fail("an unexpected end");
    const char c = d_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::kObject;
      if (eat('}')) return v;
      do {
        std::string k = string();
        if (!eat(':')) fail("expected ':'");
        v.members.emplace_back(std::move(k), value(depth + 1));
      } while (eat(','));
      if (!eat('}')) fail("expected '}'");
    } else if (c == '[') {
      ++i_;
      v.kind = Json::kArray;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      if (!eat(']')) fail("expected ']'");
    } else if (c == '"') {
      v.kind = Json::kString;
      v.text = string();
    } else {
      const size_t start = i_;
      while (i_ < d_.size() && std::string(",}] \n\r\t").find(d_[i_]) == std::string::npos) ++i_;
      v.text = d_.substr(start, i_ - start);
      if (v.text.empty()) fail("expected a value");
      v.kind = (v.text == "true" || v.text == "false") ? Json::kBool : v.text == "null" ? Json::kNull : Json::kNumber;
    }
    return v;
  }
};

// (name, path) of each of the bundle's own files, from `root`/manifest.json: manifest.json, bundle.files, the models
// (bundle.artifacts) and the reference arrays. Throws std::runtime_error for a manifest that is not JSON.
inline std::vector<std::pair<std::string, std::string>> bundle_listed(const std::string& root, const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const std::string& rel) { out.emplace_back(rel, (std::filesystem::path(root) / rel).string()); };
  add("manifest.json");
  const Json doc = JsonReader(text).document();
  const Json* b = doc.get("bundle");
  if (b == nullptr) return out;
  for (const char* key : {"files", "artifacts"})
    if (const Json* o = b->get(key))
      for (const auto& m : o->members) add(m.first);
  if (const Json* ref = b->get("reference")) {
    if (const Json* in = ref->get("inputs"))
      if (in->kind == Json::kString) add(in->text);
    if (const Json* lg = ref->get("logits"))
      for (const auto& m : lg->members)
        if (m.second.kind == Json::kString) add(m.second.text);
  }
  return out;
}

}  // namespace outputs
}  // namespace vitdeploy
