// ErrnoText and SignalText (src/common/errno_text.h): the C library's texts, also for
// numbers it does not know.

#include "src/common/errno_text.h"

#include <errno.h>
#include <signal.h>

#include "gtest/gtest.h"

namespace sbx {
namespace {

TEST(ErrnoTextTest, KnownAndUnknownNumbers) {
  EXPECT_EQ(ErrnoText(ENOENT), "No such file or directory");
  EXPECT_EQ(ErrnoText(ENOSPC), "No space left on device");
  EXPECT_EQ(ErrnoText(0), "Success");
  EXPECT_EQ(ErrnoText(98765), "Unknown error 98765");
  EXPECT_EQ(ErrnoText(-3), "Unknown error -3");
}

TEST(SignalTextTest, KnownAndUnknownNumbers) {
  EXPECT_EQ(SignalText(SIGKILL), "Killed");
  EXPECT_EQ(SignalText(SIGTERM), "Terminated");
  EXPECT_EQ(SignalText(1000), "Unknown signal 1000");
}

}  // namespace
}  // namespace sbx
