#include "src/sandboxd/output_ring.h"

#include <algorithm>
#include <utility>

namespace sbx::sandboxd {

OutputRing::OutputRing(int64_t capacity) : capacity_(std::max<int64_t>(1, capacity)) {}

void OutputRing::Append(OutputStream stream, std::string data) {
  if (data.empty()) return;
  const int64_t n = static_cast<int64_t>(data.size());
  if (n > capacity_) {
    // Only the last `capacity_` bytes of this chunk can stay: everything before goes.
    const int64_t keep_from = end_ + n - capacity_;
    dropped_ += keep_from - start_;
    chunks_.clear();
    data.erase(0, static_cast<size_t>(n - capacity_));
    chunks_.push_back({keep_from, stream, std::move(data)});
    start_ = keep_from;
    end_ += n;
    return;
  }
  // Merge small writes of the same stream (a shell echoing key by key) into one chunk, so
  // that the deque does not grow by a node per byte.
  if (!chunks_.empty() && chunks_.back().stream == stream && chunks_.back().data.size() < 4096 &&
      data.size() < 4096) {
    chunks_.back().data.append(data);
  } else {
    chunks_.push_back({end_, stream, std::move(data)});
  }
  end_ += n;
  if (end_ - start_ > capacity_) {
    const int64_t new_start = end_ - capacity_;
    dropped_ += new_start - start_;
    TrimFront(new_start);
  }
}

void OutputRing::TrimFront(int64_t offset) {
  while (!chunks_.empty()) {
    Chunk& front = chunks_.front();
    const int64_t chunk_end = front.offset + static_cast<int64_t>(front.data.size());
    if (chunk_end <= offset) {
      chunks_.pop_front();
      continue;
    }
    if (front.offset < offset) {
      front.data.erase(0, static_cast<size_t>(offset - front.offset));
      front.offset = offset;
    }
    break;
  }
  start_ = offset;
}

void OutputRing::DiscardBefore(int64_t offset) {
  offset = std::clamp(offset, start_, end_);
  if (offset > start_) TrimFront(offset);
}

OutputRing::Read OutputRing::ReadAt(int64_t* cursor, size_t max_bytes) const {
  Read read;
  if (*cursor < start_) {
    read.gap = start_ - *cursor;
    *cursor = start_;
    return read;
  }
  if (*cursor >= end_) return read;
  // The chunk holding the cursor: chunks are sorted by offset and contiguous.
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), *cursor,
                             [](int64_t off, const Chunk& c) { return off < c.offset; });
  --it;  // exists: chunks_.front().offset == start_ <= *cursor
  const size_t from = static_cast<size_t>(*cursor - it->offset);
  const size_t n = std::min(max_bytes, it->data.size() - from);
  read.stream = it->stream;
  read.data = it->data.substr(from, n);
  *cursor += static_cast<int64_t>(n);
  return read;
}

}  // namespace sbx::sandboxd
