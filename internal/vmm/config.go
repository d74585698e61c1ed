package vmm

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// DecodeConfig decodes a driver's section of the configuration
// (Options.Config) into out, a pointer to a struct whose json tags name
// the keys (snake_case, as in forkd.toml). A key out has no field for, or
// a value of the wrong type, is an errdefs.ErrInvalidArgument-class error
// naming the driver and the key: a typo is never silently ignored. A nil
// or empty section leaves out as it is.
func DecodeConfig(driver string, section map[string]any, out any) error {
	if len(section) == 0 {
		return nil
	}
	data, err := json.Marshal(section)
	if err != nil {
		return fmt.Errorf("[driver.%s]: %v: %w", driver, err, errdefs.ErrInvalidArgument)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("[driver.%s]: %v: %w", driver, err, errdefs.ErrInvalidArgument)
	}
	return nil
}
