// Expert tensor parallel inside EP: the etp group's received rows gathered
// and regrouped by local expert, and the partial outputs reduce-scattered
// back, both on dim 0 of fp32 rows (uneven members by the v-forms).
#include <cstring>
#include <string>

#include "parallel/internal.h"
#include "weft/parallel/ep.hpp"

namespace weft::parallel {

ExpertTp::ExpertTp(const Axis& etp, std::span<const size_t> expert_rows) : axis_(etp) {
  const size_t local = expert_rows.size(), members = size_t(etp.size());
  detail::require(local > 0, "expert_rows is empty: one entry per local expert");
  std::vector<uint64_t> mine(expert_rows.begin(), expert_rows.end()), all(local * members);
  if (members == 1) {
    all = mine;
  } else {
    detail::blocking(etp, "ep.etp.counts", "allgather", all.size() * sizeof(uint64_t),
                     [&](weftComm_t c, weftStream_t s) {
                       return weftAllGather(mine.data(), all.data(), local, weftUint64, c, s);
                     });
  }
  counts_.assign(members, std::vector<size_t>(local));
  member_rows_.assign(members, 0);
  expert_rows_.assign(local, 0);
  for (size_t m = 0; m < members; ++m)
    for (size_t e = 0; e < local; ++e) {
      counts_[m][e] = all[m * local + e];
      member_rows_[m] += counts_[m][e];
      expert_rows_[e] += counts_[m][e];
    }
  size_t offset = 0;
  for (size_t e = 0; e < local; ++e) {
    expert_offset_.push_back(offset);
    offset += expert_rows_[e];
  }
  // Member m's rows of expert e land after the earlier members' rows of e.
  std::vector<size_t> filled(expert_offset_);
  for (size_t m = 0; m < members; ++m)
    for (size_t e = 0; e < local; ++e)
      for (size_t n = 0; n < counts_[m][e]; ++n) order_.push_back(filled[e]++);
}

size_t ExpertTp::rows() const {
  return order_.size();
}
size_t ExpertTp::expert_rows(int local_expert) const {
  detail::require(local_expert >= 0 && size_t(local_expert) < expert_rows_.size(),
                  "local_expert=" + std::to_string(local_expert) + " is out of range [0, " +
                      std::to_string(expert_rows_.size()) + ")");
  return expert_rows_[local_expert];
}
size_t ExpertTp::expert_offset(int local_expert) const {
  expert_rows(local_expert);  // the range check
  return expert_offset_[local_expert];
}

void ExpertTp::gather(std::span<const float> own, std::span<float> all, size_t hidden) const {
  const size_t mine = member_rows_[axis_.rank()];
  detail::require_size("own", own.size(), mine * hidden);
  detail::require_size("all", all.size(), rows() * hidden);
  std::vector<float> gathered(rows() * hidden);
  all_gather_dim(axis_, view(own.data(), {mine, hidden}), view(gathered.data(), {rows(), hidden}),
                 0, member_rows_, "ep.etp.gather");
  for (size_t r = 0; r < order_.size(); ++r)
    std::memcpy(all.data() + order_[r] * hidden, gathered.data() + r * hidden,
                hidden * sizeof(float));
}

void ExpertTp::reduce_scatter(std::span<const float> all, std::span<float> own,
                              size_t hidden) const {
  const size_t mine = member_rows_[axis_.rank()];
  detail::require_size("all", all.size(), rows() * hidden);
  detail::require_size("own", own.size(), mine * hidden);
  std::vector<float> by_member(rows() * hidden);
  for (size_t r = 0; r < order_.size(); ++r)
    std::memcpy(by_member.data() + r * hidden, all.data() + order_[r] * hidden,
                hidden * sizeof(float));
  reduce_scatter_dim(axis_, view(by_member.data(), {rows(), hidden}),
                     view(own.data(), {mine, hidden}), 0, member_rows_, "ep.etp.reduce_scatter");
}

}  // namespace weft::parallel
