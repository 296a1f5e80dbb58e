{{/*
Names and pieces of the admission webhook (templates/webhook.yaml), shared with the controller's
Deployment (environment, certificate volume) and RBAC.
*/}}

{{- define "vgpu-dra.webhookEnabled" -}}
{{- if and .Values.controller.enabled .Values.webhook.enabled }}true{{ end -}}
{{- end -}}

{{- define "vgpu-dra.webhookName" -}}
{{- printf "%s-webhook" (include "vgpu-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu-dra.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "vgpu-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu-dra.webhookCertDir" -}}/etc/vgpu-dra/webhook-tls{{- end -}}

{{/*
The legacy names that route a pod to the mutating webhook. They mirror
controller/webhook/legacy.py (RESOURCES, RESOURCE_PREFIXES, ANNOTATION_BY_KEY, VGPU_SCHEDULER);
tests/unit/deploy/test_webhook_chart.py fails when the rendered matchConditions differ from
controller.webhook.translate.match_conditions() for the same values.
*/}}
{{- define "vgpu-dra.webhookMatchExpression" -}}
{{- $resources := list "nvidia.com/gpu" "nvidia.com/gpucores" "nvidia.com/gpumem" "nvidia.com/gpumem-percentage" "nvidia.com/vcuda-core" "nvidia.com/vcuda-memory" "nvidia.com/vgpu-cores" "nvidia.com/vgpu-memory" "nvidia.com/vgpu-number" -}}
{{- range $name, $_ := .Values.webhook.sharedResources }}{{ $resources = append $resources $name }}{{ end -}}
{{- $annotations := list "hami.io/gpu-scheduler-policy" "hami.io/node-scheduler-policy" "nvidia.com/device-scheduler-policy" "nvidia.com/device-topology-mode" "nvidia.com/exclude-gpu-type" "nvidia.com/exclude-gpu-uuid" "nvidia.com/include-gpu-type" "nvidia.com/include-gpu-uuid" "nvidia.com/node-scheduler-policy" "nvidia.com/nouse-gputype" "nvidia.com/nouse-gpuuuid" "nvidia.com/use-gputype" "nvidia.com/use-gpuuuid" "nvidia.com/vcuda-core-limit" "nvidia.com/vgpu-compute-policy" "nvidia.com/vgpu-mode" "vgpu.dra.dev/compute-policy" "vgpu.dra.dev/device-policy" "vgpu.dra.dev/device-scheduler-policy" "vgpu.dra.dev/device-topology-mode" "vgpu.dra.dev/exclude-gpu-type" "vgpu.dra.dev/exclude-gpu-uuid" "vgpu.dra.dev/gpu-type" "vgpu.dra.dev/gpu-uuid" "vgpu.dra.dev/include-gpu-type" "vgpu.dra.dev/include-gpu-uuid" "vgpu.dra.dev/memory-percentage" "vgpu.dra.dev/node-policy" "vgpu.dra.dev/node-scheduler-policy" "vgpu.dra.dev/topology" -}}
{{- $prefixList := list -}}
{{- range (list "nvidia.com/mig-" | sortAlpha) }}{{ $prefixList = append $prefixList (printf "r.startsWith(%s)" (toJson .)) }}{{ end -}}
{{- $prefixes := join " || " $prefixList -}}
{{- $res := list -}}
{{- range ($resources | uniq | sortAlpha) }}{{ $res = append $res (toJson .) }}{{ end -}}
{{- $ann := list -}}
{{- range ($annotations | sortAlpha) }}{{ $ann = append $ann (toJson .) }}{{ end -}}
{{- $resList := printf "[%s]" (join ", " $res) -}}
{{- $annList := printf "[%s]" (join ", " $ann) -}}
{{- $parts := list "(has(object.spec.schedulerName) && object.spec.schedulerName == \"vgpu-scheduler\")" (printf "(has(object.metadata.annotations) && %s.exists(a, a in object.metadata.annotations))" $annList) -}}
{{- range (list "containers" "initContainers") -}}
{{- $per := printf "has(c.resources) && ((has(c.resources.limits) && (%s.exists(r, r in c.resources.limits) || c.resources.limits.exists(r, %s))) || (has(c.resources.requests) && (%s.exists(r, r in c.resources.requests) || c.resources.requests.exists(r, %s))))" $resList $prefixes $resList $prefixes -}}
{{- $parts = append $parts (printf "(has(object.spec.%s) && object.spec.%s.exists(c, %s))" . . $per) -}}
{{- end -}}
{{- join " || " $parts -}}
{{- end -}}

{{/* CEL: the DRA object (its `devices`, at `path`) configures our driver (opaque VgpuConfig). */}}
{{- define "vgpu-dra.webhookClaimConfigExpression" -}}
{{- $ctx := index . 0 -}}
{{- $path := index . 1 -}}
{{- printf "has(%s) && has(%s.config) && %s.config.exists(c, has(c.opaque) && c.opaque.driver == %s)" $path $path $path (toJson $ctx.Values.driverName) -}}
{{- end -}}

{{/* CEL: the DRA object (its `devices`, at `path`) has a request of a DeviceClass of ours. */}}
{{- define "vgpu-dra.webhookClaimClassExpression" -}}
{{- $ctx := index . 0 -}}
{{- $path := index . 1 -}}
{{- $classes := list -}}
{{- range $ctx.Values.deviceClasses }}{{ $classes = append $classes (toJson (default $ctx.Values.driverName .name)) }}{{ end -}}
{{- $classList := printf "[%s]" (join ", " $classes) -}}
{{- printf "has(%s) && has(%s.requests) && %s.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName in %s) || (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in %s)))" $path $path $path $classList $classList -}}
{{- end -}}

{{/* Environment of the controller container for the webhook. */}}
{{- define "vgpu-dra.webhookEnv" -}}
{{- if include "vgpu-dra.webhookEnabled" . }}
- name: VGPU_DRA_WEBHOOK_PORT
  value: {{ .Values.controller.webhookPort | quote }}
- name: VGPU_DRA_WEBHOOK_BIND
  value: {{ .Values.webhook.bindAddress | quote }}
- name: VGPU_DRA_WEBHOOK_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: VGPU_DRA_WEBHOOK_SERVICE
  value: {{ include "vgpu-dra.controllerName" . | quote }}
- name: VGPU_DRA_WEBHOOK_CONFIG_NAMES
  value: {{ include "vgpu-dra.webhookName" . | quote }}
- name: VGPU_DRA_WEBHOOK_TEMPLATE_GRACE
  value: {{ .Values.webhook.templateGrace | quote }}
- name: VGPU_DRA_WEBHOOK_DRAIN
  value: {{ .Values.webhook.drain | quote }}
{{- if .Values.webhook.clientCA.configMap }}
- name: VGPU_DRA_WEBHOOK_CLIENT_CA
  value: {{ printf "%s/%s" (include "vgpu-dra.webhookClientCADir" .) .Values.webhook.clientCA.key | quote }}
{{- end }}
{{- if .Values.webhook.certManager.enabled }}
- name: VGPU_DRA_WEBHOOK_CERT_DIR
  value: {{ include "vgpu-dra.webhookCertDir" . | quote }}
{{- else }}
- name: VGPU_DRA_WEBHOOK_SECRET
  value: {{ include "vgpu-dra.webhookSecretName" . | quote }}
- name: VGPU_DRA_WEBHOOK_CA_LIFETIME
  value: {{ .Values.webhook.certificates.caLifetime | quote }}
- name: VGPU_DRA_WEBHOOK_CERT_LIFETIME
  value: {{ .Values.webhook.certificates.certLifetime | quote }}
{{- end }}
{{- with .Values.webhook.sharedResources }}
{{- $pairs := list }}
{{- range $name, $n := . }}{{ $pairs = append $pairs (printf "%s=%v" $name $n) }}{{ end }}
- name: VGPU_DRA_SHARED_RESOURCES
  value: {{ join "," $pairs | quote }}
{{- end }}
{{- with .Values.webhook.sharedResourceMemoryMiB }}
{{- $pairs := list }}
{{- range $name, $mib := . }}{{ $pairs = append $pairs (printf "%s=%v" $name $mib) }}{{ end }}
- name: VGPU_DRA_SHARED_MEMORY
  value: {{ join "," $pairs | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where the CA of the API server's client certificate is mounted (webhook.clientCA). */}}
{{- define "vgpu-dra.webhookClientCADir" -}}/etc/vgpu-dra/webhook-client-ca{{- end -}}

{{- define "vgpu-dra.webhookVolumeMounts" -}}
{{- if include "vgpu-dra.webhookEnabled" . }}
{{- if .Values.webhook.certManager.enabled }}
- name: webhook-tls
  mountPath: {{ include "vgpu-dra.webhookCertDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.webhook.clientCA.configMap }}
- name: webhook-client-ca
  mountPath: {{ include "vgpu-dra.webhookClientCADir" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "vgpu-dra.webhookVolumes" -}}
{{- if include "vgpu-dra.webhookEnabled" . }}
{{- if .Values.webhook.certManager.enabled }}
- name: webhook-tls
  secret:
    secretName: {{ include "vgpu-dra.webhookSecretName" . }}
    defaultMode: 0440
{{- end }}
{{- if .Values.webhook.clientCA.configMap }}
- name: webhook-client-ca
  configMap:
    name: {{ .Values.webhook.clientCA.configMap }}
    items:
      - {key: {{ .Values.webhook.clientCA.key }}, path: {{ .Values.webhook.clientCA.key }}}
{{- end }}
{{- end }}
{{- end -}}
