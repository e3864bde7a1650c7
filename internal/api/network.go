package api

import (
	"net/http"

	"github.com/cube-dev/cube/internal/master"
)

// updateNetwork serves PUT /sandboxes/{sandboxID}/network
// (SandboxNetworkUpdateConfig): 204, 400 for bad CIDRs/domains, 404, or 501
// when the node cannot change a running sandbox's network.
func (s *server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		AllowInternetAccess *bool                           `json:"allow_internet_access"`
		AllowOut            []string                        `json:"allowOut"`
		DenyOut             []string                        `json:"denyOut"`
		EgressProxy         *master.EgressProxy             `json:"egressProxy"`
		Rules               map[string][]master.NetworkRule `json:"rules"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	err := s.m.UpdateNetwork(r.Context(), r.PathValue("sandboxID"), master.NetworkUpdate{
		AllowInternetAccess: body.AllowInternetAccess, AllowOut: body.AllowOut, DenyOut: body.DenyOut,
		EgressProxy: body.EgressProxy, Rules: body.Rules,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
