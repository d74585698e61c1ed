package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Ports: the API reaches a TCP port inside a sandbox by dialing from the
// sandbox's namespace (Engine.DialPort), behind the API's auth.
//
//	/v1/sandboxes/{id}/ports/{port}/PATH   HTTP and WebSocket, reverse-proxied
//	GET /v1/sandboxes/{id}/ports/{port}    with Upgrade: tcp, a raw TCP tunnel;
//	                                       without, where the port is served
//
// With Server.PortDomain set, a request for the host PORT-ID.PORTDOMAIN is
// proxied with its whole path, so apps that use absolute paths work.

// TunnelProtocol is the Upgrade token of a raw TCP tunnel.
const TunnelProtocol = "tcp"

// portProxyPrefix starts the proxy routes (not audited: app traffic).
const portProxyPrefix = "/v1/sandboxes/{id}/ports/{port}/"

func portArg(r *http.Request) (int, error) {
	p, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %q: want 1-65535: %w", r.PathValue("port"), errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// portInfo answers where a port is served, or opens a TCP tunnel.
func (s *Server) portInfo(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := portArg(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), TunnelProtocol) {
		s.tunnel(w, r, id, port)
		return
	}
	if _, err := s.Engine.Get(id); err != nil {
		writeProblem(w, r, err)
		return
	}
	info := apiv1.Port{Port: port, Path: fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", id, port)}
	if s.PortDomain != "" {
		info.Host = fmt.Sprintf("%d-%s.%s", port, id, s.PortDomain)
	}
	writeJSON(w, info)
}

// tunnel switches the connection to raw TCP with the sandbox's port.
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, id string, port int) {
	conn, err := s.Engine.DialPort(r.Context(), id, port)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	defer conn.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Upgrade", TunnelProtocol)
	w.Header().Set("Connection", "Upgrade")
	w.WriteHeader(http.StatusSwitchingProtocols)
	client, buf, err := rc.Hijack()
	if err != nil {
		return
	}
	defer client.Close()
	client.SetDeadline(time.Time{}) // the server's timeouts were for HTTP
	if n := buf.Reader.Buffered(); n > 0 {
		b, _ := buf.Reader.Peek(n)
		if _, err := conn.Write(b); err != nil {
			return
		}
	}
	splice(client, conn)
}

// splice copies both ways until both directions end, passing on each
// half-close.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go one(a, b)
	go one(b, a)
	wg.Wait()
}

// portProxy reverse-proxies HTTP (and WebSocket upgrades) to a sandbox's
// port. The synthetic upstream host "ID:PORT" keys the transport's
// connection pool per sandbox port; its dialer goes through the engine.
func (s *Server) portProxy() *httputil.ReverseProxy {
	s.proxyOnce.Do(func() {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				id, p, _ := strings.Cut(addr, ":")
				port, _ := strconv.Atoi(p)
				return s.Engine.DialPort(ctx, id, port)
			},
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		}
		s.proxy = &httputil.ReverseProxy{
			Transport: tr,
			Rewrite: func(pr *httputil.ProxyRequest) {
				in := pr.In
				pr.Out.URL.Scheme = "http"
				pr.Out.URL.Host = in.PathValue("id") + ":" + in.PathValue("port")
				pr.Out.URL.Path = "/" + in.PathValue("path")
				pr.Out.URL.RawPath = ""
				pr.Out.Host = in.Host
				pr.SetXForwarded()
				if auth.TokenConsumed(in.Context()) {
					// The API's bearer token is not the app's to see;
					// any other Authorization is the app's.
					pr.Out.Header.Del("Authorization")
				}
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if !errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) && !errdefs.IsUnavailable(err) {
					err = fmt.Errorf("sandbox %s port %s: %w: %w", r.PathValue("id"), r.PathValue("port"), err, errdefs.ErrUnavailable)
				}
				writeProblem(w, r, err)
			},
		}
	})
	return s.proxy
}

func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) {
	if _, err := portArg(r); err != nil {
		writeProblem(w, r, err)
		return
	}
	s.portProxy().ServeHTTP(w, r)
}

// hostRoute rewrites a request for PORT-ID.PortDomain to its proxy path.
func (s *Server) hostRoute(r *http.Request) {
	if s.PortDomain == "" {
		return
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	sub, ok := strings.CutSuffix(strings.ToLower(host), "."+s.PortDomain)
	if !ok {
		return
	}
	port, id, ok := strings.Cut(sub, "-")
	if !ok || strings.Contains(id, ".") {
		return
	}
	if _, err := strconv.Atoi(port); err != nil {
		return
	}
	r.URL.Path = "/v1/sandboxes/" + id + "/ports/" + port + r.URL.Path
	r.URL.RawPath = ""
}
