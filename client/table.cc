// Plain-text tables (see table.h).
#include "client/table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace dequantd {

Table::Table(std::vector<std::string> headings, std::vector<bool> right_aligned)
    : headings_(std::move(headings)), right_aligned_(std::move(right_aligned)) {
  right_aligned_.resize(headings_.size(), false);
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headings_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(headings_.size());
  for (size_t c = 0; c < headings_.size(); ++c) {
    width[c] = headings_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) line += "  ";
      line += right_aligned_[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  print_row(headings_);
  for (const auto& row : rows_) print_row(row);
}

std::string Fixed(double value, int digits) { return absl::StrFormat("%.*f", digits, value); }

std::string Count(int64_t n, const std::string& noun) {
  return absl::StrFormat("%d %s%s", n, noun, n == 1 ? "" : "s");
}

}  // namespace dequantd
