#pragma once
// sbx::common: the small pieces every component shares — status macros, the injected
// clock, id generation and name validation, logging setup, signals for main(), build info.

#include "src/common/build_info.h"
#include "src/common/clock.h"
#include "src/common/dropped.h"
#include "src/common/ids.h"
#include "src/common/logging.h"
#include "src/common/signals.h"
#include "src/common/status_macros.h"
