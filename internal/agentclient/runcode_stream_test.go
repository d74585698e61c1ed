package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestRunCodeStreamEvents(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		var req agentapi.RunCodeRequest
		if r.URL.Path != agentapi.PathRunCodeStream || r.Method != http.MethodPost {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Code != "x" || req.TimeoutMillis != 5 {
			t.Errorf("request body: %+v %v", req, err)
		}
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "a"})
		enc.Encode(agentapi.RunCodeEvent{Type: "progress"}) // unknown types are skipped
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStderr, Data: "é"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "b"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventResult, Result: &agentapi.RunCodeResult{
			Result: map[string]string{"text/plain": "3"}, DurationMicros: 9,
		}})
	})
	var out, errb bytes.Buffer
	res, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x", TimeoutMillis: 5}, &out, &errb)
	if err != nil || res.Result["text/plain"] != "3" || res.DurationMicros != 9 || out.String() != "ab" || errb.String() != "é" {
		t.Fatalf("%+v %v %q %q", res, err, out.String(), errb.String())
	}
	// nil writers discard.
	if _, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x", TimeoutMillis: 5}, nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestRunCodeStreamWithoutResultIsAnError(t *testing.T) {
	for name, tail := range map[string]string{
		"cut":           "",
		"cut mid-line":  `{"type":"result","resu`,
		"empty result":  `{"type":"result"}` + "\n",
		"garbage after": "not json\n",
	} {
		c := server(t, func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "partial"})
			w.Write([]byte(tail))
		})
		var out bytes.Buffer
		res, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x"}, &out, nil)
		if !errdefs.IsUnavailable(err) {
			t.Errorf("%s: RunCodeStream = %+v, %v; want unavailable", name, res, err)
		}
		if out.String() != "partial" {
			t.Errorf("%s: stdout %q", name, out.String())
		}
	}
}

func TestRunCodeStreamErrorEventKeepsItsClass(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "dying"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventError, Error: &agentapi.Problem{
			Status: 409, Detail: "the Python session exited", Code: "failed_precondition",
		}})
	})
	_, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x"}, nil, nil)
	var pe *ProblemError
	if !errdefs.IsFailedPrecondition(err) || !errors.As(err, &pe) || pe.Problem.Detail != "the Python session exited" {
		t.Fatalf("%v", err)
	}
}

func TestRunCodeStreamProblemBeforeStart(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(409)
		json.NewEncoder(w).Encode(agentapi.Problem{Status: 409, Detail: "no Python session", Code: "failed_precondition"})
	})
	if _, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x"}, nil, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("%v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestRunCodeStreamWriterFailure(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "a"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventResult, Result: &agentapi.RunCodeResult{}})
	})
	if _, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x"}, failWriter{}, nil); err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Fatalf("%v", err)
	}
}
