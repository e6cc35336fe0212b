// chart-render renders a Helm chart the way `helm template` does, for machines without
// Helm: Go's text/template with the sprig functions and Helm's own additions (include,
// tpl, required, toYaml, fromYaml, toJson, fromJson, lookup), the built-in objects
// .Values, .Release, .Chart, .Capabilities, .Files and .Template, values.yaml merged
// with -f files and --set pairs, and the merged values checked against
// values.schema.json. The output is one multi-document YAML stream, each document
// headed by a `# Source:` comment and ordered by kind like Helm's install order.
//
// Usage:
//
//	chart-render [--name RELEASE] [--namespace NS] [-f values.yaml]... [--set a.b=c,d=e]...
//	             [--include-crds] [--kube-version v1.32.0] [--api-versions group/version]...
//	             CHART_DIR
//
// Exit status 0 with the manifests on stdout, 1 with "chart-render: error: ..." on stderr.
//
// It builds offline in GOPATH mode from Debian's packages (golang-go,
// golang-github-masterminds-sprig-dev, golang-k8s-sigs-yaml-dev,
// golang-github-xeipuuv-gojsonschema-dev):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off go build -o chart-render main.go
//
// Not done: subcharts and dependencies, .helmignore, --set list syntax (a[0]=x, {a,b}),
// `lookup` against a cluster (it always returns an empty map, as in `helm template`).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

// maxIncludeDepth bounds recursion through include and tpl, as Helm does.
const maxIncludeDepth = 1000

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// Chart is .Chart: the fields of Chart.yaml under Helm's capitalised names.
type Chart struct {
	APIVersion   string                   `json:"apiVersion"`
	Name         string                   `json:"name"`
	Version      string                   `json:"version"`
	AppVersion   string                   `json:"appVersion"`
	Description  string                   `json:"description"`
	Type         string                   `json:"type"`
	KubeVersion  string                   `json:"kubeVersion"`
	Home         string                   `json:"home"`
	Icon         string                   `json:"icon"`
	Deprecated   bool                     `json:"deprecated"`
	Keywords     []string                 `json:"keywords"`
	Sources      []string                 `json:"sources"`
	Maintainers  []map[string]interface{} `json:"maintainers"`
	Annotations  map[string]string        `json:"annotations"`
	Dependencies []map[string]interface{} `json:"dependencies"`
}

// Release is .Release.
type Release struct {
	Name      string
	Namespace string
	Service   string
	IsInstall bool
	IsUpgrade bool
	Revision  int
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

// Has reports whether "group/version" or "group/version/Kind" is served.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// Capabilities is .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion map[string]string
}

// Files is .Files: the chart's files other than templates, by path relative to the chart.
type Files map[string][]byte

// Get returns the file's content, or "" when there is no such file (as Helm does).
func (f Files) Get(name string) string { return string(f[name]) }

// GetBytes returns the file's content as bytes.
func (f Files) GetBytes(name string) []byte { return f[name] }

// Lines returns the file's lines.
func (f Files) Lines(name string) []string {
	s := string(f[name])
	if s == "" {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// Glob returns the files whose path matches the shell pattern.
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for name, data := range f {
		if ok, _ := path.Match(pattern, name); ok {
			out[name] = data
		}
	}
	return out
}

// TemplateInfo is .Template.
type TemplateInfo struct {
	Name     string
	BasePath string
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "chart-render: error: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("chart-render", flag.ContinueOnError)
	name := fs.String("name", "release-name", "release name (.Release.Name)")
	namespace := fs.String("namespace", "default", "release namespace (.Release.Namespace)")
	includeCrds := fs.Bool("include-crds", false, "also print the chart's crds/ first")
	kubeVersion := fs.String("kube-version", "v1.32.0", "Kubernetes version for .Capabilities")
	var valueFiles, sets, apiVersions listFlag
	fs.Var(&valueFiles, "f", "values file merged over values.yaml (repeatable)")
	fs.Var(&valueFiles, "values", "same as -f")
	fs.Var(&sets, "set", "a.b=c[,d=e] merged over the values files (repeatable)")
	fs.Var(&apiVersions, "api-versions", "extra group/version for .Capabilities (repeatable)")
	// Flags may follow the chart folder, as with helm.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		return errors.New("usage: chart-render [flags] CHART_DIR (one chart folder)")
	}
	chartDir := positional[0]

	chart, err := loadChart(chartDir)
	if err != nil {
		return err
	}
	values, err := loadValues(chartDir, valueFiles, sets)
	if err != nil {
		return err
	}
	if err := validateValues(chartDir, chart.Name, values); err != nil {
		return err
	}
	files, templates, err := loadFiles(chartDir)
	if err != nil {
		return err
	}
	caps, err := capabilities(*kubeVersion, apiVersions)
	if err != nil {
		return err
	}
	if err := checkKubeVersion(chart, caps.KubeVersion.Version); err != nil {
		return err
	}
	top := map[string]interface{}{
		"Values":       values,
		"Release":      Release{Name: *name, Namespace: *namespace, Service: "Helm", IsInstall: true, Revision: 1},
		"Chart":        chart,
		"Capabilities": caps,
		"Files":        files,
	}
	docs, err := render(chart.Name, templates, top)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	docs = sortByKind(docs)
	if *includeCrds {
		// First, as Helm installs them before anything else.
		crds, err := crdDocs(chartDir, chart.Name)
		if err != nil {
			return err
		}
		docs = append(crds, docs...)
	}
	for _, d := range docs {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", d.source, d.body)
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

func loadChart(dir string) (Chart, error) {
	var c Chart
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return c, fmt.Errorf("chart %q: %v", dir, err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("%s: %v", filepath.Join(dir, "Chart.yaml"), err)
	}
	if c.APIVersion != "v2" {
		return c, fmt.Errorf("%s: apiVersion %q is not v2", filepath.Join(dir, "Chart.yaml"), c.APIVersion)
	}
	if c.Name == "" || c.Version == "" {
		return c, fmt.Errorf("%s: name and version are required", filepath.Join(dir, "Chart.yaml"))
	}
	return c, nil
}

// loadValues returns values.yaml merged with each -f file, then each --set.
func loadValues(dir string, files, sets []string) (map[string]interface{}, error) {
	values := map[string]interface{}{}
	for _, f := range append([]string{filepath.Join(dir, "values.yaml")}, files...) {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("values file: %v", err)
		}
		var v map[string]interface{}
		if err := yaml.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("values file %s: %v", f, err)
		}
		values = mergeValues(values, v)
	}
	for _, s := range sets {
		if err := applySet(values, s); err != nil {
			return nil, err
		}
	}
	return values, nil
}

