{{/* Names are cut at 63 characters: the DNS label limit of Kubernetes names. */}}
{{- define "pdd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pdd-operator.fullname" -}}
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

{{/* The metrics Service: a DNS-1035 label, so the suffix must fit in 63 characters too. */}}
{{- define "pdd-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "pdd-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The agent's objects: the full name with a suffix that still fits in 63 characters. */}}
{{- define "pdd-operator.agentName" -}}
{{- printf "%s-topology-agent" (include "pdd-operator.fullname" . | trunc 48 | trimSuffix "-") }}
{{- end }}

{{- define "pdd-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries besides its selector labels. */}}
{{- define "pdd-operator.metaLabels" -}}
helm.sh/chart: {{ include "pdd-operator.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdd
{{- end }}

{{- define "pdd-operator.labels" -}}
app.kubernetes.io/name: {{ include "pdd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "pdd-operator.metaLabels" . }}
{{- end }}

{{/* Selector labels never change across upgrades (a Deployment's selector is immutable). */}}
{{- define "pdd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "pdd-operator.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pdd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: topology-agent
{{- end }}

{{- define "pdd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest; the tag defaults to the chart's appVersion. With
imageRegistry, the repository's last name under that registry instead of its own. */}}
{{- define "pdd-operator.imageRef" -}}
{{- $repository := .image.repository }}
{{- with .registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) (base $repository) }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .appVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "pdd-operator.image" -}}
{{- include "pdd-operator.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion "registry" .Values.imageRegistry) }}
{{- end }}

{{- define "pdd-operator.sidecarImage" -}}
{{- include "pdd-operator.imageRef" (dict "image" .Values.sidecarImage "appVersion" .Chart.AppVersion "registry" .Values.imageRegistry) }}
{{- end }}

{{/* Read with a default: a release upgraded with --reuse-values from a chart before
routerImage has none in its values. */}}
{{- define "pdd-operator.routerImage" -}}
{{- $image := .Values.routerImage | default (dict "repository" "ghcr.io/pdd-dev/pdd-router") }}
{{- include "pdd-operator.imageRef" (dict "image" $image "appVersion" .Chart.AppVersion "registry" .Values.imageRegistry) }}
{{- end }}

{{/* True when the ServiceMonitor is wanted and the cluster can take it. */}}
{{- define "pdd-operator.serviceMonitorEnabled" -}}
{{- $sm := .Values.metrics.serviceMonitor }}
{{- if and $sm.enabled (or $sm.skipCapabilityCheck (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) }}true{{ end }}
{{- end }}

{{- define "pdd-operator.podMonitorsEnabled" -}}
{{- $pm := .Values.metrics.podMonitors | default dict }}
{{- if and $pm.enabled (or $pm.skipCapabilityCheck (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor")) }}true{{ end }}
{{- end }}
