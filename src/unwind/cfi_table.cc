// CfiModuleTable's rows in their compact form (internal/cfi_table.h): the
// distinct rules, the rows' pcs and rule indexes, the per-bucket index and
// the lookup cache; and CfiSnapshot, the tables at their load addresses.
// The builders (cfi_table_libdw.cc) and the direct lookups
// (cfi_table_direct_linux.cc) are elsewhere.
#include "inprof/internal/cfi_table.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/cfi_walk.h"

namespace inprof::internal {

CfiGlobalState g_cfi_state;

CfiModuleTable::~CfiModuleTable() = default;

std::shared_ptr<const CfiModuleTable> CfiModuleTable::Pending(
    uint64_t text_lo, uint64_t text_hi, std::string path) {
  auto table = std::make_shared<CfiModuleTable>(
      text_lo, text_hi, std::vector<CfiRow>(), std::move(path));
  table->pending_ = true;
  return table;
}

CfiModuleTable::CfiModuleTable(uint64_t text_lo, uint64_t text_hi,
                               const std::vector<CfiRow>& rows,
                               std::string path, std::string build_id)
    : text_lo_(text_lo),
      text_size_(text_hi > text_lo ? text_hi - text_lo : 0),
      path_(std::move(path)),
      build_id_(std::move(build_id)) {
  if (text_size_ > std::numeric_limits<uint32_t>::max()) text_size_ = 0;
  // Growth-safe: a build on the collector's thread that meets the heap
  // exhausted unwinds through it (growth_safe_table.h).
  internal::GrowthSafeMap<uint64_t, uint16_t> index;
  rules_.push_back(0);  // [0]: kNone
  {
    internal::GrowthReserve reserve(index);
    index[0] = 0;
  }
  CfiRule unsupported_rule;
  unsupported_rule.kind = CfiRule::kUnsupported;
  const uint64_t unsupported = EncodeRule(unsupported_rule);
  rules_.push_back(unsupported);  // [1]: the overflow rule
  {
    internal::GrowthReserve reserve(index);
    index[unsupported] = 1;
  }
  auto rule_index = [&](const CfiRule& rule) -> uint16_t {
    const uint64_t word = EncodeRule(rule);
    auto it = index.find(word);
    if (it != index.end()) return it->second;
    if (rules_.size() > std::numeric_limits<uint16_t>::max()) return 1;
    const auto i = static_cast<uint16_t>(rules_.size());
    internal::GrowthReserve reserve(index);
    rules_.push_back(word);
    index[word] = i;
    return i;
  };
  // A leading kNone row at 0, so every offset has a row in force.
  row_pc_.reserve(rows.size() + 1);
  row_rule_.reserve(rows.size() + 1);
  row_pc_.push_back(0);
  row_rule_.push_back(0);
  bool any = false;
  for (const CfiRow& row : rows) {
    if (row.pc >= text_size_) continue;
    if (row.rule.kind != CfiRule::kNone) any = true;
    const uint16_t r = rule_index(row.rule);
    if (!row_pc_.empty() && row_pc_.back() > row.pc) continue;  // unsorted
    if (!row_pc_.empty() && row_pc_.back() == row.pc) {
      row_rule_.back() = r;  // the last of equal pcs wins
      if (row_rule_.size() >= 2 && row_rule_[row_rule_.size() - 2] == r) {
        row_pc_.pop_back();
        row_rule_.pop_back();
      }
      continue;
    }
    if (!row_rule_.empty() && row_rule_.back() == r) continue;
    row_pc_.push_back(row.pc);
    row_rule_.push_back(r);
  }
  if (!any) {
    row_pc_.clear();
    row_rule_.clear();
  }
  // Rows merge rarely here (the builder merged them): keep the reserved
  // room unless a quarter of it is unused.
  if (row_pc_.size() < row_pc_.capacity() / 4 * 3) {
    row_pc_.shrink_to_fit();
    row_rule_.shrink_to_fit();
  }
  rules_.shrink_to_fit();
  if (row_pc_.empty()) return;
  while (cache_bits_ < 12 && (size_t{1} << cache_bits_) * 4 < row_pc_.size()) {
    ++cache_bits_;
  }
  cache_ = std::make_unique<std::atomic<uint64_t>[]>(size_t{1} << cache_bits_);
  cache_mask_ = (uint32_t{1} << cache_bits_) - 1;
  const size_t buckets = static_cast<size_t>((text_size_ - 1) >> kBucketShift) + 1;
  bucket_row_.resize(buckets);
  size_t row = 0;
  for (size_t b = 0; b < buckets; ++b) {
    const uint64_t start = uint64_t{b} << kBucketShift;
    while (row + 1 < row_pc_.size() && row_pc_[row + 1] <= start) ++row;
    bucket_row_[b] = static_cast<uint32_t>(row);
  }
}

size_t CfiModuleTable::MemoryBytes() const {
  return sizeof(*this) + row_pc_.capacity() * sizeof(uint32_t) +
         row_rule_.capacity() * sizeof(uint16_t) +
         rules_.capacity() * sizeof(uint64_t) +
         bucket_row_.capacity() * sizeof(uint32_t) +
         (cache_ != nullptr ? (size_t{1} << cache_bits_) * sizeof(uint64_t) : 0) +
         path_.capacity() +
         build_id_.capacity();
}

std::vector<CfiRow> CfiModuleTable::Rows() const {
  std::vector<CfiRow> rows(row_pc_.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = {row_pc_[i], DecodeRule(rules_[row_rule_[i]])};
  }
  return rows;
}

CfiSnapshot::CfiSnapshot(
    std::vector<std::pair<uintptr_t, std::shared_ptr<const CfiModuleTable>>>
        modules,
    uint64_t generation)
    : generation_(generation) {
  std::sort(modules.begin(), modules.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [lo, table] : modules) {
    if (table == nullptr) continue;
    const uintptr_t hi = lo + (table->text_hi() - table->text_lo());
    if (!modules_.empty() && lo < modules_.back().hi) continue;  // overlap
    modules_.push_back({lo, hi, table.get()});
    owned_.push_back(std::move(table));
  }
}

}  // namespace inprof::internal
