// Random damage for the parsers' robustness tests: a few edits, each a
// random byte, a cut, an inserted token, a swap of two bytes or a truncation.
#pragma once

#include <random>
#include <span>
#include <string>
#include <utility>

namespace weft::topo {

inline std::string damage(std::string text, std::mt19937& random,
                          std::span<const std::string> tokens, int max_edits) {
  int edits = 1 + static_cast<int>(random() % static_cast<unsigned>(max_edits));
  for (int e = 0; e < edits && !text.empty(); ++e) {
    size_t at = random() % text.size();
    switch (random() % 5) {
      case 0:
        text[at] = static_cast<char>(random() % 256);
        break;
      case 1:
        text.erase(at, 1 + random() % 8);
        break;
      case 2:
        text.insert(at, tokens[random() % tokens.size()]);
        break;
      case 3:
        std::swap(text[at], text[random() % text.size()]);
        break;
      default:
        text.resize(at);
        break;
    }
  }
  return text;
}

}  // namespace weft::topo
