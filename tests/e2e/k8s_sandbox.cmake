# End-to-end test of sbx-server's Kubernetes Sandbox controller against kube-emulator, with
# the real kubectl. Included from tests/e2e/CMakeLists.txt.
add_test(NAME e2e.k8s_sandbox COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_sandbox_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_sandbox PROPERTIES TIMEOUT 300)

# sbx serving SandboxWarmPools and SandboxClaims (--runtime kubernetes), with kubectl and grpcio.
add_test(NAME e2e.k8s_pool COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_pool_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_pool PROPERTIES TIMEOUT 600)

# Fenced replicas (issue 32): a paused leader, a cut-off leader, a deleted Lease, three
# replicas, kill -9 with the takeover time printed; the emulator's request log is the witness.
add_test(NAME e2e.k8s_fencing COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_fencing_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_fencing PROPERTIES TIMEOUT 600)

# bench/k8s_pool_bench.py scaled down (300 members, 30 claims): it must run and count at
# most 3 API writes per SandboxClaim; its timings are printed, never asserted.
if(TARGET sbx-loadgen)
  add_test(NAME bench.k8s_pool_smoke COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/bench/k8s_pool_bench.py
           --server $<TARGET_FILE:sbx-server> --emulator $<TARGET_FILE:kube-emulator>
           --loadgen $<TARGET_FILE:sbx-loadgen> --source ${PROJECT_SOURCE_DIR}
           --members 300 --claims 30 --grpc_requests 100 --kube_workers 16 --write_workers 16 --check)
  set_tests_properties(bench.k8s_pool_smoke PROPERTIES TIMEOUT 300)
endif()

# The NetworkPolicy of each SandboxTemplate (sbx-server --kubeconfig, kubectl), and the
# template label and secure defaults of the pods it selects (--runtime kubernetes).
add_test(NAME e2e.k8s_template COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_template_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_template PROPERTIES TIMEOUT 180)

# Pools on a bad day (issue 23): API faults, watch drops, a 410 relist, a scale and a kill -9
# with restart in the middle; every acknowledged gRPC claim must survive on its sandbox.
add_test(NAME e2e.k8s_faults COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_faults_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_faults PROPERTIES TIMEOUT 300)

# agents.x-k8s.io v1alpha1 through sbx-server's conversion webhook: the webhook's defences
# over real HTTPS, and kubectl reading and writing v1alpha1 against kube-emulator calling it.
add_test(NAME e2e.k8s_conversion COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_conversion_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_conversion PROPERTIES TIMEOUT 300)

# Placement policies (issue 22): a SandboxWarmPool annotated spread, then pack, over the
# emulator's three nodes labelled with zones; gRPC claims with and without node_preference.
add_test(NAME e2e.k8s_placement COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_placement_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_placement PROPERTIES TIMEOUT 300)

# A fleet (issue 40): one sbx-server in front of three kube-emulators as three clusters
# (--cluster), a pool spread across them, claims with and without a cluster preference,
# exec into a member of each cluster.
add_test(NAME e2e.k8s_fleet COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/k8s_fleet_test.py $<TARGET_FILE:sbx-server> $<TARGET_FILE:kube-emulator> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.k8s_fleet PROPERTIES TIMEOUT 300)
