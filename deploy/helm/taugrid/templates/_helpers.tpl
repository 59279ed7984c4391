{{/*
Names and labels. src/kube/render_cluster.cc (`tau cluster render`) derives the same names: keep
the two in step (tests/integration/test_helm_chart.py compares them).
*/}}

{{/* The release's name, or RELEASE-taugrid when the release's name does not say taugrid. */}}
{{- define "taugrid.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "taugrid.version" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "taugrid.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "taugrid.version" .) -}}
{{- end -}}

{{- define "taugrid.serverAccount" -}}
{{- .Values.serviceAccount.server | default (printf "%s-server" (include "taugrid.fullname" .)) -}}
{{- end -}}

{{- define "taugrid.agentAccount" -}}
{{- .Values.serviceAccount.healthAgent | default (printf "%s-health-agent" (include "taugrid.fullname" .)) -}}
{{- end -}}

{{/* Selector labels; call with (dict "root" . "component" "server"). */}}
{{- define "taugrid.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Object labels; call with (dict "root" . "component" "server"). */}}
{{- define "taugrid.labels" -}}
{{ include "taugrid.selectorLabels" . }}
app.kubernetes.io/version: {{ include "taugrid.version" .root | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}