// mergeValues merges src over dst: maps merge key by key, anything else replaces, and
// a null in src deletes the key (Helm's rule for overriding a default away).
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = mergeValues(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

// applySet applies "a.b=c,d=e": dotted keys (a backslash escapes a dot or comma),
// values typed like helm --set (integers, true/false, null; anything else a string).
func applySet(values map[string]interface{}, s string) error {
	for _, pair := range splitEscaped(s, ',') {
		eq := strings.IndexByte(pair, '=')
		if eq <= 0 {
			return fmt.Errorf("--set %q: want key=value", pair)
		}
		keys := splitEscaped(pair[:eq], '.')
		raw := pair[eq+1:]
		var value interface{}
		switch {
		case raw == "true":
			value = true
		case raw == "false":
			value = false
		case raw == "null":
			value = nil
		default:
			if n, err := strconv.ParseInt(raw, 10, 64); err == nil && (raw == "0" || !strings.HasPrefix(raw, "0")) {
				value = n
			} else {
				value = raw
			}
		}
		m := values
		for i, k := range keys {
			if k == "" {
				return fmt.Errorf("--set %q: empty key", pair)
			}
			if i == len(keys)-1 {
				if value == nil {
					delete(m, k)
				} else {
					m[k] = value
				}
				break
			}
			next, ok := m[k].(map[string]interface{})
			if !ok {
				next = map[string]interface{}{}
				m[k] = next
			}
			m = next
		}
	}
	return nil
}

func splitEscaped(s string, sep byte) []string {
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == sep:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(parts, cur.String())
}

// validateValues checks the merged values against values.schema.json, when the chart has one.
func validateValues(dir, chartName string, values map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	doc, err := json.Marshal(values)
	if err != nil {
		return fmt.Errorf("values: %v", err)
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(doc))
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	if result.Valid() {
		return nil
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n", chartName)
	for _, e := range result.Errors() {
		fmt.Fprintf(&msg, "- %s\n", e)
	}
	return errors.New(strings.TrimSuffix(msg.String(), "\n"))
}

// loadFiles returns .Files (every file outside templates/ and crds/, by slash path) and
// the templates (path under the chart -> text).
func loadFiles(dir string) (Files, map[string]string, error) {
	files := Files{}
	templates := map[string]string{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasPrefix(rel, "templates/") {
			templates[rel] = string(data)
		} else {
			files[rel] = data
		}
		return nil
	})
	return files, templates, err
}

func capabilities(version string, extra []string) (Capabilities, error) {
	v := strings.TrimPrefix(version, "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return Capabilities{}, fmt.Errorf("--kube-version %q: want vMAJOR.MINOR[.PATCH]", version)
	}
	apis := VersionSet{"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
		"networking.k8s.io/v1", "coordination.k8s.io/v1", "apiextensions.k8s.io/v1",
		"autoscaling/v2", "storage.k8s.io/v1", "events.k8s.io/v1"}
	apis = append(apis, extra...)
	return Capabilities{
		KubeVersion: KubeVersion{Version: "v" + v, Major: parts[0], Minor: parts[1], GitVersion: "v" + v},
		APIVersions: apis,
		HelmVersion: map[string]string{"Version": "v3-compatible (chart-render)"},
	}, nil
}

// checkKubeVersion refuses a Kubernetes version outside the chart's kubeVersion
// constraint, as Helm does.
func checkKubeVersion(chart Chart, version string) error {
	if chart.KubeVersion == "" {
		return nil
	}
	c, err := semver.NewConstraint(chart.KubeVersion)
	if err != nil {
		return fmt.Errorf("Chart.yaml: kubeVersion %q: %v", chart.KubeVersion, err)
	}
	v, err := semver.NewVersion(version)
	if err != nil {
		return fmt.Errorf("--kube-version %q: %v", version, err)
	}
	if !c.Check(v) {
		return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
			chart.KubeVersion, version)
	}
	return nil
}

