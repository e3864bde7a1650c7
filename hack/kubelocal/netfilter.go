package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
)

// ownChain reports whether an iptables chain belongs to the cluster:
// kube-proxy's and the kubelet's KUBE-*, the CNI plugins' CNI-*.
func ownChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// iptablesDeletes parses iptables-save output and returns, per table, the
// rules to delete (chain and 1-based position, last first, so positions stay
// valid) in chains not ours that jump to ours, and the chains that are ours.
func iptablesDeletes(save string) (rules map[string][][2]string, chains map[string][]string) {
	rules, chains = map[string][][2]string{}, map[string][]string{}
	table := ""
	pos := map[string]int{}
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			pos = map[string]int{}
		case strings.HasPrefix(line, ":"):
			if name := strings.Fields(line[1:])[0]; ownChain(name) {
				chains[table] = append(chains[table], name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			chain := f[1]
			pos[chain]++
			if ownChain(chain) {
				continue // flushed with its chain
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && ownChain(f[i+1]) {
					rules[table] = append(rules[table], [2]string{chain, strconv.Itoa(pos[chain])})
					break
				}
			}
		}
	}
	for t := range rules {
		r := rules[t]
		sort.SliceStable(r, func(i, j int) bool {
			if r[i][0] != r[j][0] {
				return r[i][0] < r[j][0]
			}
			a, _ := strconv.Atoi(r[i][1])
			b, _ := strconv.Atoi(r[j][1])
			return a > b
		})
	}
	return rules, chains
}

// cleanIptables removes the cluster's rules and chains from iptables and
// ip6tables (both the nft backend here).
func cleanIptables(ctx context.Context) error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		save, err := run(ctx, "/", nil, tool+"-save")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rules, chains := iptablesDeletes(save)
		n := 0
		for table, rs := range rules {
			for _, r := range rs {
				if _, err := run(ctx, "/", nil, tool, "-w", "-t", table, "-D", r[0], r[1]); err != nil {
					errs = append(errs, err)
				}
				n++
			}
		}
		for table, cs := range chains {
			for _, ch := range cs {
				if _, err := run(ctx, "/", nil, tool, "-w", "-t", table, "-F", ch); err != nil {
					errs = append(errs, err)
				}
			}
			for _, ch := range cs {
				if _, err := run(ctx, "/", nil, tool, "-w", "-t", table, "-X", ch); err != nil {
					errs = append(errs, err)
				}
				n++
			}
		}
		if n > 0 {
			slog.Info("removed the cluster's iptables rules and chains", "tool", tool, "count", n)
		}
	}
	return errors.Join(errs...)
}

// nftTables lists "family name" of every nftables table.
func nftTables(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "/", nil, "nft", "list", "tables")
	if err != nil {
		return nil, err
	}
	var ts []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			ts = append(ts, f[1]+" "+f[2])
		}
	}
	return ts, nil
}

// dropNewEmptyTables deletes the nftables tables that were not there
// before the cluster and now hold no rule: the iptables-nft tables (ip nat,
// ip filter, ...) that kube-proxy's and the kubelet's iptables calls created.
func dropNewEmptyTables(ctx context.Context, before []string) error {
	now, err := nftTables(ctx)
	if err != nil {
		return err
	}
	had := map[string]bool{}
	for _, t := range before {
		had[t] = true
	}
	var errs []error
	for _, t := range now {
		if had[t] {
			continue
		}
		f := strings.Fields(t)
		out, err := run(ctx, "/", nil, "nft", "list", "table", f[0], f[1])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if hasRules(out) {
			continue
		}
		if _, err := run(ctx, "/", nil, "nft", "delete", "table", f[0], f[1]); err != nil {
			errs = append(errs, fmt.Errorf("delete nft table %s: %w", t, err))
			continue
		}
		slog.Info("removed empty nft table", "table", t)
	}
	return errors.Join(errs...)
}

// hasRules reports whether `nft list table` output has any rule (a line
// that is not a table/chain/set header, a chain's type/policy or a brace).
func hasRules(listing string) bool {
	for _, l := range strings.Split(listing, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "", l == "}", strings.HasPrefix(l, "table "), strings.HasPrefix(l, "chain "),
			strings.HasPrefix(l, "type "), strings.HasPrefix(l, "policy "), strings.HasPrefix(l, "comment "):
			continue
		}
		return true
	}
	return false
}
