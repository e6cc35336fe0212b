#include "src/common/build_info.h"

namespace sbx {

const char* Version() { return SBX_VERSION; }
const char* GitCommit() { return SBX_GIT_COMMIT; }

}  // namespace sbx
