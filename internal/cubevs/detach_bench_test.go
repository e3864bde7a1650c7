package cubevs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkDetach measures the dataplane's part of a kill with N other
// sandboxes resident: each resident owner holds what a sandbox holds in the
// dataplane table (an egress chain, a verdict map entry, one port mapping),
// and each iteration removes one more such owner (Detach, which the cubelet
// calls once per kill after RemoveMapping of its ports). The veth pair and
// the netns pin are left out: their cost does not depend on N (measured in
// docs/benchmarks.md), and attaching 1000 would take minutes. Compare the
// sizes of one run: the kill should cost the same at 10 and at 1000.
//
//	go test -run '^$' -bench Detach -benchtime 300x ./internal/cubevs
func BenchmarkDetach(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("resident=%d", n), func(b *testing.B) { benchDetach(b, n) })
	}
}

func benchDetach(b *testing.B, resident int) {
	requireRoot(b)
	cfg := testConfig(b)
	r := randU32(b)
	// Room for 1000 sandboxes plus the measured ones, inside the dataplane
	// netns only; the ports stay below the kernel's ephemeral range.
	cfg.NodeCIDR = netip.MustParsePrefix(fmt.Sprintf("172.30.%d.0/21", r%32*8))
	cfg.PortMin, cfg.PortMax = 16000, 17199
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d := openDP(b, cfg)
	ip := cfg.NodeCIDR.Addr().Next()
	port := cfg.PortMin
	add := func(owner string) {
		ip = ip.Next()
		if err := d.SetEgress(ctx, owner, ip, EgressPolicy{AllowInternet: true}); err != nil {
			b.Fatal(err)
		}
		if err := d.AddMapping(ctx, Mapping{Owner: owner, HostPort: port, SandboxIP: ip, GuestPort: 49983}); err != nil {
			b.Fatal(err)
		}
		port++
	}
	for i := 0; i < resident; i++ {
		add(fmt.Sprintf("sbx-res-%d", i))
	}
	// The measured owner reuses one address and port: its predecessor is
	// gone by then.
	ipM, portM := ip, port
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ip, port = ipM, portM
		owner := fmt.Sprintf("sbx-kill-%d", i)
		add(owner)
		b.StartTimer()
		if err := d.RemoveMapping(ctx, portM); err != nil {
			b.Fatal(err)
		}
		if err := d.Detach(ctx, owner); err != nil {
			b.Fatal(err)
		}
	}
}
