#include "core/bootstrap_protocol.h"

#include <algorithm>
#include <cstring>

#include "common/wire.h"

namespace weft {

Status check_frame_header(const FrameHeader& header, uint64_t max_payload) {
  if (header.magic != kFrameMagic)
    return Error(weftRemoteError, "bootstrap message with a bad magic 0x%08x", header.magic);
  if (header.length > max_payload)
    return Error(weftRemoteError, "bootstrap message of %llu bytes exceeds the limit of %llu",
                 static_cast<unsigned long long>(header.length),
                 static_cast<unsigned long long>(max_payload));
  return Status::Ok();
}

void FrameReader::append(const uint8_t* data, size_t size) {
  // Frames already returned are dropped here, in one move, rather than one erase per frame.
  if (consumed_ > 0) {
    input_.erase(input_.begin(), input_.begin() + static_cast<ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  input_.insert(input_.end(), data, data + size);
}

FrameReader::Next FrameReader::next(uint64_t max_payload, uint32_t* type, Blob* payload) {
  if (buffered() < sizeof(FrameHeader)) return Next::kIncomplete;
  FrameHeader header;
  memcpy(&header, input_.data() + consumed_, sizeof(header));
  if (!check_frame_header(header, max_payload).ok()) return Next::kInvalid;
  if (buffered() - sizeof(header) < header.length) return Next::kIncomplete;
  const uint8_t* begin = input_.data() + consumed_ + sizeof(header);
  *type = header.type;
  payload->assign(begin, begin + header.length);
  consumed_ += sizeof(header) + header.length;
  return Next::kFrame;
}

namespace {

void put_ranks(WireWriter* writer, const std::vector<int32_t>& ranks) {
  writer->put(static_cast<uint32_t>(ranks.size()));
  for (int32_t rank : ranks) writer->put(rank);
}

// A count (at most nranks) and that many ranks. The count is checked against the bytes left
// before anything is allocated: a few bytes must not make the root reserve 4 * nranks.
bool get_ranks(WireReader* reader, int nranks, std::vector<int32_t>* ranks) {
  uint32_t count = 0;
  if (!reader->get(&count) || nranks < 0 || count > static_cast<uint32_t>(nranks) ||
      count > reader->left() / sizeof(int32_t))
    return false;
  ranks->resize(count);
  for (int32_t& rank : *ranks)
    if (!reader->get(&rank)) return false;
  return true;
}

}  // namespace

Blob encode_hello(const Hello& hello) {
  WireWriter writer;
  writer.put(hello.version);
  for (uint8_t byte : hello.secret) writer.put(byte);
  writer.put(hello.rank);
  writer.put(hello.nranks);
  writer.put_string(hello.label);
  writer.put_blob(hello.info);
  return std::move(writer.data());
}

bool decode_hello(const Blob& payload, Hello* out) {
  WireReader reader(payload);
  if (!reader.get(&out->version)) return false;
  for (uint8_t& byte : out->secret)
    if (!reader.get(&byte)) return false;
  return reader.get(&out->rank) && reader.get(&out->nranks) && reader.get_string(&out->label) &&
         reader.get_blob(&out->info);
}

Blob encode_allgather(const AllGatherPart& part) {
  WireWriter writer;
  writer.put(part.sequence);
  writer.put_blob(part.part);
  writer.put(part.timeout_ms);
  return std::move(writer.data());
}

bool decode_allgather(const Blob& payload, AllGatherPart* out) {
  WireReader reader(payload);
  // The timeout becomes a deadline: out of range, it would overflow the clock's arithmetic.
  return reader.get(&out->sequence) && reader.get_blob(&out->part) &&
         reader.get(&out->timeout_ms) && out->timeout_ms >= 1 && out->timeout_ms <= kMaxWaitMs;
}

Blob encode_failure_report(const FailureReport& report) {
  WireWriter writer;
  writer.put_string(report.message);
  put_ranks(&writer, report.waited);
  return std::move(writer.data());
}

bool decode_failure_report(const Blob& payload, int nranks, FailureReport* out) {
  WireReader reader(payload);
  return reader.get_string(&out->message) && get_ranks(&reader, nranks, &out->waited);
}

Blob encode_shrink_request(const ShrinkRequest& request) {
  WireWriter writer;
  writer.put(request.sequence);
  put_ranks(&writer, request.excluded);
  writer.put_blob(request.part);
  return std::move(writer.data());
}

bool decode_shrink_request(const Blob& payload, int nranks, ShrinkRequest* out) {
  WireReader reader(payload);
  if (!reader.get(&out->sequence) || !get_ranks(&reader, nranks, &out->excluded)) return false;
  for (int32_t rank : out->excluded)
    if (rank < 0 || rank >= nranks) return false;
  return reader.get_blob(&out->part);
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string text = "{";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text + "}";
}

Blob encode_calls(const std::vector<CallRecord>& calls) {
  WireWriter writer;
  writer.put<uint32_t>(static_cast<uint32_t>(calls.size()));
  for (const CallRecord& call : calls) {
    writer.put(call.sequence);
    writer.put(call.fingerprint);
    writer.put_string(call.text);
    writer.put<uint32_t>(static_cast<uint32_t>(call.counts.size()));
    for (uint64_t count : call.counts) writer.put(count);
  }
  return std::move(writer.data());
}

bool decode_calls(const Blob& payload, std::vector<CallRecord>* out) {
  WireReader reader(payload);
  uint32_t count = 0;
  if (!reader.get(&count) || count > kMaxCallRecords) return false;
  out->assign(count, CallRecord{});
  for (CallRecord& call : *out) {
    uint32_t counts = 0;
    if (!reader.get(&call.sequence) || !reader.get(&call.fingerprint) ||
        !reader.get_string(&call.text) || !reader.get(&counts) || counts % 2 != 0 ||
        counts > 2 * kMaxCountedRanks)
      return false;
    call.counts.assign(counts, 0);
    for (uint64_t& count : call.counts)
      if (!reader.get(&count)) return false;
  }
  return true;
}

std::string describe_count_mismatch(int from, int to, uint64_t sends, uint64_t receives,
                                    uint64_t sequence) {
  return "mismatched alltoallv counts: rank " + std::to_string(from) + " sends " +
         std::to_string(sends) + " elements to rank " + std::to_string(to) + " while rank " +
         std::to_string(to) + " receives " + std::to_string(receives) + " from rank " +
         std::to_string(from) + ", sequence " + std::to_string(sequence);
}

void CallComparison::add_row(int rank, uint64_t sequence, const std::vector<uint64_t>& counts) {
  const size_t n = counts.size() / 2;
  if (static_cast<size_t>(rank) >= n) return;  // a row of another communicator size
  std::map<int, std::vector<uint64_t>>& rows = rows_[sequence];
  if (!rows.try_emplace(rank, counts).second) return;
  auto note = [&](int from, int to, uint64_t sends, uint64_t receives) {
    if (sends == receives) return;
    auto [it, added] =
        count_mismatches_.try_emplace(sequence, CountPair{from, to, sends, receives});
    if (!added && std::pair(from, to) < std::pair(it->second.from, it->second.to))
      it->second = CountPair{from, to, sends, receives};
  };
  const size_t me = static_cast<size_t>(rank);
  for (const auto& [q, row] : rows) {
    if (q == rank || row.size() != counts.size()) continue;
    const size_t peer = static_cast<size_t>(q);
    note(rank, q, counts[peer], row[n + me]);
    note(q, rank, row[me], counts[n + peer]);
  }
}

void CallComparison::add(int rank, const std::vector<CallRecord>& calls) {
  for (const CallRecord& call : calls) {
    std::map<uint64_t, Caller>& callers = by_sequence_[call.sequence];
    auto [it, added] = callers.try_emplace(call.fingerprint, Caller{rank, call.text});
    if (!added && rank < it->second.rank) it->second = Caller{rank, call.text};
    if (callers.size() > 1) disagreeing_.insert(call.sequence);
    if (!call.counts.empty()) add_row(rank, call.sequence, call.counts);
  }
  while (by_sequence_.size() > kKeptSequences) {
    const uint64_t oldest = by_sequence_.begin()->first;
    disagreeing_.erase(oldest);
    rows_.erase(oldest);
    count_mismatches_.erase(oldest);
    by_sequence_.erase(by_sequence_.begin());
  }
}

std::string CallComparison::mismatch() const {
  // The lowest sequence that disagrees; different calls before different counts.
  const uint64_t calls = disagreeing_.empty() ? UINT64_MAX : *disagreeing_.begin();
  if (!count_mismatches_.empty() && count_mismatches_.begin()->first < calls) {
    const auto& [sequence, pair] = *count_mismatches_.begin();
    return describe_count_mismatch(pair.from, pair.to, pair.sends, pair.receives, sequence);
  }
  if (disagreeing_.empty()) return "";
  const uint64_t sequence = calls;
  const std::map<uint64_t, Caller>& callers = by_sequence_.at(sequence);
  auto lowest = [](const auto& a, const auto& b) { return a.second.rank < b.second.rank; };
  const auto first = std::min_element(callers.begin(), callers.end(), lowest);
  const Caller* other = nullptr;
  for (const auto& [fingerprint, caller] : callers)
    if (fingerprint != first->first && (other == nullptr || caller.rank < other->rank))
      other = &caller;
  return "mismatched collectives: rank " + std::to_string(other->rank) + " called " + other->text +
         " while rank " + std::to_string(first->second.rank) + " called " + first->second.text +
         ", sequence " + std::to_string(sequence);
}

}  // namespace weft
