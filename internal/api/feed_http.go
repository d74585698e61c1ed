package api

import (
	"context"
	"net/http"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// feedHeartbeat is how often an idle SSE stream gets a comment, so that
// proxies and clients can tell a quiet stream from a dead one.
const feedHeartbeat = 15 * time.Second

// feedWriteTimeout bounds one write to a stream's client: a client that
// stops reading is cut, as one that falls behind is.
const feedWriteTimeout = 30 * time.Second

// auditedEvents are the engine's events that the audit log records on
// their own: the daemon decided them, no request did (a fork's or a
// kill's request is audited as the request).
var auditedEvents = map[string]bool{
	sandbox.EventDied: true, sandbox.EventExpired: true, sandbox.EventDiscarded: true,
	sandbox.EventBranchReady: true, sandbox.EventBranchFailed: true,
}

// events returns the lifecycle event feed, made on first use.
func (s *Server) events() *feed {
	s.feedOnce.Do(func() { s.feedV = newFeed(time.Now()) })
	return s.feedV
}

// EngineEvent takes an engine's lifecycle event (sandbox.Config.OnEvent):
// the audit log records those no request caused, and every one goes to
// the event streams. A snapshot event is its owner's to see: the tenant
// the engine was told (a template's, a branch's, a compaction's), or, for
// a deletion, the tag's recorded owner.
func (s *Server) EngineEvent(ev sandbox.Event) {
	if auditedEvents[ev.Kind] {
		targets := []string{ev.SandboxID}
		if ev.Tag != "" {
			targets = append(targets, ev.Tag)
		}
		s.RecordEvent(ev.Kind, targets, ev.Err, map[string]any{"reason": ev.Reason})
	}
	out := apiv1.Event{Type: ev.Kind, Sandbox: ev.SandboxID, Tag: ev.Tag, Tenant: ev.Tenant, Reason: ev.Reason}
	if out.Tenant == "" && ev.Kind == sandbox.EventSnapshotDeleted {
		// Told before the API forgets the tag's owner.
		out.Tenant, _ = s.owners.owner(ev.Tag, "")
	}
	if ev.Err != nil {
		out.Error = ev.Err.Error()
	}
	s.events().publish(out)
}

// CloseStreams ends the streams the server holds open (lifecycle events,
// operation events, a create's progress, a wait for an operation) and
// refuses new event streams; call it when the HTTP server shuts down
// (http.Server.RegisterOnShutdown), which otherwise waits for them while
// the operations they follow go on.
func (s *Server) CloseStreams() { s.events().close() }

// streamContext is r's context, ended too when the server closes its
// streams (CloseStreams): a handler that follows something long uses it.
func (s *Server) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.events().closing, cancel)
	return ctx, func() { stop(); cancel() }
}

// streamEvents serves GET /v1/events: lifecycle events as Server-Sent
// Events (Accept: text/event-stream) or NDJSON, those of the caller's
// tenant (an admin's: all), optionally only some types (?type=sandbox.*,
// repeated or comma-separated). Last-Event-ID (or ?since=ID) resumes
// after that event from the kept backlog. The stream runs until the
// client leaves, falls too far behind, or the daemon stops.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	types, err := parseEventTypes(r.URL.Query()["type"])
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	// A browser's EventSource reconnects to the same URL with a newer
	// Last-Event-ID: the header wins over ?since=.
	after := r.Header.Get("Last-Event-ID")
	if after == "" {
		after = r.URL.Query().Get("since")
	}
	f := s.events()
	sub, backlog, err := f.subscribe(s.principalOf(r), types, after)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	defer f.unsubscribe(sub)
	rc := http.NewResponseController(w)
	w.Header().Set("X-Accel-Buffering", "no") // nginx: pass events as they come
	rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout))
	// The server sets no write timeout of its own, so a deadline left
	// here would outlive the stream on a kept-alive connection.
	defer rc.SetWriteDeadline(time.Time{})
	out := startEvents(w, r, rc)
	send := func(ev apiv1.Event) bool {
		rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout))
		if ev.Seq != 0 {
			ev.ID = f.id(ev.Seq)
		}
		return out.sendID(ev.ID, ev.Type, ev) == nil
	}
	for _, ev := range backlog {
		if !send(ev) {
			return
		}
	}
	beat := time.NewTicker(feedHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-sub.cut:
			return
		case ev := <-sub.ch:
			if !send(ev) {
				return
			}
		case <-beat.C:
			rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout))
			if out.comment("keep-alive") != nil {
				return
			}
		}
	}
}

// publishOperation tells the event streams that an operation ended.
func (s *Server) publishOperation(op apiv1.Operation) {
	ev := apiv1.Event{Type: ActionOperationFinished, Operation: op.ID, Tenant: auth.TenantOf(op.Tenant), Reason: string(op.State)}
	if op.Error != nil {
		ev.Error = op.Error.Detail
	}
	s.events().publish(ev)
}
