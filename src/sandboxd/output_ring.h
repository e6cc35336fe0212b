#pragma once
// OutputRing: the replay buffer of one process (process_table.h). It holds the most recent
// output of the process as chunks tagged with their stream, addressed by absolute byte
// offsets (the first byte the process ever wrote is offset 0), and never more than its
// capacity: appending beyond it drops the oldest bytes and counts them. Readers keep
// their own cursor (an offset) and read from it; bytes that every reader has passed are
// discarded with DiscardBefore.
//
// Thread-safety: none; the owner (Process) guards it with its mutex.
// Lifetime: plain value type.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace sbx::sandboxd {

enum class OutputStream { kStdout, kStderr, kPty };

class OutputRing {
 public:
  // `capacity`: bytes held at most, 1 or more.
  explicit OutputRing(int64_t capacity);

  // Appends `data` (non-empty) of `stream`. When the ring would then hold more than its
  // capacity the oldest bytes go (a chunk may lose its head); dropped() counts them.
  void Append(OutputStream stream, std::string data);

  // What a read from a cursor gives.
  struct Read {
    // Bytes missing between the cursor and the oldest byte held (dropped before the
    // reader got them); the cursor moves past them. 0: none.
    int64_t gap = 0;
    // Up to max_bytes of one stream starting at the (moved) cursor; empty when the
    // cursor is at the end.
    OutputStream stream = OutputStream::kStdout;
    std::string data;
  };
  // Reads at `*cursor` (at most end()) and advances it: a gap first, on its own, if the
  // cursor points before start(); else data of one chunk.
  Read ReadAt(int64_t* cursor, size_t max_bytes) const;

  // Discards the bytes before `offset` (clamped to start()..end()); they are not counted
  // as dropped.
  void DiscardBefore(int64_t offset);

  // The offset of the oldest byte held, and one past the newest (the total written).
  int64_t start() const { return start_; }
  int64_t end() const { return end_; }
  int64_t size() const { return end_ - start_; }
  int64_t capacity() const { return capacity_; }
  // Bytes dropped by Append to stay within the capacity.
  int64_t dropped() const { return dropped_; }

 private:
  struct Chunk {
    int64_t offset;
    OutputStream stream;
    std::string data;
  };
  // Drops the bytes before `offset` from the front chunks.
  void TrimFront(int64_t offset);

  const int64_t capacity_;
  std::deque<Chunk> chunks_;
  int64_t start_ = 0;
  int64_t end_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace sbx::sandboxd
