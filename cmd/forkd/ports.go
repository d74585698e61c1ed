package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %q: want 1-65535: %w", s, errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// portCmd is `forkd port ID PORT`: where a sandbox's port is served.
func portCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "port ID PORT",
		Short: "Print the URL that reaches a TCP port inside a sandbox (HTTP and WebSocket, through the API)",
		Example: "  forkd exec sb-0123456789 -- python3 -m http.server 8080 &\n" +
			"  curl \"$(forkd port sb-0123456789 8080)\"",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			p, err := c.Port(cmd.Context(), args[0], port)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(p)
			}
			u := c.URL(p.Path)
			if p.Host != "" {
				scheme := "http"
				if strings.HasPrefix(u, "https:") {
					scheme = "https"
				}
				u = scheme + "://" + p.Host + "/"
			}
			fmt.Println(u)
			if g.host == "" {
				fmt.Fprintf(os.Stderr, "(through the daemon's Unix socket: curl --unix-socket %s %q; for a local TCP port, forkd port-forward %s %d)\n", g.socket, u, args[0], port)
			}
			return nil
		},
	}
}

// portForwardCmd is `forkd port-forward ID [LOCAL:]PORT`.
func portForwardCmd(g *globals) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward ID [LOCAL:]PORT",
		Short: "Forward a local TCP port to a port inside a sandbox (raw TCP, through the API) until interrupted",
		Example: "  forkd port-forward sb-0123456789 5432          # localhost:5432 -> the sandbox's 5432\n" +
			"  forkd port-forward sb-0123456789 8000:8080     # localhost:8000 -> the sandbox's 8080\n" +
			"  forkd port-forward sb-0123456789 0:8080        # a free local port, printed",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			local, remote, ok := strings.Cut(args[1], ":")
			if !ok {
				local, remote = args[1], args[1]
			}
			port, err := parsePort(remote)
			if err != nil {
				return err
			}
			if local != "0" {
				if _, err := parsePort(local); err != nil {
					return err
				}
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			// Fails now, with the reason, if the sandbox or port is wrong.
			probe, err := c.Tunnel(cmd.Context(), id, port)
			if err != nil {
				return err
			}
			probe.Close()
			ln, err := net.Listen("tcp", net.JoinHostPort(address, local))
			if err != nil {
				return fmt.Errorf("listen on %s: %w", net.JoinHostPort(address, local), err)
			}
			defer ln.Close()
			go func() { <-cmd.Context().Done(); ln.Close() }()
			fmt.Fprintf(os.Stderr, "forwarding %s -> %s port %d (Ctrl-C to stop)\n", ln.Addr(), id, port)
			for {
				conn, err := ln.Accept()
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer conn.Close()
					t, err := c.Tunnel(cmd.Context(), id, port)
					if err != nil {
						fmt.Fprintf(os.Stderr, "forkd: %s port %d: %v\n", id, port, err)
						return
					}
					defer t.Close()
					copyBoth(conn, t)
				}()
			}
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// copyBoth copies both ways. A local half-close is passed on where the
// tunnel can take it; when the sandbox's side ends, both are closed.
func copyBoth(a net.Conn, b io.ReadWriteCloser) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(b, a)
		if cw, ok := b.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	io.Copy(a, b)
	a.Close()
	b.Close()
	<-done
}
