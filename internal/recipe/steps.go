package recipe

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// StepKind says what a build step does.
type StepKind string

// Build steps. Run and Copy make a layer; Env, Workdir and User change the
// configuration later steps run with and the image keeps.
const (
	StepRun     StepKind = "run"     // a command in a build VM (RUN)
	StepCopy    StepKind = "copy"    // files of the build context (COPY, ADD, files)
	StepEnv     StepKind = "env"     // one environment variable (ENV, env)
	StepWorkdir StepKind = "workdir" // the working directory (WORKDIR, workdir)
	StepUser    StepKind = "user"    // the user processes run as (USER, user)
	// The image's default command (CMD, ENTRYPOINT): Argv, which a shell
	// form makes ["/bin/sh", "-c", ...]. An ENTRYPOINT with Value
	// ResetCmd also clears the Cmd the base image set, as Docker does
	// when a Dockerfile sets ENTRYPOINT without a CMD before it.
	StepCmd        StepKind = "cmd"
	StepEntrypoint StepKind = "entrypoint"
)

// Step is one build step of a recipe (run, files, env, workdir, user) or
// a Dockerfile (internal/dockerfile). Steps run in order on the image of
// the step before, starting from the recipe's from image.
type Step struct {
	Kind StepKind `json:"kind"`
	// Origin says where the step came from, for messages: "run[1]",
	// "Dockerfile:12 RUN".
	Origin string `json:"origin"`
	// Run: Shell is run with /bin/sh -c; Argv (a Dockerfile's exec form)
	// is run as is. BuildEnv holds variables set for this command only
	// (a Dockerfile's ARG values), not kept in the image.
	Shell    string            `json:"shell,omitempty"`
	Argv     []string          `json:"argv,omitempty"`
	BuildEnv map[string]string `json:"build_env,omitempty"`
	// Copy: Src are paths in the build context (a file, or a directory
	// whose contents are copied), Dst the path in the image; a Dst ending
	// in "/", or several sources, is a directory they go into.
	Src []string `json:"src,omitempty"`
	Dst string   `json:"dst,omitempty"`
	// Env: Key=Value. Workdir, User: Value.
	Key   string `json:"key,omitempty"`
	Value string `json:"value,omitempty"`
}

// ContextFile is one file of a build context: what Copy steps copy.
type ContextFile struct {
	Mode fs.FileMode // permission bits (0o755: executable)
	Data []byte
}

// Bounds on a recipe's build steps and context.
const (
	MaxSteps        = 256
	MaxContextBytes = 64 << 20
	MaxContextFiles = 100_000
)

// userRule is USER's argument: a name or number, optionally :group.
var userRule = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)

// buildSteps derives the steps of a recipe's run, files, env, workdir and
// user fields: files first (sorted by destination), then env (sorted),
// workdir and user, then the run commands in order. user and workdir apply
// to the run commands and to the sandboxes forked from the image.
func (r *Recipe) buildSteps() []Step {
	var out []Step
	dsts := make([]string, 0, len(r.Files))
	for d := range r.Files {
		dsts = append(dsts, d)
	}
	sort.Strings(dsts)
	for _, d := range dsts {
		out = append(out, Step{Kind: StepCopy, Origin: fmt.Sprintf("files[%q]", d), Src: []string{r.Files[d]}, Dst: d})
	}
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, Step{Kind: StepEnv, Origin: "env." + k, Key: k, Value: r.Env[k]})
	}
	if r.Workdir != "" {
		out = append(out, Step{Kind: StepWorkdir, Origin: "workdir", Value: r.Workdir})
	}
	if r.User != "" {
		out = append(out, Step{Kind: StepUser, Origin: "user", Value: r.User})
	}
	for i, c := range r.Run {
		out = append(out, Step{Kind: StepRun, Origin: fmt.Sprintf("run[%d]", i), Shell: c})
	}
	return out
}

// validateSteps checks the steps, which need a from image: there is no
// shell to run them with in a base built on the host before it has one.
func (r *Recipe) validateSteps() error {
	if len(r.Steps) == 0 {
		return nil
	}
	if r.From == "" {
		return fmt.Errorf("run, files, env, workdir and user need from = \"REF\" (an image with /bin/sh); a base recipe installs packages instead: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Steps) > MaxSteps {
		return fmt.Errorf("%d build steps, at most %d: join run commands with && in fewer: %w", len(r.Steps), MaxSteps, errdefs.ErrInvalidArgument)
	}
	for _, s := range r.Steps {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("%s: %w", s.Origin, err)
		}
	}
	return nil
}

// ResetCmd is the Value of an entrypoint step that clears the base
// image's Cmd.
const ResetCmd = "reset-cmd"

// Validate checks one step.
func (s Step) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	noNUL := func(v string) bool { return !strings.ContainsRune(v, 0) }
	switch s.Kind {
	case StepRun:
		if (s.Shell == "") == (len(s.Argv) == 0) || len(s.Shell) > MaxWarmCommandBytes || !noNUL(s.Shell) {
			return bad("want a shell command of 1 to %d bytes without NUL, or an argument vector", MaxWarmCommandBytes)
		}
		for _, a := range s.Argv {
			if !noNUL(a) {
				return bad("argument %q has a NUL byte", a)
			}
		}
		for k, v := range s.BuildEnv {
			if !validEnvKey(k) || !noNUL(v) {
				return bad("build variable %q: want a name of letters, digits and '_' and a value without NUL", k)
			}
		}
	case StepCopy:
		if len(s.Src) == 0 {
			return bad("copies nothing: name a source")
		}
		for _, src := range s.Src {
			if _, err := ContextPath(src); err != nil {
				return err
			}
		}
		if !strings.HasPrefix(s.Dst, "/") || !noNUL(s.Dst) || len(s.Dst) > 4096 {
			return bad("destination %q: want an absolute path in the image", s.Dst)
		}
	case StepEnv:
		if !validEnvKey(s.Key) || !noNUL(s.Value) {
			return bad("variable %q: want a name of letters, digits and '_' (not starting with a digit) and a value without NUL", s.Key)
		}
	case StepWorkdir:
		if !strings.HasPrefix(s.Value, "/") || !noNUL(s.Value) || len(s.Value) > 4096 {
			return bad("workdir %q: want an absolute path in the image", s.Value)
		}
	case StepUser:
		if !userRule.MatchString(s.Value) {
			return bad("user %q: want NAME, UID, NAME:GROUP or UID:GID", s.Value)
		}
	case StepCmd, StepEntrypoint:
		if s.Value != "" && (s.Kind != StepEntrypoint || s.Value != ResetCmd) {
			return bad("%s value %q: want none (or %q for an entrypoint)", s.Kind, s.Value, ResetCmd)
		}
		for _, a := range s.Argv {
			if !noNUL(a) || len(a) > MaxWarmCommandBytes {
				return bad("argument %q: want at most %d bytes without NUL", a, MaxWarmCommandBytes)
			}
		}
	default:
		return bad("unknown step kind %q", s.Kind)
	}
	return nil
}

// ContextPath cleans a path of the build context: relative, inside it
// ("." is all of it).
func ContextPath(p string) (string, error) {
	c := path.Clean(strings.TrimPrefix(p, "./"))
	if p == "" || strings.HasPrefix(c, "/") || c == ".." || strings.HasPrefix(c, "../") || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("source %q: want a path inside the build context (relative, without ..): %w", p, errdefs.ErrInvalidArgument)
	}
	return c, nil
}

func validEnvKey(k string) bool {
	if k == "" || len(k) > 256 || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
