# End-to-end test of sbx-server's Kubernetes Sandbox controller against kube-emulator, with
# the real kubectl. Included from tests/e2e/CMakeLists.txt.
add_test(NAME e2e.k8s_sandbox COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_sandbox_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_sandbox PROPERTIES TIMEOUT 300)

# sbx serving SandboxWarmPools and SandboxClaims (--runtime kubernetes), with kubectl and grpcio.
add_test(NAME e2e.k8s_pool COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_pool_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_pool PROPERTIES TIMEOUT 600)
