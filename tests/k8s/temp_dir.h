#pragma once
// A temporary directory for a test, removed with everything in it when the object goes.
// Not thread-safe; one test at a time.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace sbx::k8s::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "sbx_k8s_test_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `text` to the file `name` in the directory; returns its path.
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ + "/" + name) << text;
    return path_ + "/" + name;
  }
  // The contents of the file `name`, "" when it cannot be read.
  std::string Read(const std::string& name) const {
    std::ifstream in(path_ + "/" + name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string path_;
};

}  // namespace sbx::k8s::testing
