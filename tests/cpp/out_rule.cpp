// The C++ example's output rule (bundle_files/cpp/outputs.h) on cases read from stdin, for tests/test_output_rule.py:
//   stdin:  {"listed_manifest": {"root": DIR, "text": MANIFEST_JSON}, "cases": [{"out": P, "inputs": [P...]}, ...]}
//   stdout: the names bundle_listed found (one a line, as "name<TAB>path"), a line "--", then one line per case:
//           "refused<TAB>reason" or "ok"
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "outputs.h"

int main() {
  using vitdeploy::outputs::Json;
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const Json doc = vitdeploy::outputs::JsonReader(text).document();
  const Json* m = doc.get("listed_manifest");
  const auto listed = vitdeploy::outputs::bundle_listed(m->get("root")->text, m->get("text")->text);
  for (const auto& l : listed) std::cout << l.first << '\t' << l.second << '\n';
  std::cout << "--\n";
  for (const Json& c : doc.get("cases")->items) {
    std::vector<std::string> inputs;
    for (const Json& i : c.get("inputs")->items) inputs.push_back(i.text);
    const std::string why = vitdeploy::outputs::out_refusal(c.get("out")->text, inputs, listed);
    std::cout << (why.empty() ? std::string("ok") : "refused\t" + why) << '\n';
  }
  return 0;
}
