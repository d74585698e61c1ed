// Package procenv builds the environment of the processes the agent starts
// and finds their executables. The agent's own environment (PID 1 gets
// almost none from the kernel) is never inherited: every process gets the
// default environment plus what its request sets.
package procenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Default is the base environment of every process the agent starts.
var Default = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
}

// Merge returns base with the variables of extra set (replacing any of the
// same name), extra's in sorted order so the result is deterministic.
func Merge(base []string, extra map[string]string) []string {
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, override := extra[k]; !override {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+extra[k])
	}
	return out
}

// Validate rejects variable names the kernel would mangle.
func Validate(extra map[string]string) error {
	for k, v := range extra {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("invalid environment variable %q: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Get returns the value of key in env, or "".
func Get(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// LookPath finds file as a shell would with env's PATH (not the agent's):
// a name with a slash is used as is. Errors wrap errdefs.ErrNotFound or
// ErrFailedPrecondition (found but not executable).
func LookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, checkExecutable(file)
	}
	var notExec error
	for _, dir := range filepath.SplitList(Get(env, "PATH")) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if errdefs.IsFailedPrecondition(err) && notExec == nil {
			notExec = err
		}
	}
	if notExec != nil {
		return "", notExec
	}
	return "", fmt.Errorf("executable %q not found in PATH %q: %w", file, Get(env, "PATH"), errdefs.ErrNotFound)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("executable %q does not exist: %w", p, errdefs.ErrNotFound)
		}
		return fmt.Errorf("executable %q: %v: %w", p, err, errdefs.ErrFailedPrecondition)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%q is not an executable file: %w", p, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// FromImageConfig returns the base environment and the default working
// directory of an image built from an OCI image: base with the variables
// of the image config at path (agentapi.ImageConfigPath) set, and its
// WorkingDir. Without that file (other images): base and "".
func FromImageConfig(path string, base []string) (env []string, cwd string, err error) {
	c, err := readImageConfig(path)
	if err != nil {
		return base, "", err
	}
	extra := map[string]string{}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			extra[k] = v
		}
	}
	if err := Validate(extra); err != nil {
		return base, "", fmt.Errorf("%s: %w", path, err)
	}
	return Merge(base, extra), c.WorkingDir, nil
}

// ImageUser is the User of the image config at path: the user execs run
// as by default ("": root, also without that file).
func ImageUser(path string) (string, error) {
	c, err := readImageConfig(path)
	return c.User, err
}

// readImageConfig reads the image config at path; a missing file is an
// empty config.
func readImageConfig(path string) (agentapi.ImageConfig, error) {
	var c agentapi.ImageConfig
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("%s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return c, nil
}