type document struct {
	source string
	kind   string
	body   string
}

// render executes every template whose file name does not start with "_" (and is not
// NOTES.txt) and splits the output into documents.
func render(chartName string, templates map[string]string, top map[string]interface{}) ([]document, error) {
	root := template.New("chart-render")
	// Missing values render as empty, and "<no value>" is removed, as in Helm.
	root.Option("missingkey=zero")
	depth := 0
	funcs := funcMap()
	funcs["include"] = func(name string, data interface{}) (string, error) {
		if depth >= maxIncludeDepth {
			return "", fmt.Errorf("include %q: rendering went %d levels deep", name, depth)
		}
		depth++
		defer func() { depth-- }()
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		if depth >= maxIncludeDepth {
			return "", fmt.Errorf("tpl: rendering went %d levels deep", depth)
		}
		depth++
		defer func() { depth-- }()
		clone, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err := clone.New("tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	root.Funcs(funcs)

	names := make([]string, 0, len(templates))
	for n := range templates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		full := chartName + "/" + n
		if _, err := root.New(full).Parse(templates[n]); err != nil {
			return nil, err
		}
	}
	var docs []document
	for _, n := range names {
		base := path.Base(n)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		full := chartName + "/" + n
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = TemplateInfo{Name: full, BasePath: chartName + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, full, data); err != nil {
			return nil, err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		split, err := splitDocs(full, text)
		if err != nil {
			return nil, err
		}
		docs = append(docs, split...)
	}
	return docs, nil
}

// splitDocs cuts a template's output at "---" lines, drops empty documents and checks
// that each one is a YAML mapping with apiVersion and kind.
func splitDocs(source, text string) ([]document, error) {
	var docs []document
	var cur []string
	flush := func() error {
		body := strings.TrimSpace(strings.Join(cur, "\n"))
		cur = nil
		if body == "" || onlyComments(body) {
			return nil
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		var obj map[string]interface{}
		if err := yaml.Unmarshal([]byte(body), &obj); err != nil {
			return fmt.Errorf("%s: the output is not valid YAML: %v\n%s", source, err, numbered(body))
		}
		if err := yaml.Unmarshal([]byte(body), &head); err != nil || head.APIVersion == "" || head.Kind == "" {
			return fmt.Errorf("%s: a document without apiVersion and kind:\n%s", source, numbered(body))
		}
		docs = append(docs, document{source: source, kind: head.Kind, body: body})
		return nil
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimRight(line, " \t") == "---" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		cur = append(cur, line)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

func onlyComments(body string) bool {
	for _, l := range strings.Split(body, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

func numbered(body string) string {
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = fmt.Sprintf("%4d| %s", i+1, l)
	}
	return strings.Join(lines, "\n")
}

// crdDocs returns the chart's crds/*.yaml as they are (Helm does not template them).
func crdDocs(dir, chartName string) ([]document, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var docs []document
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		split, err := splitDocs(chartName+"/crds/"+filepath.Base(p), string(data))
		if err != nil {
			return nil, err
		}
		docs = append(docs, split...)
	}
	return docs, nil
}

// installOrder is the order in which Helm installs kinds; other kinds come last.
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

func sortByKind(docs []document) []document {
	rank := map[string]int{}
	for i, k := range installOrder {
		rank[k] = i
	}
	order := func(k string) int {
		if r, ok := rank[k]; ok {
			return r
		}
		return len(installOrder)
	}
	sort.SliceStable(docs, func(i, j int) bool { return order(docs[i].kind) < order(docs[j].kind) })
	return docs
}

// funcMap is sprig's text functions without env and expandenv (as in Helm), plus
// Helm's own.
func funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	f["mustToYaml"] = func(v interface{}) (string, error) {
		data, err := yaml.Marshal(v)
		if err != nil {
			return "", err
		}
		return strings.TrimSuffix(string(data), "\n"), nil
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []interface{} {
		a := []interface{}{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			a = []interface{}{err.Error()}
		}
		return a
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromJsonArray"] = func(s string) []interface{} {
		a := []interface{}{}
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			a = []interface{}{err.Error()}
		}
		return a
	}
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return v, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	// No cluster to ask: like `helm template`, lookup finds nothing.
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	// Placeholders replaced per render (they need the template set).
	f["include"] = func(string, interface{}) (string, error) { return "", nil }
	f["tpl"] = func(string, interface{}) (string, error) { return "", nil }
	return f
}
