{{/*
Names. The InferencePool is the release's name and the picker <release>-epp, as upstream's chart names
them, so a gateway, route or dashboard set up for upstream's picker finds Pointsman's under the same names.
*/}}
{{- define "pointsman.base" -}}
{{- .Release.Name | lower | trim | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "pointsman.pool" -}}{{ .Release.Name }}{{- end -}}
{{- define "pointsman.picker" -}}{{ include "pointsman.base" . }}-epp{{- end -}}
{{- define "pointsman.collector" -}}{{ include "pointsman.base" . }}-collector{{- end -}}
{{- define "pointsman.redis" -}}{{ include "pointsman.base" . }}-redis{{- end -}}
{{- define "pointsman.config" -}}{{ include "pointsman.base" . }}-config{{- end -}}
{{- define "pointsman.tlsProxy" -}}{{ include "pointsman.picker" . }}-tls-proxy{{- end -}}

{{- define "pointsman.tlsSecret" -}}
{{- .Values.inferenceExtension.tls.existingSecret | default (printf "%s-tls" (include "pointsman.picker" .)) -}}
{{- end -}}

{{- define "pointsman.redisSecret" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecret -}}
{{- else -}}
{{- include "pointsman.redis" . -}}
{{- end -}}
{{- end -}}

{{- define "pointsman.redisSecretKey" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecretKey | default "url" -}}
{{- else -}}url{{- end -}}
{{- end -}}

