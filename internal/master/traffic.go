package master

import (
	"context"
	"crypto/subtle"
	"fmt"

	"github.com/cube-dev/cube/internal/errdefs"
)

// AuthorizeTraffic checks the traffic access token for a request to a
// sandbox's non-envd port: sandboxes created with
// network.allowPublicTraffic=false answer only requests carrying it.
func (m *Master) AuthorizeTraffic(ctx context.Context, id string, _ uint16, token string) error {
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.TrafficAccessToken == "" {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(sb.TrafficAccessToken)) != 1 {
		return fmt.Errorf("sandbox %s: traffic access token: %w", id, errdefs.ErrPermissionDenied)
	}
	return nil
}

// wantsTrafficToken reports whether a create asked for private traffic.
func wantsTrafficToken(n *Network) bool {
	return n != nil && n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic
}
