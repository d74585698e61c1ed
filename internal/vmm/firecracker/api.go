package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The request bodies the driver sends, as firecracker.yaml defines them
// (fields the driver does not use are left out).

type bootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	InitrdPath      string `json:"initrd_path,omitempty"`
	BootArgs        string `json:"boot_args,omitempty"`
}

type tokenBucket struct {
	Size       int64 `json:"size"`
	RefillTime int64 `json:"refill_time"` // ms
}

type rateLimiter struct {
	Bandwidth *tokenBucket `json:"bandwidth,omitempty"`
	Ops       *tokenBucket `json:"ops,omitempty"`
}

type drive struct {
	DriveID      string       `json:"drive_id"`
	PathOnHost   string       `json:"path_on_host,omitempty"`
	IsRootDevice bool         `json:"is_root_device"`
	IsReadOnly   bool         `json:"is_read_only"`
	RateLimiter  *rateLimiter `json:"rate_limiter,omitempty"`
}

type partialDrive struct {
	DriveID    string `json:"drive_id"`
	PathOnHost string `json:"path_on_host,omitempty"`
}

type machineConfig struct {
	VCPUCount       int  `json:"vcpu_count"`
	MemSizeMiB      int  `json:"mem_size_mib"`
	TrackDirtyPages bool `json:"track_dirty_pages"`
}

type networkInterface struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
	GuestMAC    string `json:"guest_mac,omitempty"`
}

type vsock struct {
	GuestCID int    `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

type entropyDevice struct {
	RateLimiter *rateLimiter `json:"rate_limiter,omitempty"`
}

type instanceAction struct {
	ActionType string `json:"action_type"` // InstanceStart, SendCtrlAltDel, FlushMetrics
}

type vmState struct {
	State string `json:"state"` // Paused, Resumed
}

type snapshotCreate struct {
	SnapshotType string `json:"snapshot_type"` // Full, Diff
	SnapshotPath string `json:"snapshot_path"`
	MemFilePath  string `json:"mem_file_path"`
}

type memBackend struct {
	BackendType string `json:"backend_type"` // File, Uffd
	BackendPath string `json:"backend_path"`
}

type networkOverride struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
}

type vsockOverride struct {
	UDSPath string `json:"uds_path"`
}

type snapshotLoad struct {
	SnapshotPath     string            `json:"snapshot_path"`
	MemBackend       memBackend        `json:"mem_backend"`
	TrackDirtyPages  bool              `json:"track_dirty_pages,omitempty"`
	ResumeVM         bool              `json:"resume_vm"`
	NetworkOverrides []networkOverride `json:"network_overrides,omitempty"`
	VsockOverride    *vsockOverride    `json:"vsock_override,omitempty"`
	ClockRealtime    bool              `json:"clock_realtime,omitempty"`
}

type firecrackerVersion struct {
	FirecrackerVersion string `json:"firecracker_version"`
}

// client speaks Firecracker's HTTP API over its Unix socket.
type client struct {
	sock string
	hc   *http.Client
}

// replyLimit bounds how much of an answer the driver reads: Firecracker
// answers with small JSON objects.
const replyLimit = 64 << 10

func newClient(sock string) *client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		// One request at a time per VMM; a kept connection saves the
		// dial on the restore path.
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	return &client{sock: sock, hc: &http.Client{Transport: tr}}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// APIError is an error answer from Firecracker: its status and
// fault_message. It wraps an errdefs class (see classify).
type APIError struct {
	Method, Path string
	Status       int
	Fault        string
	class        error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("firecracker %s %s: %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), e.Fault)
}

func (e *APIError) Unwrap() error { return e.class }

// classify maps an error answer to an errdefs class. Firecracker answers
// 400 both for bad input and for a request the microVM's state does not
// allow; its messages tell them apart.
func classify(status int, fault string) error {
	if status >= 500 {
		return errdefs.ErrInternal
	}
	f := strings.ToLower(fault)
	for _, state := range []string{"not supported after starting", "not supported before starting", "not allowed after",
		"not paused", "dirty page tracking disabled", "without kernel configuration"} {
		if strings.Contains(f, state) {
			return errdefs.ErrFailedPrecondition
		}
	}
	return errdefs.ErrInvalidArgument
}

// do sends one request; in (if not nil) is the JSON body, out (if not
// nil) receives the JSON answer.
func (c *client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("firecracker %s %s: %w", method, path, context.Cause(ctx))
		}
		return fmt.Errorf("firecracker %s %s: the API socket %s: %v: %w", method, path, c.sock, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, replyLimit))
	if err != nil {
		return fmt.Errorf("firecracker %s %s: read the answer: %v: %w", method, path, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			FaultMessage string `json:"fault_message"`
		}
		if json.Unmarshal(b, &e) != nil || e.FaultMessage == "" {
			e.FaultMessage = "(no fault_message) " + strings.TrimSpace(string(b))
		}
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Fault: e.FaultMessage, class: classify(resp.StatusCode, e.FaultMessage)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("firecracker %s %s: the answer is not the documented JSON: %v: %w", method, path, err, errdefs.ErrInternal)
		}
	}
	return nil
}

func (c *client) put(ctx context.Context, path string, in any) error {
	return c.do(ctx, http.MethodPut, path, in, nil)
}

func (c *client) patch(ctx context.Context, path string, in any) error {
	return c.do(ctx, http.MethodPatch, path, in, nil)
}

func (c *client) version(ctx context.Context) (string, error) {
	var v firecrackerVersion
	if err := c.do(ctx, http.MethodGet, "/version", nil, &v); err != nil {
		return "", err
	}
	return v.FirecrackerVersion, nil
}

// isAPIError reports whether err is an answer from Firecracker (as
// opposed to a transport failure).
func isAPIError(err error) bool {
	var e *APIError
	return errors.As(err, &e)
}
