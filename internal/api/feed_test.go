package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

var (
	admin = auth.Principal{Role: auth.RoleAdmin, Tenant: auth.DefaultTenant}
	acme  = auth.Principal{Role: auth.RoleUser, Tenant: "acme"}
)

// drain returns the events already delivered to s.
func drain(s *feedSub) []apiv1.Event {
	var out []apiv1.Event
	for {
		select {
		case ev := <-s.ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func types(evs []apiv1.Event) string {
	var t []string
	for _, ev := range evs {
		t = append(t, fmt.Sprintf("%s:%s", ev.Type, ev.Sandbox+ev.Tag+ev.Operation))
	}
	return strings.Join(t, " ")
}

// TestFeedVisibility: an admin sees every event, a tenant its own; a
// type filter takes exact types and prefixes.
func TestFeedVisibility(t *testing.T) {
	f := newFeed(time.Now())
	all, _, _ := f.subscribe(admin, nil, "")
	mine, _, _ := f.subscribe(acme, nil, "")
	onlyDeaths, _, _ := f.subscribe(admin, []string{"sandbox.died", "snapshot."}, "")
	f.publish(apiv1.Event{Type: "sandbox.created", Sandbox: "sb-a", Tenant: "acme"})
	f.publish(apiv1.Event{Type: "sandbox.died", Sandbox: "sb-b", Tenant: auth.DefaultTenant})
	f.publish(apiv1.Event{Type: "snapshot.deleted", Tag: "t1", Tenant: "acme"})
	if got := types(drain(all)); got != "sandbox.created:sb-a sandbox.died:sb-b snapshot.deleted:t1" {
		t.Errorf("admin saw %s", got)
	}
	if got := types(drain(mine)); got != "sandbox.created:sb-a snapshot.deleted:t1" {
		t.Errorf("tenant acme saw %s", got)
	}
	if got := types(drain(onlyDeaths)); got != "sandbox.died:sb-b snapshot.deleted:t1" {
		t.Errorf("filtered stream saw %s", got)
	}
	for _, bad := range []string{"sandbox.exploded", "sandbox", "*"} {
		if _, err := parseEventTypes([]string{bad}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "sandbox.created") {
			t.Errorf("type %q: %v", bad, err)
		}
	}
	if got, err := parseEventTypes([]string{"sandbox.*,operation.finished", " snapshot.created "}); err != nil || strings.Join(got, " ") != "sandbox. operation.finished snapshot.created" {
		t.Errorf("parseEventTypes = %q, %v", got, err)
	}
}

// TestFeedResume: a stream resuming after an event gets the kept ones
// after it; one resuming from before the backlog, or from another
// daemon's epoch, is told first that it lost events.
func TestFeedResume(t *testing.T) {
	f := newFeed(time.Now())
	for i := range 3 {
		f.publish(apiv1.Event{Type: "sandbox.created", Sandbox: fmt.Sprintf("sb-%d", i+1)})
	}
	_, backlog, _ := f.subscribe(admin, nil, f.id(1))
	if got := types(backlog); got != "sandbox.created:sb-2 sandbox.created:sb-3" {
		t.Errorf("resume after 1: %s", got)
	}
	_, backlog, _ = f.subscribe(admin, nil, f.id(3))
	if len(backlog) != 0 {
		t.Errorf("resume after the newest: %s", types(backlog))
	}
	_, backlog, _ = f.subscribe(admin, nil, "oldepoch.2")
	if len(backlog) != 4 || backlog[0].Type != apiv1.EventsLost || !strings.Contains(backlog[0].Reason, "restarted") {
		t.Errorf("resume from another daemon: %+v", backlog)
	}
	for i := range 2 * feedBacklog {
		f.publish(apiv1.Event{Type: "sandbox.killed", Sandbox: fmt.Sprintf("sb-k%d", i)})
	}
	_, backlog, _ = f.subscribe(admin, nil, f.id(2))
	want := fmt.Sprintf("events 3 to %d are no longer kept", f.seq-feedBacklog)
	if len(backlog) != feedBacklog+1 || backlog[0].Type != apiv1.EventsLost || !strings.Contains(backlog[0].Reason, want) || backlog[1].Seq != f.seq-feedBacklog+1 {
		t.Errorf("resume from before the backlog: %d events, first %+v; want %q", len(backlog), backlog[0], want)
	}
}

// TestFeedCutsSlowStreams: publishing never waits for a stream; one that
// falls feedBuffer events behind is cut; a closed feed cuts every stream
// and refuses new ones.
func TestFeedCutsSlowStreams(t *testing.T) {
	f := newFeed(time.Now())
	slow, _, _ := f.subscribe(admin, nil, "")
	other, _, _ := f.subscribe(acme, nil, "") // sees none of them: never cut
	for i := range feedBuffer + 1 {
		f.publish(apiv1.Event{Type: "sandbox.created", Sandbox: fmt.Sprint(i)})
	}
	select {
	case <-slow.cut:
	default:
		t.Fatal("a stream that fell behind was not cut")
	}
	select {
	case <-other.cut:
		t.Fatal("a stream that saw nothing was cut")
	default:
	}
	f.close()
	select {
	case <-other.cut:
	default:
		t.Fatal("close left a stream open")
	}
	if _, _, err := f.subscribe(admin, nil, ""); !errdefs.IsUnavailable(err) {
		t.Fatalf("subscribe after close: %v", err)
	}
}

// TestFeedTenantStreamLimit: one tenant's tokens cannot hold every
// stream; others and admins still get theirs.
func TestFeedTenantStreamLimit(t *testing.T) {
	f := newFeed(time.Now())
	for i := range maxTenantFeedStreams {
		if _, _, err := f.subscribe(acme, nil, ""); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if _, _, err := f.subscribe(acme, nil, ""); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), `tenant "acme"`) {
		t.Fatalf("one stream past the tenant's limit: %v", err)
	}
	beta := auth.Principal{Role: auth.RoleUser, Tenant: "beta"}
	for _, p := range []auth.Principal{beta, admin} {
		if _, _, err := f.subscribe(p, nil, ""); err != nil {
			t.Fatalf("%v after acme's limit: %v", p, err)
		}
	}
}

// TestStreamEventsHTTP: GET /v1/events as SSE carries each engine event
// with an id, its type and its JSON; Last-Event-ID resumes after it; a
// bad type is a 400 naming the known ones.
func TestStreamEventsHTTP(t *testing.T) {
	s := &Server{}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	defer s.CloseStreams()
	open := func(lastID string) (*http.Response, *bufio.Reader) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/v1/events?type=sandbox.*", nil)
		req.Header.Set("Accept", "text/event-stream")
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return resp, bufio.NewReader(resp.Body)
	}
	next := func(rd *bufio.Reader) (id, typ string, ev apiv1.Event) {
		t.Helper()
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended: %v", err)
			}
			switch line = strings.TrimSuffix(line, "\n"); {
			case strings.HasPrefix(line, "id: "):
				id = line[4:]
			case strings.HasPrefix(line, "event: "):
				typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil {
					t.Fatal(err)
				}
			case line == "" && typ != "":
				return id, typ, ev
			}
		}
	}
	// The 200 came after the subscription: these cannot be missed.
	resp, rd := open("")
	s.EngineEvent(sandbox.Event{Kind: sandbox.EventSnapshotCreated, Tag: "t1"}) // filtered out
	s.EngineEvent(sandbox.Event{Kind: sandbox.EventCreated, SandboxID: "sb-1", Tag: "t1", Tenant: "acme"})
	s.EngineEvent(sandbox.Event{Kind: sandbox.EventExpired, SandboxID: "sb-1", Tag: "t1", Tenant: "acme", Reason: "timeout"})
	id, typ, ev := next(rd)
	if typ != "sandbox.created" || ev.Sandbox != "sb-1" || ev.Tenant != "acme" || ev.ID != id || ev.Seq != 2 || ev.Time.IsZero() {
		t.Fatalf("first event: id %q type %q %+v", id, typ, ev)
	}
	if _, typ, ev = next(rd); typ != "sandbox.expired" || ev.Reason != "timeout" {
		t.Fatalf("second event: %q %+v", typ, ev)
	}
	resp.Body.Close()

	resp, rd = open(id)
	if _, typ, ev = next(rd); typ != "sandbox.expired" || ev.Seq != 3 {
		t.Fatalf("resumed after %s: %q %+v", id, typ, ev)
	}
	resp.Body.Close()

	bad, err := http.Get(ts.URL + "/v1/events?type=sandbox.exploded")
	if err != nil {
		t.Fatal(err)
	}
	bad.Body.Close()
	if bad.StatusCode != 400 {
		t.Fatalf("bad type: %d", bad.StatusCode)
	}
}

// TestCloseStreamsEndsOperationStreams: a server shutting down ends the
// streams that follow an operation (which goes on), so that its HTTP
// shutdown does not wait for the operation.
func TestCloseStreamsEndsOperationStreams(t *testing.T) {
	s := &Server{}
	op := s.ops.start(apiv1.OpImageBuild, "minimal", "")
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/v1/operations/" + op.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, op.ID) {
		t.Fatalf("first event: %q, %v", line, err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := rd.ReadString('\n')
		ended <- err
	}()
	s.CloseStreams()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the stream sent another event instead of ending")
		}
	case <-time.After(time.Minute):
		t.Fatal("the operation's stream outlived CloseStreams")
	}
	if got, _ := s.ops.get(op.ID); got.State != apiv1.OpRunning {
		t.Fatalf("the operation itself ended: %+v", got)
	}
}
