package main

import (
	"context"
	"fmt"
)

// coreDNS is the cluster DNS: Service names resolve in Pods as on every real
// cluster, and other names are forwarded to the host's resolvers as a real
// cluster's CoreDNS does. It runs on the host network, bound to the node IP
// only: Pods here have no route off the machine, so a CoreDNS on the pod
// network could not reach the host's resolvers (the cube-node Pod needs them,
// e.g. to debootstrap the base template from the Debian mirror).
const coreDNS = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        bind %[3]s
        errors
        health %[3]s:18080
        ready %[3]s:18181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        forward . /etc/resolv.conf
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      hostNetwork: true
      dnsPolicy: Default
      tolerations:
      - {operator: Exists}
      containers:
      - name: coredns
        image: %[1]s
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 18181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 18080}
        resources:
          requests: {cpu: 50m, memory: 32Mi}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: %[2]s
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`

func installCoreDNS(ctx context.Context, c *Config) error {
	if _, err := kubectlIn(ctx, c, fmt.Sprintf(coreDNS, c.corednsImage(), c.DNSIP, c.NodeIP), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("install CoreDNS: %w", err)
	}
	return nil
}
