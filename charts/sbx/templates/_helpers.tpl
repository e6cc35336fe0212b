{{/*
Names and labels shared by the templates of the sbx chart.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "sbx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the objects: fullnameOverride, or "<release>-<chart>" (just the release
name when it already contains the chart name). At most 52 characters: a StatefulSet's
pods add "-<ordinal>" and its claims "data-" in front, and names of labels stop at 63.
*/}}
{{- define "sbx.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "sbx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sbx.labels" -}}
helm.sh/chart: {{ include "sbx.chart" . }}
{{ include "sbx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the pods (never change them: a StatefulSet's selector is immutable). */}}
{{- define "sbx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sbx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "sbx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sbx.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespace of the leader-election Lease. */}}
{{- define "sbx.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.leaseNamespace }}
{{- end }}

{{/*
The --kube_pool_namespace to pass: kube.poolNamespace, which with watchNamespace set must
be that namespace (the Role grants nothing elsewhere). Empty: the server's default.
*/}}
{{- define "sbx.poolNamespace" -}}
{{- $pool := .Values.kube.poolNamespace }}
{{- if and .Values.watchNamespace $pool (ne $pool .Values.watchNamespace) }}
{{- fail (printf "kube.poolNamespace %q must be empty or equal to watchNamespace %q: sbx may act only in the watched namespace" $pool .Values.watchNamespace) }}
{{- end }}
{{- $pool }}
{{- end }}

{{/* The Secret with the key of the sandboxes' daemon secrets (in the release namespace). */}}
{{- define "sbx.sandboxKeySecret" -}}
{{- default (printf "%s-sandbox-key" (include "sbx.fullname" .)) .Values.sandboxKey.secretName }}
{{- end }}

{{/* True (non-empty) when the replicas elect a leader. */}}
{{- define "sbx.leaderElection" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
The rules sbx needs on the agents.x-k8s.io objects and the objects it makes for them, in
the watched namespace(s). tests/chart/chart_test.py runs sbx-server against the API
emulator and checks every request it makes against these rules, and that every rule is
used (or listed there with the reason it is kept).
*/}}
{{- define "sbx.rules" -}}
# Sandboxes: watched; created as warm-pool members and cold claims, relabelled and
# re-owned when a claim binds one (merge patch), deleted at scale-down, release and
# expiry; status written with a merge patch.
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion on objects owned by Sandboxes, claims and pools
# (the OwnerReferencesPermissionEnforcement admission plugin asks for this).
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes/finalizers"]
  verbs: ["update"]
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxwarmpools/finalizers", "sandboxclaims/finalizers",
              "sandboxtemplates/finalizers"]
  verbs: ["update"]
# Templates and pools are read (informers); pool status is written.
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxtemplates", "sandboxwarmpools"]
  verbs: ["list", "watch"]
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxwarmpools/status"]
  verbs: ["patch"]
# Claims: watched; claims made over gRPC are created as SandboxClaims (read back when the
# create finds one already there) and deleted on release; status written; with
# kube.claimAnnotations (the default), annotated with upstream's sandbox-name and
# controller-first-observed-at (merge patch).
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxclaims"]
  verbs: ["get", "list", "watch", "create", "delete"{{ if .Values.kube.claimAnnotations }}, "patch"{{ end }}]
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxclaims/status"]
  verbs: ["patch"]
# What a Sandbox is made of. Read from informers (list, watch); a pod is read directly
# after a create that found one already there, and patched with a claim's
# additionalPodMetadata. PVCs are never deleted by sbx: they go with their Sandbox
# (garbage collection).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# The NetworkPolicy "<template>-network-policy" of each SandboxTemplate: watched (informer),
# created, replaced with an update when it drifts from the template, deleted when the
# template turns Unmanaged (with the template, garbage collection deletes it). Never read
# directly and never patched.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "update", "delete"]
{{- end }}

{{/*
--kube_server_pod_labels: the labels that select sbx-server's pods (sbx.selectorLabels as
k=v,k=v), which the default NetworkPolicy of each SandboxTemplate admits to sbx-sandboxd.
*/}}
{{- define "sbx.serverPodLabelsFlag" -}}
{{- $pairs := list }}
{{- range $k, $v := (include "sbx.selectorLabels" . | fromYaml) }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
