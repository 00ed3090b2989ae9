{{/* The release's name for its objects, the usual Helm rule: fullnameOverride, else the
release name when it contains the chart's name, else "<release>-<name>"; at most 63
characters. A release named ext-proc-token-policy (how deploy/kubernetes is rendered)
keeps the names the shipped wiring uses. The Service <fullname>-headless must be a DNS
label too, so a longer fullname fails the render instead of being cut into a clash. */}}
{{- define "ext-proc-token-policy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ext-proc-token-policy.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- $full = .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $full = printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- if gt (len $full) 54 -}}
{{- fail (printf "the objects' name %q is longer than 54 characters (its Service %s-headless must be a DNS label): set fullnameOverride" $full $full) -}}
{{- end -}}
{{- $full -}}
{{- end }}

{{/* The chart's Redis and its Secret: ext-proc-redis for the fullname
ext-proc-token-policy, <fullname without -token-policy>-redis for any other. */}}
{{- define "ext-proc-token-policy.redisName" -}}
{{- printf "%s-redis" (include "ext-proc-token-policy.fullname" . | trimSuffix "-token-policy") -}}
{{- end }}

{{- define "ext-proc-token-policy.redisAuthSecret" -}}
{{- printf "%s-auth" (include "ext-proc-token-policy.redisName" .) -}}
{{- end }}

{{- define "ext-proc-token-policy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; the selectors hold the name and the instance, so the
objects of two releases in one namespace never select each other's pods. */}}
{{- define "ext-proc-token-policy.commonLabels" -}}
helm.sh/chart: {{ include "ext-proc-token-policy.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ext-proc-token-policy
{{- end }}

{{- define "ext-proc-token-policy.selector" -}}
app.kubernetes.io/name: {{ include "ext-proc-token-policy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ext-proc-token-policy.labels" -}}
{{ include "ext-proc-token-policy.selector" . }}
{{ include "ext-proc-token-policy.commonLabels" . }}
{{- end }}

{{- define "ext-proc-token-policy.redisSelector" -}}
app.kubernetes.io/name: ext-proc-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ext-proc-token-policy.redisLabels" -}}
{{ include "ext-proc-token-policy.redisSelector" . }}
{{ include "ext-proc-token-policy.commonLabels" . }}
{{- end }}

{{- define "ext-proc-token-policy.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}
{{- end }}

{{/* The gateway's Envoy pods: the NetworkPolicy admits them, Istio's EnvoyFilter
selects them. */}}
{{- define "ext-proc-token-policy.gatewayPodLabels" -}}
{{- if .Values.gateway.podLabels -}}
{{ toYaml .Values.gateway.podLabels }}
{{- else -}}
gateway.networking.k8s.io/gateway-name: {{ .Values.gateway.name }}
{{- end }}
{{- end }}

{{/* What the chart's Redis lets the processor do: the record's keys (PREFIX and SINCE
of ext_proc/edge/redis_record.py), the commands redis-py sends for its script (EVALSHA,
SCRIPT LOAD when the script is not cached), those the script calls (INFO, TIME, GET,
SET) and the start-up check's INFO. */}}
{{- define "ext-proc-token-policy.redisACL" -}}
resetkeys ~ext_proc:* resetchannels -@all +evalsha +script|load +info +time +get +set
{{- end }}

{{/* The record of spent proofs: the chart's Redis or the external one; neither fails
the render (the replicas would each keep their own record and a replay would pass). */}}
{{- define "ext-proc-token-policy.redisURL" -}}
{{- if .Values.redis.enabled -}}
redis://{{ include "ext-proc-token-policy.redisName" . }}:6379/0
{{- else if .Values.redis.url -}}
{{ .Values.redis.url }}
{{- else -}}
{{ fail "redis.enabled is false and redis.url is empty: the replicas need a shared record of spent proofs" }}
{{- end }}
{{- end }}
