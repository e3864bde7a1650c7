package cubelet

import "github.com/cube-dev/cube/internal/nodeproto"

// The node protocol's types (package nodeproto) under the names the node
// agent's code uses; the control plane imports nodeproto, never cubelet.
type (
	CreateRequest = nodeproto.CreateRequest
	Sandbox       = nodeproto.Sandbox
	Metrics       = nodeproto.Metrics
)
