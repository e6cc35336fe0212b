#include "src/common/logging.h"

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace sbx {

absl::Status LogOptions::Validate() const {
  if (spdlog::level::from_str(level) == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level \"", level, "\" is not one of trace, debug, info, warn, error, critical, off"));
  }
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("log format \"", format, "\" is not one of text, json"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const LogOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto logger = spdlog::stderr_logger_mt("sbx");
  if (options.format == "json") {
    // %v is the message; messages are plain text, so escape-free content is the caller's
    // duty only for quotes, which spdlog does not escape: we keep messages quote-light.
    logger->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,"msg":"%v"})",
                        spdlog::pattern_time_type::utc);
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %L %t] %v", spdlog::pattern_time_type::utc);
  }
  logger->set_level(spdlog::level::from_str(options.level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace sbx
