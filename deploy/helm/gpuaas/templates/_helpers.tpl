{{/* The gpuaas image every gpuaas container runs. */}}
{{- define "gpuaas.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A component's config file: its `config` value as YAML. (list $ "extender") */}}
{{- define "gpuaas.config" -}}
{{- toYaml (index (index . 0).Values (index . 1) "config") }}
{{- end }}

{{/* The nodescaler's config file. Its Lease lives in the release namespace: that is where its Role grants it. */}}
{{- define "gpuaas.nodescalerConfig" -}}
{{- $config := deepCopy .Values.nodescaler.config }}
{{- $election := mergeOverwrite (default (dict) $config.leader_election) (dict "namespace" .Release.Namespace) }}
{{- toYaml (set $config "leader_election" $election) }}
{{- end }}

{{/* The gang controller's config file. Its Lease lives in the release namespace: that is where its Role grants it. */}}
{{- define "gpuaas.gangsConfig" -}}
{{- $config := deepCopy .Values.gangs.config }}
{{- $election := mergeOverwrite (default (dict) $config.leader_election) (dict "namespace" .Release.Namespace) }}
{{- toYaml (set $config "leader_election" $election) }}
{{- end }}
