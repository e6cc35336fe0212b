#pragma once
// LineSplitter: a stream body's bytes as they arrive, handed out line by line (the watch
// protocol is one JSON object per line). Shared by the HTTP transports' streams.
// Not thread-safe: one reader.

#include <string>

namespace sbx::k8s {

class LineSplitter {
 public:
  // The buffer to append arrived bytes to; what was taken is dropped from it first.
  std::string* buffer() {
    if (pos_ == pending_.size()) {
      pending_.clear();
      pos_ = 0;
    } else if (pos_ > (size_t{1} << 16)) {
      pending_.erase(0, pos_);
      pos_ = 0;
    }
    return &pending_;
  }

  // Takes the next complete line, without its "\n" or "\r\n"; false when none is complete.
  bool TakeLine(std::string* line) {
    const size_t newline = pending_.find('\n', pos_);
    if (newline == std::string::npos) return false;
    line->assign(pending_, pos_, newline - pos_);
    pos_ = newline + 1;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    return true;
  }

  // At the end of the body: takes what is left as a last line without its newline; false
  // when nothing is left.
  bool TakeRest(std::string* line) {
    if (pos_ == pending_.size()) return false;
    line->assign(pending_, pos_);
    pos_ = pending_.size();
    return true;
  }

  // Everything not taken yet, byte for byte; the splitter is empty afterwards.
  std::string TakeAll() {
    std::string rest = pending_.substr(pos_);
    pending_.clear();
    pos_ = 0;
    return rest;
  }

 private:
  std::string pending_;  // bytes not yet taken, from pos_ on
  size_t pos_ = 0;
};

}  // namespace sbx::k8s
