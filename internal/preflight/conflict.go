package preflight

import (
	"fmt"
	"slices"
	"strings"
)

// cniSignature names the traces a general-purpose CNI leaves on a node and
// what to configure so it leaves Cube's link alone.
type cniSignature struct {
	name   string
	types  []string // CNI plugin types in /etc/cni/net.d
	links  []string // interface names (prefix match when ending in "*")
	procs  []string // process command names
	advice string
}

var cniSignatures = []cniSignature{
	{"cilium", []string{"cilium-cni"}, []string{"cilium_host", "cilium_net", "cilium_vxlan"}, []string{"cilium-agent"},
		"set Cilium's devices to the node uplinks so it attaches no BPF program to cube0"},
	{"calico", []string{"calico"}, []string{"vxlan.calico", "cali*"}, []string{"calico-node"},
		"set IP_AUTODETECTION_METHOD=skip-interface=cube0 so Calico never picks Cube's link"},
	{"flannel", []string{"flannel"}, []string{"flannel.1", "flannel-wg"}, []string{"flanneld"},
		"pin flannel's --iface to the node uplink"},
	{"weave", []string{"weave-net"}, []string{"weave"}, []string{"weaver"}, "exclude cube0 from Weave"},
	{"antrea", []string{"antrea"}, []string{"antrea-gw0"}, []string{"antrea-agent"}, "exclude cube0 from Antrea"},
	{"kube-router", []string{"kube-router"}, []string{"kube-bridge"}, []string{"kube-router"}, "exclude cube0 from kube-router"},
}

// checkCNI warns about general-purpose CNIs on the node. Cube's dataplane
// lives in the cube-dp netns and shows the host one link (cube0), so most
// setups work, but a CNI that manages every link or TC hook on the host can
// still touch cube0.
func checkCNI(f Facts) Result {
	const n = "node.cni"
	var found []string
	for _, s := range cniSignatures {
		var why []string
		for _, c := range f.CNIConfigs {
			for _, t := range c.Types {
				if slices.Contains(s.types, t) {
					why = append(why, "config "+c.File)
				}
			}
		}
		for _, l := range f.Links {
			if matchAny(s.links, l) {
				why = append(why, "link "+l)
			}
		}
		for _, p := range f.Processes {
			if slices.Contains(s.procs, p) {
				why = append(why, "process "+p)
			}
		}
		if len(why) > 0 {
			slices.Sort(why)
			why = slices.Compact(why)
			found = append(found, fmt.Sprintf("%s (%s): %s", s.name, strings.Join(why, ", "), s.advice))
		}
	}
	if len(found) > 0 {
		return warn(n, "general-purpose CNI on this node: %s; a dedicated compute pool with a minimal CNI is safest", strings.Join(found, "; "))
	}
	return ok(n, "no general-purpose CNI found (%d CNI configs)", len(f.CNIConfigs))
}

// checkKubeProxy warns when kube-proxy runs on the node: its chains are
// evaluated on the same hooks as Cube's host DNAT.
func checkKubeProxy(f Facts) Result {
	const n = "node.kube-proxy"
	var why []string
	for _, t := range f.NFTTables {
		if strings.HasSuffix(t, " kube-proxy") {
			why = append(why, "nft table "+t)
		}
	}
	chains := 0
	for _, c := range f.NFTChains {
		if _, chain, ok := strings.Cut(c, "/"); ok && strings.HasPrefix(chain, "KUBE-") {
			chains++
		}
	}
	if chains > 0 {
		why = append(why, fmt.Sprintf("%d KUBE-* iptables-nft chains", chains))
	}
	if slices.Contains(f.Links, "kube-ipvs0") {
		why = append(why, "link kube-ipvs0")
	}
	if slices.Contains(f.Processes, "kube-proxy") {
		why = append(why, "process kube-proxy")
	}
	if len(why) > 0 {
		return warn(n, "kube-proxy is active on this node (%s): keep its NodePort range disjoint from Cube's host port range, or run compute nodes without kube-proxy", strings.Join(why, ", "))
	}
	return ok(n, "no kube-proxy found")
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if prefix, wild := strings.CutSuffix(p, "*"); wild {
			if strings.HasPrefix(s, prefix) {
				return true
			}
		} else if p == s {
			return true
		}
	}
	return false
}
