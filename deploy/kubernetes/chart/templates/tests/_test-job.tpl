{{/*
A `helm test` hook: a Job (backoffLimit 0, so it fails like a Pod would) that
runs a bash script in the images.cubeServer image with the server URL and the
API key in its environment. It uses the namespace's default ServiceAccount
without a token: the checks talk to Cube, never to the Kubernetes API.
Call with (dict "ctx" $ "name" "server-health" "script" "..." "deadline" 120).
*/}}
{{- define "cube.testJob" -}}
{{- $ := .ctx -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: cube-test-{{ .name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "cube.labels" (dict "ctx" $ "component" "test") | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: 0
  activeDeadlineSeconds: {{ .deadline }}
  template:
    metadata:
      labels:
        {{- include "cube.selectorLabels" (dict "ctx" $ "component" "test") | nindent 8 }}
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      {{- with $.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.Values.placement.controlPlane.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $.Values.placement.controlPlane.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .name }}
          image: {{ include "cube.image" (dict "ctx" $ "image" $.Values.images.cubeServer) }}
          imagePullPolicy: {{ $.Values.images.cubeServer.pullPolicy }}
          command: ["/bin/bash", "-c"]
          args:
            - |
              {{- .script | nindent 14 }}
          env:
            - name: CUBE_SERVER
              value: {{ include "cube.serverURL" $ | quote }}
            - name: CUBE_SERVER_HOST
              value: cube-server.{{ $.Release.Namespace }}.svc
            - name: CUBE_SERVER_PORT
              value: {{ $.Values.controlPlane.port | quote }}
            - name: CUBE_API_KEY
              valueFrom:
                secretKeyRef: {name: {{ include "cube.apiKeySecret" $ }}, key: api-key}
          resources:
            {{- toYaml $.Values.tests.resources | nindent 12 }}
          securityContext:
            runAsNonRoot: true
            runAsUser: 65534
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
{{- end -}}
