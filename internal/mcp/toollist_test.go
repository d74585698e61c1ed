package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var update = flag.Bool("update", false, "rewrite testdata/tools.json from the tools as they are now")

// TestToolList pins the tools/list result a client receives (names, order,
// titles, descriptions, schemas and annotations, as the server encodes
// them): any change to it shows in review as a diff of testdata/tools.json.
// After a deliberate change: go test ./internal/mcp -run TestToolList -update
func TestToolList(t *testing.T) {
	ctx := context.Background()
	s := NewServer(&fakeBackend{}, Options{Version: "test"})
	var wire []byte
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method == "tools/list" && err == nil {
				wire, err = json.Marshal(res) // as the transport encodes it
			}
			return res, err
		}
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "forkd-test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cs.Close()
		ss.Wait()
	}()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := json.Indent(&got, wire, "", "  "); err != nil {
		t.Fatalf("tools/list result %q: %v", wire, err)
	}
	got.WriteByte('\n')
	golden := filepath.Join("testdata", "tools.json")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (create it with go test ./internal/mcp -run TestToolList -update)", err)
	}
	if bytes.Equal(got.Bytes(), want) {
		return
	}
	gl, wl := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
	i := 0
	for i < len(gl) && i < len(wl) && gl[i] == wl[i] {
		i++
	}
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end)"
	}
	t.Errorf("tools/list differs from %s at line %d:\n got: %s\nwant: %s\nIf the change is deliberate: go test ./internal/mcp -run TestToolList -update, and review the diff.",
		golden, i+1, line(gl), line(wl))
}
