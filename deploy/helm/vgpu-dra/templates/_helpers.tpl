{{/* Names shared by every template. */}}
{{- define "vgpu-dra.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vgpu-dra.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vgpu-dra.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vgpu-dra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "vgpu-dra.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "vgpu-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu-dra.controllerName" -}}
{{- printf "%s-controller" (include "vgpu-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Environment every component reads (log level/format, metrics, tracing). */}}
{{- define "vgpu-dra.commonEnv" -}}
- name: VGPU_DRA_DRIVER_NAME
  value: {{ .Values.driverName | quote }}
- name: VGPU_DRA_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: VGPU_DRA_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- if .Values.metrics.enabled }}
- name: VGPU_DRA_METRICS_ADDRESS
  value: {{ .Values.metrics.address | quote }}
{{- end }}
{{- if .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.tracing.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.sampleRatio | quote }}
{{- end }}
- name: VGPU_DRA_FEATURE_BINDING_CONDITIONS
  value: {{ .Values.features.bindingConditions | quote }}
- name: VGPU_DRA_DEFAULT_COMPUTE_POLICY
  value: {{ .Values.defaults.computePolicy | quote }}
{{- end -}}
