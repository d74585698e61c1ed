package fctest

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve runs a fake on a socket and returns a request helper.
func serve(t *testing.T) (*Server, func(method, path, body string) (int, string)) {
	t.Helper()
	srv := NewServer(loadSpec(t), "t", nil)
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { l.Close(); srv.Close() })
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return srv, func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
}

func TestStateMachine(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, []byte("x"), 0o600)
	srv, do := serve(t)
	steps := []struct {
		method, path, body string
		status             int
		fault              string
	}{
		{"PATCH", "/vm", `{"state":"Paused"}`, 400, msgBeforeStart},
		{"PUT", "/actions", `{"action_type":"InstanceStart"}`, 400, "without kernel configuration"},
		{"PUT", "/boot-source", `{"kernel_image_path":"/nonexistent"}`, 400, "kernel_image_path"},
		{"PUT", "/boot-source", `{"kernel_image_path":"` + kernel + `"}`, 204, ""},
		{"PUT", "/machine-config", `{"vcpu_count":1,"mem_size_mib":64}`, 204, ""},
		{"PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"File","backend_path":"/m"}}`, 400, msgLoadLate},
		{"PUT", "/actions", `{"action_type":"InstanceStart"}`, 204, ""},
		{"PUT", "/machine-config", `{"vcpu_count":2,"mem_size_mib":64}`, 400, msgAfterStart},
		{"PUT", "/snapshot/create", `{"snapshot_path":"` + dir + `/s","mem_file_path":"` + dir + `/m"}`, 400, msgNotPaused},
		{"PATCH", "/vm", `{"state":"Paused"}`, 204, ""},
		{"PUT", "/snapshot/create", `{"snapshot_type":"Diff","snapshot_path":"` + dir + `/s","mem_file_path":"` + dir + `/m"}`, 400, "dirty page tracking disabled"},
		{"PUT", "/snapshot/create", `{"snapshot_path":"` + dir + `/s","mem_file_path":"` + dir + `/m"}`, 204, ""},
		{"PUT", "/snapshot/create", `{"snapshot_path":"` + dir + `/s","mem_file_path":"` + dir + `/m","extra":1}`, 400, "contract violation"},
		{"GET", "/", ``, 200, ""},
	}
	for _, s := range steps {
		status, body := do(s.method, s.path, s.body)
		if status != s.status || !strings.Contains(body, s.fault) {
			t.Errorf("%s %s %s: %d %s, want %d %q", s.method, s.path, s.body, status, body, s.status, s.fault)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "m")); err != nil || st.Size() != 64<<20 {
		t.Errorf("memory file: %v", err)
	}
	if v := srv.Violations(); len(v) != 1 || !strings.Contains(v[0], "extra") {
		t.Errorf("violations %q", v)
	}
	if n := len(srv.Calls()); n != len(steps) {
		t.Errorf("%d calls recorded, want %d", n, len(steps))
	}

	// A fresh process loads the snapshot; overrides must name its devices.
	_, fresh := serve(t)
	status, body := fresh("PUT", "/snapshot/load", `{"snapshot_path":"`+dir+`/s","mem_backend":{"backend_type":"File","backend_path":"`+dir+`/m"},"network_overrides":[{"iface_id":"eth0","host_dev_name":"tap1"}]}`)
	if status != 400 || !strings.Contains(body, "no interface eth0") {
		t.Errorf("override of a missing NIC: %d %s", status, body)
	}
	if status, body := fresh("PUT", "/snapshot/load", `{"snapshot_path":"`+dir+`/s","mem_backend":{"backend_type":"File","backend_path":"`+dir+`/m"},"resume_vm":true}`); status != 204 {
		t.Errorf("load: %d %s", status, body)
	}
	if status, body := fresh("GET", "/", ""); !strings.Contains(body, `"Running"`) {
		t.Errorf("state after load: %d %s", status, body)
	}
	if status, _ := fresh("PUT", "/boot-source", `{"kernel_image_path":"`+kernel+`"}`); status != 400 {
		t.Error("boot config after a load was accepted")
	}
}

func TestFaultInjection(t *testing.T) {
	srv, do := serve(t)
	srv.Fail("GET", "/version", 500, "boom")
	if status, body := do("GET", "/version", ""); status != 500 || !strings.Contains(body, "boom") {
		t.Errorf("injected fault: %d %s", status, body)
	}
	if status, body := do("GET", "/version", ""); status != 200 || !strings.Contains(body, "1.17.0-dev") {
		t.Errorf("after the fault: %d %s", status, body)
	}
}
