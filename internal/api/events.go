package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Streamed answer formats, chosen by the Accept header.
const (
	ndjson  = "application/x-ndjson"
	sseType = "text/event-stream"
)

// eventWriter writes typed events to a streamed answer (exec, run_code
// stream) as NDJSON lines or Server-Sent Events, flushing each so the
// client sees output as it happens.
type eventWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	sse bool
	// writeTimeout, if set, bounds each write: a client that stops
	// reading fails the stream instead of holding it forever.
	writeTimeout time.Duration
}

// startEvents sends the 200 with the format the request accepts (SSE when
// it asks for text/event-stream, NDJSON otherwise).
func startEvents(w http.ResponseWriter, r *http.Request, rc *http.ResponseController) *eventWriter {
	ev := &eventWriter{w: w, rc: rc, sse: strings.Contains(r.Header.Get("Accept"), sseType)}
	if ev.sse {
		w.Header().Set("Content-Type", sseType)
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", ndjson)
	}
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	return ev
}

// send writes one event of type typ.
func (e *eventWriter) send(typ string, ev any) error { return e.sendID("", typ, ev) }

// sendID writes one event of type typ with an SSE id (none if empty; an
// NDJSON line carries its id in ev).
func (e *eventWriter) sendID(id, typ string, ev any) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deadline()
	if e.sse {
		if id != "" {
			_, err = fmt.Fprintf(e.w, "id: %s\n", id)
		}
		if err == nil {
			_, err = fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", typ, data)
		}
	} else {
		_, err = e.w.Write(append(data, '\n'))
	}
	if err != nil {
		return err
	}
	return e.rc.Flush()
}

// comment writes an SSE comment (a heartbeat); nothing in NDJSON, whose
// clients see a quiet stream as quiet.
func (e *eventWriter) comment(text string) error {
	if !e.sse {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deadline()
	if _, err := fmt.Fprintf(e.w, ": %s\n\n", text); err != nil {
		return err
	}
	return e.rc.Flush()
}

// deadline sets the write deadline for the next write, with e.mu held.
func (e *eventWriter) deadline() {
	if e.writeTimeout > 0 {
		e.rc.SetWriteDeadline(time.Now().Add(e.writeTimeout))
	}
}

// keepAlive writes an SSE comment every interval until stop is called, so
// that proxies and clients do not take a quiet stream for a dead one
// (nothing for NDJSON). stop waits for a write in flight: the handler may
// return once it has.
func (e *eventWriter) keepAlive(every time.Duration) (stop func()) {
	if !e.sse {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if e.comment("keep-alive") != nil {
					return
				}
			}
		}
	}()
	return func() { close(quit); <-done }
}

// stream returns a writer that sends each write as an event of type typ,
// built by mk (which must copy p if it keeps it).
func (e *eventWriter) stream(typ string, mk func(p []byte) any) io.Writer {
	return &eventStream{e: e, typ: typ, mk: mk}
}

type eventStream struct {
	e   *eventWriter
	typ string
	mk  func([]byte) any
}

func (s *eventStream) Write(p []byte) (int, error) {
	if err := s.e.send(s.typ, s.mk(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
