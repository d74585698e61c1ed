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
	"github.com/forkd-dev/forkd/internal/vmm"
)

// defaultConfigPath is read by `forkd serve` when it exists and --config is
// not given.
const defaultConfigPath = "/etc/forkd/forkd.toml"

// driverConfigKey is the table of per-driver sections in forkd.toml:
// [driver.qemu] holds the qemu driver's settings (vmm.Options.Config).
// It is not [vmm.qemu]: vmm is the key that picks the driver.
const driverConfigKey = "driver"

// driverSections are the [driver.NAME] tables of a config file, by driver
// name.
type driverSections map[string]map[string]any

// applyConfig reads a TOML file whose keys are serve's flag names with '_'
// for '-' (max_fork = 50) and sets every flag not given on the command
// line: flags override the file, the file overrides defaults. Unknown keys
// are errors, so a typo is never silently ignored. It returns the
// [driver.NAME] sections for the drivers to parse; a section of a driver
// this forkd lacks is an error too.
func applyConfig(cmd *cobra.Command, path string, explicit bool) (driverSections, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	var values map[string]any
	if _, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&values); err != nil {
		return nil, fmt.Errorf("config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	drivers, err := driverConfigs(path, values[driverConfigKey])
	if err != nil {
		return nil, err
	}
	delete(values, driverConfigKey)
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.ReplaceAll(k, "_", "-")
		f := cmd.Flag(name)
		if f == nil || name == "config" || name == "json" {
			return nil, fmt.Errorf("config %s: unknown key %q (keys are `forkd serve` flag names with _ for -, e.g. max_fork): %w", path, k, errdefs.ErrInvalidArgument)
		}
		if f.Changed {
			continue
		}
		if err := f.Value.Set(fmt.Sprint(values[k])); err != nil {
			return nil, fmt.Errorf("config %s: %s = %v: %v: %w", path, k, values[k], err, errdefs.ErrInvalidArgument)
		}
	}
	return drivers, nil
}

// driverConfigs checks the [driver] table v of a config file: one table
// per registered driver, each left for its driver to parse.
func driverConfigs(path string, v any) (driverSections, error) {
	if v == nil {
		return nil, nil
	}
	tables, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("config %s: %s = %v: want tables such as [%s.%s]: %w", path, driverConfigKey, v, driverConfigKey, defaultVMM, errdefs.ErrInvalidArgument)
	}
	out := driverSections{}
	for name, t := range tables {
		if _, err := vmm.Lookup(name); err != nil {
			return nil, fmt.Errorf("config %s: [%s.%s]: no driver %q in this forkd (it has %s): %w",
				path, driverConfigKey, name, name, strings.Join(vmm.List(), ", "), errdefs.ErrInvalidArgument)
		}
		section, ok := t.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("config %s: %s.%s = %v: want a table [%s.%s]: %w", path, driverConfigKey, name, t, driverConfigKey, name, errdefs.ErrInvalidArgument)
		}
		out[name] = section
	}
	return out, nil
}
