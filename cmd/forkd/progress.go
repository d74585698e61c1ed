package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/progress"
)

// progressFlags is --progress: how long commands (image build, snapshot
// create, pack, unpack, cp) show how they are going, on stderr.
type progressFlags struct {
	mode progress.Mode
	// envErr: FORKD_PROGRESS did not parse.
	envErr error
}

func addProgressFlag(pf *pflag.FlagSet, p *progressFlags) {
	p.mode = progress.Auto
	if v := os.Getenv("FORKD_PROGRESS"); v != "" {
		if err := p.mode.Set(v); err != nil {
			p.envErr = fmt.Errorf("FORKD_PROGRESS=%q: %w", v, err)
		}
	}
	pf.Var(&p.mode, "progress", "progress of image build, snapshot create, pack, unpack and cp on stderr (env FORKD_PROGRESS): "+
		"auto (json with --json, tty on a terminal, else plain), tty (bars with bytes, rate and time left), plain (a line per step, "+
		"byte counts every 5s or quarter), json (NDJSON events), none")
}

// reporter is the progress of one operation (op names it in events),
// shown as --progress says. dataOnStdout: the command writes data to
// stdout, so bars, which redraw, are not drawn when stdout is the same
// terminal.
func (g *globals) reporter(op string, dataOnStdout bool) (*progress.Reporter, error) {
	if err := g.progress.envErr; err != nil {
		return nil, err
	}
	mode := progress.Resolve(g.progress.mode, g.jsonOut, os.Stderr)
	if mode == progress.Bar && dataOnStdout && progress.IsTerminal(os.Stdout) {
		mode = progress.None
	}
	return progress.New(progress.Options{Op: op, Mode: mode, Out: os.Stderr}), nil
}