{{/* Labels: every object gets these; a component's pods are selected by name + instance. */}}
{{- define "pointsman.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: pointsman
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "name" "picker") */}}
{{- define "pointsman.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{- define "pointsman.componentLabels" -}}
{{ include "pointsman.labels" .ctx }}
app.kubernetes.io/name: {{ .name }}
{{- end -}}

{{/* image: (dict "image" .Values.x.image "ctx" $) */}}
{{- define "pointsman.image" -}}
{{- $tag := .image.tag | default .ctx.Chart.AppVersion -}}
{{- if .image.registry -}}
{{ .image.registry }}/{{ .image.repository }}:{{ $tag }}
{{- else -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* The pod and container security contexts the restricted Pod Security Standard asks for. */}}
{{- define "pointsman.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "pointsman.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/*
The TLS sidecar's Envoy bootstrap is deploy/k8s/base/picker-tls-proxy.yaml, or with clientAuth
deploy/k8s/components/picker-mtls/picker-tls-proxy.yaml (files/ holds copies of both, `make chart-files`): the port it serves TLS
on and the loopback address it passes ext_proc to are read from it, so the picker's config, the
container ports and the Service follow it. The certificate (and the client CA) come by SDS from the
files beside it in the same ConfigMap, re-read when the Secret changes.
*/}}
{{- define "pointsman.tlsProxyBootstrap" -}}
{{- if .Values.inferenceExtension.tls.clientAuth.enabled -}}
{{- .Files.Get "files/picker-tls-proxy-mtls.yaml" -}}
{{- else -}}
{{- .Files.Get "files/picker-tls-proxy.yaml" -}}
{{- end -}}
{{- end -}}

{{- define "pointsman.tlsProxyPort" -}}
{{- $bootstrap := include "pointsman.tlsProxyBootstrap" . | fromYaml -}}
{{- (index $bootstrap.static_resources.listeners 0).address.socket_address.port_value -}}
{{- end -}}

{{- define "pointsman.tlsProxyUpstream" -}}
{{- $bootstrap := include "pointsman.tlsProxyBootstrap" . | fromYaml -}}
{{- $cluster := index $bootstrap.static_resources.clusters 0 -}}
{{- $address := (index (index $cluster.load_assignment.endpoints 0).lb_endpoints 0).endpoint.address.socket_address -}}
{{- printf "%s:%v" $address.address $address.port_value -}}
{{- end -}}

{{/* Ports the picker and the collector listen on (the config's picker.* and collector.listen). */}}
{{- define "pointsman.pickerPort" -}}9002{{- end -}}
{{- define "pointsman.healthPort" -}}9003{{- end -}}
{{- define "pointsman.metricsPort" -}}9090{{- end -}}
{{- define "pointsman.collectorPort" -}}9100{{- end -}}

{{- define "pointsman.pickerListen" -}}
{{- if .Values.inferenceExtension.tls.enabled -}}
{{- include "pointsman.tlsProxyUpstream" . -}}
{{- else -}}
0.0.0.0:{{ include "pointsman.pickerPort" . }}
{{- end -}}
{{- end -}}

{{/* The container port the Service's ext_proc port goes to: the sidecar's with TLS, else the picker's. */}}
{{- define "pointsman.extProcTargetPort" -}}
{{- if .Values.inferenceExtension.tls.enabled -}}
{{- include "pointsman.tlsProxyPort" . -}}
{{- else -}}
{{- include "pointsman.pickerPort" . -}}
{{- end -}}
{{- end -}}

{{/* The Redis URL the services get as REDIS_URL (the Secret's `url`), for the modes the chart writes. */}}
{{- define "pointsman.redisUrl" -}}
{{- $redis := .Values.redis -}}
{{- if eq $redis.mode "bundled" -}}
{{- printf "redis://:%s@%s:6379/0" (include "pointsman.redisPassword" .) (include "pointsman.redis" .) -}}
{{- else if eq $redis.mode "external" -}}
{{- $redis.external.url -}}
{{- else -}}
{{- $auth := "" -}}
{{- /* Percent-encoded: a password may hold "@", "/" or ":". */ -}}
{{- if $redis.sentinel.password -}}{{- $auth = printf ":%s@" ($redis.sentinel.password | urlquery | replace "+" "%20") -}}{{- end -}}
{{- printf "redis+sentinel://%s%s/%s/%v" $auth (join "," $redis.sentinel.hosts) $redis.sentinel.masterName $redis.sentinel.db -}}
{{- end -}}
{{- end -}}

{{/* The bundled Redis's password: the value, else the one already in the cluster, else a new one. */}}
{{- define "pointsman.redisPassword" -}}
{{- if .Values.redis.bundled.password -}}
{{- .Values.redis.bundled.password -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "pointsman.redis" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- /* Computed once per render: every template that needs it reads the same value. */ -}}
{{- if not (hasKey .Values.redis.bundled "_generated") -}}
{{- $_ := set .Values.redis.bundled "_generated" (randAlphaNum 32) -}}
{{- end -}}
{{- .Values.redis.bundled._generated -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The gateways allowed to call the picker's ext_proc port, as NetworkPolicy peers (a YAML list). */}}
{{- define "pointsman.gatewayPeers" -}}
{{- $provider := lower .Values.provider.name -}}
{{- if .Values.networkPolicy.gatewayPeers -}}
{{- toYaml .Values.networkPolicy.gatewayPeers -}}
{{- else if eq $provider "envoy-gateway" -}}
- namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: {{ .Values.provider.envoyGateway.namespace }}}
  podSelector:
    matchLabels: {app.kubernetes.io/managed-by: envoy-gateway, app.kubernetes.io/component: proxy}
{{- else if eq $provider "istio" -}}
- namespaceSelector: {}
  podSelector:
    matchLabels: {gateway.networking.k8s.io/gateway-name: {{ .Values.experimentalHttpRoute.inferenceGatewayName }}}
{{- else if eq $provider "none" -}}
- namespaceSelector: {}
  podSelector:
    matchLabels: {pointsman.dev/gateway: "true"}
{{- end -}}
{{- end -}}

{{/* Who may read the picker's metrics and the collectors' port, as NetworkPolicy peers (a YAML list). */}}
{{- define "pointsman.scraperPeers" -}}
{{- if .Values.networkPolicy.scraperPeers -}}
{{- toYaml .Values.networkPolicy.scraperPeers -}}
{{- else if eq (lower .Values.provider.name) "gke" -}}
- namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: gmp-system}
{{- else -}}
- namespaceSelector: {}
  podSelector:
    matchLabels: {app.kubernetes.io/name: prometheus}
{{- end -}}
{{- end -}}

{{- define "pointsman.poolGroup" -}}
{{- index (splitList "/" .Values.inferencePool.apiVersion) 0 -}}
{{- end -}}

{{- define "pointsman.v1Pool" -}}
{{- if eq .Values.inferencePool.apiVersion "inference.networking.k8s.io/v1" -}}true{{- end -}}
{{- end -}}
