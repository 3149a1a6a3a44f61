// ResponseView (see response_view.h).
#include "client/response_view.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace dequantd {
namespace {

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
// DequantizeResponse's fields (proto/dequant/v1/dequant.proto).
constexpr uint32_t kHeaderField = 1, kOffsetField = 2, kDataField = 3;

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(absl::StrCat("response message: ", what));
}

// Reads bytes across the slices of one message.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool at_end() const { return slice_ == slices_.size(); }

  // A varint of at most 10 bytes; false when the message ends inside it or it is longer.
  bool Varint(uint64_t* value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (at_end()) return false;
      const uint8_t b = slices_[slice_].begin()[at_];
      Advance(1);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *value = v;
        return true;
      }
    }
    return false;
  }

  // The next `n` bytes as views into the slices (appended to `out`, when given); false when the
  // message holds fewer.
  bool Take(uint64_t n, std::vector<absl::Span<const uint8_t>>* out) {
    while (n > 0) {
      if (at_end()) return false;
      const grpc::Slice& s = slices_[slice_];
      const uint64_t here = std::min<uint64_t>(n, s.size() - at_);
      if (out != nullptr) out->emplace_back(s.begin() + at_, static_cast<size_t>(here));
      Advance(static_cast<size_t>(here));
      n -= here;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    at_ += n;
    if (at_ == slices_[slice_].size()) {
      ++slice_;
      at_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t at_ = 0;
};

}  // namespace

absl::Status ResponseView::Parse(grpc::ByteBuffer& buffer) {
  slices_.clear();
  has_header_ = false;
  header_.Clear();
  offset_ = 0;
  data_.clear();
  data_bytes_ = 0;
  if (grpc::Status s = buffer.Dump(&slices_); !s.ok()) {
    return Malformed(absl::StrCat("cannot read the message: ", s.error_message()));
  }
  buffer.Clear();
  Cursor in(slices_);
  while (!in.at_end()) {
    uint64_t tag = 0;
    if (!in.Varint(&tag)) return Malformed("truncated field tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    const uint32_t type = static_cast<uint32_t>(tag & 7);
    uint64_t value = 0;
    switch (type) {
      case kVarint:
        if (!in.Varint(&value)) return Malformed(absl::StrCat("truncated varint field ", field));
        if (field == kOffsetField) offset_ = static_cast<int64_t>(value);
        break;
      case kFixed64:
      case kFixed32:
        if (!in.Take(type == kFixed64 ? 8 : 4, nullptr)) {
          return Malformed(absl::StrCat("truncated fixed-size field ", field));
        }
        break;
      case kLengthDelimited: {
        if (!in.Varint(&value)) return Malformed(absl::StrCat("truncated length of field ", field));
        std::vector<absl::Span<const uint8_t>> pieces;
        if (!in.Take(value, &pieces)) {
          return Malformed(absl::StrCat("field ", field, " of ", value, " bytes is truncated"));
        }
        if (field == kDataField) {
          data_ = std::move(pieces);  // a repeated `bytes` field keeps its last value
          data_bytes_ = static_cast<int64_t>(value);
        } else if (field == kHeaderField) {
          std::string bytes;
          bytes.reserve(static_cast<size_t>(value));
          for (absl::Span<const uint8_t> p : pieces) {
            bytes.append(reinterpret_cast<const char*>(p.data()), p.size());
          }
          ::dequant::v1::DequantizeHeader part;
          if (!part.ParseFromString(bytes)) return Malformed("the header does not parse");
          header_.MergeFrom(part);
          has_header_ = true;
        }
        break;
      }
      default:
        return Malformed(absl::StrCat("field ", field, " has wire type ", type));
    }
  }
  return absl::OkStatus();
}

}  // namespace dequantd
