package main

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

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
