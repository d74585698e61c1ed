// Package recipe reads guest image recipes: small declarative TOML files in
// recipes/ that say what goes into a root file system, how big the VM is, and
// what the persistent Python session imports before a snapshot.
package recipe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Bases a recipe can start from.
const (
	BaseBusybox = "busybox" // Debian's busybox-static and nothing else
	BaseDebian  = "debian"  // mmdebstrap of the host's Debian release + Packages
)

// Recipe is one parsed recipe file.
type Recipe struct {
	Name        string `toml:"name"`
	Description string `toml:"description"`
	Base        string `toml:"base"`
	// From is an OCI or Docker image reference (REGISTRY/REPO[:TAG|@DIGEST])
	// whose layers become the root file system, instead of a Base.
	From string `toml:"from"`
	// InsecureRegistry lets From use a plain-HTTP registry or one with an
	// untrusted TLS certificate.
	InsecureRegistry bool     `toml:"insecure_registry"`
	Packages         []string `toml:"packages"`
	// Omit names packages that are never installed: anything that depends
	// on one gets an empty placeholder package in its place. It is for
	// build-time tools Debian lists as hard dependencies (scipy depends on
	// the pythran compiler, which pulls in gcc, g++ and the boost headers:
	// over half a gigabyte no sandbox runs).
	Omit      []string `toml:"omit"`
	MemoryMiB int      `toml:"memory_mib"`
	VCPUs     int      `toml:"vcpus"`
	// CPUs is the default CPU limit of each sandbox forked from this
	// recipe's snapshots (0.5: half a CPU), from 0.1 to VCPUs; 0: one CPU
	// per vCPU plus half a CPU for the VMM. A fork may ask for another.
	CPUs float64 `toml:"cpus"`
	// Warm are shell commands (sh -c) run in order in the template VM,
	// after the Python warm-up, before the snapshot: what they leave in
	// memory (a server started with `cmd &`, a warmed cache, a REPL) is in
	// every child. Each must exit 0 within the warm-up's time.
	Warm   []string `toml:"warm"`
	Python Python   `toml:"python"`

	// Build steps (they need From): Files copies files of the build
	// context (the recipe file's directory) into the image, destination
	// path -> source path; Env, Workdir and User set the environment,
	// working directory and user of the Run commands and of every
	// sandbox; Run are shell commands run in order in a build VM, each
	// result kept as a cached layer (see Steps).
	Run     []string          `toml:"run"`
	Files   map[string]string `toml:"files"`
	Env     map[string]string `toml:"env"`
	Workdir string            `toml:"workdir"`
	User    string            `toml:"user"`

	// Steps are the build steps, from the fields above (Validate derives
	// them) or from a Dockerfile; Context holds the files Copy steps name,
	// by their path in the build context, which whoever reads the recipe
	// (the CLI) supplies.
	Steps   []Step                 `toml:"-"`
	Context map[string]ContextFile `toml:"-"`

	// Path is where the recipe was read from; Source its exact bytes, which
	// feed the image digest.
	Path   string `toml:"-"`
	Source []byte `toml:"-"`
}

// Python configures the persistent Python session started before snapshot.
type Python struct {
	Enabled bool   `toml:"enabled"`
	Warm    string `toml:"warm"`
	// Rehearse is code that each pooled child runs in a throwaway copy of
	// its session before it is handed out (the session itself is left as
	// it was): under emulation (TCG) it translates ahead what a first
	// request runs, so that request costs about what a second one does.
	// Empty: a trivial expression, which still rehearses the request path.
	Rehearse string `toml:"rehearse"`
}

// Bounds on a recipe's warm commands.
const (
	MaxWarmCommands     = 64
	MaxWarmCommandBytes = 64 << 10
)

var (
	nameRule    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	packageRule = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
)

// Parse reads a recipe from bytes; path is used in messages only.
func Parse(path string, data []byte) (*Recipe, error) {
	var r Recipe
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&r)
	if err != nil {
		return nil, fmt.Errorf("recipe %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("recipe %s: unknown keys %s (known: name, description, base, from, insecure_registry, packages, omit, memory_mib, vcpus, cpus, warm, run, files, env, workdir, user, [python] enabled, warm, rehearse): %w",
			path, strings.Join(keys, ", "), errdefs.ErrInvalidArgument)
	}
	r.Path, r.Source = path, data
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("recipe %s: %w", path, err)
	}
	return &r, nil
}

