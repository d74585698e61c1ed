package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// defaultConfigPath is read by `forkd serve` when it exists and --config is
// not given.
const defaultConfigPath = "/etc/forkd/forkd.toml"

// applyConfig reads a TOML file whose keys are serve's flag names with '_'
// for '-' (max_fork = 50) and sets every flag not given on the command
// line: flags override the file, the file overrides defaults. Unknown keys
// are errors, so a typo is never silently ignored.
func applyConfig(cmd *cobra.Command, path string, explicit bool) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil
	}
	if err != nil {
		return fmt.Errorf("config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	var values map[string]any
	if _, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&values); err != nil {
		return fmt.Errorf("config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		f := cmd.Flag(name)
		if f == nil || name == "config" || name == "json" {
			return fmt.Errorf("config %s: unknown key %q (keys are `forkd serve` flag names with _ for -, e.g. max_fork): %w", path, k, errdefs.ErrInvalidArgument)
		}
		if f.Changed {
			continue
		}
		if err := f.Value.Set(fmt.Sprint(values[k])); err != nil {
			return fmt.Errorf("config %s: %s = %v: %v: %w", path, k, values[k], err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
