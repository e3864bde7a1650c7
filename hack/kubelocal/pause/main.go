// Command pause is the local cluster's Pod sandbox image (containerd's
// sandbox_image): the process that holds a Pod's namespaces. It waits for
// SIGINT or SIGTERM and exits 0, and reaps children re-parented to it (it is
// pid 1 of Pods that share their pid namespace). Built static by
// hack/kube-node-assets.sh and packed as an image by hack/kubelocal, so the
// cluster needs no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
