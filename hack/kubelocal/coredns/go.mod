// The CoreDNS build of the local cluster (hack/kube-node-assets.sh copies this module into a throwaway
// directory and resolves it there; it is a module of its own so that Cube's module does not depend on CoreDNS).
module cube.local/coredns

go 1.25

require github.com/coredns/coredns v1.15.0
