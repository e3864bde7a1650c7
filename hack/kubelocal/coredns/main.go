// CoreDNS with only the plugins the local cluster's Corefile uses
// (hack/kubelocal/addons.go): the documented way to build CoreDNS with a
// chosen plugin set, without compiling the cloud providers' SDKs of the
// full build.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	// The order plugins run in, as in CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes", "forward"}
	coremain.Run()
}
