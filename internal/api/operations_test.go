package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// fakeCreate stands in for the engine's CreateSnapshot: it writes through
// the real snapshot store (stage, then commit or abort), reports a
// progress line, then waits for release or for its context to end.
type fakeCreate struct {
	store   *snapshot.Store
	release chan struct{}
	started chan string // the staging directory, once written
	calls   atomic.Int32
	// ctxErr is the context's error when the work ended (nil: released).
	ctxErr atomic.Pointer[error]
}

func newFakeCreate(s *Server) *fakeCreate {
	f := &fakeCreate{store: s.Engine.Store(), release: make(chan struct{}), started: make(chan string, 8)}
	s.createSnapshotFn = f.create
	return f
}

func (f *fakeCreate) create(ctx context.Context, opts sandbox.CreateSnapshotOptions) (*snapshot.Snapshot, error) {
	defer opts.Slot.Release()
	f.calls.Add(1)
	st, err := f.store.Stage(opts.Tag)
	if err != nil {
		return nil, err
	}
	defer st.Abort()
	if err := os.WriteFile(st.Path(snapshot.MemoryFile), []byte("memory"), 0o600); err != nil {
		return nil, err
	}
	opts.Progress("booting template")
	f.started <- st.Dir
	select {
	case <-ctx.Done():
		err := ctx.Err()
		f.ctxErr.Store(&err)
		return nil, err
	case <-f.release:
	}
	return st.Commit(snapshot.Manifest{})
}

const createBody = `{"tag":"t1","recipe_toml":"name = 'tiny'\nbase = 'busybox'\n"}`

var asyncHdr = map[string]string{"Prefer": "respond-async"}

