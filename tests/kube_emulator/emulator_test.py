"""Raw HTTP tests of kube-emulator.

Usage: python3 emulator_test.py KUBE_EMULATOR_BINARY PROJECT_SOURCE_DIR
"""
import json
import os
import re
import shutil
import ssl
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emu_harness import (Client, ConversionWebhook, Emulator, Watch, WEBHOOK_DNS,  # noqa: E402
                         ca_bundle, free_port, make_ca, make_serving_cert, make_tls,
                         wait_until, widget_conversion_crd)

BINARY = None
NS = "/api/v1/namespaces/default"
WIDGETS = "/apis/test.example.com/v1/namespaces/default/widgets"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.example.com"},
    "spec": {
        "group": "test.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                  "shortNames": ["wd"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {
                "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector"}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "string", "enum": ["S", "M", "L"]},
                        "replicas": {"type": "integer", "minimum": 0, "default": 1},
                        "color": {"type": "string", "default": "blue"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "extra": {"type": "object",
                                  "x-kubernetes-preserve-unknown-fields": True}}},
                    "status": {"type": "object", "properties": {
                        "replicas": {"type": "integer"}, "selector": {"type": "string"},
                        "phase": {"type": "string"}}}}}}}]}}


def pod(name, labels=None, **meta):
    m = {"name": name, "labels": labels or {}}
    m.update(meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m,
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def cm(name, labels=None, **meta):
    m = {"name": name, "labels": labels or {}}
    m.update(meta)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m, "data": {"k": "v"}}


def widget(name, size="S", **spec):
    s = {"size": size}
    s.update(spec)
    return {"apiVersion": "test.example.com/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": s}


class ApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.emu = Emulator(BINARY, "--pod_ready_delay_ms", "50", "--bookmark_interval_ms", "200",
                           "--seed", "7").__enter__()
        cls.c = cls.emu.client()
        r = cls.c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD)
        assert r.status == 201, r

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.emu.stop()

    # ------------------------------------------------------------ CRUD and errors
    def test_discovery(self):
        c = self.c
        v = c.get("/version").json
        self.assertTrue(v["gitVersion"].startswith("v1.32"))
        core = c.get("/api/v1").json
        names = {r["name"]: r for r in core["resources"]}
        self.assertIn("pods/status", names)
        self.assertTrue(names["pods"]["namespaced"])
        self.assertFalse(names["namespaces"]["namespaced"])
        groups = [g["name"] for g in c.get("/apis").json["groups"]]
        self.assertIn("coordination.k8s.io", groups)
        self.assertIn("test.example.com", groups)
        wl = {r["name"]: r for r in c.get("/apis/test.example.com/v1").json["resources"]}
        self.assertEqual(wl["widgets"]["shortNames"], ["wd"])
        self.assertEqual(wl["widgets/scale"]["kind"], "Scale")
        crd = c.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                    "widgets.test.example.com").json
        conds = {x["type"]: x["status"] for x in crd["status"]["conditions"]}
        self.assertEqual(conds, {"NamesAccepted": "True", "Established": "True"})

    def test_crud_and_error_bodies(self):
        c = self.c
        r = c.post(NS + "/pods", pod("crud-1", {"app": "crud"}))
        self.assertEqual(r.status, 201, r)
        meta = r.json["metadata"]
        self.assertTrue(meta["uid"])
        self.assertRegex(meta["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual(meta["generation"], 1)
        self.assertEqual(c.get(NS + "/pods/crud-1").json["metadata"]["uid"], meta["uid"])
        r = c.post(NS + "/pods", pod("crud-1"))
        self.assertEqual(r.status, 409)
        self.assertEqual(r.json["kind"], "Status")
        self.assertEqual(r.json["reason"], "AlreadyExists")
        self.assertEqual(r.json["message"], 'pods "crud-1" already exists')
        r = c.get(NS + "/pods/nope")
        self.assertEqual(r.status, 404)
        self.assertEqual(r.json["reason"], "NotFound")
        self.assertEqual(r.json["message"], 'pods "nope" not found')
        self.assertEqual(r.json["details"], {"name": "nope", "group": "", "kind": "pods"})
        r = c.post(NS + "/pods", pod("Bad_Name"))
        self.assertEqual(r.status, 422)
        self.assertEqual(r.json["reason"], "Invalid")
        self.assertEqual(r.json["details"]["causes"][0]["field"], "metadata.name")
        bad = pod("nocontainers")
        bad["spec"] = {}
        r = c.post(NS + "/pods", bad)
        self.assertEqual(r.status, 422)
        self.assertEqual(r.json["message"],
                         'Pod "nocontainers" is invalid: spec.containers: Required value')
        r = c.post("/api/v1/namespaces/missing/pods", pod("x"))
        self.assertEqual(r.status, 404)
        self.assertEqual(r.json["message"], 'namespaces "missing" not found')
        r = c.post(NS + "/configmaps", {"metadata": {"generateName": "gen-"}, "data": {}})
        self.assertEqual(r.status, 201)
        self.assertRegex(r.json["metadata"]["name"], r"^gen-[a-z0-9]{5}$")
        r = c.delete(NS + "/pods/crud-1")
        self.assertEqual(r.status, 200)
        self.assertTrue(wait_until(lambda: c.get(NS + "/pods/crud-1").status == 404))
        self.assertEqual(c.delete(NS + "/pods/crud-1").status, 404)
        self.assertEqual(c.get("/api/v1/nothing").status, 404)

    def test_builtin_kinds(self):
        c = self.c
        svc = c.post(NS + "/services", {"metadata": {"name": "svc-a"},
                                        "spec": {"ports": [{"port": 80}]}}).json
        self.assertRegex(svc["spec"]["clusterIP"], r"^10\.96\.")
        headless = c.post(NS + "/services", {"metadata": {"name": "svc-h"},
                                             "spec": {"clusterIP": "None"}}).json
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        pvc = c.post(NS + "/persistentvolumeclaims",
                     {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}})
        self.assertEqual(pvc.json["status"]["phase"], "Bound")
        for path, body in [
                ("/apis/coordination.k8s.io/v1/namespaces/default/leases",
                 {"metadata": {"name": "l1"}, "spec": {"holderIdentity": "me"}}),
                ("/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
                 {"metadata": {"name": "np"}, "spec": {"podSelector": {}}}),
                (NS + "/events", {"metadata": {"name": "ev1"}, "reason": "Test"})]:
            r = c.post(path, body)
            self.assertEqual(r.status, 201, (path, r))
        nodes = c.get("/api/v1/nodes").json["items"]
        self.assertEqual(len(nodes), 3)
        # Every kubelet sets the well-known os and arch labels (Go's GOARCH names).
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64")
        for n in nodes:
            self.assertEqual(n["metadata"]["labels"].get("kubernetes.io/os"), "linux", n)
            self.assertEqual(n["metadata"]["labels"].get("kubernetes.io/arch"), arch, n)

    def test_workload_rbac_and_pdb_kinds(self):
        c = self.c
        apps = "/apis/apps/v1/namespaces/default/statefulsets"
        sts = {"metadata": {"name": "db"}, "spec": {
            "selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
            "template": {"metadata": {"labels": {"app": "db", "x": "y"}},
                         "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}
        r = c.post(apps, sts)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["spec"]["replicas"], 1)  # defaulted like the API server
        s = c.get(apps + "/db/scale").json
        self.assertEqual(s["spec"]["replicas"], 1)
        self.assertEqual(s["status"]["selector"], "app=db")
        self.assertEqual(c.patch(apps + "/db/scale", {"spec": {"replicas": 3}}).status, 200)
        self.assertEqual(c.get(apps + "/db").json["spec"]["replicas"], 3)
        self.assertEqual(c.patch(apps + "/db/status", {"status": {"replicas": 3}}).status, 200)
        # The selector must select the template's labels, and is immutable.
        bad = json.loads(json.dumps(sts))
        bad["metadata"]["name"] = "db2"
        bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
        r = c.post(apps, bad)
        self.assertEqual(r.status, 422, r)
        self.assertIn("`selector` does not match template `labels`", r.json["message"])
        r = c.patch(apps + "/db", {"spec": {"selector": {"matchLabels": {"x": "y"}}}})
        self.assertEqual(r.status, 422, r)
        self.assertIn("Forbidden: updates to statefulset spec", r.json["message"])
        del bad["spec"]["template"]["spec"]["containers"][0]["image"]
        bad["spec"]["template"]["metadata"]["labels"] = {"app": "db"}
        r = c.post(apps, bad)
        self.assertEqual(r.status, 422, r)
        self.assertEqual(r.json["details"]["causes"][0]["field"],
                         "spec.template.spec.containers[0].image")
        self.assertIn("statefulsets/scale",
                      {x["name"] for x in c.get("/apis/apps/v1").json["resources"]})

        rbac = "/apis/rbac.authorization.k8s.io/v1"
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
        self.assertEqual(c.post(rbac + "/namespaces/default/roles",
                                {"metadata": {"name": "r"}, "rules": [rule]}).status, 201)
        r = c.post(rbac + "/namespaces/default/roles",
                   {"metadata": {"name": "r2"}, "rules": [{"nonResourceURLs": ["/x"],
                                                          "verbs": ["get"]}]})
        self.assertEqual(r.status, 422, r)
        self.assertIn("namespaced rules cannot apply to non-resource URLs", r.json["message"])
        r = c.post(rbac + "/clusterroles", {"metadata": {"name": "cr"}, "rules": [
            rule, {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
        self.assertEqual(r.status, 201, r)
        self.assertFalse(r.json["metadata"].get("namespace"))
        r = c.post(rbac + "/clusterroles", {"metadata": {"name": "cr2"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"]}]})
        self.assertEqual(r.status, 422, r)
        self.assertEqual(r.json["details"]["causes"][0]["field"], "rules[0].verbs")
        sa = {"kind": "ServiceAccount", "name": "sa", "namespace": "default"}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"}
        self.assertEqual(c.post(rbac + "/namespaces/default/rolebindings",
                                {"metadata": {"name": "rb"}, "roleRef": ref,
                                 "subjects": [sa]}).status, 201)
        r = c.patch(rbac + "/namespaces/default/rolebindings/rb",
                    {"roleRef": dict(ref, name="other")})
        self.assertEqual(r.status, 422, r)
        self.assertIn("cannot change roleRef", r.json["message"])
        r = c.post(rbac + "/clusterrolebindings", {"metadata": {"name": "crb"}, "roleRef": ref,
                                                   "subjects": [dict(sa, namespace="")]})
        self.assertEqual(r.status, 422, r)
        fields = {x["field"] for x in r.json["details"]["causes"]}
        self.assertEqual(fields, {"roleRef.kind", "subjects[0].namespace"})
        self.assertEqual(c.post(rbac + "/clusterrolebindings", {
            "metadata": {"name": "crb"}, "roleRef": dict(ref, kind="ClusterRole", name="cr"),
            "subjects": [sa]}).status, 201)

        pdbs = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
        self.assertEqual(c.post(pdbs, {"metadata": {"name": "p"}, "spec": {
            "maxUnavailable": 1, "selector": {"matchLabels": {"app": "db"}}}}).status, 201)
        r = c.post(pdbs, {"metadata": {"name": "p2"}, "spec": {"maxUnavailable": 1,
                                                               "minAvailable": "50%"}})
        self.assertEqual(r.status, 422, r)
        self.assertEqual(c.patch(pdbs + "/p/status",
                                 {"status": {"currentHealthy": 0}}).status, 200)

    def test_request_log(self):
        c = self.c
        c.post("/emulator/stats/reset", {})
        ua = {"User-Agent": "sbx/test-log"}
        c.post(NS + "/configmaps", cm("log-1"), headers=ua)
        c.get(NS + "/configmaps/log-1", headers=ua)
        c.get(NS + "/configmaps?labelSelector=a%3Db", headers=ua)
        c.get("/api/v1/pods?watch=true&timeoutSeconds=1", headers=ua)
        c.patch(NS + "/pods/nope/status", {"status": {}}, headers=ua)
        c.put(WIDGETS + "/nope/scale", {"spec": {"replicas": 1}}, headers=ua)
        c.delete(NS + "/configmaps/log-1", headers=ua)
        c.delete(NS + "/configmaps?labelSelector=nothing%3Dhere", headers=ua)
        c.get("/apis/unknown.example.com/v1/namespaces/x/things/t", headers=ua)
        c.get("/api/v1/namespaces/default", headers=ua)
        c.get("/version", headers=ua)
        c.get(NS + "/configmaps")  # another client
        log = c.get("/emulator/requests").json
        mine = c.get("/emulator/requests?user_agent=sbx/").json
        self.assertEqual(len(log), len(mine) + 1)
        self.assertTrue(all(r["user_agent"] == "sbx/test-log" for r in mine))
        got = [(r["verb"], r["group"], r["resource"], r["subresource"], r["namespace"],
                r["name"]) for r in mine]
        self.assertEqual(got, [
            ("create", "", "configmaps", "", "default", ""),
            ("get", "", "configmaps", "", "default", "log-1"),
            ("list", "", "configmaps", "", "default", ""),
            ("watch", "", "pods", "", "", ""),
            ("patch", "", "pods", "status", "default", "nope"),
            ("update", "test.example.com", "widgets", "scale", "default", "nope"),
            ("delete", "", "configmaps", "", "default", "log-1"),
            ("deletecollection", "", "configmaps", "", "default", ""),
            ("get", "unknown.example.com", "things", "", "x", "t"),
            ("get", "", "namespaces", "", "default", "default"),
            ("get", "", "", "", "", ""),
        ])
        self.assertEqual(mine[-1]["path"], "/version")
        self.assertEqual(mine[0]["version"], "v1")
        self.assertEqual(c.post("/emulator/stats/reset", {}).status, 200)
        self.assertEqual(c.get("/emulator/requests").json, [])

    def test_generation_and_stale_update(self):
        c = self.c
        r = c.post(WIDGETS, widget("gen-1", junk="dropped", extra={"free": {"x": 1}}))
        self.assertEqual(r.status, 201, r)
        w = r.json
        self.assertEqual(w["metadata"]["generation"], 1)
        self.assertEqual(w["spec"]["replicas"], 1)  # defaulted
        self.assertEqual(w["spec"]["color"], "blue")
        self.assertNotIn("junk", w["spec"])  # pruned
        self.assertEqual(w["spec"]["extra"], {"free": {"x": 1}})  # preserved
        stale = json.loads(json.dumps(w))
        w["spec"]["size"] = "M"
        r = c.put(WIDGETS + "/gen-1", w)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["metadata"]["generation"], 2)
        self.assertNotEqual(r.json["metadata"]["resourceVersion"], stale["metadata"]["resourceVersion"])
        # Label-only change: no generation bump.
        w2 = r.json
        w2["metadata"]["labels"] = {"a": "b"}
        r = c.put(WIDGETS + "/gen-1", w2)
        self.assertEqual(r.json["metadata"]["generation"], 2)
        stale["spec"]["size"] = "L"
        r = c.put(WIDGETS + "/gen-1", stale)
        self.assertEqual(r.status, 409)
        self.assertEqual(r.json["reason"], "Conflict")
        self.assertIn("the object has been modified; please apply your changes to the latest "
                      "version and try again", r.json["message"])
        del stale["metadata"]["resourceVersion"]
        r = c.put(WIDGETS + "/gen-1", stale)
        self.assertEqual(r.status, 422)
        r = c.post(WIDGETS, widget("bad-size", size="XXL"))
        self.assertEqual(r.status, 422)
        self.assertIn('spec.size: Unsupported value: "XXL"', r.json["message"])
        r = c.post(WIDGETS, {"apiVersion": "test.example.com/v1", "kind": "Widget",
                             "metadata": {"name": "no-size"}, "spec": {"replicas": -1}})
        self.assertEqual(r.status, 422)
        fields = sorted(x["field"] for x in r.json["details"]["causes"])
        self.assertEqual(fields, ["spec.replicas", "spec.size"])

    # ------------------------------------------------------------ list
    def test_pagination_and_expired_continue(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "pages"}})
        for i in range(25):
            self.assertEqual(c.post("/api/v1/namespaces/pages/configmaps",
                                    cm("cm-%02d" % i)).status, 201)
        names = []
        r = c.get("/api/v1/namespaces/pages/configmaps?limit=10").json
        self.assertEqual(r["metadata"]["remainingItemCount"], 15)
        names += [x["metadata"]["name"] for x in r["items"]]
        while r["metadata"].get("continue"):
            r = c.get("/api/v1/namespaces/pages/configmaps?limit=10&continue=" +
                      r["metadata"]["continue"]).json
            names += [x["metadata"]["name"] for x in r["items"]]
        self.assertEqual(names, ["cm-%02d" % i for i in range(25)])
        r = c.get("/api/v1/namespaces/pages/configmaps?limit=10").json
        token = r["metadata"]["continue"]
        c.post(NS + "/configmaps", cm("after-page"))
        self.assertEqual(c.post("/emulator/compact", {}).status, 200)
        r = c.get("/api/v1/namespaces/pages/configmaps?limit=10&continue=" + token)
        self.assertEqual(r.status, 410)
        self.assertEqual(r.json["reason"], "Expired")
        # All-namespaces list sees both namespaces.
        all_cms = c.get("/api/v1/configmaps").json["items"]
        self.assertTrue({x["metadata"]["namespace"] for x in all_cms} >= {"pages", "default"})

    def test_label_and_field_selectors(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "sel"}})
        base = "/api/v1/namespaces/sel/configmaps"
        for name, labels in [("a", {"app": "x", "tier": "web"}), ("b", {"app": "x", "tier": "db"}),
                             ("c", {"app": "y"}), ("d", {})]:
            c.post(base, cm(name, labels))

        def names(q):
            r = c.get(base + "?" + q)
            self.assertEqual(r.status, 200, r)
            return sorted(x["metadata"]["name"] for x in r.json["items"])
        self.assertEqual(names("labelSelector=app%3Dx"), ["a", "b"])
        self.assertEqual(names("labelSelector=app%3D%3Dx,tier!%3Ddb"), ["a"])
        self.assertEqual(names("labelSelector=tier+in+(web,db)"), ["a", "b"])
        self.assertEqual(names("labelSelector=app+notin+(x)"), ["c", "d"])
        self.assertEqual(names("labelSelector=tier"), ["a", "b"])
        self.assertEqual(names("labelSelector=!app"), ["d"])
        self.assertEqual(names("fieldSelector=metadata.name%3Dc"), ["c"])
        self.assertEqual(names("fieldSelector=metadata.name!%3Dc"), ["a", "b", "d"])
        self.assertEqual(names("fieldSelector=metadata.namespace%3Dsel&labelSelector=app%3Dy"),
                         ["c"])
        self.assertEqual(c.get(base + "?labelSelector=a+in+b)").status, 400)
        c.post("/api/v1/namespaces/sel/pods", pod("p-sel"))
        wait_until(lambda: c.get("/api/v1/namespaces/sel/pods/p-sel").json["status"]["phase"]
                   == "Running")
        r = c.get("/api/v1/pods?fieldSelector=status.phase%3DRunning,metadata.namespace%3Dsel")
        self.assertEqual([x["metadata"]["name"] for x in r.json["items"]], ["p-sel"])
        r = c.get("/api/v1/pods?fieldSelector=spec.nodeName%3Demu-node-999")
        self.assertEqual(r.json["items"], [])

    # ------------------------------------------------------------ watch
    def test_watch_order_and_resume(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "w1"}})
        base = "/api/v1/namespaces/w1/configmaps"
        rv0 = c.get(base).json["metadata"]["resourceVersion"]
        w = Watch(self.emu, base + "?watch=true&resourceVersion=" + rv0)
        try:
            c.post(base, cm("one"))
            obj = c.get(base + "/one").json
            obj["data"] = {"k": "v2"}
            c.put(base + "/one", obj)
            c.delete(base + "/one")
            self.assertTrue(w.wait_for(lambda ev: len(ev) >= 3), w.events)
            self.assertEqual([e["type"] for e in w.events[:3]], ["ADDED", "MODIFIED", "DELETED"])
            rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in w.events[:3]]
            self.assertEqual(rvs, sorted(rvs))
            self.assertEqual(w.events[1]["object"]["data"], {"k": "v2"})
        finally:
            w.close()
        # Resume from the ADDED event's resourceVersion: MODIFIED then DELETED.
        w2 = Watch(self.emu, base + "?watch=1&resourceVersion=%d" % rvs[0])
        try:
            self.assertTrue(w2.wait_for(lambda ev: len(ev) >= 2))
            self.assertEqual([e["type"] for e in w2.events[:2]], ["MODIFIED", "DELETED"])
        finally:
            w2.close()
        # resourceVersion unset: synthetic ADDED for current objects.
        c.post(base, cm("two"))
        w3 = Watch(self.emu, base + "?watch=true")
        try:
            self.assertTrue(w3.wait_for(lambda ev: len(ev) >= 1))
            self.assertEqual(w3.events[0]["type"], "ADDED")
            self.assertEqual(w3.events[0]["object"]["metadata"]["name"], "two")
        finally:
            w3.close()
        # After compaction an old resourceVersion gets one 410 ERROR event and the end.
        c.post("/emulator/compact", {})
        w4 = Watch(self.emu, base + "?watch=true&resourceVersion=%d" % rvs[0])
        self.assertTrue(w4.wait_end())
        self.assertEqual(len(w4.events), 1)
        self.assertEqual(w4.events[0]["type"], "ERROR")
        self.assertEqual(w4.events[0]["object"]["code"], 410)
        self.assertEqual(w4.events[0]["object"]["reason"], "Expired")
        self.assertIn("too old resource version: %d" % rvs[0], w4.events[0]["object"]["message"])
        w4.close()

    def test_boolean_parameters_read_as_the_api_server_reads_them(self):
        # Python's kubernetes client sends watch=True; the API server parses booleans with
        # Go's strconv.ParseBool, so True, t and 1 start a watch, and a value it cannot
        # parse is refused instead of serving a list.
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "bools"}})
        base = "/api/v1/namespaces/bools/configmaps"
        c.post(base, cm("one"))
        for value in ("True", "t", "1", "TRUE"):
            w = Watch(self.emu, base + "?watch=%s&allowWatchBookmarks=True" % value)
            try:
                self.assertTrue(w.wait_for(lambda ev: len(ev) >= 1), value)
                self.assertEqual(w.events[0]["type"], "ADDED", value)
            finally:
                w.close()
        for value in ("False", "0", "f"):
            r = c.get(base + "?watch=" + value)
            self.assertEqual(r.status, 200, value)
            self.assertEqual(r.json["kind"], "ConfigMapList", value)
        r = c.get(base + "?watch=yes")
        self.assertEqual(r.status, 400, r.json)
        self.assertIn('"yes" of query parameter watch', r.json["message"])

    def test_watch_selector_transitions_bookmarks_timeout(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "w2"}})
        base = "/api/v1/namespaces/w2/configmaps"
        w = Watch(self.emu, base + "?watch=true&labelSelector=app%3Dx&allowWatchBookmarks=true"
                  "&timeoutSeconds=2")
        try:
            obj = c.post(base, cm("m", {"app": "x"})).json
            c.post(base, cm("other", {"app": "y"}))
            obj["metadata"]["labels"] = {"app": "y"}
            c.put(base + "/m", obj)
            self.assertTrue(w.wait_for(
                lambda ev: [e["type"] for e in ev if e["type"] != "BOOKMARK"] == ["ADDED", "DELETED"]),
                w.events)
            self.assertTrue(w.wait_for(lambda ev: any(e["type"] == "BOOKMARK" for e in ev)))
            bm = [e for e in w.events if e["type"] == "BOOKMARK"][0]["object"]
            self.assertEqual(set(bm), {"kind", "apiVersion", "metadata"})
            self.assertEqual(set(bm["metadata"]), {"resourceVersion"})
            self.assertEqual(bm["kind"], "ConfigMap")
            # timeoutSeconds=2 ends the stream cleanly.
            self.assertTrue(w.wait_end(timeout=5))
            self.assertTrue(w.ended)
            self.assertFalse(any(e["object"]["metadata"].get("name") == "other"
                                 for e in w.events if e["type"] != "BOOKMARK"))
        finally:
            w.close()
        # kubectl wait's form: a field selector on one name.
        w = Watch(self.emu, base + "?fieldSelector=metadata.name%3Dm&watch=true")
        try:
            self.assertTrue(w.wait_for(lambda ev: len(ev) == 1))
            self.assertEqual(w.events[0]["object"]["metadata"]["name"], "m")
        finally:
            w.close()
        stats = wait_until(lambda: c.get("/emulator/stats").json["watches_active"] == 0, timeout=5)
        self.assertTrue(stats)

    # ------------------------------------------------------------ patch and subresources
    def test_patch_kinds(self):
        c = self.c
        p = c.post(NS + "/pods", {"metadata": {"name": "patchme"}, "spec": {"containers": [
            {"name": "a", "image": "img-a", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "img-b"}]}}).json
        r = c.patch(NS + "/pods/patchme", {"metadata": {"labels": {"l": "1"}}})
        self.assertEqual(r.json["metadata"]["labels"], {"l": "1"})
        r = c.patch(NS + "/pods/patchme", {"metadata": {"labels": {"l": None, "m": "2"}}})
        self.assertEqual(r.json["metadata"]["labels"], {"m": "2"})
        r = c.patch(NS + "/pods/patchme", {"spec": {"$setElementOrder/containers": [
            {"name": "a"}, {"name": "b"}], "containers": [
            {"name": "a", "image": "img-a2", "env": [{"name": "Y", "value": "2"}]}]}},
            ctype="application/strategic-merge-patch+json")
        self.assertEqual(r.status, 200, r)
        cs = {x["name"]: x for x in r.json["spec"]["containers"]}
        self.assertEqual(cs["a"]["image"], "img-a2")
        self.assertEqual(cs["b"]["image"], "img-b")
        self.assertEqual([e["name"] for e in cs["a"]["env"]], ["X", "Y"])
        r = c.patch(NS + "/pods/patchme", {"spec": {"containers": [
            {"name": "b", "$patch": "delete"}]}}, ctype="application/strategic-merge-patch+json")
        self.assertEqual([x["name"] for x in r.json["spec"]["containers"]], ["a"])
        ops = [{"op": "test", "path": "/metadata/labels/m", "value": "2"},
               {"op": "add", "path": "/metadata/labels/n", "value": "3"}]
        r = c.patch(NS + "/pods/patchme", ops, ctype="application/json-patch+json")
        self.assertEqual(r.json["metadata"]["labels"], {"m": "2", "n": "3"})
        ops = [{"op": "test", "path": "/metadata/labels/m", "value": "wrong"},
               {"op": "remove", "path": "/metadata/labels/n"}]
        r = c.patch(NS + "/pods/patchme", ops, ctype="application/json-patch+json")
        self.assertEqual(r.status, 422, r)
        self.assertIn("n", c.get(NS + "/pods/patchme").json["metadata"]["labels"])
        c.post(WIDGETS, widget("pw"))
        r = c.patch(WIDGETS + "/pw", {"spec": {"size": "L"}},
                    ctype="application/strategic-merge-patch+json")
        self.assertEqual(r.status, 415)
        self.assertEqual(r.json["reason"], "UnsupportedMediaType")
        r = c.patch(WIDGETS + "/pw", {"spec": {"size": "L"}})
        self.assertEqual(r.json["spec"]["size"], "L")
        self.assertEqual(r.json["metadata"]["generation"], 2)
        r = c.patch(WIDGETS + "/pw", {"spec": {"size": "nope"}})
        self.assertEqual(r.status, 422)
        self.assertEqual(c.patch(NS + "/pods/ghost", {}).status, 404)
        # A stale resourceVersion inside a patch is a conflict.
        r = c.patch(WIDGETS + "/pw", {"metadata": {"resourceVersion": "1"}, "spec": {"size": "M"}})
        self.assertEqual(r.status, 409)
        del p

    def test_status_subresource_isolation(self):
        c = self.c
        w = c.post(WIDGETS, widget("st")).json
        self.assertNotIn("status", w)
        w["status"] = {"phase": "Hacked"}
        w["spec"]["size"] = "M"
        r = c.put(WIDGETS + "/st", w).json
        self.assertNotIn("status", r)  # status ignored on the main resource
        self.assertEqual(r["spec"]["size"], "M")
        r["status"] = {"phase": "Ready", "replicas": 2}
        r["spec"]["size"] = "L"
        s = c.put(WIDGETS + "/st/status", r)
        self.assertEqual(s.status, 200, s)
        self.assertEqual(s.json["status"]["phase"], "Ready")
        self.assertEqual(s.json["spec"]["size"], "M")  # spec ignored on /status
        s = c.patch(WIDGETS + "/st/status", {"status": {"phase": "Done"}, "spec": {"size": "S"}})
        self.assertEqual(s.json["status"]["phase"], "Done")
        self.assertEqual(s.json["spec"]["size"], "M")
        self.assertEqual(s.json["metadata"]["generation"], 2)
        s = c.patch(WIDGETS + "/st", {"status": {"phase": "X"}})
        self.assertEqual(s.json["status"]["phase"], "Done")
        # Pods too.
        c.post(NS + "/pods", pod("st-pod"))
        r = c.patch(NS + "/pods/st-pod/status", {"status": {"message": "hello"}})
        self.assertEqual(r.json["status"]["message"], "hello")

    def test_scale_subresource(self):
        c = self.c
        c.post(WIDGETS, widget("sc", replicas=2))
        c.patch(WIDGETS + "/sc/status", {"status": {"replicas": 2, "selector": "app=sc"}})
        s = c.get(WIDGETS + "/sc/scale").json
        self.assertEqual(s["kind"], "Scale")
        self.assertEqual(s["apiVersion"], "autoscaling/v1")
        self.assertEqual(s["spec"]["replicas"], 2)
        self.assertEqual(s["status"], {"replicas": 2, "selector": "app=sc"})
        r = c.patch(WIDGETS + "/sc/scale", {"spec": {"replicas": 5}})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["spec"]["replicas"], 5)
        w = c.get(WIDGETS + "/sc").json
        self.assertEqual(w["spec"]["replicas"], 5)
        self.assertEqual(w["metadata"]["generation"], 2)
        s = c.get(WIDGETS + "/sc/scale").json
        s["spec"]["replicas"] = 1
        self.assertEqual(c.put(WIDGETS + "/sc/scale", s).json["spec"]["replicas"], 1)
        s["spec"]["replicas"] = 3  # stale resourceVersion
        self.assertEqual(c.put(WIDGETS + "/sc/scale", s).status, 409)
        self.assertEqual(c.patch(WIDGETS + "/sc/scale", {"spec": {"replicas": -1}}).status, 422)

    # ------------------------------------------------------------ deletion
    def test_finalizers(self):
        c = self.c
        c.post(NS + "/configmaps", cm("fin", finalizers=["test.example.com/hold"]))
        r = c.delete(NS + "/configmaps/fin")
        self.assertEqual(r.status, 200)
        obj = c.get(NS + "/configmaps/fin")
        self.assertEqual(obj.status, 200)
        self.assertIn("deletionTimestamp", obj.json["metadata"])
        r = c.patch(NS + "/configmaps/fin", {"metadata": {"finalizers": None}})
        self.assertEqual(r.status, 200)
        self.assertEqual(c.get(NS + "/configmaps/fin").status, 404)
        c.post(NS + "/configmaps", cm("pre"))
        r = c.delete(NS + "/configmaps/pre", {"kind": "DeleteOptions", "apiVersion": "v1",
                                              "preconditions": {"uid": "not-the-uid"}})
        self.assertEqual(r.status, 409)
        r = c.delete(NS + "/configmaps/pre", {"preconditions": {"resourceVersion": "1"}})
        self.assertEqual(r.status, 409)
        r = c.delete(NS + "/configmaps/pre?gracePeriodSeconds=0")
        self.assertEqual(r.status, 200)

    def _owned(self, name, owner, block=False, **meta):
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"],
               "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block}
        return cm(name, ownerReferences=[ref], **meta)

    def test_gc_background_foreground_orphan(self):
        c = self.c
        base = NS + "/configmaps"
        # Background: dependents of a deleted owner go away.
        owner = c.post(base, cm("bg-owner")).json
        c.post(base, self._owned("bg-dep", owner))
        c.delete(base + "/bg-owner")
        self.assertTrue(wait_until(lambda: c.get(base + "/bg-dep").status == 404))
        # Orphan: dependents stay, without the owner reference.
        owner = c.post(base, cm("or-owner")).json
        c.post(base, self._owned("or-dep", owner))
        c.delete(base + "/or-owner?propagationPolicy=Orphan")
        time.sleep(0.1)
        dep = c.get(base + "/or-dep")
        self.assertEqual(dep.status, 200)
        self.assertNotIn("ownerReferences", dep.json["metadata"])
        # Foreground: the owner waits (finalizer + deletionTimestamp) for its dependents.
        owner = c.post(base, cm("fg-owner")).json
        c.post(base, self._owned("fg-dep", owner, block=True,
                                 finalizers=["test.example.com/hold"]))
        r = c.delete(base + "/fg-owner", {"propagationPolicy": "Foreground"})
        self.assertEqual(r.status, 200)
        time.sleep(0.1)
        o = c.get(base + "/fg-owner").json
        self.assertIn("foregroundDeletion", o["metadata"]["finalizers"])
        self.assertIn("deletionTimestamp", o["metadata"])
        self.assertIn("deletionTimestamp", c.get(base + "/fg-dep").json["metadata"])
        c.patch(base + "/fg-dep", {"metadata": {"finalizers": None}})
        self.assertTrue(wait_until(lambda: c.get(base + "/fg-owner").status == 404))
        self.assertEqual(c.get(base + "/fg-dep").status, 404)

    def test_namespace_and_crd_cascade(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "doomed"}})
        c.post("/api/v1/namespaces/doomed/configmaps", cm("x"))
        self.assertEqual(c.delete("/api/v1/namespaces/doomed").status, 200)
        self.assertTrue(wait_until(lambda: c.get("/api/v1/namespaces/doomed").status == 404))
        self.assertEqual(c.get("/api/v1/namespaces/doomed/configmaps/x").status, 404)
        crd = json.loads(json.dumps(WIDGET_CRD).replace("widget", "gadget").replace("Widget", "Gadget"))
        self.assertEqual(c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                crd).status, 201)
        gadgets = "/apis/test.example.com/v1/namespaces/default/gadgets"
        r = c.post(gadgets, {"apiVersion": "test.example.com/v1", "kind": "Gadget",
                             "metadata": {"name": "g"}, "spec": {"size": "S"}})
        self.assertEqual(r.status, 201, r)
        c.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                 "gadgets.test.example.com")
        self.assertEqual(c.get(gadgets).status, 404)

    def test_deletecollection(self):
        c = self.c
        c.post("/api/v1/namespaces", {"metadata": {"name": "dc"}})
        base = "/api/v1/namespaces/dc/configmaps"
        for i in range(5):
            c.post(base, cm("c%d" % i, {"grp": "a" if i < 3 else "b"}))
        r = c.delete(base + "?labelSelector=grp%3Da")
        self.assertEqual(r.status, 200)
        self.assertEqual(sorted(x["metadata"]["name"] for x in c.get(base).json["items"]),
                         ["c3", "c4"])

    def test_dangling_owner_collected(self):
        c = self.c
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "no-such-uid"}
        c.post(NS + "/configmaps", cm("dangling", ownerReferences=[ref]))
        self.assertTrue(wait_until(lambda: c.get(NS + "/configmaps/dangling").status == 404))

    def test_server_side_apply_and_field_validation(self):
        c = self.c
        body = widget("ssa", extra={"a": 1})
        path = WIDGETS + "/ssa"
        r = c.patch(path, body, ctype="application/apply-patch+yaml")
        self.assertEqual(r.status, 422)
        self.assertIn("fieldManager", r.json["message"])
        r = c.patch(path + "?fieldManager=test", body, ctype="application/apply-patch+yaml")
        self.assertEqual(r.status, 201, r)
        body["spec"]["size"] = "L"
        r = c.patch(path + "?fieldManager=test", body, ctype="application/apply-patch+yaml")
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json["spec"]["size"], r.json["metadata"]["generation"]), ("L", 2))
        yaml_body = ("apiVersion: test.example.com/v1\nkind: Widget\nmetadata:\n  name: ssa\n"
                     "spec:\n  size: M\n  tags: [a, b]\n")
        r = c.patch(path + "?fieldManager=test", yaml_body, ctype="application/apply-patch+yaml")
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json["spec"]["size"], r.json["spec"]["tags"]), ("M", ["a", "b"]))
        r = c.post(WIDGETS, "apiVersion: test.example.com/v1\nkind: Widget\n"
                   "metadata: {name: from-yaml}\nspec: {size: S, replicas: 3}\n",
                   ctype="application/yaml")
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["spec"]["replicas"], 3)
        typo = widget("strict")
        typo["spec"]["colour"] = "red"
        r = c.post(WIDGETS + "?fieldValidation=Strict", typo)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json["message"], 'Widget in version "v1" cannot be handled as a Widget: '
                         'strict decoding error: unknown field "spec.colour"')
        r = c.post(WIDGETS + "?fieldValidation=Warn", typo)
        self.assertEqual(r.status, 201)
        self.assertIn('unknown field \\"spec.colour\\"', r.headers.get("Warning", ""))
        self.assertNotIn("colour", r.json["spec"])

    # ------------------------------------------------------------ kubelet
    def test_scheduler_honours_node_selector(self):
        c = self.c
        body = pod("sched-1")
        body["spec"]["nodeSelector"] = {"example.com/accelerator": "tpu"}
        self.assertEqual(c.post(NS + "/pods", body).status, 201)

        def condition(name):
            p = c.get(NS + "/pods/" + name).json
            return p, {x["type"]: x for x in p["status"].get("conditions", [])}
        self.assertTrue(wait_until(lambda: condition("sched-1")[1].get("PodScheduled")))
        p, conds = condition("sched-1")
        self.assertEqual(conds["PodScheduled"]["status"], "False")
        self.assertEqual(conds["PodScheduled"]["reason"], "Unschedulable")
        self.assertIn("didn't match Pod's node affinity/selector", conds["PodScheduled"]["message"])
        self.assertEqual(p["status"]["phase"], "Pending")
        self.assertNotIn("nodeName", p["spec"])
        time.sleep(1.2)  # retried, still unschedulable, written once
        self.assertEqual(condition("sched-1")[0]["metadata"]["resourceVersion"],
                         p["metadata"]["resourceVersion"])
        # A node gets the label: the pod is bound to it, PodScheduled turns True before
        # the kubelet starts it (slowed down here to see the step).
        c.post("/emulator/kubelet", {"ready_delay_ms": 3000})
        try:
            r = c.patch("/api/v1/nodes/emu-node-2",
                        {"metadata": {"labels": {"example.com/accelerator": "tpu"}}})
            self.assertEqual(r.status, 200)
            self.assertTrue(wait_until(
                lambda: condition("sched-1")[1]["PodScheduled"]["status"] == "True", timeout=2))
            p, conds = condition("sched-1")
            self.assertEqual(p["status"]["phase"], "Pending")  # bound, not started yet
            self.assertEqual(p["spec"]["nodeName"], "emu-node-2")
            self.assertNotIn("reason", conds["PodScheduled"])
        finally:
            c.post("/emulator/kubelet", {"ready_delay_ms": 50})
            c.patch("/api/v1/nodes/emu-node-2",
                    {"metadata": {"labels": {"example.com/accelerator": None}}})
        self.assertTrue(wait_until(
            lambda: condition("sched-1")[0]["status"]["phase"] == "Running", timeout=10))

    def test_kubelet_ready_and_fail(self):
        c = self.c
        c.post(NS + "/pods", pod("kb-1"))
        c.post(NS + "/pods", pod("kb-2"))

        def ready(name):
            p = c.get(NS + "/pods/" + name).json
            conds = {x["type"]: x["status"] for x in p["status"].get("conditions", [])}
            return p if p["status"]["phase"] == "Running" and conds.get("Ready") == "True" else None
        p1 = wait_until(lambda: ready("kb-1"))
        p2 = wait_until(lambda: ready("kb-2"))
        self.assertTrue(p1 and p2)
        self.assertRegex(p1["status"]["podIP"], r"^10\.\d+\.\d+\.\d+$")
        self.assertNotEqual(p1["status"]["podIP"], p2["status"]["podIP"])
        self.assertEqual(p1["status"]["podIPs"], [{"ip": p1["status"]["podIP"]}])
        self.assertTrue(p1["spec"]["nodeName"].startswith("emu-node-"))
        self.assertTrue(p1["status"]["hostIP"])
        conds = {x["type"]: x["status"] for x in p1["status"]["conditions"]}
        for t in ("Initialized", "ContainersReady", "Ready", "PodScheduled"):
            self.assertEqual(conds[t], "True")
        cs = p1["status"]["containerStatuses"][0]
        self.assertTrue(cs["ready"] and cs["started"] and "running" in cs["state"])
        r = c.post("/emulator/pods/fail", {"namespace": "default", "name": "kb-2",
                                           "reason": "OOMKilled"})
        self.assertEqual(r.status, 200)
        p = c.get(NS + "/pods/kb-2").json
        self.assertEqual(p["status"]["phase"], "Failed")
        conds = {x["type"]: x["status"] for x in p["status"]["conditions"]}
        self.assertEqual(conds["Ready"], "False")
        self.assertEqual(p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
                         "OOMKilled")
        # Every kubelet step is its own watch event.
        rv = c.get(NS + "/pods").json["metadata"]["resourceVersion"]
        w = Watch(self.emu, NS + "/pods?watch=true&resourceVersion=" + rv +
                  "&fieldSelector=metadata.name%3Dkb-3")
        try:
            c.post(NS + "/pods", pod("kb-3"))
            self.assertTrue(w.wait_for(lambda ev: any(
                e["object"]["status"].get("phase") == "Running" for e in ev)))
            self.assertEqual([e["type"] for e in w.events], ["ADDED", "MODIFIED", "MODIFIED"])
        finally:
            w.close()
        # A bound pod terminates gracefully: deletionTimestamp first, gone after the kubelet delay.
        r = c.delete(NS + "/pods/kb-1")
        self.assertEqual(r.status, 200)
        self.assertIn("deletionTimestamp", r.json["metadata"])
        self.assertEqual(r.json["metadata"]["deletionGracePeriodSeconds"], 30)
        self.assertTrue(wait_until(lambda: c.get(NS + "/pods/kb-1").status == 404))
        r = c.delete(NS + "/pods/kb-2?gracePeriodSeconds=0")
        self.assertEqual(c.get(NS + "/pods/kb-2").status, 404)
        # fail_rate=1 makes new pods fail instead of starting.
        c.post("/emulator/kubelet", {"fail_rate": 1.0})
        try:
            c.post(NS + "/pods", pod("kb-4"))
            self.assertTrue(wait_until(
                lambda: c.get(NS + "/pods/kb-4").json["status"]["phase"] == "Failed"))
        finally:
            c.post("/emulator/kubelet", {"fail_rate": 0})


