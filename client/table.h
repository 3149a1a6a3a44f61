// A plain-text table with columns padded to their widest cell, for dequantctl's output.
// Numbers are right-aligned, text left-aligned. Not thread-safe.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace dequantd {

class Table {
 public:
  // `right_aligned[i]`: whether column i is right-aligned (numbers). Shorter = left.
  Table(std::vector<std::string> headings, std::vector<bool> right_aligned);
  // A row of cells; missing cells print empty, extra cells are an error the caller avoids.
  void AddRow(std::vector<std::string> cells);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> headings_;
  std::vector<bool> right_aligned_;
  std::vector<std::vector<std::string>> rows_;
};

// "%.*f" of `value`, e.g. Fixed(1.23456, 2) == "1.23".
std::string Fixed(double value, int digits);

// `n` and `noun`, plural unless n == 1: Count(1, "layer") == "1 layer", Count(2, ...) "2 layers".
std::string Count(int64_t n, const std::string& noun);

}  // namespace dequantd
