package main

import (
	"os"
	"testing"
)

// The watchdog a bench run starts is this program's hidden `bench
// watchdog`, given the run's dirs and this process as its owner.
func TestBenchWatchdogCommandLine(t *testing.T) {
	c, err := benchConfig(&globals{runDir: "/run/x", dataDir: "/data/x"})
	if err != nil {
		t.Fatal(err)
	}
	if self, _ := os.Executable(); c.Watchdog[0] != self {
		t.Fatalf("watchdog runs %q, want this program", c.Watchdog[0])
	}
	g := &globals{}
	cmd, args, err := newRootCmd(g).Find(c.Watchdog[1:])
	if err != nil || cmd.CommandPath() != "forkd bench watchdog" {
		t.Fatalf("%q resolves to %v (%v)", c.Watchdog[1:], cmd, err)
	}
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	owner, err := cmd.Flags().GetInt("owner")
	if err != nil || owner != os.Getpid() || g.runDir != "/run/x" || g.dataDir != "/data/x" {
		t.Fatalf("owner %d (%v), run dir %q, data dir %q", owner, err, g.runDir, g.dataDir)
	}
}
