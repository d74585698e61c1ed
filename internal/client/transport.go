package client

import (
	"net/http"
	"strings"
)

// NewWithTransport returns a client that sends its requests through rt to
// base (a URL prefix such as "http://forkd") instead of dialing a daemon.
// The daemon's MCP endpoint uses it with a RoundTripper that serves each
// request with the API's own handler in-process (internal/api/mcp.go).
func NewWithTransport(base string, rt http.RoundTripper) *Client {
	return &Client{socket: base, base: strings.TrimSuffix(base, "/"), http: &http.Client{Transport: rt}}
}
