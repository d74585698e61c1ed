package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// unixHTTP is a raw HTTP client for the daemon's socket, to check wire
// formats the CLI does not use.
func unixHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// TestAPIFormats checks the exec answer formats (NDJSON, SSE, buffered
// JSON), problem+json errors with request ids, label filters and the image
// build operation.
func TestAPIFormats(t *testing.T) {
	c := newCLI(t)
	tag := "it-api-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "1", "--label", "team=it", "--timeout", "10m", "--json")), &fr)
	if len(fr.Sandboxes) != 1 || fr.Sandboxes[0].Metadata["team"] != "it" || fr.Sandboxes[0].ExpiresAt == nil {
		t.Fatalf("fork with labels and timeout: %+v", fr)
	}
	id := fr.Sandboxes[0].ID
	hc := unixHTTP(filepath.Join(c.runDir, "forkd.sock"))
	execReq := func(accept string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://forkd/v1/sandboxes/"+id+"/exec", nil)
		req.Header.Set(apiv1.ExecHeader, `{"shell":"echo out; echo err >&2; exit 4"}`)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := execReq("application/json")
	var res apiv1.ExecResult
	json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode != 4 {
		t.Fatalf("buffered exec: %+v", res)
	}

	resp = execReq("text/event-stream")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || !strings.Contains(string(body), "event: exit\ndata: ") || !strings.Contains(string(body), `"exit_code":4`) {
		t.Fatalf("SSE exec: %s\n%s", resp.Header.Get("Content-Type"), body)
	}

	resp = execReq("")
	sc := bufio.NewScanner(resp.Body)
	var last apiv1.ExecEvent
	for sc.Scan() {
		json.Unmarshal(sc.Bytes(), &last)
	}
	resp.Body.Close()
	if last.Type != "exit" || last.ExitCode != 4 {
		t.Fatalf("NDJSON exec ended with %+v", last)
	}

	// A branch and a compact retried with their Idempotency-Key get the
	// first answer, replayed, without doing the work again.
	post := func(path, body string, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://forkd"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, data
	}
	brTag, flatTag := tag+"-br", tag+"-flat"
	defer c.run("rmi", brTag)
	defer c.run("rmi", flatTag)
	brKey := map[string]string{apiv1.IdempotencyKeyHeader: "branch-" + brTag}
	r1, b1 := post("/v1/sandboxes/"+id+"/branch", `{"tag":"`+brTag+`"}`, brKey)
	r2, b2 := post("/v1/sandboxes/"+id+"/branch", `{"tag":"`+brTag+`"}`, brKey)
	if r1.StatusCode != http.StatusCreated || r2.StatusCode != http.StatusCreated || string(b1) != string(b2) || r2.Header.Get(apiv1.IdempotentReplayedHeader) != "true" {
		t.Fatalf("retried branch: %d %s then %d %v %s, want the first 201 replayed", r1.StatusCode, b1, r2.StatusCode, r2.Header, b2)
	}
	cKey := map[string]string{apiv1.IdempotencyKeyHeader: "compact-" + flatTag, "Prefer": apiv1.PreferAsync}
	var op1, op2 apiv1.Operation
	r1, b1 = post("/v1/snapshots/"+brTag+"/compact", `{"to":"`+flatTag+`"}`, cKey)
	r2, b2 = post("/v1/snapshots/"+brTag+"/compact", `{"to":"`+flatTag+`"}`, cKey)
	if json.Unmarshal(b1, &op1) != nil || json.Unmarshal(b2, &op2) != nil || r1.StatusCode != http.StatusAccepted || op1.ID == "" || op2.ID != op1.ID || r2.Header.Get(apiv1.IdempotentReplayedHeader) != "true" {
		t.Fatalf("retried compact: %d %s then %d %s, want the same operation", r1.StatusCode, b1, r2.StatusCode, b2)
	}
	c.ok("operation", "watch", op1.ID)
	c.ok("snapshot", "info", flatTag)

	// Errors are problem+json with the request id, also for bad JSON.
	req, _ := http.NewRequest(http.MethodPost, "http://forkd/v1/sandboxes", strings.NewReader(`{"tag":`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p apiv1.Problem
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || p.RequestID == "" || p.RequestID != resp.Header.Get("X-Request-Id") {
		t.Fatalf("malformed JSON: %d %s %+v", resp.StatusCode, resp.Header.Get("Content-Type"), p)
	}

	// Label filter.
	var sbs []apiv1.Sandbox
	json.Unmarshal([]byte(c.ok("ls", "--label", "team=it", "--json")), &sbs)
	if len(sbs) != 1 {
		t.Fatalf("ls --label team=it: %+v", sbs)
	}
	json.Unmarshal([]byte(c.ok("ls", "--label", "team=other", "--json")), &sbs)
	if len(sbs) != 0 {
		t.Fatalf("ls --label team=other: %+v", sbs)
	}

	// Tag and state filters, with a dead sandbox to tell states apart.
	var victim apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "1", "--label", "team=victim", "--json")), &victim)
	if len(victim.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", victim)
	}
	deadID := victim.Sandboxes[0].ID
	syscall.Kill(victim.Sandboxes[0].PID, syscall.SIGKILL)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var sb apiv1.Sandbox
		json.Unmarshal([]byte(c.okRaw(hc, "/v1/sandboxes/"+deadID)), &sb)
		if sb.State == apiv1.StateDead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s whose VMM was killed: %+v", deadID, sb)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ids := func(query string) []string {
		t.Helper()
		// One sandbox a page: every one comes, filters applied, once.
		var sbs []apiv1.Sandbox
		for cursor := ""; ; {
			var page apiv1.List[apiv1.Sandbox]
			if err := json.Unmarshal([]byte(c.okRaw(hc, "/v1/sandboxes?limit=1&cursor="+url.QueryEscape(cursor)+"&"+query)), &page); err != nil {
				t.Fatal(err)
			}
			sbs = append(sbs, page.Items...)
			if cursor = page.NextCursor; cursor == "" || len(sbs) > 10 {
				break
			}
		}
		out := []string{}
		for _, s := range sbs {
			out = append(out, s.ID)
		}
		sort.Strings(out)
		return out
	}
	both := []string{id, deadID}
	sort.Strings(both)
	for query, want := range map[string][]string{
		"tag=" + tag:                        both,
		"tag=it-no-such-tag":                {},
		"state=running&tag=" + tag:          {id},
		"state=dead&tag=" + tag:             {deadID},
		"state=stopped":                     {},
		"state=dead&label=team%3Dvictim":    {deadID},
		"state=running&label=team%3Dvictim": {},
	} {
		if got := ids(query); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("GET /v1/sandboxes?%s: %v, want %v", query, got, want)
		}
	}
	resp, err = hc.Get("http://forkd/v1/sandboxes?state=zombie")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != 400 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "want one of starting, running, dead, stopped") {
		t.Fatalf("unknown state filter: %d %+v", resp.StatusCode, p)
	}
	c.ok("kill", deadID)

	// Image build is an operation the CLI follows to the end; with --json
	// its progress events go to stderr and stdout is the image.
	start := time.Now()
	// A local recipe file is sent as its contents.
	out := c.ok("image", "build", filepath.Join(repoRoot, "recipes", "minimal.toml"), "--json")
	var img apiv1.Image
	if err := json.Unmarshal([]byte(out), &img); err != nil || img.Recipe != "minimal" || len(img.Digest) != 64 {
		t.Fatalf("image build: %v %s", err, out)
	}
	var opList apiv1.List[apiv1.Operation]
	if err := json.Unmarshal([]byte(c.okRaw(hc, "/v1/operations")), &opList); err != nil {
		t.Fatal(err)
	}
	ops := opList.Items
	if len(ops) == 0 || ops[len(ops)-1].State != apiv1.OpSucceeded {
		t.Fatalf("operations after a build (%s): %+v", time.Since(start), ops)
	}
}

func (c *cli) okRaw(hc *http.Client, path string) string {
	c.t.Helper()
	resp, err := hc.Get("http://forkd" + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, data)
	}
	return string(data)
}