// events follows an operation's event stream as who until it ends.
func (tk *tenancy) events(who, id string) []apiv1.OperationEvent {
	tk.t.Helper()
	req, _ := http.NewRequest("GET", tk.srv.URL+"/v1/operations/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+tk.tok[who])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tk.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ndjson {
		tk.t.Fatalf("events of %s: %d %s", id, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out []apiv1.OperationEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev apiv1.OperationEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tk.t.Fatalf("event %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	return out
}

func (tk *tenancy) startCreate(who, body string, hdr map[string]string) apiv1.Operation {
	tk.t.Helper()
	a := tk.call(who, "POST", "/v1/snapshots", body, hdr)
	var op apiv1.Operation
	if a.status != http.StatusAccepted || json.Unmarshal(a.body, &op) != nil || a.header.Get("Location") != "/v1/operations/"+op.ID {
		tk.t.Fatalf("POST /v1/snapshots (async): %d %v %s", a.status, a.header, a.body)
	}
	return op
}

// TestSnapshotCreateIsAnOperation: with Prefer: respond-async, a create
// answers 202 with a running snapshot.create operation of the caller's
// tenant; its events start with its state, carry its progress and end with
// the terminal state and the snapshot, and the tag exists.
func TestSnapshotCreateIsAnOperation(t *testing.T) {
	tk := newTenancy(t, nil)
	f := newFakeCreate(tk.s)
	op := tk.startCreate("alice", createBody, asyncHdr)
	if op.Kind != apiv1.OpSnapshotCreate || op.Target != "t1" || op.State != apiv1.OpRunning || op.Tenant != "acme" {
		t.Fatalf("operation %+v", op)
	}
	<-f.started
	done := make(chan []apiv1.OperationEvent)
	go func() { done <- tk.events("alice", op.ID) }()
	// A follower attached while it runs sees its state first, then the end.
	testutil.WaitFor(t, "the progress line", func() bool {
		got, _ := tk.s.ops.get(op.ID)
		return len(got.Progress) == 1
	})
	close(f.release)
	evs := <-done
	first, last := evs[0], evs[len(evs)-1]
	if first.Type != apiv1.OpEventState || first.Operation == nil || first.Operation.ID != op.ID {
		t.Errorf("first event %+v, want the operation's state", first)
	}
	if last.Type != apiv1.OpEventState || last.Operation == nil || last.Operation.State != apiv1.OpSucceeded {
		t.Fatalf("last event %+v, want the succeeded state", last)
	}
	var snap apiv1.Snapshot
	if err := json.Unmarshal(last.Operation.Result, &snap); err != nil || snap.Tag != "t1" || snap.Owner != "acme" {
		t.Errorf("result %s (%v), want the snapshot t1 of acme", last.Operation.Result, err)
	}
	if a := tk.call("alice", "GET", "/v1/snapshots/t1", "", nil); a.status != http.StatusOK {
		t.Errorf("GET the created tag: %d %s", a.status, a.body)
	}
	// Re-attaching to a finished operation: one event, its end.
	if evs := tk.events("alice", op.ID); len(evs) != 1 || evs[0].Operation.State != apiv1.OpSucceeded {
		t.Errorf("re-attach after the end: %+v", evs)
	}
}

// TestSnapshotCreateSurvivesClientGoingAway: a synchronous create (the
// progress stream) whose client disconnects goes on and commits the tag.
func TestSnapshotCreateSurvivesClientGoingAway(t *testing.T) {
	tk := newTenancy(t, nil)
	f := newFakeCreate(tk.s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", tk.srv.URL+"/v1/snapshots", strings.NewReader(createBody))
	req.Header.Set("Authorization", "Bearer "+tk.tok["alice"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	opID := resp.Header.Get(apiv1.OperationHeader)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if resp.StatusCode != http.StatusOK || opID == "" || err != nil || !strings.Contains(line, "booting template") {
		t.Fatalf("sync create: %d op %q first line %q %v", resp.StatusCode, opID, line, err)
	}
	cancel() // the client goes away mid-create
	resp.Body.Close()
	// The handler notices (its follow ends), the work does not.
	testutil.WaitFor(t, "the request to end", func() bool {
		return len(auditRecords(t, tk.auditDir)["POST /v1/snapshots"]) > 0
	})
	if op, _ := tk.s.ops.get(opID); op.State != apiv1.OpRunning {
		t.Fatalf("after the client left the operation is %s, want running", op.State)
	}
	if e := f.ctxErr.Load(); e != nil {
		t.Fatalf("the work's context ended with the client: %v", *e)
	}
	close(f.release)
	op, err := tk.s.ops.wait(context.Background(), opID)
	if err != nil || op.State != apiv1.OpSucceeded {
		t.Fatalf("operation ended %+v %v", op, err)
	}
	if _, err := tk.s.Engine.Store().Get("t1"); err != nil {
		t.Errorf("the tag after its client left: %v", err)
	}
}

// TestCancelLeavesNoTag: cancelling a create ends its work's context; the
// operation ends cancelled, no tag and no staging directory is left, the
// cancel is audited, and another tenant can neither see nor cancel it.
func TestCancelLeavesNoTag(t *testing.T) {
	tk := newTenancy(t, nil)
	f := newFakeCreate(tk.s)
	op := tk.startCreate("alice", createBody, asyncHdr)
	staging := <-f.started
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/operations/" + op.ID},
		{"GET", "/v1/operations/" + op.ID + "/events"},
		{"POST", "/v1/operations/" + op.ID + "/cancel"},
	} {
		if a := tk.call("bob", c.method, c.path, "", nil); a.status != http.StatusNotFound {
			t.Errorf("bob %s %s: %d %s, want 404", c.method, c.path, a.status, a.body)
		}
	}
	list := listAs[apiv1.Operation](tk, "bob", "/v1/operations")
	if len(list) != 0 {
		t.Errorf("bob lists %+v", list)
	}
	if a := tk.call("viewer", "POST", "/v1/operations/"+op.ID+"/cancel", "", nil); a.status != http.StatusForbidden {
		t.Errorf("read-only cancel: %d %s, want 403", a.status, a.body)
	}
	a := tk.call("alice", "POST", "/v1/operations/"+op.ID+"/cancel", "", nil)
	var got apiv1.Operation
	if a.status != http.StatusAccepted || json.Unmarshal(a.body, &got) != nil || !got.CancelRequested {
		t.Fatalf("cancel: %d %s", a.status, a.body)
	}
	evs := tk.events("alice", op.ID)
	end := evs[len(evs)-1].Operation
	if end == nil || end.State != apiv1.OpCancelled || end.Error == nil || end.Error.Code != "canceled" {
		t.Fatalf("after cancel: %+v", evs[len(evs)-1])
	}
	if _, err := tk.s.Engine.Store().Get("t1"); err == nil {
		t.Error("a cancelled create left its tag")
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Errorf("staging directory %s after cancel: %v", staging, err)
	}
	left, _ := filepath.Glob(filepath.Join(tk.s.Engine.Config().DataDir, "snapshots", ".staging-*"))
	if len(left) > 0 {
		t.Errorf("staging debris: %v", left)
	}
	if a := tk.call("alice", "POST", "/v1/operations/"+op.ID+"/cancel", "", nil); a.status != http.StatusConflict {
		t.Errorf("cancel of a finished operation: %d %s, want 409", a.status, a.body)
	}
	var cancels int
	for action, recs := range auditRecords(t, tk.auditDir) {
		for _, r := range recs {
			if strings.Contains(action, "cancel") && r.Outcome == "ok" && strings.Contains(strings.Join(r.Targets, ","), op.ID) {
				cancels++
			}
		}
	}
	if cancels != 1 {
		t.Errorf("audit records of the cancel: %d, want 1 (%v)", cancels, auditRecords(t, tk.auditDir))
	}
	// The slot the create held is free again.
	s, err := tk.s.Engine.TryAcquireBuild("after the cancel", "acme", sandbox.TenantQuota{})
	if err != nil {
		t.Fatalf("build slot after cancel: %v", err)
	}
	s.Release()
}

// TestIdempotencyKey: a retried create with the same key gets the same
// operation, even after a daemon restart, without doing the work twice;
// the same key with another body is 422; another tenant's same key is its
// own; a bad key is 400; a fork that failed leaves its key free.
func TestIdempotencyKey(t *testing.T) {
	tk := newTenancy(t, nil)
	f := newFakeCreate(tk.s)
	key := map[string]string{"Prefer": "respond-async", apiv1.IdempotencyKeyHeader: "create-t1-0001"}
	op := tk.startCreate("alice", createBody, key)
	<-f.started
	a := tk.call("alice", "POST", "/v1/snapshots", createBody, key)
	var again apiv1.Operation
	if a.status != http.StatusAccepted || json.Unmarshal(a.body, &again) != nil || again.ID != op.ID || a.header.Get(apiv1.IdempotentReplayedHeader) != "true" {
		t.Fatalf("retry while running: %d %v %s, want 202 with %s", a.status, a.header, a.body, op.ID)
	}
	other := strings.Replace(createBody, "t1", "t2", 1)
	if a := tk.call("alice", "POST", "/v1/snapshots", other, key); a.status != http.StatusUnprocessableEntity || !strings.Contains(a.p.Detail, "another request") {
		t.Errorf("same key, other body: %d %s, want 422", a.status, a.body)
	}
	for _, bad := range []string{strings.Repeat("k", maxIdempotencyKeyLen+1), "tab\there"} {
		h := map[string]string{apiv1.IdempotencyKeyHeader: bad}
		if a := tk.call("alice", "POST", "/v1/snapshots", createBody, h); a.status != http.StatusBadRequest {
			t.Errorf("key %q: %d %s, want 400", bad, a.status, a.body)
		}
	}
	close(f.release)
	if end, _ := tk.s.ops.wait(context.Background(), op.ID); end.State != apiv1.OpSucceeded {
		t.Fatalf("create ended %+v", end)
	}
	// The same key from another tenant is not alice's: bob's create of
	// t1 runs (and fails: alice's t1 exists).
	if a := tk.call("bob", "POST", "/v1/snapshots", createBody, key); a.header.Get(apiv1.IdempotentReplayedHeader) != "" {
		t.Errorf("bob got alice's answer: %d %s", a.status, a.body)
	}

	// A new daemon over the same state file answers the retry from the
	// record: the operation, finished.
	s2 := &Server{Engine: tk.s.Engine, Tokens: tk.s.Tokens}
	if err := s2.LoadState(tk.st); err != nil {
		t.Fatal(err)
	}
	s2.createSnapshotFn = f.create
	tk.s = s2
	tk.srv.Config.Handler = s2.Handler()
	a = tk.call("alice", "POST", "/v1/snapshots", createBody, key)
	if a.status != http.StatusAccepted || json.Unmarshal(a.body, &again) != nil || again.ID != op.ID || again.State != apiv1.OpSucceeded {
		t.Fatalf("retry after a restart: %d %s, want %s succeeded", a.status, a.body, op.ID)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("the create ran %d times, want once", n)
	}

	// A fork that fails (no VMM here) keeps no answer: the retry runs.
	fk := map[string]string{apiv1.IdempotencyKeyHeader: "fork-1"}
	for i := range 2 {
		a := tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"a-base"}`, fk)
		if a.status < 400 || a.header.Get(apiv1.IdempotentReplayedHeader) != "" {
			t.Errorf("failing fork %d with a key: %d %v %s", i, a.status, a.header, a.body)
		}
	}
}

// TestIdempotentForkReplays: the answer a fork recorded for its key is
// what a retry gets, byte for byte, without forking again.
func TestIdempotentForkReplays(t *testing.T) {
	tk := newTenancy(t, nil)
	body := `{"tag":"a-base"}`
	claim, replayed, err := tk.s.idempotent(nil, tenantRequest(t, tk, "acme", "POST", "/v1/sandboxes", "fork-2"), apiv1.ForkRequest{Tag: "a-base"}, nil)
	if err != nil || replayed || claim == nil {
		t.Fatalf("claim: %v %v %v", claim, replayed, err)
	}
	want := `{"sandboxes":[{"id":"sb-recorded"}],"total_ms":1}` + "\n"
	claim.result(http.StatusCreated, []byte(want))
	a := tk.call("alice", "POST", "/v1/sandboxes", body, map[string]string{apiv1.IdempotencyKeyHeader: "fork-2"})
	if a.status != http.StatusCreated || string(a.body) != want || a.header.Get(apiv1.IdempotentReplayedHeader) != "true" {
		t.Errorf("replayed fork: %d %v %q, want 201 %q", a.status, a.header, a.body, want)
	}
	if a := tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"a-base","count":2}`, map[string]string{apiv1.IdempotencyKeyHeader: "fork-2"}); a.status != http.StatusUnprocessableEntity {
		t.Errorf("same key, other fork: %d %s, want 422", a.status, a.body)
	}
}

// tenantRequest is a request as the server sees it from who's tenant
// (its principal in the context), for calling handler helpers directly.
func tenantRequest(t *testing.T, tk *tenancy, tenant, method, path, key string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set(apiv1.IdempotencyKeyHeader, key)
	return r.WithContext(auth.WithPrincipal(r.Context(), auth.Principal{Role: auth.RoleUser, Tenant: tenant}))
}
