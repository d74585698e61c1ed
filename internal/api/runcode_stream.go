package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

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
	agent, err := s.Engine.Agent(r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	proxyRunCodeStream(w, r, agent, agentRunCode(req))
}

// proxyRunCodeStream answers 200 at once, as exec does, then relays the
// agent's events; what fails after that (no session, the session died, the
// agent is gone) is the error event.
func proxyRunCodeStream(w http.ResponseWriter, r *http.Request, agent codeStreamer, req agentapi.RunCodeRequest) {
	rc := http.NewResponseController(w)
	cw := &codeEventWriter{w: w, rc: rc, sse: strings.Contains(r.Header.Get("Accept"), sseType)}
	if cw.sse {
		w.Header().Set("Content-Type", sseType)
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", ndjson)
	}
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	// A failed write (the client left) fails the agent call, which
	// interrupts the code.
	res, err := agent.RunCodeStream(r.Context(), req, cw.stream(agentapi.EventStdout), cw.stream(agentapi.EventStderr))
	if err != nil {
		noteError(r, err)
		p := ProblemOf(err, requestID(r))
		cw.send(apiv1.RunCodeEvent{Type: agentapi.EventError, Error: &p})
		return
	}
	cw.send(apiv1.RunCodeEvent{Type: agentapi.EventResult, Result: &res})
}

// codeEventWriter writes RunCodeEvents as NDJSON lines or SSE messages,
// flushing each.
type codeEventWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	sse bool
}

func (c *codeEventWriter) send(ev apiv1.RunCodeEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sse {
		_, err = fmt.Fprintf(c.w, "event: %s\ndata: %s\n\n", ev.Type, data)
	} else {
		_, err = c.w.Write(append(data, '\n'))
	}
	if err != nil {
		return err
	}
	return c.rc.Flush()
}

type codeEventStream struct {
	c   *codeEventWriter
	typ string
}

func (c *codeEventWriter) stream(typ string) io.Writer { return &codeEventStream{c: c, typ: typ} }

func (s *codeEventStream) Write(p []byte) (int, error) {
	if err := s.c.send(apiv1.RunCodeEvent{Type: s.typ, Data: string(p)}); err != nil {
		return 0, err
	}
	return len(p), nil
}
