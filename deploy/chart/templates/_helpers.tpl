{{/* Names: the release name, or <release>-modelhost when the release name does not say modelhost. */}}
{{- define "modelhost.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelhost.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "modelhost.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelhost.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "modelhost.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "modelhost.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "modelhost.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.variant }}
{{- $tag = printf "%s-%s" $tag .Values.image.variant }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* The Secret mounted at /run/secrets/modelhost: the user's, or the chart's. */}}
{{- define "modelhost.secretName" -}}
{{- default (include "modelhost.fullname" .) .Values.existingSecret }}
{{- end }}

{{/*
"true" when the gateways keep no state of their own (PostgreSQL and S3): only then may there be more
than one, and the data directory is a cache.
*/}}
{{- define "modelhost.shared" -}}
{{- if and (or .Values.database.url .Values.database.inExistingSecret) .Values.s3.enabled }}true{{ end }}
{{- end }}

{{- define "modelhost.scalesOut" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* MODELHOST_MEMORY_BUDGET_MB: memory.budgetPercent of the memory limit, in whole MiB. */}}
{{- define "modelhost.memoryBudget" -}}
{{- div (mul (int64 .Values.memory.limitMiB) (int64 .Values.memory.budgetPercent)) 100 }}
{{- end }}

{{- define "modelhost.terminationGracePeriod" -}}
{{- add (int64 .Values.shutdown.drainSeconds) (int64 .Values.shutdown.marginSeconds) }}
{{- end }}

{{/*
A setting's value as the ConfigMap's string: whole numbers without an exponent (YAML numbers reach
templates as floats, and 1000000 would print as 1e+06).
*/}}
{{- define "modelhost.settingValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . | toString }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
Every refusal, in one place, each saying which value to set: rendered by the ConfigMap (which every
render has) so that `helm template` and `helm install` stop before anything is applied.
*/}}
{{- define "modelhost.validate" -}}
{{- $v := .Values }}
{{- if and (not $v.adminKey) (not $v.existingSecret) }}
{{- fail "modelhost: set adminKey (the operator's key, MODELHOST_ADMIN_KEY), or existingSecret: the name of a Secret with a MODELHOST_ADMIN_KEY key" }}
{{- end }}
{{- if $v.existingSecret }}
{{- if or $v.adminKey $v.database.url $v.fileUrlSecret $v.secrets }}
{{- fail "modelhost: with existingSecret, put the admin key, database URL, file URL secret and other secrets in that Secret (as MODELHOST_* keys) and leave adminKey, database.url, fileUrlSecret and secrets empty" }}
{{- end }}
{{- if and $v.s3.accessKeyId (not $v.s3.existingSecret) }}
{{- fail "modelhost: with existingSecret the chart renders no Secret of its own: give the S3 credentials in s3.existingSecret (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)" }}
{{- end }}
{{- end }}
{{- if and $v.database.url (not (hasPrefix "postgresql" $v.database.url)) }}
{{- fail "modelhost: database.url is for PostgreSQL (postgresql+psycopg://user:pass@host/db); leave it empty for SQLite on the data volume" }}
{{- end }}
{{- if and $v.s3.enabled (not $v.s3.bucket) }}
{{- fail "modelhost: s3.enabled needs s3.bucket" }}
{{- end }}
{{- if ne (empty $v.s3.accessKeyId) (empty $v.s3.secretAccessKey) }}
{{- fail "modelhost: set both s3.accessKeyId and s3.secretAccessKey, or neither" }}
{{- end }}
{{- if and (include "modelhost.scalesOut" .) (not (include "modelhost.shared" .)) }}
{{- fail (printf "modelhost: %s needs PostgreSQL (database.url, or database.inExistingSecret) and S3 (s3.enabled): with SQLite or local blobs the state is one ReadWriteOnce volume that only one gateway may use. Set replicaCount: 1 and autoscaling.enabled: false, or see ci/postgres-s3-values.yaml" (ternary "autoscaling" (printf "replicaCount: %d" (int $v.replicaCount)) $v.autoscaling.enabled)) }}
{{- end }}
{{- if and (include "modelhost.shared" .) (not $v.fileUrlSecret) (not $v.existingSecret) }}
{{- fail "modelhost: with PostgreSQL and S3, set fileUrlSecret (MODELHOST_FILE_URL_SECRET, e.g. openssl rand -hex 32): every gateway must check the file links the others sign, and its data directory is only a cache" }}
{{- end }}
{{- if and (include "modelhost.shared" .) $v.persistence.usePVCWithS3 (include "modelhost.scalesOut" .) }}
{{- fail "modelhost: persistence.usePVCWithS3 is one ReadWriteOnce claim: one replica only (more gateways each get an emptyDir cache)" }}
{{- end }}
{{- if not (has $v.image.variant (list "" "vllm" "cuda")) }}
{{- fail (printf "modelhost: image.variant is \"\", \"vllm\" or \"cuda\", not %q" $v.image.variant) }}
{{- end }}
{{- $percent := int $v.memory.budgetPercent }}
{{- if or (lt $percent 1) (gt $percent 100) }}
{{- fail "modelhost: memory.budgetPercent is a percentage of memory.limitMiB, 1 to 100" }}
{{- end }}
{{- range $kind := list "requests" "limits" }}
{{- $asked := get $v.resources $kind }}
{{- if and $asked (hasKey $asked "memory") }}
{{- fail (printf "modelhost: set the memory with memory.limitMiB, not resources.%s.memory: the chart derives MODELHOST_MEMORY_BUDGET_MB from it" $kind) }}
{{- end }}
{{- end }}
{{- $owned := dict
  "MODELHOST_DATA_DIR" "persistence"
  "MODELHOST_HOST" "(the image's 0.0.0.0)"
  "MODELHOST_PORT" "(the image's 8000; service.port for the Service)"
  "MODELHOST_SECRETS_DIR" "(the Secret's mount)"
  "MODELHOST_MEMORY_BUDGET_MB" "memory.limitMiB and memory.budgetPercent"
  "MODELHOST_SHUTDOWN_DRAIN_SECONDS" "shutdown.drainSeconds"
  "MODELHOST_PUBLIC_URL" "publicUrl"
  "MODELHOST_BLOB_STORE" "s3.enabled"
  "MODELHOST_S3_BUCKET" "s3.bucket"
  "MODELHOST_S3_ENDPOINT_URL" "s3.endpointUrl"
  "MODELHOST_S3_REGION" "s3.region"
  "MODELHOST_S3_KEY_PREFIX" "s3.keyPrefix"
  "MODELHOST_S3_ACCESS_KEY_ID" "s3.accessKeyId (or s3.existingSecret)"
  "MODELHOST_S3_SECRET_ACCESS_KEY" "s3.secretAccessKey (or s3.existingSecret)"
  "MODELHOST_ADMIN_KEY" "adminKey"
  "MODELHOST_DATABASE_URL" "database.url"
  "MODELHOST_FILE_URL_SECRET" "fileUrlSecret"
  "MODELHOST_OIDC_CLIENT_SECRET" "secrets"
  "MODELHOST_METRICS_KEY" "secrets"
  "MODELHOST_SECRETS_KEY" "secrets"
}}
{{- range $name, $_ := $v.config }}
{{- if not (hasPrefix "MODELHOST_" $name) }}
{{- fail (printf "modelhost: config holds MODELHOST_* settings only; put %s in extraEnv" $name) }}
{{- end }}
{{- if hasKey $owned $name }}
{{- fail (printf "modelhost: %s is not set through config: use %s" $name (get $owned $name)) }}
{{- end }}
{{- end }}
{{- range $v.extraEnv }}
{{- if has .name (list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "AWS_SESSION_TOKEN") }}
{{- fail (printf "modelhost: %s is not an environment variable here (every worker process inherits the environment): give the blob store's keys in s3.accessKeyId and s3.secretAccessKey, or s3.existingSecret; they are mounted as files" .name) }}
{{- end }}
{{- end }}
{{- range $name, $_ := $v.secrets }}
{{- if not (hasPrefix "MODELHOST_" $name) }}
{{- fail (printf "modelhost: secrets holds MODELHOST_* settings only, not %s" $name) }}
{{- end }}
{{- if has $name (list "MODELHOST_ADMIN_KEY" "MODELHOST_DATABASE_URL" "MODELHOST_FILE_URL_SECRET" "MODELHOST_S3_ACCESS_KEY_ID" "MODELHOST_S3_SECRET_ACCESS_KEY") }}
{{- fail (printf "modelhost: %s is not set through secrets: use %s" $name (get $owned $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A NetworkPolicy egress port: (list explicit url default): the explicit value, else the URL's own port,
else 443 / 80 for an https / http URL, else the default.
*/}}
{{- define "modelhost.networkPolicy.port" -}}
{{- $explicit := index . 0 }}
{{- $url := index . 1 }}
{{- $port := index . 2 }}
{{- if $explicit }}
{{- $port = $explicit }}
{{- else if $url }}
{{- $hostPort := regexReplaceAll "^[A-Za-z0-9+.-]+://([^/?#]*@)?([^/?#]*).*$" $url "${2}" }}
{{- $given := regexFind ":[0-9]+$" $hostPort | trimPrefix ":" }}
{{- if $given }}
{{- $port = $given }}
{{- else if hasPrefix "https://" (lower $url) }}
{{- $port = 443 }}
{{- else if hasPrefix "http://" (lower $url) }}
{{- $port = 80 }}
{{- end }}
{{- end }}
{{- $port | int }}
{{- end }}

{{/*
Any address but link-local ones (the cloud's metadata service and credential endpoints, 169.254.0.0/16,
fe80::/10, and AWS's IPv6 one, fd00:ec2::254): the peers of an egress rule whose `to` is not given.
*/}}
{{- define "modelhost.networkPolicy.notLinkLocal" -}}
- ipBlock:
    cidr: 0.0.0.0/0
    except:
      - 169.254.0.0/16
- ipBlock:
    cidr: ::/0
    except:
      - fe80::/10
      - fd00:ec2::254/128
{{- end }}
