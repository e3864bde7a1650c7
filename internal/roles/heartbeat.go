package roles

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/nodeapi"
)

// heartbeater keeps a node registered with the server: over HTTP for a
// cubelet (one client per server replica, failing over in order), or
// in-process for the node of an all-in-one Cube (cluster.NewRegistryService).
type heartbeater struct {
	nodeID  string
	servers []string // names of the servers, for logs; parallel to clients
	clients []nodev1connect.RegistryServiceClient
	node    *cubelet.Cubelet
	info    nodeapi.InfoFunc
	check   *selfCheck
	log     *slog.Logger
	// registered, if set, is closed after the first registration.
	registered chan struct{}
	// link, if set, records each call's outcome for GET /readyz.
	link *serverLink
	// usage, if set, measures what the sandboxes use for each heartbeat.
	usage *usageSampler
	// builds, if set, are recipe build sandboxes the server does not know
	// of: left out of the heartbeat (the server would kill them as strays).
	builds *nodeSandboxes
}

// run registers with the server (retrying with backoff) and then
// heartbeats, each time with a fresh self-check (see selfCheck); it kills
// sandboxes the server no longer knows and registers again when the server
// asks. It returns when ctx ends.
func (h heartbeater) run(ctx context.Context) {
	log := h.log
	cur := 0
	// failover moves to the next server replica after a failed call; the
	// new replica may not know this node yet, so register again.
	failover := func() {
		if len(h.clients) > 1 {
			cur = (cur + 1) % len(h.clients)
		}
	}
	interval, registered, backoff := 2*time.Second, false, 500*time.Millisecond
	for {
		client, server := h.clients[cur], h.servers[cur]
		if !registered {
			h.check.refresh(ctx)
			ni, err := h.info(ctx)
			if err == nil {
				var res *connect.Response[nodev1.RegisterResponse]
				res, err = client.Register(ctx, connect.NewRequest(&nodev1.RegisterRequest{Node: ni}))
				if err == nil {
					registered, backoff = true, 500*time.Millisecond
					h.link.succeeded(server, true)
					if ms := res.Msg.HeartbeatIntervalMs; ms > 0 {
						interval = time.Duration(ms) * time.Millisecond
					}
					log.Info("registered with server", "server", server, "serverVersion", res.Msg.ServerVersion)
					if h.registered != nil {
						close(h.registered)
						h.registered = nil
					}
				}
			}
			if err != nil {
				log.Warn("register with server", "server", server, "err", nodeapi.FromConnect(err))
				h.link.failed(server, nodeapi.FromConnect(err))
				failover()
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(backoff*2, 15*time.Second)
				continue
			}
		}
		if !sleepCtx(ctx, interval) {
			return
		}
		sbs, err := h.node.Sandboxes(ctx)
		if err != nil {
			log.Warn("list sandboxes for heartbeat", "err", err)
			continue
		}
		ids := make([]string, 0, len(sbs))
		for _, sb := range sbs {
			if !h.builds.hidden(sb.ID) {
				ids = append(ids, sb.ID)
			}
		}
		hb := &nodev1.HeartbeatRequest{NodeId: h.nodeID, SandboxIds: ids, Health: h.check.refresh(ctx),
			Usage: h.usage.sample(len(ids) + h.node.PoolSize())}
		if ni, err := h.info(ctx); err == nil {
			hb.Templates = ni.Templates
		}
		res, err := client.Heartbeat(ctx, connect.NewRequest(hb))
		if err != nil {
			log.Warn("heartbeat", "server", server, "err", nodeapi.FromConnect(err))
			h.link.failed(server, nodeapi.FromConnect(err))
			failover()
			registered = len(h.clients) == 1
			continue
		}
		h.link.succeeded(server, false)
		if res.Msg.Reregister {
			registered = false
			continue
		}
		for _, id := range res.Msg.KillSandboxIds {
			log.Info("server no longer knows sandbox: removing it", "sandbox", id)
			if err := h.node.KillSandbox(ctx, id); err != nil {
				log.Warn("remove unknown sandbox", "sandbox", id, "err", err)
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
