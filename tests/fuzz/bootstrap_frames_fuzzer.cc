// Fuzz target: bytes as the bootstrap root receives them from one connection.
// The first byte chooses how the stream is cut into reads (as TCP may cut it);
// the rest is the stream. Like the root, the reader takes only a hello (at most
// kMaxHelloPayload) until one decodes, then every message type at the larger
// bound. Every decoded message must encode back to the bytes it came from.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/bootstrap_protocol.h"

namespace {

using weft::Blob;

// The decoders ignore trailing bytes: what they read is the encoding's length.
void expect_prefix(const Blob& encoded, const Blob& payload) {
  if (encoded.size() > payload.size() || memcmp(encoded.data(), payload.data(), encoded.size()))
    abort();
}

void check_frame(uint32_t type, const Blob& payload, int* nranks) {
  switch (type) {
    case weft::kHello: {
      weft::Hello hello;
      if (!weft::decode_hello(payload, &hello)) return;
      expect_prefix(weft::encode_hello(hello), payload);
      if (*nranks < 0 && hello.nranks > 0 && hello.rank >= 0 && hello.rank < hello.nranks)
        *nranks = hello.nranks;
      return;
    }
    case weft::kAllGather: {
      weft::AllGatherPart part;
      if (!weft::decode_allgather(payload, &part)) return;
      if (part.timeout_ms < 1 || part.timeout_ms > weft::kMaxWaitMs) abort();
      expect_prefix(weft::encode_allgather(part), payload);
      return;
    }
    case weft::kFailed: {
      weft::FailureReport report;
      if (!weft::decode_failure_report(payload, *nranks, &report)) return;
      if (report.waited.size() > static_cast<size_t>(*nranks)) abort();
      expect_prefix(weft::encode_failure_report(report), payload);
      return;
    }
    case weft::kCalls: {
      std::vector<weft::CallRecord> calls;
      if (!weft::decode_calls(payload, &calls)) return;
      if (calls.size() > weft::kMaxCallRecords) abort();
      expect_prefix(weft::encode_calls(calls), payload);
      // The root adds a report to the others it holds: here, as two ranks'.
      weft::CallComparison comparison;
      comparison.add(0, calls);
      comparison.add(1, calls);
      (void)comparison.mismatch();
      return;
    }
    case weft::kShrink: {
      weft::ShrinkRequest request;
      if (!weft::decode_shrink_request(payload, *nranks, &request)) return;
      for (int32_t rank : request.excluded)
        if (rank < 0 || rank >= *nranks) abort();
      expect_prefix(weft::encode_shrink_request(request), payload);
      return;
    }
    default:
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  ++data;
  --size;
  weft::FrameReader reader;
  int nranks = -1;  // learnt from the first hello, as the root does
  size_t framed = 0;
  for (size_t offset = 0; offset < size; offset += piece) {
    reader.append(data + offset, std::min(piece, size - offset));
    while (true) {
      const uint64_t limit = nranks < 0 ? weft::kMaxHelloPayload : weft::kMaxFramePayload;
      uint32_t type = 0;
      Blob payload;
      weft::FrameReader::Next next = reader.next(limit, &type, &payload);
      if (next == weft::FrameReader::Next::kInvalid) return 0;  // the root drops the connection
      if (next == weft::FrameReader::Next::kIncomplete) break;
      if (payload.size() > limit) abort();
      framed += sizeof(weft::FrameHeader) + payload.size();
      if (nranks < 0 && type != weft::kHello) return 0;  // dropped before a hello
      check_frame(type, payload, &nranks);
    }
  }
  // Every byte appended is in a frame returned or still buffered.
  if (framed + reader.buffered() != size) abort();
  return 0;
}
