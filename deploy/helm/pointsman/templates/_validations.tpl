{{/* What the chart refuses to render, each with the value to fix; values.schema.json checks each value's
type and allowed words, this what depends on several. */}}
{{- define "pointsman.validate" -}}
{{- $v := .Values -}}
{{- if or (empty $v.inferencePool.modelServers) (not $v.inferencePool.modelServers.matchLabels) -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels of the model-server pods" -}}
{{- end -}}
{{- if not $v.inferencePool.targetPorts -}}
{{- fail "inferencePool.targetPorts needs at least one {number: PORT}" -}}
{{- end -}}
{{- if and (not (include "pointsman.v1Pool" .)) (gt (len $v.inferencePool.targetPorts) 1) -}}
{{- fail "inferencePool.targetPorts: a v1alpha2 InferencePool has one target port" -}}
{{- end -}}
{{- if and (not (include "pointsman.v1Pool" .)) $v.inferenceObjectives -}}
{{- fail "inferenceObjectives need the v1 InferencePool (inferencePool.apiVersion); v1alpha2 pools take models as InferenceModels" -}}
{{- end -}}
{{- if and (not (include "pointsman.v1Pool" .)) $v.inferenceModelRewrites.enabled -}}
{{- fail "inferenceModelRewrites need the v1 InferencePool (inferencePool.apiVersion); v1alpha2 pools take targetModels in their InferenceModels" -}}
{{- end -}}
{{- if and (eq $v.redis.mode "external") (not (or $v.redis.external.url $v.redis.external.existingSecret)) -}}
{{- fail "redis.mode external needs redis.external.url or redis.external.existingSecret" -}}
{{- end -}}
{{- if and (eq $v.redis.mode "external") $v.redis.external.url (not (regexMatch "^(rediss?|unix|rediss?\\+cluster)://" $v.redis.external.url)) -}}
{{- fail "redis.external.url must start with redis://, rediss://, unix:// or redis+cluster:// (rediss+cluster://); for Sentinel set redis.mode sentinel" -}}
{{- end -}}
{{- if and (eq $v.redis.mode "sentinel") (not $v.redis.sentinel.hosts) -}}
{{- fail "redis.mode sentinel needs redis.sentinel.hosts (host:port of each Sentinel)" -}}
{{- end -}}
{{- if and $v.inferenceExtension.tls.clientAuth.enabled (not $v.inferenceExtension.tls.enabled) -}}
{{- fail "inferenceExtension.tls.clientAuth needs inferenceExtension.tls.enabled" -}}
{{- end -}}
{{- if and $v.inferenceExtension.tls.clientAuth.enabled (not $v.inferenceExtension.tls.existingSecret) -}}
{{- fail "inferenceExtension.tls.clientAuth needs inferenceExtension.tls.existingSecret: a CA you keep, to sign the gateways' client certificates with (deploy/k8s/picker-tls.sh)" -}}
{{- end -}}
{{- if and (eq (lower $v.provider.name) "envoy-gateway") $v.provider.envoyGateway.patchPolicy.enabled (not (or $v.experimentalHttpRoute.enabled $v.provider.envoyGateway.httpRouteName)) -}}
{{- fail "provider.envoyGateway.patchPolicy attaches to an HTTPRoute: set experimentalHttpRoute.enabled or provider.envoyGateway.httpRouteName" -}}
{{- end -}}
{{- range $key, $instead := dict "pool" "inferencePool.*" "redis" "redis.*" "models" "models" "objectives" "inferenceObjectives" "apiVersion" "nothing" "kind" "nothing" -}}
{{- if hasKey $v.config $key -}}
{{- fail (printf "config.%s is the chart's to write: set %s instead" $key $instead) -}}
{{- end -}}
{{- end -}}
{{- end -}}
