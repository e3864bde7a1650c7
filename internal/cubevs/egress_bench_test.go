package cubevs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkSetEgress times what a create asks of nftables (its egress
// policy and its envd mapping) with 10 and 2000 sandboxes resident, each
// holding a policy and a mapping as a sandbox does: the default policy
// (internet), or one with a DenyOut prefix (a rule in its out chain).
// kill-ns/op is what the kill's Release of the same took. Needs root.
//
//	go test -run '^$' -bench SetEgress -benchtime 200x ./internal/cubevs
func BenchmarkSetEgress(b *testing.B) {
	for _, n := range []int{10, 2000} {
		for _, prefixes := range []bool{false, true} {
			name := fmt.Sprintf("resident=%d/policy=internet", n)
			if prefixes {
				name += "+denyout"
			}
			b.Run(name, func(b *testing.B) { benchSetEgress(b, n, prefixes) })
		}
	}
}

func benchSetEgress(b *testing.B, resident int, prefixes bool) {
	requireRoot(b)
	cfg := testConfig(b)
	r := randU32(b)
	cfg.NodeCIDR = netip.MustParsePrefix(fmt.Sprintf("172.30.%d.0/20", r%16*16))
	cfg.PortMin, cfg.PortMax = 14000, 17199
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d := openDP(b, cfg)
	ip := cfg.NodeCIDR.Addr().Next()
	port := cfg.PortMin
	add := func(owner string) {
		ip = ip.Next()
		p := EgressPolicy{AllowInternet: true}
		if prefixes {
			p.DenyOut = []netip.Prefix{netip.MustParsePrefix("8.8.8.0/24")}
		}
		if err := d.SetEgress(ctx, owner, ip, p); err != nil {
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
	ipM, portM := ip, port
	var kill time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ip, port = ipM, portM
		owner := fmt.Sprintf("sbx-new-%d", i)
		add(owner)
		b.StopTimer()
		t := time.Now()
		if err := d.Release(ctx, owner, []uint16{portM}); err != nil {
			b.Fatal(err)
		}
		kill += time.Since(t)
		b.StartTimer()
	}
	b.ReportMetric(float64(kill.Nanoseconds())/float64(b.N), "kill-ns/op")
}
