package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func (g *globals) logPath() string { return filepath.Join(g.runDir, "forkd.log") }

// startDaemon launches `forkd serve` detached (own session, output to the
// log file) and waits until it answers, so one command works on a fresh
// machine.
func (g *globals) startDaemon(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(g.runDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(g.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"serve", "--data-dir", g.dataDir, "--run-dir", g.runDir, "--socket", g.socketPath()}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start forkd daemon: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	c := client.New(g.socketPath())
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("forkd daemon exited at start; its log %s says:\n%s: %w", g.logPath(), tailFile(g.logPath(), 1500), errdefs.ErrUnavailable)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if c.Ping(ctx) == nil {
			fmt.Fprintf(os.Stderr, "forkd: started daemon (pid %d, socket %s, log %s)\n", pid, g.socketPath(), g.logPath())
			return nil
		}
	}
	return fmt.Errorf("forkd daemon (pid %d) did not answer within 20s; see %s: %w", pid, g.logPath(), errdefs.ErrUnavailable)
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() > n {
		f.Seek(st.Size()-n, 0)
	}
	buf := make([]byte, n)
	k, _ := f.Read(buf)
	return strings.TrimSpace(string(buf[:k]))
}

func daemonPID(g *globals) int {
	data, err := os.ReadFile(filepath.Join(g.runDir, "forkd.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func daemonCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "daemon", Short: "Start, stop or inspect the local daemon"}
	cmd.AddCommand(&cobra.Command{
		Use: "start", Short: "Start the daemon in the background", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if client.New(g.socketPath()).Ping(cmd.Context()) != nil {
				if err := g.startDaemon(cmd.Context()); err != nil {
					return err
				}
			} else if !g.jsonOut {
				fmt.Println("forkd daemon already running on", g.socketPath())
			}
			if g.jsonOut {
				return printJSON(map[string]any{"running": true, "pid": daemonPID(g), "socket": g.socketPath()})
			}
			return nil
		},
	}, &cobra.Command{
		Use: "stop", Short: "Stop the daemon (sandboxes keep running unless it was started with --stop-sandboxes; the next daemon re-adopts them)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pid := daemonPID(g)
			say := func(stopped bool, msg string) error {
				if g.jsonOut {
					return printJSON(map[string]any{"stopped": stopped, "pid": pid})
				}
				fmt.Println(msg)
				return nil
			}
			if pid == 0 || syscall.Kill(pid, 0) != nil {
				return say(false, "forkd daemon is not running")
			}
			syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 600; i++ {
				if syscall.Kill(pid, 0) != nil {
					return say(true, "forkd daemon stopped")
				}
				time.Sleep(50 * time.Millisecond)
			}
			return fmt.Errorf("daemon pid %d still running after 30s: %w", pid, errdefs.ErrUnavailable)
		},
	}, &cobra.Command{
		Use: "status", Short: "Say whether the daemon runs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client.New(g.socketPath()).Version(cmd.Context())
			if g.jsonOut {
				return printJSON(map[string]any{"running": err == nil, "pid": daemonPID(g), "socket": g.socketPath(), "version": v})
			}
			if err != nil {
				fmt.Println("forkd daemon is not running:", err)
				return exitError{1}
			}
			fmt.Printf("forkd daemon %s running (pid %d) on %s; VMM %s %s, data in %s\n", v.Version, daemonPID(g), g.socketPath(), v.VMM, v.VMMVersion, v.DataDir)
			return nil
		},
	}, &cobra.Command{
		Use: "logs", Short: "Print the daemon's log", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := tailFile(g.logPath(), 64<<10)
			if g.jsonOut {
				return printJSON(map[string]any{"path": g.logPath(), "log": log})
			}
			fmt.Println(log)
			return nil
		},
	})
	return cmd
}
