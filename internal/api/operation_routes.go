package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	op, ok := s.ops.get(r.PathValue("id"))
	if !ok {
		writeProblem(w, r, errNoOperation(r.PathValue("id")))
		return
	}
	writeJSON(w, op)
}

// listOperations lists the operations of r's tenant (all for an admin), a
// page at a time (paging.go), oldest first.
func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	p := s.principalOf(r)
	out := []apiv1.Operation{}
	for _, op := range s.ops.list() {
		if p.Sees(op.Tenant) {
			out = append(out, op)
		}
	}
	writePage(w, r, out, operationOrder)
}

// operationEvents streams an operation's events until it ends: its current
// state first (so a client that re-attaches starts from where it is),
// progress as it comes, its terminal state last. NDJSON by default, like
// the daemon's other streams (one JSON value a line, read with any line
// reader, what the CLI and SDKs already parse); Server-Sent Events with
// Accept: text/event-stream, for browsers' EventSource.
func (s *Server) operationEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := s.ops.get(id); !ok {
		writeProblem(w, r, errNoOperation(id))
		return
	}
	ctx, done := s.streamContext(r)
	defer done()
	rc := http.NewResponseController(w)
	// The server sets no write timeout of its own: one left here would
	// outlive the stream on a kept-alive connection.
	defer rc.SetWriteDeadline(time.Time{})
	ev := startEvents(w, r, rc)
	ev.writeTimeout = feedWriteTimeout
	// A build can print nothing for minutes (a package download).
	defer ev.keepAlive(feedHeartbeat)()
	s.ops.follow(ctx, id, func(e apiv1.OperationEvent) error { return ev.send(e.Type, e) })
}

// cancelOperation cancels a running operation's work: 202 with the
// operation (cancel_requested set); its state becomes cancelled once the
// work has unwound, which its events say. A finished one is 409.
func (s *Server) cancelOperation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	op, err := s.ops.cancel(id, errOpCancelled)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	if op.Target != "" {
		noteTargets(r, op.Target)
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(op)
}
