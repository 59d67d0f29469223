{{/* Name of the release's objects: the release name, with the chart's unless it has it. */}}
{{- define "streamlimit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "streamlimit.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "streamlimit.labels" -}}
{{ include "streamlimit.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
streamlimit.io/site: {{ .Values.site | quote }}
{{- end -}}

{{- define "streamlimit.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) | quote }}
{{- end -}}

{{- define "streamlimit.site" -}}
{{- if not .Values.site -}}
{{- fail "site is required: this data center's name (and its MirrorMaker 2 alias)" -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9][a-z0-9-]*$" .Values.site) -}}
{{- fail "site must be lower-case letters, digits and '-' (it prefixes topic names: <site>.hits)" -}}
{{- end -}}
{{- .Values.site -}}
{{- end -}}

{{/* The Kafka flags shared by every command. */}}
{{- define "streamlimit.kafkaArgs" -}}
{{- $_ := include "streamlimit.site" . -}}
{{- if not .Values.kafka.brokers -}}
{{- fail "kafka.brokers is required: this data center's Kafka" -}}
{{- end -}}
- --brokers={{ join "," .Values.kafka.brokers }}
{{- with .Values.kafka.sasl.mechanism }}
- --kafka-sasl-mechanism={{ . }}
{{- end }}
{{- with .Values.kafka.sasl.user }}
- --kafka-sasl-user={{ . }}
{{- end }}
{{- end -}}

{{- define "streamlimit.commonArgs" -}}
- --log-format={{ .Values.logFormat }}
- --log-level={{ .Values.logLevel }}
{{- end -}}

{{/* Environment shared by every container: secrets stay out of args. */}}
{{- define "streamlimit.kafkaEnv" -}}
{{- if .Values.kafka.sasl.passwordSecret.name -}}
- name: STREAMLIMIT_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.passwordSecret.name }}
      key: {{ .Values.kafka.sasl.passwordSecret.key }}
{{- end }}
{{- end -}}

{{- define "streamlimit.topicArgs" -}}
- --hits-topic={{ .Values.topics.hitsTopic }}
- --counts-topic={{ .Values.topics.countsTopic }}
{{- end -}}

{{- define "streamlimit.aggregatorName" -}}
{{ include "streamlimit.fullname" . }}-aggregator
{{- end -}}

{{- define "streamlimit.enforcerEnv" -}}
{{ include "streamlimit.kafkaEnv" . }}
{{- if .Values.redis.passwordSecret.name }}
- name: STREAMLIMIT_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.passwordSecret.name }}
      key: {{ .Values.redis.passwordSecret.key }}
{{- end }}
{{- with .Values.enforcer.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
