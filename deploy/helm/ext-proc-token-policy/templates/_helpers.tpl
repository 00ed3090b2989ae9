{{/* The objects' names are fixed (the gateway wiring and the ConfigMap name them): one
release per namespace. */}}

{{- define "ext-proc-token-policy.labels" -}}
app.kubernetes.io/name: ext-proc-token-policy
app.kubernetes.io/part-of: ext-proc-token-policy
{{- end }}

{{- define "ext-proc-token-policy.selector" -}}
app.kubernetes.io/name: ext-proc-token-policy
{{- end }}

{{- define "ext-proc-token-policy.redisLabels" -}}
app.kubernetes.io/name: ext-proc-redis
app.kubernetes.io/part-of: ext-proc-token-policy
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
redis://ext-proc-redis:6379/0
{{- else if .Values.redis.url -}}
{{ .Values.redis.url }}
{{- else -}}
{{ fail "redis.enabled is false and redis.url is empty: the replicas need a shared record of spent proofs" }}
{{- end }}
{{- end }}
