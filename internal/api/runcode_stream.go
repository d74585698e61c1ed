package api

import (
	"context"
	"io"
	"net/http"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
)

// codeStreamer is the agent client's streamed run_code (an interface so
// the proxy is tested without an engine).
type codeStreamer interface {
	RunCodeStream(ctx context.Context, req agentapi.RunCodeRequest, stdout, stderr io.Writer) (agentapi.RunCodeResult, error)
}

// runCodeStream runs code in the sandbox's Python session and streams its
// output: NDJSON RunCodeEvents (default), or Server-Sent Events (Accept:
// text/event-stream).
func (s *Server) runCodeStream(w http.ResponseWriter, r *http.Request) {
	var req apiv1.RunCodeRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	proxyRunCodeStream(w, r, agent, agentRunCode(req))
}

// proxyRunCodeStream answers 200 at once, as exec does, then relays the
// agent's events; what fails after that (no session, the session died, the
// agent is gone) is the error event.
func proxyRunCodeStream(w http.ResponseWriter, r *http.Request, agent codeStreamer, req agentapi.RunCodeRequest) {
	ev := startEvents(w, r, http.NewResponseController(w))
	out := func(typ string) io.Writer {
		return ev.stream(typ, func(p []byte) any { return apiv1.RunCodeEvent{Type: typ, Data: string(p)} })
	}
	// A failed write (the client left) fails the agent call, which
	// interrupts the code.
	res, err := agent.RunCodeStream(r.Context(), req, out(agentapi.EventStdout), out(agentapi.EventStderr))
	if err != nil {
		noteError(r, err)
		p := ProblemOf(err, requestID(r))
		ev.send(agentapi.EventError, apiv1.RunCodeEvent{Type: agentapi.EventError, Error: &p})
		return
	}
	ev.send(agentapi.EventResult, apiv1.RunCodeEvent{Type: agentapi.EventResult, Result: &res})
}
