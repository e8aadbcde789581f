{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "nightjar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every resource name: the release name when it already says "nightjar". */}}
{{- define "nightjar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Operator objects: Deployment, Service, ClusterRole(s), bindings. */}}
{{- define "nightjar.operator.fullname" -}}
{{- printf "%s-operator" (include "nightjar.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nightjar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nightjar.labels" -}}
helm.sh/chart: {{ include "nightjar.chart" . }}
{{ include "nightjar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nightjar
{{- end }}

{{- define "nightjar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nightjar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nightjar.operator.selectorLabels" -}}
{{ include "nightjar.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "nightjar.operator.labels" -}}
{{ include "nightjar.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "nightjar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nightjar.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nightjar.operator.image" -}}
{{- $img := .Values.operator.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves monitoring.coreos.com/v1 (Prometheus Operator); `helm template`
     users pass --api-versions monitoring.coreos.com/v1 to get the objects. */}}
{{- define "nightjar.monitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Namespace the dashboards ConfigMaps go to (Grafana's sidecar may watch a fixed one). */}}
{{- define "nightjar.dashboards.namespace" -}}
{{- default .Release.Namespace .Values.dashboards.namespace }}
{{- end }}

{{/* NetworkPolicyPeers the operator adds to every NightjarDeployment's NetworkPolicy (JSON): its own
     pods (the fleet loop scrapes each worker's :8000/metrics) and networkPolicy.extraFrom. The
     namespace is matched by the kubernetes.io/metadata.name label (automatic from Kubernetes 1.21). */}}
{{- define "nightjar.networkPolicyPeers" -}}
{{- $operator := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "nightjar.operator.selectorLabels" . | fromYaml)) }}
{{- prepend .Values.networkPolicy.extraFrom $operator | toJson }}
{{- end }}