// Validate checks a recipe and fills in defaults (memory_mib 256, vcpus 1).
// Parse calls it; call it on a Recipe built in code.
func (r *Recipe) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if !nameRule.MatchString(r.Name) {
		return bad("name %q must be 1-32 lowercase letters, digits or '-', starting with a letter or digit", r.Name)
	}
	if r.From != "" {
		if err := r.validateFrom(); err != nil {
			return err
		}
	} else if r.InsecureRegistry {
		return bad("insecure_registry is set but from is not")
	}
	switch r.Base {
	case "":
		if r.From == "" {
			return bad("set base (%q or %q) or from (an image reference such as \"docker.io/library/alpine:3.20\")", BaseBusybox, BaseDebian)
		}
	case BaseBusybox:
		if len(r.Packages) > 0 || len(r.Omit) > 0 {
			return bad("base %q takes no packages or omit; use base = %q", BaseBusybox, BaseDebian)
		}
	case BaseDebian:
		for _, p := range r.Packages {
			if !packageRule.MatchString(p) {
				return bad("package %q is not a Debian package name", p)
			}
		}
		for _, p := range r.Omit {
			if !packageRule.MatchString(p) {
				return bad("omit: %q is not a Debian package name", p)
			}
			if slices.Contains(r.Packages, p) {
				return bad("package %q is both in packages and in omit; keep it in one", p)
			}
		}
	default:
		return bad("base %q: must be %q or %q", r.Base, BaseBusybox, BaseDebian)
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = 256
	}
	if r.MemoryMiB < 64 || r.MemoryMiB > 65536 {
		return bad("memory_mib %d out of range 64..65536", r.MemoryMiB)
	}
	if r.VCPUs == 0 {
		r.VCPUs = 1
	}
	if r.VCPUs < 1 || r.VCPUs > 64 {
		return bad("vcpus %d out of range 1..64", r.VCPUs)
	}
	if r.CPUs != 0 && !(r.CPUs >= 0.1 && r.CPUs <= float64(r.VCPUs)) {
		return bad("cpus %g out of range 0.1..%d (vcpus)", r.CPUs, r.VCPUs)
	}
	if r.Python.Enabled && r.Base != BaseDebian {
		return bad("[python] needs base = %q with python3 in packages", BaseDebian)
	}
	if r.Python.Enabled && !slices.Contains(r.Packages, "python3") {
		return bad("[python] enabled = true needs \"python3\" in packages")
	}
	if len(r.Warm) > MaxWarmCommands {
		return bad("warm has %d commands, at most %d: join them with && in fewer", len(r.Warm), MaxWarmCommands)
	}
	for i, c := range r.Warm {
		if strings.TrimSpace(c) == "" || len(c) > MaxWarmCommandBytes || strings.ContainsRune(c, 0) {
			return bad("warm[%d]: want a shell command of 1 to %d bytes without NUL", i, MaxWarmCommandBytes)
		}
	}
	if r.Steps == nil {
		// Written only when there are steps (and then once), so that
		// validating a shared recipe again, as concurrent builds do,
		// writes nothing.
		if s := r.buildSteps(); len(s) > 0 {
			r.Steps = s
		}
	}
	if err := r.validateSteps(); err != nil {
		return err
	}
	if !r.Python.Enabled && strings.TrimSpace(r.Python.Warm) != "" {
		return bad("[python] warm code is set but enabled is false")
	}
	if !r.Python.Enabled && strings.TrimSpace(r.Python.Rehearse) != "" {
		return bad("[python] rehearse code is set but enabled is false")
	}
	return nil
}

// Digest is a stable hash of what the recipe asks for: its exact bytes when
// it was parsed, else (a Recipe built in code) a canonical encoding of its
// fields.
func (r *Recipe) Digest() string {
	src := r.Source
	if len(src) == 0 {
		var buf bytes.Buffer
		c := *r
		c.Path, c.Source, c.Steps, c.Context = "", nil, nil, nil
		if err := toml.NewEncoder(&buf).Encode(c); err != nil {
			// Only unsupported types fail to encode; Recipe has none.
			panic("recipe: encode: " + err.Error())
		}
		src = buf.Bytes()
	}
	sum := sha256.Sum256(src)
	return hex.EncodeToString(sum[:])
}

// RootfsKey hashes only what shapes the root file system (base, sorted
// packages and sorted omitted packages), so editing warm-up code or memory
// size does not rebuild it.
func (r *Recipe) RootfsKey() string {
	pk := append([]string(nil), r.Packages...)
	sort.Strings(pk)
	key := r.Base + "\n" + strings.Join(pk, "\n")
	if r.From != "" {
		// Only when set, so the keys of other recipes stay as they were.
		// The builder adds the digest the reference resolved to.
		key += "\nfrom\n" + r.From
	}
	if len(r.Omit) > 0 {
		// Only when set, so the keys of recipes without omit stay as they were.
		om := append([]string(nil), r.Omit...)
		sort.Strings(om)
		key += "\nomit\n" + strings.Join(om, "\n")
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Load finds a recipe by name or path. A name is looked up as NAME.toml in
// each of dirs, in order.
func Load(nameOrPath string, dirs []string) (*Recipe, error) {
	if strings.ContainsRune(nameOrPath, '/') || strings.HasSuffix(nameOrPath, ".toml") {
		data, err := os.ReadFile(nameOrPath)
		if err != nil {
			return nil, fmt.Errorf("recipe file %s: %v: %w", nameOrPath, err, errdefs.ErrNotFound)
		}
		return Parse(nameOrPath, data)
	}
	for _, d := range dirs {
		p := filepath.Join(d, nameOrPath+".toml")
		if data, err := os.ReadFile(p); err == nil {
			return Parse(p, data)
		}
	}
	known := Names(dirs)
	return nil, fmt.Errorf("recipe %q not found in %v (known: %s); pass a path to a .toml file or one of the known names: %w",
		nameOrPath, dirs, strings.Join(known, ", "), errdefs.ErrNotFound)
}

// Names lists the recipe names found in dirs.
func Names(dirs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, "*.toml"))
		for _, p := range m {
			n := strings.TrimSuffix(filepath.Base(p), ".toml")
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}