class FaultTest(unittest.TestCase):
    def test_error_rate_retry_after_and_stats(self):
        with Emulator(BINARY, "--error_rate", "429=0.3", "--retry_after_seconds", "3",
                      "--seed", "1") as emu:
            c = emu.client()
            codes = []
            retry = set()
            for i in range(300):
                r = c.get(NS + "/configmaps")
                codes.append(r.status)
                if r.status == 429:
                    retry.add(r.headers.get("Retry-After"))
                    self.assertEqual(r.json["reason"], "TooManyRequests")
            frac = codes.count(429) / len(codes)
            self.assertTrue(0.2 < frac < 0.4, frac)
            self.assertEqual(retry, {"3"})
            self.assertEqual(set(codes), {200, 429})
            stats = c.get("/emulator/stats").json
            self.assertEqual(stats["requests"]["list configmaps"], 300)
            # Admin knobs: remove the error rate, add 500s for writes only through the endpoint.
            r = c.post("/emulator/faults", {"errors": {"429": 0, "500": 1.0}})
            self.assertEqual(r.json["errors"], {"500": 1.0})
            self.assertEqual(c.post(NS + "/configmaps", cm("f")).status, 500)
            c.post("/emulator/faults", {"errors": {"500": 0, "409": 1.0}})
            self.assertEqual(c.get(NS + "/configmaps").status, 200)  # 409 is for writes only
            self.assertEqual(c.post(NS + "/configmaps", cm("f")).status, 409)
            c.post("/emulator/faults", {"errors": {"409": 0}, "latency_ms": 100})
            t0 = time.time()
            self.assertEqual(c.get(NS + "/configmaps").status, 200)
            self.assertGreaterEqual(time.time() - t0, 0.09)
            c.post("/emulator/faults", {"latency_ms": 0})
            # Stats count writes, injected failures included.
            c.post("/emulator/stats/reset", {})
            c.post(NS + "/configmaps", cm("s1"))
            c.post(NS + "/configmaps", cm("s2"))
            c.patch(NS + "/configmaps/s1", {"data": {"a": "b"}})
            c.delete(NS + "/configmaps/s2")
            c.get(NS + "/configmaps/s1")
            stats = c.get("/emulator/stats").json
            self.assertEqual(stats["requests"], {"create configmaps": 2, "patch configmaps": 1,
                                                 "delete configmaps": 1, "get configmaps": 1})
            self.assertEqual(stats["writes"], 4)
            self.assertEqual(stats["total"], 5)
            self.assertGreater(stats["objects"], 5)
            c.close()

    def test_latency_is_per_connection(self):
        import threading
        with Emulator(BINARY, "--latency_ms", "1000") as emu:
            done = []

            def one():
                cl = emu.client()
                done.append(cl.get(NS + "/configmaps").status)
                cl.close()
            t0 = time.time()
            threads = [threading.Thread(target=one) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(done, [200] * 4)
            # Four requests in parallel take about one latency; served one after another
            # they would take four (4 s). The bound leaves 2 s of slack for a loaded machine.
            self.assertLess(time.time() - t0, 3.0)
            self.assertGreaterEqual(time.time() - t0, 0.99)

    def test_stuck_watcher_does_not_block_writers(self):
        import socket
        with Emulator(BINARY) as emu:
            c = emu.client()
            s = socket.create_connection((emu.host, emu.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(("GET %s/configmaps?watch=true HTTP/1.1\r\nHost: x\r\n\r\n" % NS).encode())
            big = "x" * 20000
            for i in range(300):  # ~6 MB of events the watcher never reads
                r = c.post(NS + "/configmaps", {"metadata": {"name": "big-%d" % i},
                                                "data": {"k": big}})
                self.assertEqual(r.status, 201)
            self.assertEqual(c.get("/emulator/stats").json["watches_active"], 1)
            s.close()
            c.post(NS + "/configmaps", cm("after"))  # the next event fails its write
            self.assertTrue(wait_until(
                lambda: c.get("/emulator/stats").json["watches_active"] == 0, timeout=10))
            c.close()

    def test_watch_history_bound(self):
        with Emulator(BINARY, "--watch_history", "5") as emu:
            c = emu.client()
            first = c.post(NS + "/configmaps", cm("h0")).json["metadata"]["resourceVersion"]
            for i in range(1, 10):
                c.post(NS + "/configmaps", cm("h%d" % i))
            w = Watch(emu, NS + "/configmaps?watch=true&resourceVersion=" + first)
            self.assertTrue(w.wait_end())
            self.assertEqual(w.events[0]["object"]["reason"], "Expired")
            w.close()
            recent = c.get(NS + "/configmaps/h7").json["metadata"]["resourceVersion"]
            w = Watch(emu, NS + "/configmaps?watch=true&resourceVersion=" + recent)
            self.assertTrue(w.wait_for(lambda ev: len(ev) == 2))
            self.assertEqual([e["object"]["metadata"]["name"] for e in w.events], ["h8", "h9"])
            w.close()
            c.close()

    def test_qps_limit(self):
        with Emulator(BINARY, "--qps_limit", "20") as emu:
            c = emu.client()
            t0 = time.time()
            codes = [c.get(NS + "/configmaps").status for _ in range(60)]
            elapsed = time.time() - t0
            self.assertIn(429, codes)
            # At most 20 per started second (plus one), however slow the machine was.
            self.assertLessEqual(codes.count(200), 20 * (int(elapsed) + 2) + 1)
            time.sleep(1.1)
            self.assertEqual(c.get(NS + "/configmaps").status, 200)
            c.post("/emulator/faults", {"qps_limit": 0})
            self.assertNotIn(429, [c.get(NS + "/configmaps").status for _ in range(50)])
            c.close()

    def test_watch_drop_and_410(self):
        with Emulator(BINARY, "--watch_drop_rate", "1") as emu:
            c = emu.client()
            for i in range(3):
                c.post(NS + "/configmaps", cm("d%d" % i))
            w = Watch(emu, NS + "/configmaps?watch=true")
            self.assertTrue(w.wait_end())
            self.assertTrue(w.broken)  # cut without the end marker
            self.assertEqual(len(w.events), 1)
            w.close()
            c.post("/emulator/faults", {"watch_drop_rate": 0, "errors": {"410": 1.0}})
            w = Watch(emu, NS + "/configmaps?watch=true")
            self.assertTrue(w.wait_end())
            self.assertEqual(w.events[0]["object"]["code"], 410)
            w.close()
            self.assertEqual(c.get(NS + "/configmaps").status, 200)  # plain lists are spared
            c.close()


REPLICA_A = {"User-Agent": "sbx/0.1 (replica-a)"}
REPLICA_B = {"User-Agent": "sbx/0.1 (replica-b)"}


def raw_request(emu, method, path, body, user_agent):
    """Sends one request on a fresh socket and returns the socket (unread)."""
    import socket
    s = socket.create_connection((emu.host, emu.port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nUser-Agent: %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (method, path, user_agent, len(data))).encode() + data)
    return s


class RequestLogTimeTest(unittest.TestCase):
    def test_time_and_code_of_ordinary_requests(self):
        with Emulator(BINARY) as emu:
            c = emu.client()
            t0 = time.time()
            self.assertEqual(c.post(NS + "/configmaps", cm("t1"), headers=REPLICA_B).status, 201)
            self.assertEqual(c.get(NS + "/configmaps/t1", headers=REPLICA_B).status, 200)
            self.assertEqual(c.get(NS + "/configmaps/none", headers=REPLICA_B).status, 404)
            self.assertEqual(c.post(NS + "/configmaps", cm("t1"), headers=REPLICA_B).status, 409)
            self.assertEqual(c.get(NS + "/configmaps?watch=true&timeoutSeconds=1",
                                   headers=REPLICA_B).status, 200)
            # Acted on after the injected latency: a write's time is when it was applied.
            c.post("/emulator/faults", {"latency_ms": 300})
            t_slow = time.time()
            self.assertEqual(c.post(NS + "/configmaps", cm("t2"), headers=REPLICA_B).status, 201)
            c.post("/emulator/faults", {"latency_ms": 0, "errors": {"500": 1.0}})
            self.assertEqual(c.get(NS + "/configmaps", headers=REPLICA_B).status, 500)
            c.post("/emulator/faults", {"errors": {"500": 0}})
            t1 = time.time()
            log = c.get("/emulator/requests?user_agent=sbx/0.1%20(replica-b)").json
            self.assertEqual([(r["verb"], r["code"]) for r in log],
                             [("create", 201), ("get", 200), ("get", 404), ("create", 409),
                              ("watch", 200), ("create", 201), ("list", 500)])
            self.assertFalse(any(r["dropped"] for r in log))
            times = [r["time"] for r in log]
            self.assertEqual(times, sorted(times))
            self.assertGreaterEqual(times[0], t0 - 0.001)
            self.assertLessEqual(times[-1], t1 + 0.001)
            self.assertGreaterEqual(times[5], t_slow + 0.29)
            # ?since keeps the records acted on at or after it, the boundary included.
            since = c.get("/emulator/requests?since=%.6f" % times[5]).json
            self.assertEqual([(r["verb"], r["code"]) for r in since],
                             [("create", 201), ("list", 500)])
            self.assertEqual(c.get("/emulator/requests?since=%.6f" % (t1 + 60)).json, [])
            r = c.get("/emulator/requests?since=yesterday")
            self.assertEqual(r.status, 400)
            self.assertIn("since", r.json["error"])
            c.close()


class PartitionTest(unittest.TestCase):
    """The hold_user_agents fault: a one-sided partition of some clients."""

    def held(self, c):
        return c.get("/emulator/faults").json["held"]

    def test_held_create_is_applied_only_after_the_heal(self):
        import threading
        with Emulator(BINARY) as emu:
            c = emu.client()
            r = c.post("/emulator/faults", {"hold_user_agents": ["sbx/0.1 (replica-a)"]})
            self.assertEqual(r.json["hold_user_agents"], ["sbx/0.1 (replica-a)"])
            self.assertEqual(c.get("/emulator/faults").json["hold_user_agents"],
                             ["sbx/0.1 (replica-a)"])
            result = {}

            def create():
                a = emu.client(timeout=30)
                result["r"] = a.post(NS + "/configmaps", cm("fenced"), headers=REPLICA_A)
                a.close()
            t = threading.Thread(target=create)
            t.start()
            self.assertTrue(wait_until(lambda: self.held(c) == 1))
            # Another replica is served meanwhile, over its own connections.
            b = emu.client(timeout=5)
            self.assertEqual(b.post(NS + "/configmaps", cm("other"), headers=REPLICA_B).status,
                             201)
            time.sleep(0.3)
            self.assertEqual(b.get(NS + "/configmaps/fenced", headers=REPLICA_B).status, 404)
            self.assertNotIn("r", result)
            self.assertEqual(c.get("/emulator/requests?user_agent=sbx/0.1%20(replica-a)").json,
                             [])
            healed_at = time.time()
            r = c.post("/emulator/faults", {"hold_user_agents": []})
            self.assertEqual(r.json["hold_user_agents"], [])
            t.join(timeout=10)
            self.assertEqual(result["r"].status, 201, result["r"])
            self.assertEqual(b.get(NS + "/configmaps/fenced", headers=REPLICA_B).status, 200)
            log = c.get("/emulator/requests?user_agent=sbx/0.1%20(replica-a)").json
            self.assertEqual(len(log), 1, log)
            self.assertEqual((log[0]["verb"], log[0]["code"], log[0]["dropped"]),
                             ("create", 201, False))
            self.assertGreater(log[0]["time"], healed_at)
            other = c.get("/emulator/requests?user_agent=sbx/0.1%20(replica-b)").json
            self.assertLess(other[0]["time"], healed_at)
            b.close()
            c.close()

    def test_held_request_of_a_client_that_gave_up_is_dropped(self):
        with Emulator(BINARY) as emu:
            c = emu.client()
            c.post("/emulator/faults", {"hold_user_agents": ["sbx/0.1 (replica-a"]})
            s = raw_request(emu, "POST", NS + "/configmaps", cm("lost"), "sbx/0.1 (replica-a)")
            self.assertTrue(wait_until(lambda: self.held(c) == 1))
            gave_up = time.time()
            s.close()  # the client times out
            # Its place is freed without waiting for the heal.
            self.assertTrue(wait_until(lambda: self.held(c) == 0))
            c.post("/emulator/faults", {"hold_user_agents": []})
            time.sleep(0.3)
            self.assertEqual(c.get(NS + "/configmaps/lost").status, 404)
            log = c.get("/emulator/requests?user_agent=sbx/0.1%20(replica-a)").json
            self.assertEqual(len(log), 1, log)
            self.assertEqual((log[0]["verb"], log[0]["resource"], log[0]["code"],
                              log[0]["dropped"]), ("create", "configmaps", 0, True))
            self.assertGreaterEqual(log[0]["time"], gave_up - 0.001)
            c.close()

    def test_open_watch_of_a_held_agent_hears_nothing_until_the_heal(self):
        with Emulator(BINARY) as emu:
            c = emu.client()
            c.post(NS + "/configmaps", cm("before"))
            w = Watch(emu, NS + "/configmaps?watch=true", headers=REPLICA_A)
            self.assertTrue(w.wait_for(lambda ev: len(ev) == 1))
            c.post("/emulator/faults", {"hold_user_agents": ["sbx/0.1 (replica-a)"]})
            c.post(NS + "/configmaps", cm("during"))
            self.assertFalse(w.wait_for(lambda ev: len(ev) > 1, timeout=0.6))
            self.assertFalse(w.ended or w.broken)
            c.post("/emulator/faults", {"hold_user_agents": []})
            self.assertTrue(w.wait_for(lambda ev: len(ev) == 2))
            self.assertEqual(w.events[1]["object"]["metadata"]["name"], "during")
            w.close()
            c.close()

    def test_bound_and_bad_lists(self):
        import threading
        with Emulator(BINARY, "--max_held_requests", "1") as emu:
            c = emu.client()
            for bad, field in [("sbx/", "hold_user_agents"), ([1], "hold_user_agents[0]"),
                               (["ok", ""], "hold_user_agents[1]")]:
                r = c.post("/emulator/faults", {"hold_user_agents": bad})
                self.assertEqual(r.status, 400, r)
                self.assertIn(field, r.json["error"])
            self.assertEqual(c.get("/emulator/faults").json["hold_user_agents"], [])
            r = c.post("/emulator/faults", {"hold_user_agents": ["held/"]})
            self.assertEqual(r.json["max_held_requests"], 1)
            result = {}

            def first():
                a = emu.client(timeout=30)
                result["r"] = a.get(NS + "/configmaps", headers={"User-Agent": "held/1"})
                a.close()
            t = threading.Thread(target=first)
            t.start()
            self.assertTrue(wait_until(lambda: self.held(c) == 1))
            other = emu.client(timeout=5)
            r = other.get(NS + "/configmaps", headers={"User-Agent": "held/2"})
            other.close()
            self.assertEqual(r.status, 503, r)
            self.assertIn("max_held_requests", r.json["message"])
            c.post("/emulator/faults", {"hold_user_agents": []})
            t.join(timeout=10)
            self.assertEqual(result["r"].status, 200)
            log = c.get("/emulator/requests?user_agent=held/").json
            self.assertEqual([(r["user_agent"], r["code"]) for r in log],
                             [("held/2", 503), ("held/1", 200)])
            c.close()

    def test_sigterm_does_not_wait_for_held_requests(self):
        import signal
        with Emulator(BINARY) as emu:
            c = emu.client()
            c.post("/emulator/faults", {"hold_user_agents": ["held/"]})
            s = raw_request(emu, "GET", NS + "/configmaps", {}, "held/1")
            self.assertTrue(wait_until(lambda: self.held(c) == 1))
            c.close()
            emu.proc.send_signal(signal.SIGTERM)
            self.assertEqual(emu.proc.wait(timeout=5), 0)
            s.close()


class AuthTlsTest(unittest.TestCase):
    def test_token_file_reload(self):
        with tempfile.TemporaryDirectory(prefix="emu-tok") as d:
            tok = os.path.join(d, "token")
            with open(tok, "w") as f:
                f.write("first-token\n")
            with Emulator(BINARY, "--token_file", tok) as emu:
                anon = emu.client()
                r = anon.get(NS + "/pods")
                self.assertEqual(r.status, 401)
                self.assertEqual(r.json["reason"], "Unauthorized")
                self.assertEqual(anon.get("/emulator/stats").status, 200)  # admin is open
                c1 = emu.client(token="first-token")
                self.assertEqual(c1.get(NS + "/pods").status, 200)
                time.sleep(0.02)
                with open(tok, "w") as f:
                    f.write("second-token-longer")
                self.assertEqual(c1.get(NS + "/pods").status, 401)
                c2 = emu.client(token="second-token-longer")
                self.assertEqual(c2.get(NS + "/pods").status, 200)
                for cl in (anon, c1, c2):
                    cl.close()

    def test_https(self):
        with tempfile.TemporaryDirectory(prefix="emu-tls") as d:
            ca, crt, key = make_tls(d)
            with Emulator(BINARY, "--tls_cert_file", crt, "--tls_key_file", key) as emu:
                self.assertTrue(emu.url.startswith("https://127.0.0.1:"))
                ctx = ssl.create_default_context(cafile=ca)
                ctx.set_alpn_protocols(["h2", "http/1.1"])
                c = emu.client(ssl_context=ctx)
                r = c.post(NS + "/configmaps", cm("tls"))
                self.assertEqual(r.status, 201, r)
                self.assertEqual(c.get(NS + "/configmaps/tls").json["metadata"]["name"], "tls")
                self.assertEqual(c.conn.sock.selected_alpn_protocol(), "http/1.1")
                c.close()
                bad = emu.client(ssl_context=ssl.create_default_context())
                with self.assertRaises(ssl.SSLError):
                    bad.get("/version")


CONV = "/apis/conv.example.com/%s/namespaces/default/widgets"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def widget_in(version, name, size="M", labels=None):
    spec = {"dimensions": {"size": size}} if version == "v2" else {"size": size}
    return {"apiVersion": "conv.example.com/" + version, "kind": "Widget",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


class ConversionTest(unittest.TestCase):
    """Multi-version CRDs and conversion webhooks over real HTTPS (a webhook in this process
    with a certificate for conv-webhook.test-ns.svc signed by a test CA)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emu-conv-")
        cls.ca = make_ca(cls.tmp, "conv-ca")
        cls.other_ca = make_ca(cls.tmp, "other-ca")
        cert = make_serving_cert(cls.tmp, "conv-webhook", cls.ca,
                                 ["DNS:" + WEBHOOK_DNS, "IP:127.0.0.1"])
        cls.hook = ConversionWebhook(cert).__enter__()
        cls.down_port = free_port()
        cls.emu = Emulator(
            BINARY, "--conversion_webhook_timeout_ms", "3000",
            "--service_address", "test-ns/conv-webhook=127.0.0.1:%d" % cls.hook.port,
            # The webhook's own address under a name its certificate does not carry.
            "--service_address", "test-ns/wrong-name=127.0.0.1:%d" % cls.hook.port,
            "--service_address", "test-ns/down=127.0.0.1:%d" % cls.down_port).__enter__()
        cls.c = cls.emu.client()
        cls.good_config = {"service": {"namespace": "test-ns", "name": "conv-webhook",
                                       "path": "/convert"},
                           "caBundle": ca_bundle(cls.ca)}
        r = cls.c.post(CRDS, widget_conversion_crd(cls.good_config))
        assert r.status == 201, r

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.emu.stop()
        cls.hook.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        self.hook.mode = "ok"
        self.use_client_config(self.good_config)

    def use_client_config(self, config):
        r = self.c.patch(CRDS + "/widgets.conv.example.com", [{
            "op": "replace", "path": "/spec/conversion/webhook/clientConfig", "value": config}],
            ctype="application/json-patch+json")
        self.assertEqual(r.status, 200, r)

    def assert_conversion_failed(self, r, version, reason):
        self.assertEqual(r.status, 500, r)
        self.assertEqual(r.json["kind"], "Status")
        self.assertNotIn("reason", r.json)  # as the API server: StatusReasonUnknown
        prefix = "conversion webhook for conv.example.com/%s, Kind=Widget failed: " % version
        self.assertTrue(r.json["message"].startswith(prefix), r.json["message"])
        self.assertRegex(r.json["message"][len(prefix):], reason)

    def test_discovery_lists_served_versions_by_priority(self):
        c = self.c
        g = c.get("/apis/conv.example.com").json
        self.assertEqual([v["version"] for v in g["versions"]], ["v2", "v1", "v1beta1"])
        self.assertEqual(g["preferredVersion"],
                         {"groupVersion": "conv.example.com/v2", "version": "v2"})
        listed = {x["name"]: x for x in c.get("/apis").json["groups"]}["conv.example.com"]
        self.assertEqual(listed["preferredVersion"]["version"], "v2")
        names = {x["name"] for x in c.get("/apis/conv.example.com/v2").json["resources"]}
        self.assertEqual(names, {"widgets", "widgets/status"})
        self.assertEqual(c.get("/apis/conv.example.com/v1alpha1").status, 404)
        self.assertEqual(c.get("/apis/conv.example.com/v1alpha1/namespaces/default/widgets")
                         .status, 404)

    def test_create_in_v2_is_stored_in_v1(self):
        c = self.c
        del self.hook.reviews[:]
        r = c.post(CONV % "v2", widget_in("v2", "made-in-v2", "M"))
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["apiVersion"], "conv.example.com/v2")
        self.assertEqual(r.json["spec"], {"dimensions": {"size": "M"}})
        # The webhook's annotation stays, its change of the generation does not.
        self.assertEqual(r.json["metadata"]["generation"], 1)
        self.assertEqual(r.json["metadata"]["annotations"],
                         {"conv.example.com/converted-to": "v2"})
        v1 = c.get(CONV % "v1" + "/made-in-v2").json
        self.assertEqual(v1["apiVersion"], "conv.example.com/v1")
        self.assertEqual(v1["spec"], {"size": "M"})
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            self.assertEqual(v1["metadata"][field], r.json["metadata"][field])
        # What the API server sends: v2 -> v1 to store, v1 -> v2 for the answer.
        path, ctype, review = self.hook.reviews[0]
        self.assertEqual(path, "/convert?timeout=3s")
        self.assertEqual(ctype, "application/json")
        self.assertEqual((review["apiVersion"], review["kind"]),
                         ("apiextensions.k8s.io/v1", "ConversionReview"))
        self.assertRegex(review["request"]["uid"], r"^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$")
        self.assertEqual(review["request"]["desiredAPIVersion"], "conv.example.com/v1")
        sent = review["request"]["objects"]
        self.assertEqual([(o["apiVersion"], o["metadata"]["name"]) for o in sent],
                         [("conv.example.com/v2", "made-in-v2")])
        self.assertEqual(sent[0]["metadata"]["uid"], r.json["metadata"]["uid"])
        self.assertEqual([x[2]["request"]["desiredAPIVersion"] for x in self.hook.reviews],
                         ["conv.example.com/v1", "conv.example.com/v2"])
        # The request version's schema applies to the body.
        bad = widget_in("v2", "bad-size", "XL")
        r = c.post(CONV % "v2", bad)
        self.assertEqual(r.status, 422, r)
        self.assertIn("spec.dimensions.size", r.json["message"])
        bad = widget_in("v2", "typo")
        bad["spec"]["dimensons"] = 1
        r = c.post(CONV % "v2" + "?fieldValidation=Strict", bad)
        self.assertEqual(r.status, 400, r)
        self.assertIn('unknown field "spec.dimensons"', r.json["message"])
        self.assertEqual(c.get(CONV % "v1" + "/typo").status, 404)
        r = c.post(CONV % "v2", widget_in("v1", "v1-body-to-v2"))
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json["message"], "the API version in the data (conv.example.com/v1) "
                         "does not match the expected API version (conv.example.com/v2)")

    def test_get_list_watch_delete_in_another_version(self):
        c = self.c
        for name in ("glw-a", "glw-b"):
            self.assertEqual(c.post(CONV % "v1", widget_in("v1", name, "S",
                                                           {"set": "glw"})).status, 201)
        w = Watch(self.emu, CONV % "v2" + "?watch=true&labelSelector=set%3Dglw")
        self.assertTrue(w.wait_for(lambda ev: len(ev) >= 2))
        self.assertEqual({(e["type"], e["object"]["apiVersion"], e["object"]["spec"]["dimensions"]
                           ["size"]) for e in w.events},
                         {("ADDED", "conv.example.com/v2", "S")})
        got = c.get(CONV % "v2" + "/glw-a").json
        self.assertEqual((got["apiVersion"], got["spec"]), ("conv.example.com/v2",
                                                            {"dimensions": {"size": "S"}}))
        del self.hook.reviews[:]
        lst = c.get(CONV % "v2" + "?labelSelector=set%3Dglw").json
        self.assertEqual(lst["apiVersion"], "conv.example.com/v2")
        self.assertEqual([i["spec"]["dimensions"]["size"] for i in lst["items"]], ["S", "S"])
        self.assertEqual([len(x[2]["request"]["objects"]) for x in self.hook.reviews], [2])
        # The same object in every served version: one resourceVersion, one history.
        r = c.patch(CONV % "v1" + "/glw-a", {"spec": {"size": "L"}})
        self.assertEqual(r.status, 200, r)
        self.assertTrue(w.wait_for(lambda ev: len(ev) >= 3))
        ev = w.events[2]
        self.assertEqual((ev["type"], ev["object"]["spec"]), ("MODIFIED",
                                                              {"dimensions": {"size": "L"}}))
        self.assertEqual(ev["object"]["metadata"]["resourceVersion"],
                         r.json["metadata"]["resourceVersion"])
        r = c.delete(CONV % "v2" + "/glw-b")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["apiVersion"], "conv.example.com/v2")
        self.assertTrue(w.wait_for(lambda ev: len(ev) >= 4))
        self.assertEqual((w.events[3]["type"], w.events[3]["object"]["apiVersion"]),
                         ("DELETED", "conv.example.com/v2"))
        # A watch whose event cannot be converted ends, as the API server ends it.
        self.hook.mode = "fail"
        c.patch(CONV % "v1" + "/glw-a", {"spec": {"size": "M"}})
        self.assertTrue(w.wait_end(timeout=5))
        self.assertEqual(len(w.events), 4)
        w.close()

    def test_writes_in_v2_apply_to_the_v2_view(self):
        c = self.c
        self.assertEqual(c.post(CONV % "v1", widget_in("v1", "pw", "S")).status, 201)
        r = c.patch(CONV % "v2" + "/pw", {"spec": {"dimensions": {"size": "L"}, "color": "red"}})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["spec"], {"dimensions": {"size": "L"}, "color": "red"})
        self.assertEqual(c.get(CONV % "v1" + "/pw").json["spec"], {"size": "L", "color": "red"})
        r = c.patch(CONV % "v2" + "/pw", [{"op": "replace", "path": "/spec/dimensions/size",
                                          "value": "M"}], ctype="application/json-patch+json")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(c.get(CONV % "v1" + "/pw").json["spec"]["size"], "M")
        # status subresource: only the status changes, the main resource keeps it.
        r = c.patch(CONV % "v2" + "/pw/status",
                    {"status": {"phase": "Ready"}, "spec": {"dimensions": {"size": "S"}}})
        self.assertEqual(r.status, 200, r)
        v1 = c.get(CONV % "v1" + "/pw").json
        self.assertEqual((v1["status"], v1["spec"]["size"]), ({"phase": "Ready"}, "M"))
        r = c.patch(CONV % "v2" + "/pw", {"status": {"phase": "Lost"}})
        self.assertEqual(c.get(CONV % "v1" + "/pw").json["status"], {"phase": "Ready"})
        # update: the resourceVersion must be current; a no-op keeps it.
        cur = c.get(CONV % "v2" + "/pw").json
        r = c.put(CONV % "v2" + "/pw", cur)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["metadata"]["resourceVersion"], cur["metadata"]["resourceVersion"])
        cur["spec"]["dimensions"]["size"] = "S"
        r = c.put(CONV % "v2" + "/pw", cur)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(c.get(CONV % "v1" + "/pw").json["spec"]["size"], "S")
        self.assertEqual(c.put(CONV % "v2" + "/pw", cur).status, 409)

    def test_webhook_answers_that_fail_the_request(self):
        c = self.c
        self.assertEqual(c.post(CONV % "v1", widget_in("v1", "wf")).status, 201)
        self.hook.mode = "fail"
        self.assert_conversion_failed(c.get(CONV % "v2" + "/wf"), "v1",
                                      r"^widgets cannot be converted today$")
        self.assert_conversion_failed(c.post(CONV % "v2", widget_in("v2", "wf-new")), "v2",
                                      r"^widgets cannot be converted today$")
        self.assertEqual(c.get(CONV % "v1" + "/wf-new").status, 404)
        self.assert_conversion_failed(c.delete(CONV % "v2" + "/wf"), "v1", "cannot be converted")
        self.assertEqual(c.get(CONV % "v1" + "/wf").status, 200)  # not deleted
        self.hook.mode = "uid"
        self.assert_conversion_failed(c.get(CONV % "v2" + "/wf"), "v1",
                                      r'^expected response.uid="[0-9a-f-]+", got "not-')
        self.hook.mode = "http500"
        self.assert_conversion_failed(
            c.get(CONV % "v2" + "/wf"), "v1",
            r'^an error on the server \("boom"\) has prevented the request from succeeding$')
        self.hook.mode = "count"
        r = c.get(CONV % "v2" + "/wf")
        self.assertEqual(r.status, 500, r)
        self.assertEqual(r.json["message"], "conversion webhook for conv.example.com/v1, "
                         "Kind=Widget returned 2 objects, expected 1")
        self.hook.mode = "ok"
        self.assertEqual(c.get(CONV % "v2" + "/wf").status, 200)

    def test_unreachable_webhooks(self):
        c = self.c
        self.assertEqual(c.post(CONV % "v1", widget_in("v1", "ur")).status, 201)
        self.use_client_config({"service": {"namespace": "test-ns", "name": "down",
                                            "path": "/convert"}, "caBundle": ca_bundle(self.ca)})
        self.assert_conversion_failed(
            c.get(CONV % "v2" + "/ur"), "v1",
            r'^Post "https://down\.test-ns\.svc:443/convert\?timeout=3s": dial tcp '
            r'127\.0\.0\.1:%d: connect: connection refused$' % self.down_port)
        self.use_client_config({"service": {"namespace": "test-ns", "name": "nowhere"}})
        self.assert_conversion_failed(
            c.get(CONV % "v2" + "/ur"), "v1",
            r'^Post "https://nowhere\.test-ns\.svc:443/\?timeout=3s": service "nowhere" not found')
        # Reads in the storage version need no conversion.
        self.assertEqual(c.get(CONV % "v1" + "/ur").status, 200)

    def test_tls_is_verified(self):
        c = self.c
        self.assertEqual(c.post(CONV % "v1", widget_in("v1", "tls")).status, 201)
        # The right address, but the certificate is not for wrong-name.test-ns.svc.
        self.use_client_config({"service": {"namespace": "test-ns", "name": "wrong-name",
                                            "path": "/convert"}, "caBundle": ca_bundle(self.ca)})
        self.assert_conversion_failed(
            c.get(CONV % "v2" + "/tls"), "v1",
            r'^Post "https://wrong-name\.test-ns\.svc:443/convert\?timeout=3s": tls: failed to '
            r'verify certificate: x509: certificate is valid for conv-webhook\.test-ns\.svc, not '
            r'wrong-name\.test-ns\.svc$')
        # The right name, but a caBundle of another CA (a live CRD change takes effect).
        other = dict(self.good_config, caBundle=ca_bundle(self.other_ca))
        self.use_client_config(other)
        self.assert_conversion_failed(c.get(CONV % "v2" + "/tls"), "v1",
                                      r"tls: failed to verify certificate: x509: certificate "
                                      r"signed by unknown authority$")
        # No caBundle: the system roots do not know the test CA either.
        self.use_client_config({"service": self.good_config["service"]})
        self.assert_conversion_failed(c.get(CONV % "v2" + "/tls"), "v1", "unknown authority")
        self.use_client_config(self.good_config)
        self.assertEqual(c.get(CONV % "v2" + "/tls").status, 200)
        # clientConfig.url: checked for its host, here an IP address.
        self.use_client_config({"url": "https://127.0.0.1:%d/convert" % self.hook.port,
                                "caBundle": ca_bundle(self.ca)})
        r = c.get(CONV % "v2" + "/tls")
        self.assertEqual((r.status, r.json["spec"]), (200, {"dimensions": {"size": "M"}}))
        self.use_client_config({"url": "https://localhost:%d/convert" % self.hook.port,
                                "caBundle": ca_bundle(self.ca)})
        self.assert_conversion_failed(c.get(CONV % "v2" + "/tls"), "v1",
                                      "certificate is valid for conv-webhook.test-ns.svc, not "
                                      "localhost$")

    def test_deprecated_version_warns(self):
        r = self.c.get(CONV % "v1beta1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("Warning"),
                         '299 - "conv.example.com/v1beta1 Widget is deprecated"')
        self.assertNotIn("Warning", self.c.get(CONV % "v1").headers)

    def test_strategy_none_rewrites_the_api_version_only(self):
        c = self.c
        crd = json.loads(json.dumps(WIDGET_CRD).replace("widget", "gizmo")
                         .replace("Widget", "Gizmo").replace("test.example.com",
                                                             "conv.example.com"))
        v1 = crd["spec"]["versions"][0]
        v2 = json.loads(json.dumps(v1))
        v2.update(name="v2", storage=False, deprecated=True,
                  deprecationWarning='gizmos "v2" go away soon')
        crd["spec"]["versions"].append(v2)
        r = c.post(CRDS, crd)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["spec"]["conversion"], {"strategy": "None"})  # defaulted
        gizmos = "/apis/conv.example.com/%s/namespaces/default/gizmos"
        body = {"apiVersion": "conv.example.com/v2", "kind": "Gizmo",
                "metadata": {"name": "g1"}, "spec": {"size": "S", "tags": ["a"]}}
        r = c.post(gizmos % "v2", body)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.headers.get("Warning"), r'299 - "gizmos \"v2\" go away soon"')
        got = c.get(gizmos % "v1" + "/g1").json
        self.assertEqual(got["apiVersion"], "conv.example.com/v1")
        self.assertEqual(got["spec"], r.json["spec"])
        r = c.patch(gizmos % "v2" + "/g1/scale", {"spec": {"replicas": 3}})
        self.assertEqual((r.status, r.json["kind"], r.json["spec"]), (200, "Scale", {"replicas": 3}))
        self.assertEqual(c.get(gizmos % "v1" + "/g1").json["spec"]["replicas"], 3)
        # A new storage version: new writes go there, old objects stay where they are.
        versions = r = c.get(CRDS + "/gizmos.conv.example.com").json["spec"]["versions"]
        versions[0]["storage"], versions[1]["storage"] = False, True
        r = c.patch(CRDS + "/gizmos.conv.example.com", {"spec": {"versions": versions}})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["status"]["storedVersions"], ["v1", "v2"])
        self.assertEqual(c.post(gizmos % "v1", dict(body, apiVersion="conv.example.com/v1",
                                                    metadata={"name": "g2"})).status, 201)
        self.assertEqual(c.get(gizmos % "v2" + "/g2").json["apiVersion"], "conv.example.com/v2")
        self.assertEqual(c.patch(gizmos % "v2" + "/g1", {"spec": {"size": "L"}}).status, 200)
        # A version objects may still be stored in cannot leave the CRD.
        r = c.patch(CRDS + "/gizmos.conv.example.com", {"spec": {"versions": versions[1:]}})
        self.assertEqual(r.status, 422, r)
        self.assertIn('status.storedVersions[0]: Invalid value: "v1": must appear in '
                      'spec.versions', r.json["message"])
        self.assertEqual(c.delete(CRDS + "/gizmos.conv.example.com").status, 200)

    def test_crd_conversion_is_validated(self):
        c = self.c

        def crd(name, **conversion):
            x = widget_conversion_crd(self.good_config)
            x["metadata"]["name"] = name + ".conv.example.com"
            x["spec"]["names"] = {"plural": name, "kind": name.capitalize()}
            x["spec"]["conversion"].update(conversion)
            return x

        bad = crd("norev")
        bad["spec"]["conversion"]["webhook"]["conversionReviewVersions"] = ["v2"]
        r = c.post(CRDS, bad)
        self.assertEqual(r.status, 422, r)
        self.assertIn('spec.conversion.conversionReviewVersions: Invalid value: []string{"v2"}: '
                      "must include at least one of v1, v1beta1", r.json["message"])
        bad = crd("plainhttp")
        bad["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": "http://127.0.0.1:1/"}
        r = c.post(CRDS, bad)
        self.assertEqual(r.status, 422, r)
        self.assertIn("'https' is the only allowed URL scheme", r.json["message"])
        bad = crd("twostores")
        bad["spec"]["versions"][3]["storage"] = True
        r = c.post(CRDS, bad)
        self.assertEqual(r.status, 422, r)
        self.assertIn("must have exactly one version marked as storage version", r.json["message"])
        # Refused on update too: the live CRD keeps converting.
        r = c.patch(CRDS + "/widgets.conv.example.com", {"spec": {"conversion": {
            "webhook": {"conversionReviewVersions": ["v1beta2"]}}}})
        self.assertEqual(r.status, 422, r)


class PerfTest(unittest.TestCase):
    def test_create_rate(self):
        """Prints creates/s over one keep-alive connection; asserts only correctness."""
        with Emulator(BINARY, "--watch_history", "100000") as emu:
            c = emu.client()
            w = Watch(emu, NS + "/configmaps?watch=true")
            n = 2000
            t0 = time.time()
            for i in range(n):
                r = c.post(NS + "/configmaps", cm("perf-%05d" % i))
                assert r.status == 201, r
            dt = time.time() - t0
            self.assertTrue(w.wait_for(lambda ev: len(ev) >= n, timeout=20))
            print("\nkube-emulator: %d creates in %.2fs = %.0f creates/s (1 connection, "
                  "1 watcher)" % (n, dt, n / dt), file=sys.stderr)
            w.close()
            c.close()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: emulator_test.py KUBE_EMULATOR_BINARY PROJECT_SOURCE_DIR")
    BINARY = sys.argv[1]
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
