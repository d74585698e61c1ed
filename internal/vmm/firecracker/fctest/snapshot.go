package fctest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/uffd/uffdtest"
)

// stateMagic starts the fake's state files, so a load of something else
// fails as a real Firecracker's would.
const stateMagic = "fctest-vmstate\n"

// createSnapshot writes the fake's configuration as the state file and
// a sparse memory file of the guest's size (Diff: the same size, as
// Firecracker's diff memory files are).
func (s *Server) createSnapshot(body map[string]any) (int, any) {
	if s.state == notStarted {
		return badRequest(msgBeforeStart)
	}
	if s.state != paused {
		return badRequest(msgNotPaused)
	}
	if body["snapshot_type"] == "Diff" && !s.cfg.TrackDirty {
		return badRequest("Diff snapshots are not allowed on uVMs with dirty page tracking disabled.")
	}
	cfg, _ := json.Marshal(s.cfg)
	if err := os.WriteFile(body["snapshot_path"].(string), append([]byte(stateMagic), cfg...), 0o600); err != nil {
		return badRequest("Cannot save the microVM state: %v", err)
	}
	f, err := os.OpenFile(body["mem_file_path"].(string), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err == nil {
		err = f.Truncate(s.memBytes())
		if err == nil && body["snapshot_type"] == "Diff" {
			s.diffs++
			for _, p := range DiffPages(s.diffs) {
				if _, err = f.WriteAt(DiffPage(s.diffs, p), p*pageSize); err != nil {
					break
				}
			}
		}
		f.Close()
	}
	if err != nil {
		return badRequest("Cannot write memory file: %v", err)
	}
	return noContent()
}

// pageSize is the guest page size the fake's memory files use.
const pageSize = 4096

// DiffPages are the pages "the guest wrote" before the fake's n-th Diff
// snapshot (1-based), which that snapshot's memory file holds, as a
// Firecracker Diff holds the pages written since the previous snapshot:
// page n, and page 100+n.
func DiffPages(n int) []int64 { return []int64{int64(n), int64(100 + n)} }

// DiffPage is the content of page p in the fake's n-th Diff snapshot.
func DiffPage(n int, p int64) []byte {
	b := make([]byte, pageSize)
	copy(b, fmt.Sprintf("fctest diff %d page %d\n", n, p))
	return b
}

func (s *Server) memBytes() int64 {
	mib, _ := s.cfg.Machine["mem_size_mib"].(float64)
	if mib == 0 {
		mib = 128 // Firecracker's default
	}
	return int64(mib) << 20
}

// loadSnapshot restores the configuration a createSnapshot wrote, with
// the request's overrides.
func (s *Server) loadSnapshot(body map[string]any) (int, any) {
	if s.state != notStarted || s.configured || s.loaded {
		return badRequest(msgLoadLate)
	}
	_, hasFile := body["mem_file_path"]
	backend, hasBackend := body["mem_backend"].(map[string]any)
	if hasFile == hasBackend {
		return badRequest("Exactly one of mem_file_path and mem_backend must be set.")
	}
	b, err := os.ReadFile(body["snapshot_path"].(string))
	if err != nil {
		return badRequest("Load snapshot error: Failed to restore from snapshot: %v", err)
	}
	var cfg vmConfig
	if !strings.HasPrefix(string(b), stateMagic) || json.Unmarshal(b[len(stateMagic):], &cfg) != nil {
		return badRequest("Load snapshot error: Failed to restore from snapshot: cannot deserialize the microVM state")
	}
	if cfg.Drives == nil {
		cfg.Drives = map[string]map[string]any{}
	}
	if hasFile {
		backend = map[string]any{"backend_type": "File", "backend_path": body["mem_file_path"]}
	}
	path := backend["backend_path"].(string)
	if backend["backend_type"] == "File" {
		if _, err := os.Stat(path); err != nil {
			return badRequest("Load snapshot error: Cannot open the memory file: %v", err)
		}
	}
	for _, d := range cfg.Drives {
		if err := mustExist(d, "path_on_host"); err != nil {
			return badRequest("Load snapshot error: Failed to restore the block device: %v", err)
		}
	}
	if ovs, ok := body["network_overrides"].([]any); ok {
		for _, o := range ovs {
			o := o.(map[string]any)
			nic, ok := cfg.Ifaces[o["iface_id"].(string)]
			if !ok {
				return badRequest("Load snapshot error: Invalid network override: no interface %v in the snapshot", o["iface_id"])
			}
			nic["host_dev_name"] = o["host_dev_name"]
		}
	}
	if ov, ok := body["vsock_override"].(map[string]any); ok {
		if cfg.Vsock == nil {
			return badRequest("Load snapshot error: Invalid vsock override: the snapshot has no vsock device")
		}
		cfg.Vsock["uds_path"] = ov["uds_path"]
	}
	if t, ok := body["track_dirty_pages"].(bool); ok {
		cfg.TrackDirty = t
	}
	s.cfg = cfg
	if backend["backend_type"] == "Uffd" {
		if err := s.attachUffd(path); err != nil {
			return badRequest("Load snapshot error: Failed to connect to the UFFD handler: %v", err)
		}
	}
	if err := s.listenVsock(); err != nil {
		return badRequest("Load snapshot error: the vsock device: %v", err)
	}
	s.loaded, s.state = true, paused
	if body["resume_vm"] == true {
		s.state = running
	}
	return noContent()
}

// attachUffd does what Firecracker does with a Uffd backend: map the
// guest's memory anonymously, register it with a userfaultfd, and send
// both to the page server. The fake has no guest to touch that memory;
// it reads all of it once, through the page server, and writes the
// digest to the console ("fctest: guest memory sha256 HEX"), so a test
// can check what the server served.
func (s *Server) attachUffd(path string) error {
	g, err := uffdtest.Attach(path, int(s.memBytes()))
	if err != nil {
		return err
	}
	go func() {
		fmt.Fprintf(s.console, "fctest: guest memory sha256 %s\n", g.Digest())
	}()
	return nil
}

// listenVsock binds the vsock device's Unix socket, as Firecracker does
// when the guest starts or is restored, and answers host-initiated
// hybrid vsock connections ("CONNECT <port>\n" -> "OK <host port>\n")
// by echoing what follows: the fake has no guest agent behind it.
func (s *Server) listenVsock() error {
	if s.cfg.Vsock == nil {
		return nil
	}
	l, err := net.Listen("unix", s.cfg.Vsock["uds_path"].(string))
	if err != nil {
		return err
	}
	s.vsock = l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveVsockConn(c)
		}
	}()
	return nil
}

func serveVsockConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(io.LimitReader(c, 64))
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "CONNECT" {
		return // Firecracker drops a connection with a bad request
	}
	if _, err := strconv.ParseUint(f[1], 10, 32); err != nil {
		return
	}
	fmt.Fprintf(c, "OK %d\n", 1<<30)
	if rest := br.Buffered(); rest > 0 {
		b, _ := br.Peek(rest)
		c.Write(b)
	}
	io.Copy(c, c)
}
