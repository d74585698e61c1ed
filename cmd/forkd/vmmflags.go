package main

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// defaultVMM is the driver forkd runs when neither --vmm nor FORKD_VMM
// names one.
const defaultVMM = "qemu"

// addDriverFlags adds --vmm and --accel (env FORKD_VMM, FORKD_ACCEL) to
// every command that starts or checks VMMs; purpose ends the help text
// ("to check").
func addDriverFlags(f *pflag.FlagSet, g *globals, purpose string) {
	if purpose != "" {
		purpose = " " + purpose
	}
	f.StringVar(&g.vmmName, "vmm", envOr("FORKD_VMM", defaultVMM),
		"VMM driver"+purpose+": "+strings.Join(vmm.List(), ", ")+" (env FORKD_VMM)")
	f.StringVar(&g.accel, "accel", os.Getenv("FORKD_ACCEL"),
		"accelerator"+purpose+": kvm, tcg, or empty for auto (env FORKD_ACCEL)")
}

// addPoolFlags adds --pool (help: what it keeps) and --pool-max to every
// command that runs an engine.
func addPoolFlags(f *pflag.FlagSet, g *globals, help string) {
	f.IntVar(&g.poolSize, "pool", sandbox.DefaultPoolSize, help)
	f.IntVar(&g.poolMax, "pool-max", sandbox.DefaultPoolMax,
		"most VMMs a fan-out grows a snapshot's pool to: a fork of N children makes it keep N (at most this) for the next fan-out, until none comes for 10 minutes; at or below --pool: no growth (env FORKD_POOL_MAX)")
	envDefault(f, g, "pool-max", "FORKD_POOL_MAX")
}
