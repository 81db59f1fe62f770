{{/* Names. */}}
{{- define "eventpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eventpipe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "eventpipe.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{- define "eventpipe.agentName" -}}{{ include "eventpipe.fullname" . }}-agent{{- end -}}
{{- define "eventpipe.collectorName" -}}{{ include "eventpipe.fullname" . }}-collector{{- end -}}

{{- define "eventpipe.agentServiceAccount" -}}
{{- default (include "eventpipe.agentName" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "eventpipe.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "eventpipe.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "eventpipe.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "eventpipe.collectorName" .) -}}
{{- else -}}
{{- required "tls.enabled needs tls.existingSecret or tls.certManager.enabled" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "eventpipe.agentTLSSecret" -}}
{{- printf "%s-client-tls" (include "eventpipe.agentName" .) -}}
{{- end -}}

{{/* The collector's in-cluster DNS name. */}}
{{- define "eventpipe.collectorHost" -}}
{{- printf "%s.%s.svc" (include "eventpipe.collectorName" .) (include "eventpipe.namespace" .) -}}
{{- end -}}

{{/* Labels: common (every object) and selector (per component). */}}
{{- define "eventpipe.labels" -}}
app.kubernetes.io/name: {{ include "eventpipe.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "eventpipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eventpipe.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "eventpipe.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Security contexts (values podSecurityContext and
containerSecurityContext): by default every pod and container runs as the
image's user 65532, non-root, read-only, without privilege escalation or
capabilities, under the runtime's seccomp profile. */}}
{{- define "eventpipe.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{- define "eventpipe.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

{{/* The extension points of one container (agent or collector): extraEnv,
extraArgs, extraVolumeMounts; extraVolumes go on the pod. */}}
{{- define "eventpipe.extraArgs" -}}
{{- range .extraArgs }}, {{ . | quote }}{{ end -}}
{{- end -}}

{{- define "eventpipe.collectorServiceAccount" -}}
{{- default (include "eventpipe.collectorName" .) .Values.collector.serviceAccount.name -}}
{{- end -}}

{{/* The collector config's restart-only part: what the collector applies
only at start-up. Sink filters and auth identities (and the tokens file)
are reloaded in place in log: local, so a change of those alone does not
roll the one replica. */}}
{{- define "eventpipe.collectorRestartConfig" -}}
{{- $c := include "eventpipe.collectorConfig" . | fromYaml -}}
{{- $sinks := list -}}
{{- range $c.sinks }}{{ $sinks = append $sinks (omit . "filter") }}{{ end -}}
{{- $_ := set $c "sinks" $sinks -}}
{{- $_ := set $c "auth" (omit $c.auth "identities") -}}
{{- toYaml $c -}}
{{- end -}}

{{/* Pod anti-affinity between the replicas of one component, by node. */}}
{{- define "eventpipe.affinity" -}}
{{- $c := index .root.Values .component -}}
{{- if $c.affinity -}}
{{ toYaml $c.affinity }}
{{- else -}}
podAntiAffinity:
  {{- if eq $c.podAntiAffinity "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "eventpipe.selectorLabels" . | nindent 10 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "eventpipe.selectorLabels" . | nindent 12 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* The agent's config file (agent/config.go). */}}
{{- define "eventpipe.agentConfig" -}}
{{- $collector := dict "token_file" "/var/run/secrets/eventpipe/collector/token" -}}
{{- with .Values.agent.collector.addresses -}}
{{- $_ := set $collector "addresses" . -}}
{{- else -}}
{{- $_ := set $collector "address" (printf "%s:%d" (include "eventpipe.collectorHost" .) (int .Values.collector.grpcPort)) -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $collector "ca_file" "/var/run/secrets/eventpipe/collector-ca/ca.crt" -}}
{{- if .Values.tls.mutualTLS -}}
{{- $_ := set $collector "cert_file" "/var/run/secrets/eventpipe/client-tls/tls.crt" -}}
{{- $_ := set $collector "key_file" "/var/run/secrets/eventpipe/client-tls/tls.key" -}}
{{- end -}}
{{- else -}}
{{- $_ := set $collector "insecure" true -}}
{{- end -}}
{{- $le := dict "enabled" .Values.agent.leaderElection.enabled "namespace" (include "eventpipe.namespace" .) "name" (include "eventpipe.agentName" .) "lease_duration" .Values.agent.leaderElection.leaseDuration "renew_deadline" .Values.agent.leaderElection.renewDeadline "retry_period" .Values.agent.leaderElection.retryPeriod -}}
{{- $base := dict "cluster" .Values.cluster "collector" $collector "leader_election" $le "http" (dict "listen" (printf ":%d" (int .Values.agent.metricsPort))) -}}
{{- toYaml (mergeOverwrite (deepCopy .Values.agent.config) $base) -}}
{{- end -}}

{{/* One sink's shared-layer keys (filter, batch, commit_interval). */}}
{{- define "eventpipe.sinkCommon" -}}
{{- $s := .sink -}}
{{- with $s.filter }}{{ $_ := set $.out "filter" . }}{{ end -}}
{{- with $s.batch }}{{ $_ := set $.out "batch" . }}{{ end -}}
{{- if $s.commitInterval }}{{ $_ := set $.out "commit_interval" $s.commitInterval }}{{ end -}}
{{- end -}}

{{/* The collector's config file (collector/config.go). */}}
{{- define "eventpipe.collectorConfig" -}}
{{- $grpc := dict "listen" (printf "0.0.0.0:%d" (int .Values.collector.grpcPort)) -}}
{{- $auth := dict "tokens_file" (printf "/var/run/secrets/eventpipe/tokens/%s" .Values.auth.tokensKey) -}}
{{- if .Values.tls.enabled -}}
{{- $tls := dict "cert_file" "/var/run/secrets/eventpipe/tls/tls.crt" "key_file" "/var/run/secrets/eventpipe/tls/tls.key" -}}
{{- $ids := list -}}
{{- if .Values.tls.mutualTLS -}}
{{- $ids = append $ids (dict "name" (include "eventpipe.agentName" .) "role" "agent" "clusters" (list .Values.cluster)) -}}
{{- end -}}
{{- range .Values.collector.identities }}{{ $ids = append $ids . }}{{ end -}}
{{- if $ids -}}
{{- $_ := set $tls "client_ca_file" "/var/run/secrets/eventpipe/tls/ca.crt" -}}
{{- $_ := set $auth "identities" $ids -}}
{{- end -}}
{{- $_ := set $grpc "tls" $tls -}}
{{- end -}}
{{- $sinks := list -}}
{{- with .Values.sinks.file -}}
{{- if .enabled -}}
{{- $s := dict "name" .name "type" "file" "file" (dict "path" .path "max_bytes" (int64 .maxBytes) "max_files" (int .maxFiles) "resend_window" (int .resendWindow)) -}}
{{- include "eventpipe.sinkCommon" (dict "sink" . "out" $s) -}}
{{- $sinks = append $sinks $s -}}
{{- end -}}
{{- end -}}
{{- with .Values.sinks.loki -}}
{{- if .enabled -}}
{{- $l := mergeOverwrite (deepCopy .config) (dict "url" (required "sinks.loki.url is required when sinks.loki.enabled" .url) "encoding" .encoding) -}}
{{- $a := dict -}}
{{- if .passwordSecret.name -}}
{{- $_ := set $a "username" (required "sinks.loki.username is required with passwordSecret" .username) -}}
{{- $_ := set $a "password_file" (printf "/var/run/secrets/eventpipe/sinks/loki/password/%s" .passwordSecret.key) -}}
{{- end -}}
{{- if .bearerTokenSecret.name -}}
{{- $_ := set $a "bearer_token_file" (printf "/var/run/secrets/eventpipe/sinks/loki/token/%s" .bearerTokenSecret.key) -}}
{{- end -}}
{{- if $a }}{{ $_ := set $l "auth" $a }}{{ end -}}
{{- if .tlsSecret.name -}}
{{- $t := dict "ca_file" (printf "/var/run/secrets/eventpipe/sinks/loki/tls/%s" .tlsSecret.caKey) -}}
{{- if .tlsSecret.certKey -}}
{{- $_ := set $t "cert_file" (printf "/var/run/secrets/eventpipe/sinks/loki/tls/%s" .tlsSecret.certKey) -}}
{{- $_ := set $t "key_file" (printf "/var/run/secrets/eventpipe/sinks/loki/tls/%s" .tlsSecret.keyKey) -}}
{{- end -}}
{{- $_ := set $l "tls" $t -}}
{{- end -}}
{{- $s := dict "name" .name "type" "loki" "loki" $l -}}
{{- include "eventpipe.sinkCommon" (dict "sink" . "out" $s) -}}
{{- $sinks = append $sinks $s -}}
{{- end -}}
{{- end -}}
{{- with .Values.sinks.kafka -}}
{{- if .enabled -}}
{{- if not .brokers }}{{ fail "sinks.kafka.brokers must list at least one host:port when sinks.kafka.enabled" }}{{ end -}}
{{- $k := mergeOverwrite (deepCopy .config) (dict "brokers" .brokers "topic" .topic "compression" .compression "value_format" .valueFormat) -}}
{{- if .sasl.mechanism -}}
{{- $_ := set $k "sasl" (dict "mechanism" .sasl.mechanism "username" (required "sinks.kafka.sasl.username is required with a mechanism" .sasl.username) "password_file" (printf "/var/run/secrets/eventpipe/sinks/kafka/password/%s" .sasl.passwordSecret.key)) -}}
{{- end -}}
{{- if .tls.enabled -}}
{{- $t := dict "enabled" true -}}
{{- if .tls.secret.name -}}
{{- $_ := set $t "ca_file" (printf "/var/run/secrets/eventpipe/sinks/kafka/tls/%s" .tls.secret.caKey) -}}
{{- if .tls.secret.certKey -}}
{{- $_ := set $t "cert_file" (printf "/var/run/secrets/eventpipe/sinks/kafka/tls/%s" .tls.secret.certKey) -}}
{{- $_ := set $t "key_file" (printf "/var/run/secrets/eventpipe/sinks/kafka/tls/%s" .tls.secret.keyKey) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $k "tls" $t -}}
{{- end -}}
{{- $s := dict "name" .name "type" "kafka" "kafka" $k -}}
{{- include "eventpipe.sinkCommon" (dict "sink" . "out" $s) -}}
{{- $sinks = append $sinks $s -}}
{{- end -}}
{{- end -}}
{{- $base := dict "grpc" $grpc "auth" $auth "http" (dict "listen" (printf "0.0.0.0:%d" (int .Values.collector.metricsPort))) "sinks" $sinks -}}
{{- $user := deepCopy .Values.collector.config -}}
{{- if eq .Values.collector.log "kafka" -}}
{{- /* No local log: the store section stays out (the collector refuses one
with log: kafka), whatever collector.config.store holds. */ -}}
{{- $_ := unset $user "store" -}}
{{- $_ := set $base "log" "kafka" -}}
{{- $_ := set $base "backbone" (include "eventpipe.backboneConfig" . | fromYaml) -}}
{{- else -}}
{{- $_ := set $base "store" (dict "dir" "/var/lib/eventpipe/log") -}}
{{- end -}}
{{- toYaml (mergeOverwrite $user $base) -}}
{{- end -}}

{{/* The collector's backbone section for log: kafka (collector/backbone/config.go). */}}
{{- define "eventpipe.backboneConfig" -}}
{{- with .Values.collector.backbone -}}
{{- if not .brokers }}{{ fail "collector.backbone.brokers must list at least one host:port with collector.log=kafka" }}{{ end -}}
{{- $b := mergeOverwrite (deepCopy .config) (dict "brokers" .brokers "topic" .topic "cursor_topic" .cursorTopic "group_prefix" .groupPrefix "create_topics" .createTopics "partitions" (int .partitions) "replication_factor" (int .replicationFactor)) -}}
{{- if .sasl.mechanism -}}
{{- $_ := set $b "sasl" (dict "mechanism" .sasl.mechanism "username" (required "collector.backbone.sasl.username is required with a mechanism" .sasl.username) "password_file" (printf "/var/run/secrets/eventpipe/backbone/password/%s" .sasl.passwordSecret.key)) -}}
{{- end -}}
{{- if .tls.enabled -}}
{{- $t := dict "enabled" true -}}
{{- if .tls.secret.name -}}
{{- $_ := set $t "ca_file" (printf "/var/run/secrets/eventpipe/backbone/tls/%s" .tls.secret.caKey) -}}
{{- if .tls.secret.certKey -}}
{{- $_ := set $t "cert_file" (printf "/var/run/secrets/eventpipe/backbone/tls/%s" .tls.secret.certKey) -}}
{{- $_ := set $t "key_file" (printf "/var/run/secrets/eventpipe/backbone/tls/%s" .tls.secret.keyKey) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $b "tls" $t -}}
{{- end -}}
{{- toYaml $b -}}
{{- end -}}
{{- end -}}
