{{/*
Helpers shared by the standalone templates and the sidecar named templates.

Templates that build containers take a dict:
  root   - the top-level context of the chart being rendered (for .Release), and
  values - the latency-predictor values (.Values here; .Values.<alias> in an EPP chart).
Names derived for the sidecar use only .Release, so they are the same whether computed
from this chart or from a parent chart that includes the templates.
*/}}

{{- define "latency-predictor.name" -}}
{{- default "latency-predictor" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "latency-predictor.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "latency-predictor" .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "latency-predictor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; call with (dict "ctx" $ "component" "training") */}}
{{- define "latency-predictor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "latency-predictor.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Full labels; call with (dict "ctx" $ "component" "training") */}}
{{- define "latency-predictor.labels" -}}
helm.sh/chart: {{ include "latency-predictor.chart" .ctx }}
{{ include "latency-predictor.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: latency-predictor
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "latency-predictor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "latency-predictor.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "latency-predictor.trainingName" -}}
{{- printf "%s-training" (include "latency-predictor.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "latency-predictor.predictionName" -}}
{{- printf "%s-prediction" (include "latency-predictor.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* In-cluster URL of the standalone training Service. */}}
{{- define "latency-predictor.trainingServiceUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "latency-predictor.trainingName" .) .Release.Namespace (int64 .Values.training.port) -}}
{{- end -}}

{{/* In-cluster URL of the standalone prediction Service. */}}
{{- define "latency-predictor.predictionServiceUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "latency-predictor.predictionName" .) .Release.Namespace (int64 .Values.predictionServers.startPort) -}}
{{- end -}}

{{/* Image reference; call with the values. */}}
{{- define "latency-predictor.image" -}}
{{- $repo := .image.repository -}}
{{- if .image.registry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .image.registry) .image.repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo .image.tag -}}
{{- end -}}
{{- end -}}

{{/* Effective number of sidecar prediction servers (predictionServerCount wins); call with the values. */}}
{{- define "latency-predictor.predictionCount" -}}
{{- if kindIs "invalid" .predictionServerCount -}}
{{- int64 .predictionServers.count -}}
{{- else -}}
{{- int64 .predictionServerCount -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the API token; call with (dict "root" $ "values" $values). */}}
{{- define "latency-predictor.tokenSecretName" -}}
{{- if .values.auth.existingSecret -}}
{{- .values.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-latency-predictor-token" .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* LATENCY_API_TOKEN from the Secret (include only when auth is enabled); call with (dict "root" $ "values" $values). */}}
{{- define "latency-predictor.tokenEnv" -}}
- name: LATENCY_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "latency-predictor.tokenSecretName" . }}
      key: {{ .values.auth.secretKey }}
{{- end -}}

{{/*
Probes of one server; call with (dict "port" 8000 "readinessPath" "/healthz"
"probes" $values.training.probes "exec" true). With exec (server bound to loopback in
the EPP pod, unreachable from the kubelet) the probe runs an HTTP GET inside the
container (python3 -I -S with a bare socket: ~half the CPU of importing urllib; exit 0
only on status 200); otherwise it is an httpGet on the pod IP.
*/}}
{{- define "latency-predictor.probes" -}}
{{- $port := int64 .port -}}
{{- range $kind := list "startup" "liveness" "readiness" }}
{{- $path := ternary $.readinessPath "/healthz" (eq $kind "readiness") }}
{{- $cfg := index $.probes $kind }}
{{ $kind }}Probe:
  {{- if $.exec }}
  exec:
    command:
      - python3
      - -I
      - -S
      - -c
      - {{ printf "import socket,sys; s=socket.create_connection(('127.0.0.1',%d),%d); s.sendall(b'GET %s HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n'); sys.exit(s.recv(64).split(b' ')[1:2]!=[b'200'])" $port (int64 (default 3 $cfg.timeoutSeconds)) $path | quote }}
  {{- else }}
  httpGet:
    path: {{ $path }}
    port: {{ $port }}
  {{- end }}
  periodSeconds: {{ int64 $cfg.periodSeconds }}
  {{- with $cfg.timeoutSeconds }}
  timeoutSeconds: {{ int64 . }}
  {{- end }}
  failureThreshold: {{ int64 $cfg.failureThreshold }}
{{- end }}
{{- end -}}

{{/*
The training-server container; call with (dict "root" $ "values" $values "host" "0.0.0.0"
"name" "training-server" "exec" false). Its argv is the one `latency-predictor up` runs
locally: latency-training-server --host H --port P --data-dir D.
*/}}
{{- define "latency-predictor.trainingContainer" -}}
{{- $v := .values -}}
{{- $t := $v.training -}}
- name: {{ .name }}
  image: {{ include "latency-predictor.image" $v | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command:
    - latency-training-server
  args:
    - --host
    - {{ .host | quote }}
    - --port
    - {{ int64 $t.port | quote }}
    - --data-dir
    - {{ $t.dataDir | quote }}
  ports:
    - name: {{ .portName | default "http" }}
      containerPort: {{ int64 $t.port }}
      protocol: TCP
  env:
    - name: LATENCY_MODEL_TYPE
      value: {{ $t.modelType | quote }}
    - name: LATENCY_OBJECTIVE_TYPE
      value: {{ $t.objectiveType | quote }}
    - name: LATENCY_QUANTILE_ALPHA
      value: {{ $v.quantileAlpha | toString | quote }}
    - name: LATENCY_RETRAINING_INTERVAL_SEC
      value: {{ $t.retrainingIntervalSec | toString | quote }}
    - name: LATENCY_MIN_SAMPLES_FOR_RETRAIN
      value: {{ int64 $t.minSamplesForRetrain | quote }}
    - name: LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET
      value: {{ int64 $t.maxTrainingDataSizePerBucket | quote }}
    - name: LATENCY_TEST_TRAIN_RATIO
      value: {{ $t.testTrainRatio | toString | quote }}
    - name: LATENCY_MAX_STORED_SAMPLES
      value: {{ int64 $t.maxStoredSamples | quote }}
    - name: LATENCY_MAX_BODY_BYTES
      value: {{ int64 $t.maxBodyBytes | quote }}
    - name: LATENCY_INGEST_QUEUE_SIZE
      value: {{ int64 $t.ingestQueueSize | quote }}
    - name: LATENCY_MAX_INFLIGHT_BYTES
      value: {{ int64 $t.maxInflightBytes | quote }}
    - name: LATENCY_BUNDLES_KEEP
      value: {{ int64 $t.bundlesKeep | quote }}
    - name: LATENCY_PUBLISH_TOLERANCE
      value: {{ $t.publishTolerance | toString | quote }}
    - name: LATENCY_LOG_LEVEL
      value: {{ $v.logLevel | quote }}
    {{- with $t.seedBundle }}
    - name: LATENCY_SEED_BUNDLE
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.auth.enabled }}
    {{- include "latency-predictor.tokenEnv" . | nindent 4 }}
    {{- end }}
    {{- with $t.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- include "latency-predictor.probes" (dict "port" $t.port "readinessPath" .readinessPath "probes" $t.probes "exec" .exec) | trim | nindent 2 }}
  resources:
    {{- toYaml $t.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: {{ .dataVolume }}
      mountPath: {{ $t.dataDir | quote }}
    - name: {{ .tmpVolume }}
      mountPath: /tmp
      {{- with .tmpSubPath }}
      subPath: {{ . }}
      {{- end }}
    {{- with .extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/*
One prediction-server container; call with (dict "root" $ "values" $values "host" H
"port" P "trainingUrl" URL "name" N "exec" bool "readinessPath" path "tmpVolume" V).
Its argv is the one `latency-predictor up` runs locally:
latency-prediction-server --host H --port P --training-server-url URL.
*/}}
{{- define "latency-predictor.predictionContainer" -}}
{{- $v := .values -}}
{{- $p := $v.predictionServers -}}
- name: {{ .name }}
  image: {{ include "latency-predictor.image" $v | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command:
    - latency-prediction-server
  args:
    - --host
    - {{ .host | quote }}
    - --port
    - {{ int64 .port | quote }}
    - --training-server-url
    - {{ .trainingUrl | quote }}
  ports:
    - name: {{ .portName | default "http" }}
      containerPort: {{ int64 .port }}
      protocol: TCP
  env:
    {{- with $p.bundleDir }}
    - name: LATENCY_BUNDLE_DIR
      value: {{ . | quote }}
    {{- end }}
    - name: MODEL_SYNC_INTERVAL_SEC
      value: {{ $p.syncIntervalSec | toString | quote }}
    - name: LATENCY_REFUSE_WITHOUT_MODEL
      value: {{ $p.refuseWithoutModel | toString | quote }}
    - name: LATENCY_MAX_BODY_BYTES
      value: {{ int64 $p.maxBodyBytes | quote }}
    - name: LATENCY_MAX_BATCH_ROWS
      value: {{ int64 $p.maxBatchRows | quote }}
    - name: LATENCY_SYNC_TIMEOUT_SEC
      value: {{ $p.syncTimeoutSec | toString | quote }}
    - name: LATENCY_MAX_BUNDLE_BYTES
      value: {{ int64 $p.maxBundleBytes | quote }}
    - name: LATENCY_ACCESS_LOG
      value: {{ $p.accessLog | toString | quote }}
    - name: LATENCY_QUANTILE_ALPHA
      value: {{ $v.quantileAlpha | toString | quote }}
    - name: LATENCY_LOG_LEVEL
      value: {{ $v.logLevel | quote }}
    {{- if $v.auth.enabled }}
    {{- include "latency-predictor.tokenEnv" . | nindent 4 }}
    {{- end }}
    {{- with $p.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- include "latency-predictor.probes" (dict "port" .port "readinessPath" .readinessPath "probes" $p.probes "exec" .exec) | trim | nindent 2 }}
  resources:
    {{- toYaml $p.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: {{ .tmpVolume }}
      mountPath: /tmp
      {{- with .tmpSubPath }}
      subPath: {{ . }}
      {{- end }}
    {{- with .extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* Fail on values the schema cannot express; call with the values. */}}
{{- define "latency-predictor.validate" -}}
{{- $count := int64 (include "latency-predictor.predictionCount" .) -}}
{{- $start := int64 .predictionServers.startPort -}}
{{- $train := int64 .training.port -}}
{{- if and (eq .mode "sidecar") (ge $train $start) (lt $train (add $start $count)) -}}
{{- fail (printf "training.port %d collides with the prediction-server ports %d..%d (predictionServers.startPort + count - 1)" $train $start (sub (add $start $count) 1)) -}}
{{- end -}}
{{- if gt (add $start $count) 65536 -}}
{{- fail (printf "predictionServers.startPort %d + count %d exceeds port 65535" $start $count) -}}
{{- end -}}
{{- if and (eq .mode "standalone") (eq $train $start) -}}
{{- fail "training.port and predictionServers.startPort must differ" -}}
{{- end -}}
{{- if and (eq .mode "sidecar") (ne .sidecar.bindAddress "127.0.0.1") (not .auth.enabled) -}}
{{- fail (printf "sidecar.bindAddress %s exposes the sidecar servers on the pod IP with no token: enable auth (auth.enabled) or keep 127.0.0.1, all the EPP in the same pod needs" .sidecar.bindAddress) -}}
{{- end -}}
{{- if and .auth.enabled (not .auth.existingSecret) (not .auth.token) -}}
{{- fail "auth.enabled needs auth.existingSecret (recommended) or auth.token" -}}
{{- end -}}
{{- if lt (int64 .training.maxInflightBytes) (int64 .training.maxBodyBytes) -}}
{{- fail (printf "training.maxInflightBytes %d must be >= training.maxBodyBytes %d (a body of the largest size is never admitted otherwise)" (int64 .training.maxInflightBytes) (int64 .training.maxBodyBytes)) -}}
{{- end -}}
{{- end -}}
