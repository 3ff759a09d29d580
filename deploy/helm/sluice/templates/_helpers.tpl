{{- define "sluice.name" -}}
{{- if eq .Values.mode "proxy" }}{{ .Release.Name }}-proxy{{ else }}{{ .Release.Name }}{{ end -}}
{{- end }}

{{- define "sluice.selector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "sluice.labels" -}}
{{ include "sluice.selector" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "sluice.healthPort" -}}
{{- if eq .Values.mode "proxy" }}admin{{ else }}http{{ end -}}
{{- end }}
