package interp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/errdefs/errhttp"
)

// The sandbox's access token is envd's: envd has it from its config or a
// later POST /init and checks X-Access-Token on its routes. This server
// keeps no copy; it asks envd with the caller's header (GET /envs, which
// it reads anyway for the sandbox's env vars), so a token /init changes
// applies here at once, a sandbox without a token accepts any caller, and
// one place decides. It fails closed: when envd cannot be asked, nothing
// runs.
//
// @e2b/code-interpreter 2.8.0 sends X-Access-Token on POST /execute only,
// not on its /contexts calls (create, list, restart, remove: they run no
// code). So /execute requires the token, and the /contexts routes check it
// when one is sent: a wrong token is refused there too, a missing one is
// not (requiring it would break the official client's context calls on
// every Cube sandbox, which all have a token).

// tokenHeader is the header the client and envd use.
const tokenHeader = "X-Access-Token"

// sandboxEnv asks envd for the sandbox's env vars with the caller's token:
// that checks the token too. A token envd refuses is ErrUnauthenticated;
// envd not answering is ErrUnavailable. Without an envd (EnvdURL empty) it
// returns nil, nil.
func (it *Interp) sandboxEnv(ctx context.Context, token string) (map[string]string, error) {
	if it.cfg.EnvdURL == "" {
		return nil, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, it.cfg.EnvdURL+"/envs", nil)
	if err != nil {
		return nil, fmt.Errorf("envd /envs: %v: %w", err, errdefs.ErrUnavailable)
	}
	if token != "" {
		req.Header.Set(tokenHeader, token)
	}
	resp, err := it.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("check %s with envd: %w: %w", tokenHeader, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("missing or wrong %s: %w", tokenHeader, errdefs.ErrUnauthenticated)
	default:
		return nil, fmt.Errorf("check %s with envd: GET /envs answered %s: %w", tokenHeader, resp.Status, errdefs.ErrUnavailable)
	}
	vars := map[string]string{}
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		return nil, fmt.Errorf("envd /envs: %v: %w", err, errdefs.ErrUnavailable)
	}
	return vars, nil
}

// tokenIfSent refuses requests whose X-Access-Token envd refuses; requests
// without the header pass (see above: the client sends none on /contexts).
func (it *Interp) tokenIfSent(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if token := r.Header.Get(tokenHeader); token != "" {
			if _, err := it.sandboxEnv(r.Context(), token); err != nil {
				errhttp.Write(w, err)
				return
			}
		}
		next(w, r)
	}
}
