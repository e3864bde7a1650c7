package cubevs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
)

// nftMirror is this process's copy of the per-sandbox objects in the
// dataplane table: the port map, the egress sets, and the sandboxes verdict
// map and sb-* chains that earlier versions made per sandbox, indexed by
// owner. It is read from the kernel once (a few dumps, at the first
// operation after Open or after a failure) and kept in
// step by every change this process commits, so neither a create's port
// check nor a kill reads the kernel: listing the maps and chains under the
// dataplane lock cost every kill time in proportion to the sandboxes on the
// node (kill p50 ~260 ms with 1200-2000 resident).
//
// The table lives in Cube's own network namespace and nothing else is meant
// to write it; if something did, the transaction that relied on a stale
// entry fails as a whole (nftables batches are atomic), the mirror is
// dropped with the connection, and the operation runs once more against a
// fresh read (see retryStale).
type nftMirror struct {
	ports map[uint16]Mapping
	// owned is the host ports of each owner (the port map's comments).
	owned map[string]map[uint16]bool
	// verdicts is the sandboxes map: key (padded link name) -> comment.
	verdicts map[string]string
	// verdictsOf is the keys whose comment names an owner.
	verdictsOf map[string]map[string]bool
	// chains is the owners whose chain sb-<owner> exists.
	chains map[string]bool
	// egress is each owner's elements in the egress sets.
	egress map[string][]egressElem
	// outs is the owners with an out-<owner> chain and outrules entry.
	outs map[string]bool
}

// mirror returns the dataplane's mirror, reading it from the kernel when
// there is none. Callers hold d.mu.
func (d *Dataplane) mirror(c *nftables.Conn) (*nftMirror, error) {
	if d.nftm != nil {
		return d.nftm, nil
	}
	m := &nftMirror{}
	ports, err := c.GetSetElements(d.portmapSet())
	if err != nil {
		return nil, fmt.Errorf("read port map: %w", err)
	}
	m.setPorts(ports)
	verdicts, err := c.GetSetElements(d.sandboxesSet())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", setSandboxes, err)
	}
	m.setVerdicts(verdicts)
	chains, err := c.ListChainsOfTableFamily(d.table().Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	m.setChains(d.table().Name, chains)
	if err := d.readEgress(c, m); err != nil {
		return nil, err
	}
	d.nftm = m
	return m, nil
}

// setPorts replaces the port part with the kernel's elements.
func (m *nftMirror) setPorts(elems []nftables.SetElement) {
	m.ports = make(map[uint16]Mapping, len(elems))
	m.owned = make(map[string]map[uint16]bool, len(elems))
	for _, e := range elems {
		if pm, ok := decodeMapping(e); ok {
			m.putPort(pm)
		}
	}
}

func (m *nftMirror) putPort(pm Mapping) {
	if old, ok := m.ports[pm.HostPort]; ok {
		m.forgetPort(old.HostPort)
	}
	m.ports[pm.HostPort] = pm
	if m.owned[pm.Owner] == nil {
		m.owned[pm.Owner] = map[uint16]bool{}
	}
	m.owned[pm.Owner][pm.HostPort] = true
}

func (m *nftMirror) forgetPort(hostPort uint16) {
	pm, ok := m.ports[hostPort]
	if !ok {
		return
	}
	delete(m.ports, hostPort)
	if set := m.owned[pm.Owner]; set != nil {
		delete(set, hostPort)
		if len(set) == 0 {
			delete(m.owned, pm.Owner)
		}
	}
}

// portsOfOwner returns owner's host ports.
func (m *nftMirror) portsOfOwner(owner string) []uint16 {
	out := make([]uint16, 0, len(m.owned[owner]))
	for hp := range m.owned[owner] {
		out = append(out, hp)
	}
	return out
}

// setVerdicts replaces the verdict map part with the kernel's elements.
func (m *nftMirror) setVerdicts(elems []nftables.SetElement) {
	m.verdicts = make(map[string]string, len(elems))
	m.verdictsOf = make(map[string]map[string]bool, len(elems))
	for _, e := range elems {
		m.putVerdict(string(e.Key), e.Comment)
	}
}

func (m *nftMirror) putVerdict(key, owner string) {
	m.forgetVerdict(key)
	m.verdicts[key] = owner
	if m.verdictsOf[owner] == nil {
		m.verdictsOf[owner] = map[string]bool{}
	}
	m.verdictsOf[owner][key] = true
}

func (m *nftMirror) forgetVerdict(key string) {
	owner, ok := m.verdicts[key]
	if !ok {
		return
	}
	delete(m.verdicts, key)
	if set := m.verdictsOf[owner]; set != nil {
		delete(set, key)
		if len(set) == 0 {
			delete(m.verdictsOf, owner)
		}
	}
}

// verdictKeysOf returns the verdict map keys that belong to owner: its
// link's key and any key whose comment names it.
func (m *nftMirror) verdictKeysOf(owner string) []string {
	var out []string
	own := string(ifNameKey(LinkName(owner)))
	if _, ok := m.verdicts[own]; ok {
		out = append(out, own)
	}
	for k := range m.verdictsOf[owner] {
		if k != own {
			out = append(out, k)
		}
	}
	return out
}

// setChains replaces the chain part with the sb-* chains of table.
func (m *nftMirror) setChains(table string, chains []*nftables.Chain) {
	m.chains = map[string]bool{}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != table {
			continue
		}
		if owner, ok := strings.CutPrefix(ch.Name, "sb-"); ok {
			m.chains[owner] = true
		}
	}
}

// flushError marks the failure of a committed batch (as opposed to a
// refusal decided from the mirror): retryStale retries those once.
type flushError struct{ err error }

func (e *flushError) Error() string { return e.err.Error() }
func (e *flushError) Unwrap() error { return e.err }

// flush commits the queued batch; a failure is a *flushError.
func flush(c *nftables.Conn, format string, a ...any) error {
	if err := c.Flush(); err != nil {
		return &flushError{fmt.Errorf(format+": %w", append(a, err)...)}
	}
	return nil
}

// retryStale runs op on the lasting connection and the mirror; when op's
// batch fails in the kernel, it drops both and runs op once more against a
// fresh read, so an object removed or changed behind the mirror's back
// costs one retry, never a failed kill or create. Callers hold d.mu.
func (d *Dataplane) retryStale(op func(*nftables.Conn, *nftMirror) error) error {
	err := d.tryOnce(op)
	var fe *flushError
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	return d.tryOnce(op)
}

// tryOnce runs op once; any error drops the connection and the mirror.
func (d *Dataplane) tryOnce(op func(*nftables.Conn, *nftMirror) error) (err error) {
	c, err := d.dpConn()
	if err != nil {
		return err
	}
	defer d.settleNFT(&err)
	m, err := d.mirror(c)
	if err != nil {
		return err
	}
	return op(c, m)
}
