package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// getSandbox serves GET /sandboxes/{sandboxID}.
func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toDetail(sb))
}

// killSandbox serves DELETE /sandboxes/{sandboxID}: 204, or 404 JSON.
func (s *server) killSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Kill(r.Context(), r.PathValue("sandboxID")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// metrics serves GET /sandboxes/{sandboxID}/metrics?start=&end= (unix
// seconds). Cube keeps no history: the answer is the current sample when it
// falls in the range, else an empty array.
func (s *server) metrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	bound := func(name string) (int64, bool, error) {
		v := q.Get(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false, errdefs.ErrInvalidArgument
		}
		return n, true, nil
	}
	start, hasStart, err1 := bound("start")
	end, hasEnd, err2 := bound("end")
	if err1 != nil || err2 != nil {
		writeErrorMessage(w, http.StatusBadRequest, "start and end must be unix timestamps in seconds")
		return
	}
	mt, err := s.m.Metrics(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := []metricJSON{}
	ts := mt.Timestamp.Truncate(time.Second).Unix()
	if (!hasStart || start <= ts) && (!hasEnd || end >= ts) {
		out = append(out, toMetric(mt))
	}
	writeJSON(w, http.StatusOK, out)
}
