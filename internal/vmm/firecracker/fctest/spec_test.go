package fctest

import (
	"strings"
	"testing"
)

func loadSpec(t *testing.T) *Spec {
	t.Helper()
	s, err := Firecracker()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpecLoads(t *testing.T) {
	s := loadSpec(t)
	if s.Version != "1.17.0-dev" {
		t.Errorf("version %q", s.Version)
	}
	for _, want := range []string{"PUT /actions", "PUT /boot-source", "PUT /drives/{drive_id}", "PATCH /drives/{drive_id}",
		"PUT /machine-config", "PUT /vsock", "PUT /entropy", "PUT /network-interfaces/{iface_id}",
		"PATCH /vm", "PUT /snapshot/create", "PUT /snapshot/load", "GET /version", "GET /"} {
		if s.ops[want] == nil {
			t.Errorf("no operation %s", want)
		}
	}
}

func TestLookup(t *testing.T) {
	s := loadSpec(t)
	op, params, err := s.Lookup("PUT", "/drives/rootfs")
	if err != nil || op.ID != "putGuestDriveByID" || params["drive_id"] != "rootfs" {
		t.Fatalf("PUT /drives/rootfs: %v %v %v", op, params, err)
	}
	if _, _, err := s.Lookup("DELETE", "/drives/rootfs"); err == nil || !strings.Contains(err.Error(), "takes no DELETE") {
		t.Errorf("DELETE: %v", err)
	}
	if _, _, err := s.Lookup("PUT", "/nope"); err == nil {
		t.Error("an unknown path was accepted")
	}
	if _, _, err := s.Lookup("PUT", "/drives/"); err == nil {
		t.Error("an empty path parameter was accepted")
	}
}

// TestCheckRequest runs the validator over the keywords the description
// uses, on real operations.
func TestCheckRequest(t *testing.T) {
	s := loadSpec(t)
	cases := []struct {
		op, path, body string
		err            string // "" = valid
	}{
		{"PUT", "/machine-config", `{"vcpu_count":2,"mem_size_mib":256,"track_dirty_pages":true}`, ""},
		{"PUT", "/machine-config", `{"vcpu_count":2}`, "mem_size_mib"},                            // required
		{"PUT", "/machine-config", `{"vcpu_count":"2","mem_size_mib":256}`, "vcpu_count"},         // type
		{"PUT", "/machine-config", `{"vcpu_count":2.5,"mem_size_mib":256}`, "vcpu_count"},         // integer
		{"PUT", "/machine-config", `{"vcpu_count":33,"mem_size_mib":256}`, "vcpu_count"},          // maximum
		{"PUT", "/machine-config", `{"vcpu_count":1,"mem_size_mib":256,"huge_pages":"1G"}`, "1G"}, // enum
		{"PUT", "/machine-config", `{"vcpu_count":1,"mem_size_mib":256,"memory":1}`, "memory"},    // closed object
		{"PATCH", "/vm", `{"state":"Paused"}`, ""},
		{"PUT", "/vm", `{"state":"Stopped"}`, "takes no PUT"},
		{"PATCH", "/vm", `{"state":"Stopped"}`, "Stopped"},
		{"PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"Uffd","backend_path":"/u"},"network_overrides":[{"iface_id":"eth0","host_dev_name":"tap1"}],"vsock_override":{"uds_path":"/v"},"clock_realtime":true,"resume_vm":true}`, ""},
		{"PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"Uffd"}}`, "backend_path"},                                    // $ref, nested required
		{"PUT", "/snapshot/load", `{"snapshot_path":"/s","network_overrides":[{"iface_id":"eth0"}]}`, "host_dev_name"},                               // items
		{"PUT", "/drives/rootfs", `{"drive_id":"rootfs","is_root_device":true,"rate_limiter":{"bandwidth":{"size":-1,"refill_time":1000}}}`, "size"}, // minimum
		{"PUT", "/actions", ``, "required"},
		{"PUT", "/actions", `{"action_type":`, "not JSON"},
		{"GET", "/version", `{}`, "takes no body"},
	}
	for _, c := range cases {
		op, _, err := s.Lookup(c.op, c.path)
		if err == nil {
			_, err = op.CheckRequest([]byte(c.body))
		}
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s %s %s: %v", c.op, c.path, c.body, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s %s %s: error %v, want one naming %q", c.op, c.path, c.body, err, c.err)
		}
	}
}

func TestCheckResponse(t *testing.T) {
	s := loadSpec(t)
	op, _, _ := s.Lookup("GET", "/version")
	if err := op.CheckResponse(200, []byte(`{"firecracker_version":"1.17.0"}`)); err != nil {
		t.Error(err)
	}
	if err := op.CheckResponse(200, []byte(`{}`)); err == nil {
		t.Error("a version without firecracker_version passed")
	}
	put, _, _ := s.Lookup("PUT", "/actions")
	if err := put.CheckResponse(204, []byte(`{}`)); err == nil {
		t.Error("a 204 with a body passed")
	}
	if err := put.CheckResponse(400, []byte(`{"fault_message":"x"}`)); err != nil {
		t.Error(err)
	}
	if err := put.CheckResponse(500, []byte(`{"fault_message":"x"}`)); err != nil {
		t.Errorf("default response: %v", err)
	}
}
