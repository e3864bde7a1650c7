package proxy

import "sync"

// maxCacheEntries bounds the address cache; it is cleared when full.
const maxCacheEntries = 65536

// addrCache remembers resolved addresses per (sandbox, port). A generation
// counter keeps a resolution that raced with an invalidation from being
// stored.
type addrCache struct {
	mu  sync.Mutex
	gen uint64
	n   int
	m   map[string]map[uint16]string
}

func newAddrCache() *addrCache { return &addrCache{m: map[string]map[uint16]string{}} }

func (c *addrCache) get(id string, port uint16) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr, ok := c.m[id][port]
	return addr, ok
}

func (c *addrCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put stores addr unless an invalidation happened since gen was read.
func (c *addrCache) put(id string, port uint16, addr string, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if c.n >= maxCacheEntries {
		c.m, c.n = map[string]map[uint16]string{}, 0
	}
	ports := c.m[id]
	if ports == nil {
		ports = map[uint16]string{}
		c.m[id] = ports
	}
	if _, ok := ports[port]; !ok {
		c.n++
	}
	ports[port] = addr
}

// invalidate forgets every port of a sandbox.
func (c *addrCache) invalidate(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.n -= len(c.m[id])
	delete(c.m, id)
}
