package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// legacyLines are records exactly as forkd wrote them before records named
// a tenant (key order and all), chained from Genesis.
func legacyLines(t *testing.T) [][]byte {
	t.Helper()
	l1 := `{"seq":1,"time":"2024-05-01T10:00:00Z","request_id":"req-1","token":"ci","peer":"127.0.0.1:5000","action":"POST /v1/sandboxes","targets":["sb-aaaaaaaaaa"],"outcome":"ok","duration_ms":12.5,"prev":"` + Genesis + `"}`
	l2 := `{"seq":2,"time":"2024-05-01T10:00:01Z","request_id":"req-2","token":"","peer":"unix","action":"DELETE /v1/sandboxes/{id}","targets":["sb-aaaaaaaaaa"],"outcome":"ok","duration_ms":3,"prev":"` + hashLine([]byte(l1)) + `"}`
	return [][]byte{[]byte(l1 + "\n"), []byte(l2 + "\n")}
}

// TestTenantFieldKeepsOldLogsValid: a log written before the tenant field
// existed verifies, reopens, and takes records that name their tenant;
// the whole chain verifies, and records read back with their tenant (none
// for the old ones).
func TestTenantFieldKeepsOldLogsValid(t *testing.T) {
	dir := t.TempDir()
	writeLines(t, filepath.Join(dir, currentName), legacyLines(t))
	verifyOK(t, dir, 2)

	l := openT(t, dir, Options{})
	r := rec(3)
	r.Tenant = "acme"
	if _, err := l.Append(r); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	verifyOK(t, dir, 3)

	data, err := os.ReadFile(filepath.Join(dir, currentName))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if strings.Contains(lines[0], "tenant") || !strings.Contains(lines[2], `"tenant":"acme"`) {
		t.Errorf("lines:\n%s", data)
	}
	recs, err := Tail(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].Tenant != "" || recs[0].Token != "ci" || recs[2].Tenant != "acme" || recs[2].Token != "ci" {
		t.Errorf("tail: %+v", recs)
	}
}
