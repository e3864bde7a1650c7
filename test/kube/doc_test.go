// Package kube renders the Helm chart in deploy/kubernetes/chart with the
// Helm SDK (no helm binary) and checks the objects: the guard that
// policy-only values never change the cube-node Pod template, labels,
// probes, hooks, and the compute-only (two-cluster) profile.
package kube
