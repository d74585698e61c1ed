package handler

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// handleRunCodeStream runs code as handleRunCode does and streams its
// output as NDJSON RunCodeEvents, ending with exactly one result (or
// error) event. Failures before the code starts (no session, canceled
// while queued, reseed failed) are problem responses; the 200 is sent when
// the code starts. If the host goes away (or stops taking events), the
// code is interrupted, as on a timeout.
func (a *Agent) handleRunCodeStream(w http.ResponseWriter, r *http.Request) {
	var req agentapi.RunCodeRequest
	if err := readJSON(w, r, &req); err != nil {
		writeProblem(w, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	// Touched by started (this goroutine, inside RunStream), by the output
	// callbacks (one goroutine at a time, all done when RunStream returns)
	// and after RunStream: never at the same time.
	started := false
	var writeErr error
	send := func(ev agentapi.RunCodeEvent) {
		if writeErr != nil {
			return
		}
		if writeErr = enc.Encode(ev); writeErr == nil {
			writeErr = rc.Flush()
		}
		if writeErr != nil {
			cancel() // nobody will see the output: interrupt the code
		}
	}
	res, err := a.py.RunStream(ctx, req, func() {
		started = true
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		if writeErr = rc.Flush(); writeErr != nil { // the host learns the code started
			cancel()
		}
	}, func(stream, data string) {
		send(agentapi.RunCodeEvent{Type: stream, Data: data})
	})
	switch {
	case err != nil && !started:
		writeProblem(w, err)
	case err != nil:
		p := problemOf(err)
		send(agentapi.RunCodeEvent{Type: agentapi.EventError, Error: &p})
	default:
		send(agentapi.RunCodeEvent{Type: agentapi.EventResult, Result: &res})
	}
}

// problemOf is err as the problem document writeProblem would send.
func problemOf(err error) agentapi.Problem {
	code := errdefs.Code(err)
	status := HTTPStatus(code)
	return agentapi.Problem{Title: http.StatusText(status), Status: status, Detail: err.Error(), Code: code}
}
