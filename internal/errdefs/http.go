package errdefs

import (
	"encoding/json"
	"net/http"
)

// WriteHTTP answers err as Cube's JSON error body {"code": <status>,
// "message": "..."} with the status HTTPStatus maps it to.
func WriteHTTP(w http.ResponseWriter, err error) {
	status := HTTPStatus(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, err.Error()})
}
