package vmm

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestDecodeConfig(t *testing.T) {
	type cfg struct {
		CPU  string `json:"cpu"`
		Size int    `json:"tb_size_mib"`
	}
	var c cfg
	if err := DecodeConfig("x", map[string]any{"cpu": "max", "tb_size_mib": int64(32)}, &c); err != nil || c != (cfg{"max", 32}) {
		t.Fatalf("%+v, %v", c, err)
	}
	keep := cfg{"host", 1}
	if err := DecodeConfig("x", nil, &keep); err != nil || keep != (cfg{"host", 1}) {
		t.Fatalf("nil section changed %+v, %v", keep, err)
	}
	for name, section := range map[string]map[string]any{
		"unknown key": {"cpus": "max"},
		"wrong type":  {"tb_size_mib": "big"},
	} {
		err := DecodeConfig("x", section, &c)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "[driver.x]") {
			t.Errorf("%s: %v, want an invalid argument naming [driver.x]", name, err)
		}
	}
}
