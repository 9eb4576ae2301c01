{{/* The image of the installer and the controller: repository:tag, tag defaulting to the chart's appVersion. */}}
{{- define "thereabouts.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The node's CNI configuration directory, where the plugin reads its flat file,
     kubeconfig and etcd certificates (the hostPath the installer writes into). */}}
{{- define "thereabouts.hostConfDir" -}}
{{ .Values.node.cniConfDir }}
{{- end -}}

{{/* KUBERNETES_SERVICE_HOST/PORT overridden by apiServer.host/port, for the
     installer and the controller (container env entries, or nothing). */}}
{{- define "thereabouts.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | quote }}
{{- end }}
{{- end -}}

{{/* The flat file (thereabouts.d/thereabouts.conf) the installer writes on every
     node, as JSON: the datastore and how to reach it, the directory of the
     installer's nodename file, then flatFile.settings. The installer has the
     plugin check it before it writes it. */}}
{{- define "thereabouts.flatFile" -}}
{{- $dir := printf "%s/thereabouts.d" (include "thereabouts.hostConfDir" .) -}}
{{- $f := .Values.flatFile -}}
{{- $file := dict "datastore" $f.datastore "configuration_path" $dir -}}
{{- if eq $f.datastore "kubernetes" -}}
{{- $_ := set $file "kubernetes" (dict "kubeconfig" ($f.kubernetes.kubeconfig | default (printf "%s/thereabouts.kubeconfig" $dir))) -}}
{{- else -}}
{{- $_ := set $file "etcd_host" (join "," $f.etcd.hosts) -}}
{{- with $f.etcd.prefix }}{{ $_ := set $file "etcd_prefix" . }}{{ end -}}
{{- if $f.etcd.tlsSecret -}}
{{- $_ := set $file "etcd_ca_cert_file" (printf "%s/etcd/ca.crt" $dir) -}}
{{- $_ := set $file "etcd_cert_file" (printf "%s/etcd/tls.crt" $dir) -}}
{{- $_ := set $file "etcd_key_file" (printf "%s/etcd/tls.key" $dir) -}}
{{- end -}}
{{- end -}}
{{- merge $file $f.settings | toJson -}}
{{- end -}}
