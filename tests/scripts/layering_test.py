#!/usr/bin/env python3
"""Shows that scripts/check_layering.py catches forbidden includes and passes clean trees."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_tree import run_on_tree  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check_layering.py")


def run(files):
    return run_on_tree(SCRIPT, files)


class LayeringTest(unittest.TestCase):
    def test_clean_tree_passes(self):
        rc, out = run({
            "src/allocator/allocator.cc": '#include "src/store/store.h"\n'
                                          '#include "src/common/clock.h"\n'
                                          '#include "absl/status/status.h"\n',
            "src/server/server.cc": '#include "src/allocator/allocator.h"\n'
                                    '#include "sbx/v1/claims.pb.h"\n#include "grpcpp/grpcpp.h"\n',
            "src/store/rocksdb_store.cc": '#include "rocksdb/db.h"\n',
            "src/cmd/main.cc": '#include "src/store/rocksdb_store.h"\n',
        })
        self.assertEqual(rc, 0, out)
        self.assertIn("layering: ok (4 files)", out)

    def test_clients_use_the_public_api_only(self):
        rc, out = run({
            "clients/mcp/test/unit.test.ts": "import {x} from '../src/limits.js';\n",
            "clients/python/sbx/gen.py": "PROTO = '../../../proto'\n",
        })
        self.assertEqual(rc, 0, out)
        rc, out = run({"clients/typescript/src/x.ts":
                       "import {Allocator} from '../../../src/allocator/allocator';\n"})
        self.assertEqual(rc, 1, out)
        self.assertIn("clients/typescript/src/x.ts:1", out)
        self.assertIn("leads into src/", out)

    def test_gateway_e2b_is_a_client_of_the_api_only(self):
        rc, out = run({"src/gateway/e2b/envd.cc": '#include "src/gateway/e2b/envd.h"\n'
                                                  '#include "src/common/ids.h"\n'
                                                  '#include "sbx/v1/sandboxes.grpc.pb.h"\n'
                                                  '#include "e2b/envd/process.pb.h"\n'
                                                  '#include "grpcpp/grpcpp.h"\n',
                       "src/gateway/e2b/http_server.cc": '#include "boost/beast/http.hpp"\n'})
        self.assertEqual(rc, 0, out)
        rc, out = run({"src/gateway/e2b/envd.cc": '#include "src/gateway/gateway.h"\n'
                                                  '#include "src/server/auth.h"\n',
                       "src/gateway/port_proxy.cc": '#include "src/gateway/e2b/e2b.h"\n'
                                                    '#include "e2b/envd/process.pb.h"\n',
                       "src/gateway/e2b/files.cc": '#include "boost/beast/http.hpp"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn('src/gateway/e2b/envd.cc:1: gateway_e2b may not include "src/gateway/gateway.h"', out)
        self.assertIn('src/gateway/e2b/envd.cc:2: gateway_e2b may not include "src/server/auth.h"', out)
        self.assertIn('src/gateway/port_proxy.cc:1: gateway may not include "src/gateway/e2b/e2b.h"', out)
        self.assertIn('src/gateway/port_proxy.cc:2: gateway may not include "e2b/envd/process.pb.h"', out)
        self.assertIn("src/gateway/e2b/files.cc:1: includes <boost/beast/http.hpp>", out)

    def test_allocator_may_not_see_store_implementation(self):
        rc, out = run({"src/allocator/pool.cc": '#include "src/store/rocksdb_store.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/allocator/pool.cc:1", out)
        self.assertIn("implementation header of store", out)

    def test_allocator_parts_do_not_include_the_allocator(self):
        rc, out = run({"src/allocator/ready_set.cc": '#include "src/allocator/allocator.h"\n',
                       "src/allocator/watch_hub.h":
                           '#pragma once\n#include "src/allocator/allocator_impl.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn('src/allocator/ready_set.cc:1: includes "src/allocator/allocator.h"', out)
        self.assertIn("src/allocator/watch_hub.h:2", out)
        self.assertIn("back-arrow", out)
        rc, out = run({"src/allocator/claim_path.cc": '#include "src/allocator/allocator_impl.h"\n',
                       "src/allocator/refill.h": '#pragma once\n#include "src/allocator/allocator.h"\n'})
        self.assertEqual(rc, 0, out)

    def test_store_may_not_include_allocator(self):
        rc, out = run({"src/store/x.h": '#pragma once\n#include "src/allocator/allocator.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn('store may not include "src/allocator/allocator.h"', out)

    def test_rocksdb_only_in_its_adapter(self):
        rc, out = run({"src/store/memory_store.cc": '#include <rocksdb/db.h>\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("rocksdb may be used only in src/store/rocksdb_store.cc", out)

    def test_openssl_only_in_the_socket_transport(self):
        rc, out = run({"src/k8s/http_socket.cc": '#include <openssl/ssl.h>\n'})
        self.assertEqual(rc, 0, out)
        rc, out = run({"src/k8s/client.cc": '#include <openssl/ssl.h>\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("openssl may be used only in src/k8s/http_socket.cc", out)

    def test_k8s_rooms(self):
        rc, out = run({
            "src/k8s/claim_controller.cc": '#include "src/allocator/allocator.h"\n'
                                           '#include "src/k8s/sandbox_objects.h"\n'
                                           '#include "src/k8s/informer.h"\n',
            "src/k8s/sandbox_controller.cc": '#include "src/k8s/leader_election.h"\n',
            "src/k8s/client.cc": '#include "src/k8s/http.h"\n#include "src/common/clock.h"\n',
        })
        self.assertEqual(rc, 0, out)
        # The REST client builds without the allocator and knows no controller.
        rc, out = run({"src/k8s/informer.cc": '#include "src/allocator/allocator.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("the client room of src/k8s includes \"src/allocator/allocator.h\"", out)
        rc, out = run({"src/k8s/client.cc": '#include "src/k8s/sandbox_objects.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("of the sandbox_controller room (client may use: transports)", out)
        # The Sandbox controller does not reach the pools (nor the allocator through them).
        rc, out = run({"src/k8s/sandbox_controller.cc": '#include "src/k8s/kube_runtime.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("of the pools room", out)
        rc, out = run({"src/k8s/new_thing.cc": '#include "src/k8s/client.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("not in a room of src/k8s", out)

    def test_runtime_rooms(self):
        rc, out = run({
            "src/runtime/bubblewrap_runtime.h": '#pragma once\n#include "src/runtime/runtime.h"\n',
            "src/runtime/bubblewrap_runtime.cc": '#include "src/runtime/spawn.h"\n'
                                                 '#include "src/runtime/adoption.h"\n',
            "src/runtime/spawn.cc": '#include "src/runtime/reaper.h"\n'
                                    '#include "src/runtime/bubblewrap_runtime.h"\n',
            "src/runtime/seccomp_filter.cc": '#include <seccomp.h>\n',
            "src/cmd/wiring.cc": '#include "src/runtime/bubblewrap_runtime.h"\n',
        })
        self.assertEqual(rc, 0, out)
        # The bottom rooms know nothing above them: no cycle.
        rc, out = run({"src/runtime/local_sandbox.h": '#include "src/runtime/spawn.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn('includes "src/runtime/spawn.h" of the spawn room (it may use: proc)', out)
        rc, out = run({"src/runtime/reaper.cc": '#include "src/runtime/adoption.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("of the adoption room", out)
        # The public header stays the door: it sees no room.
        rc, out = run({"src/runtime/bubblewrap_runtime.h": '#include "src/runtime/proc.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("of the proc room (it may use: runtime)", out)
        # Outside src/runtime, even src/cmd sees only the public headers.
        rc, out = run({"src/cmd/wiring.cc": '#include "src/runtime/local_sandbox.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("a room of the local runtime", out)
        rc, out = run({"src/runtime/reaper.cc": '#include <seccomp.h>\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("seccomp.h may be used only in src/runtime/seccomp_filter.cc", out)
        rc, out = run({"src/runtime/new_room.cc": '#include "src/runtime/proc.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("not in a room of src/runtime", out)

    def test_cycle_inside_a_component_is_named(self):
        # A line of includes with no way back passes.
        rc, out = run({"src/sandboxd/exec.cc": '#include "src/sandboxd/exec.h"\n'
                                               '#include "src/sandboxd/spawn.h"\n',
                       "src/sandboxd/spawn.h": '#pragma once\n#include "src/sandboxd/child_reaper.h"\n',
                       "src/sandboxd/spawn.cc": '#include "src/sandboxd/spawn.h"\n#include <spawn.h>\n',
                       "src/sandboxd/child_reaper.cc": '#include "src/sandboxd/child_reaper.h"\n'})
        self.assertEqual(rc, 0, out)
        # By stem: spawn.cc reaching back to exec.h closes exec -> spawn -> exec, though no
        # header includes itself.
        rc, out = run({"src/sandboxd/exec.cc": '#include "src/sandboxd/exec.h"\n'
                                               '#include "src/sandboxd/spawn.h"\n',
                       "src/sandboxd/spawn.cc": '#include "src/sandboxd/spawn.h"\n'
                                                '#include "src/sandboxd/exec.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/sandboxd: include cycle exec -> spawn -> exec "
                      "(src/sandboxd/exec.cc:2 includes src/sandboxd/spawn.h; "
                      "src/sandboxd/spawn.cc:2 includes src/sandboxd/exec.h)", out)
        # A longer cycle is named in order, and the other stems caught in it are listed.
        rc, out = run({"src/common/a.h": '#pragma once\n#include "src/common/b.h"\n',
                       "src/common/b.cc": '#include "src/common/c.h"\n',
                       "src/common/c.h": '#pragma once\n#include "src/common/a.h"\n'
                                         '#include "src/common/d.h"\n',
                       "src/common/d.cc": '#include "src/common/c.h"\n',
                       "src/common/e.cc": '#include "src/common/a.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/common: include cycle a -> b -> c -> a (src/common/a.h:2 includes "
                      "src/common/b.h; src/common/b.cc:1 includes src/common/c.h; "
                      "src/common/c.h:2 includes src/common/a.h); also in it: d", out)
        self.assertNotIn("e ->", out)
        # The gateway's E2B room is a folder of its own: a cycle there names that folder.
        rc, out = run({"src/gateway/e2b/x.cc": '#include "src/gateway/e2b/y.h"\n',
                       "src/gateway/e2b/y.cc": '#include "src/gateway/e2b/x.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/gateway/e2b: include cycle x -> y -> x", out)
        # The back-arrow the issue found: a part of the allocator including the allocator.
        rc, out = run({"src/allocator/allocator_impl.h": '#pragma once\n'
                                                         '#include "src/allocator/allocator.h"\n'
                                                         '#include "src/allocator/ready_set.h"\n',
                       "src/allocator/allocator.cc": '#include "src/allocator/allocator_impl.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/allocator: include cycle allocator -> allocator_impl -> allocator", out)

    def test_known_cycles_may_not_grow(self):
        # The runtime's door cycle (check_layering.KNOWN_CYCLES) passes while it stays
        # among the stems it had...
        rc, out = run({"src/runtime/bubblewrap_runtime.cc": '#include "src/runtime/spawn.h"\n',
                       "src/runtime/spawn.h": '#pragma once\n'
                                              '#include "src/runtime/bubblewrap_runtime.h"\n'})
        self.assertEqual(rc, 0, out)
        # ...and fails when one more stem joins it.
        rc, out = run({"src/runtime/bubblewrap_runtime.cc": '#include "src/runtime/spawn.h"\n',
                       "src/runtime/spawn.h": '#pragma once\n#include "src/runtime/proc.h"\n',
                       "src/runtime/proc.cc": '#include "src/runtime/bubblewrap_runtime.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("src/runtime: include cycle bubblewrap_runtime -> spawn -> proc -> "
                      "bubblewrap_runtime", out)

    def test_server_may_not_use_store_or_runtime(self):
        rc, out = run({"src/server/a.cc": '#include "src/runtime/runtime.h"\n'})
        self.assertEqual(rc, 1, out)

    def test_src_may_not_include_tests(self):
        rc, out = run({"src/common/a.cc": '#include "tests/common/helper.h"\n'})
        self.assertEqual(rc, 1, out)

    def test_unknown_component_is_reported(self):
        rc, out = run({"src/newthing/a.cc": '#include "src/common/clock.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("not in the layering table", out)


if __name__ == "__main__":
    unittest.main()
