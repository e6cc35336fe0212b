// FleetHealth (src/k8s/fleet_health.h) on a fake clock: a cluster whose probes fail (or
// hang) is excluded once its last success is older than the bound, reported once, and
// taken back at its next success.
#include "src/k8s/fleet_health.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

class FleetHealthTest : public ::testing::Test {
 protected:
  FleetHealthOptions Options() {
    FleetHealthOptions o;
    o.probe = [this] {
      ++probes_;
      return answer_;
    };
    o.bound = absl::Seconds(15);
    o.interval = absl::Seconds(1);
    o.on_change = [this](bool healthy, const absl::Status& error) {
      changes_.push_back(healthy);
      errors_.push_back(error);
    };
    o.clock = &clock_;
    return o;
  }

  FakeClock clock_;
  absl::Status answer_;
  std::atomic<int> probes_{0};
  std::vector<bool> changes_;
  std::vector<absl::Status> errors_;
};

TEST_F(FleetHealthTest, ExcludedAfterTheBoundOfFailuresThenBackAtTheNextSuccess) {
  FleetHealth health(Options());
  EXPECT_TRUE(health.Healthy());
  answer_ = absl::UnavailableError("connect to 127.0.0.1:1: connection refused");
  clock_.Advance(absl::Seconds(10));
  health.ProbeOnce();
  EXPECT_TRUE(health.Healthy());  // 10 s without a success: within the bound
  EXPECT_TRUE(changes_.empty());
  clock_.Advance(absl::Seconds(6));
  health.ProbeOnce();
  EXPECT_FALSE(health.Healthy());
  ASSERT_EQ(changes_, std::vector<bool>{false});
  EXPECT_EQ(errors_[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(errors_[0].message().find("connection refused"), std::string::npos);
  // Reported once, however many probes fail after.
  clock_.Advance(absl::Seconds(5));
  health.ProbeOnce();
  EXPECT_EQ(changes_.size(), 1u);
  answer_ = absl::OkStatus();
  health.ProbeOnce();
  EXPECT_TRUE(health.Healthy());
  EXPECT_EQ(changes_, (std::vector<bool>{false, true}));
}

TEST_F(FleetHealthTest, AHangingProbeCountsAgainstTheClusterWhileItHangs) {
  FleetHealth health(Options());
  // No probe answers at all (it hangs): only time passes.
  clock_.Advance(absl::Seconds(15));
  EXPECT_TRUE(health.Healthy());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(health.Healthy());
}

TEST_F(FleetHealthTest, TheThreadProbesAndStopJoinsIt) {
  FleetHealth health(Options());
  health.Start();
  for (int i = 0; i < 2000 && probes_.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(probes_.load(), 1);
  health.Stop();
  const int after = probes_.load();
  clock_.Advance(absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(probes_.load(), after);
}

TEST(FleetHealthOptionsTest, ValidateNamesWhatIsWrong) {
  FleetHealthOptions o;
  EXPECT_NE(o.Validate().message().find("no probe"), std::string::npos);
  o.probe = [] { return absl::OkStatus(); };
  EXPECT_TRUE(o.Validate().ok());
  o.interval = absl::Seconds(20);
  EXPECT_NE(o.Validate().message().find("interval <= bound"), std::string::npos) << o.Validate();
  o.interval = absl::Seconds(1);
  o.bound = absl::ZeroDuration();
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sbx::k8s
