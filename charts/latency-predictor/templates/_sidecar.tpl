{{/*
Sidecar mode: named templates an EPP chart includes in its own pod template.

Add this chart as a dependency of the EPP chart (alias latencyPredictor, mode: sidecar)
and write, in the EPP Deployment (see examples/epp-sidecar):

  containers:
    - name: epp
      env:
        {{- include "latency-predictor.sidecar.eppEnv" (dict "root" $ "values" .Values.latencyPredictor) | nindent 8 }}
    {{- include "latency-predictor.sidecar.containers" (dict "root" $ "values" .Values.latencyPredictor) | nindent 4 }}
  volumes:
    {{- include "latency-predictor.sidecar.volumes" (dict "root" $ "values" .Values.latencyPredictor) | nindent 4 }}

The servers talk to each other and to the EPP over loopback (127.0.0.1, the address they bind): the training server on
training.port (8000), prediction server i (i = 0..count-1) on predictionServers.startPort + i
(8001...). count comes from predictionServers.count, or its alias predictionServerCount.
*/}}

{{- define "latency-predictor.sidecar.trainingUrl" -}}
{{- printf "http://127.0.0.1:%d" (int64 .values.training.port) -}}
{{- end -}}

{{/* Comma-separated URLs of every sidecar prediction server. */}}
{{- define "latency-predictor.sidecar.predictionUrls" -}}
{{- $count := int64 (include "latency-predictor.predictionCount" .values) -}}
{{- $start := int64 .values.predictionServers.startPort -}}
{{- $urls := list -}}
{{- range $i := until (int $count) -}}
{{- $urls = append $urls (printf "http://127.0.0.1:%d" (add $start $i)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The EPP container's environment (a list of EnvVar). */}}
{{- define "latency-predictor.sidecar.eppEnv" -}}
- name: PREDICTION_SERVER_URL
  value: {{ include "latency-predictor.sidecar.predictionUrls" . | quote }}
- name: TRAINING_SERVER_URL
  value: {{ include "latency-predictor.sidecar.trainingUrl" . | quote }}
{{- range $k, $val := .values.sidecar.eppEnv }}
- name: {{ $k }}
  value: {{ $val | toString | quote }}
{{- end }}
{{- end -}}

{{/* One training-server container and count prediction-server containers (a list of Container). */}}
{{- define "latency-predictor.sidecar.containers" -}}
{{- $v := .values -}}
{{- include "latency-predictor.validate" $v -}}
{{- $host := $v.sidecar.bindAddress -}}
{{- $exec := eq $host "127.0.0.1" -}}
{{- $count := int64 (include "latency-predictor.predictionCount" $v) -}}
{{- $start := int64 $v.predictionServers.startPort -}}
{{- $trainingUrl := include "latency-predictor.sidecar.trainingUrl" . -}}
{{ include "latency-predictor.trainingContainer" (dict "root" .root "values" $v "host" $host "name" "latency-training-server" "portName" "lp-training" "exec" $exec "readinessPath" "/healthz" "dataVolume" "latency-predictor-data" "tmpVolume" "latency-predictor-tmp" "tmpSubPath" "training") }}
{{- range $i := until (int $count) }}
{{ include "latency-predictor.predictionContainer" (dict "root" $.root "values" $v "host" $host "port" (add $start $i) "trainingUrl" $trainingUrl "name" (printf "latency-prediction-server-%d" (add $i 1)) "portName" (printf "lp-predict-%d" (add $i 1)) "exec" $exec "readinessPath" "/healthz" "tmpVolume" "latency-predictor-tmp" "tmpSubPath" (printf "prediction-%d" (add $i 1))) }}
{{- end }}
{{- end -}}

{{/* The volumes the sidecar containers mount (a list of Volume). */}}
{{- define "latency-predictor.sidecar.volumes" -}}
{{- $v := .values -}}
- name: latency-predictor-data
  {{- if $v.sidecar.dataVolume }}
  {{- toYaml $v.sidecar.dataVolume | nindent 2 }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ $v.sidecar.dataSizeLimit }}
  {{- end }}
- name: latency-predictor-tmp
  emptyDir:
    sizeLimit: {{ $v.tmpSizeLimit }}
{{- end -}}
