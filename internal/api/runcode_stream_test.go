package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
)

// proxyEnv is the daemon's run_code stream proxy in front of a fake agent
// speaking the agent's wire format, through the real agent client.
type proxyEnv struct {
	agentReq chan agentapi.RunCodeRequest
	gone     chan struct{} // closed when the agent's request context ends
	url      string
}

func newProxyEnv(t *testing.T, agent http.HandlerFunc) *proxyEnv {
	t.Helper()
	p := &proxyEnv{agentReq: make(chan agentapi.RunCodeRequest, 1), gone: make(chan struct{})}
	as := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			go func() { <-r.Context().Done(); close(p.gone) }()
		}()
		if r.URL.Path != agentapi.PathRunCodeStream {
			t.Errorf("agent got %s", r.URL.Path)
		}
		var req agentapi.RunCodeRequest
		json.NewDecoder(r.Body).Decode(&req)
		p.agentReq <- req
		agent(w, r)
	}))
	t.Cleanup(as.Close)
	client := agentclient.NewHTTP(as.Client(), as.URL)
	ds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.RunCodeRequest
		if err := decode(w, r, &req); err != nil {
			writeProblem(w, r, err)
			return
		}
		proxyRunCodeStream(w, r, client, agentRunCode(req))
	}))
	t.Cleanup(ds.Close)
	p.url = ds.URL
	return p
}

func (p *proxyEnv) post(t *testing.T, ctx context.Context, accept, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readEvent(t *testing.T, br *bufio.Reader) apiv1.RunCodeEvent {
	t.Helper()
	line, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("reading an event: %v (got %q)", err, line)
	}
	var ev apiv1.RunCodeEvent
	if err := json.Unmarshal(line, &ev); err != nil {
		t.Fatalf("event %q: %v", line, err)
	}
	return ev
}

func TestRunCodeStreamProxiesEventsAsTheyCome(t *testing.T) {
	release := make(chan struct{})
	p := newProxyEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "0\n"})
		w.(http.Flusher).Flush()
		select { // the result waits until the client has seen the output
		case <-release:
		case <-r.Context().Done(): // the test failed before: do not hang its cleanup
			return
		}
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStderr, Data: "wärn\n"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventResult, Result: &agentapi.RunCodeResult{
			Result: map[string]string{"text/plain": "42"}, DurationMicros: 7,
		}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp := p.post(t, ctx, "", `{"code":"print(0)","timeout_ms":1500}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ndjson {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if req := <-p.agentReq; req.Code != "print(0)" || req.TimeoutMillis != 1500 {
		t.Fatalf("agent request %+v", req)
	}
	br := bufio.NewReader(resp.Body)
	if ev := readEvent(t, br); ev.Type != "stdout" || ev.Data != "0\n" {
		t.Fatalf("first event %+v", ev)
	}
	close(release)
	if ev := readEvent(t, br); ev.Type != "stderr" || ev.Data != "wärn\n" {
		t.Fatalf("second event %+v", ev)
	}
	ev := readEvent(t, br)
	if ev.Type != "result" || ev.Result == nil || ev.Result.Result["text/plain"] != "42" || ev.Result.DurationMicros != 7 || ev.Error != nil {
		t.Fatalf("result event %+v", ev)
	}
	if rest, _ := br.ReadString(0); rest != "" {
		t.Fatalf("after the result: %q", rest)
	}
}

func TestRunCodeStreamSSE(t *testing.T) {
	p := newProxyEnv(t, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "hi\n"})
		enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventResult, Result: &agentapi.RunCodeResult{}})
	})
	resp := p.post(t, context.Background(), "text/event-stream", `{"code":"print('hi')"}`)
	b := new(strings.Builder)
	bufio.NewReader(resp.Body).WriteTo(b)
	want := "event: stdout\ndata: {\"type\":\"stdout\",\"data\":\"hi\\n\"}\n\n" +
		"event: result\ndata: {\"type\":\"result\",\"result\":{\"stdout\":\"\",\"stderr\":\"\",\"duration_us\":0}}\n\n"
	if resp.Header.Get("Content-Type") != sseType || b.String() != want {
		t.Fatalf("%s:\n%s", resp.Header.Get("Content-Type"), b)
	}
}

func TestRunCodeStreamFailuresAreErrorEvents(t *testing.T) {
	for name, c := range map[string]struct {
		agent http.HandlerFunc
		code  string
	}{
		"cut": {func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "partial"})
		}, "unavailable"},
		"agent error event": {func(w http.ResponseWriter, r *http.Request) {
			enc := json.NewEncoder(w)
			enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "partial"})
			enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventError, Error: &agentapi.Problem{Status: 409, Detail: "the Python session exited", Code: "failed_precondition"}})
		}, "failed_precondition"},
		"agent problem": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			json.NewEncoder(w).Encode(agentapi.Problem{Status: 409, Detail: "no Python session", Code: "failed_precondition"})
		}, "failed_precondition"},
	} {
		p := newProxyEnv(t, c.agent)
		resp := p.post(t, context.Background(), "", `{"code":"x"}`)
		br := bufio.NewReader(resp.Body)
		ev := readEvent(t, br)
		if ev.Type == "stdout" {
			ev = readEvent(t, br)
		}
		if resp.StatusCode != 200 || ev.Type != "error" || ev.Error == nil || ev.Error.Code != c.code || ev.Error.Status == 0 || ev.Result != nil {
			t.Errorf("%s: %d %+v", name, resp.StatusCode, ev)
		}
	}
}

// A client that goes away ends the agent request (which interrupts the
// code in the guest).
func TestRunCodeStreamClientGoneCancelsAgent(t *testing.T) {
	p := newProxyEnv(t, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for i := 0; r.Context().Err() == nil; i++ {
			enc.Encode(agentapi.RunCodeEvent{Type: agentapi.EventStdout, Data: "tick\n"})
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	resp := p.post(t, ctx, "", `{"code":"loop"}`)
	readEvent(t, bufio.NewReader(resp.Body))
	cancel()
	select {
	case <-p.gone:
	case <-time.After(time.Minute):
		t.Fatal("the agent request outlived the client")
	}
}

func TestRunCodeStreamRoute(t *testing.T) {
	h := (&Server{}).Handler()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes/sb/run_code/stream", strings.NewReader(`{"cdoe":"1"}`))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	var p apiv1.Problem
	json.Unmarshal(rec.Body.Bytes(), &p)
	if rec.Code != 400 || p.Code != "invalid_argument" {
		t.Fatalf("unknown field: %d %s", rec.Code, rec.Body)
	}

	doc := loadDoc(t)
	post := obj(obj(obj(doc["paths"])["/v1/sandboxes/{id}/run_code/stream"])["post"])
	ok := obj(doc.resolve(t, obj(post["responses"])["200"])["content"])
	if obj(obj(ok[ndjson])["schema"])["$ref"] != "#/components/schemas/RunCodeEvent" || ok[sseType] == nil {
		t.Errorf("stream content %v", ok)
	}
	body := doc.resolve(t, obj(obj(obj(post["requestBody"])["content"])["application/json"])["schema"])
	if body["additionalProperties"] != false {
		t.Error("request schema allows unknown fields; the server rejects them")
	}
	types, _ := obj(obj(obj(obj(doc["components"])["schemas"])["RunCodeEvent"])["properties"])["type"].(map[string]any)["enum"].([]any)
	if !sameSet(types, []any{agentapi.EventStdout, agentapi.EventStderr, agentapi.EventResult, agentapi.EventError}) {
		t.Errorf("RunCodeEvent types %v", types)
	}
}
