// sbx-rootfs: gives a sandbox of an OCI image its copy-on-write root, then runs bubblewrap
// (src/runtime/image_root_helper.h). The local runtime starts it; it is no command for
// people.

#include "src/runtime/image_root_helper.h"

int main(int argc, char** argv) { return sbx::runtime::ImageRootHelperMain(argc, argv); }
