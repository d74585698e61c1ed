package main

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/pack"
)

// loadTrustedKeys reads --trusted-keys: comma-separated ed25519 public
// keys (PEM files from `forkd pack keygen`, KEYBASE.pub) or directories
// of them (every *.pub). Empty: no import policy.
func loadTrustedKeys(list string) ([]ed25519.PublicKey, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("--trusted-keys: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	var keys []ed25519.PublicKey
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		files := []string{p}
		if st, err := os.Stat(p); err != nil {
			return nil, bad("%v", err)
		} else if st.IsDir() {
			if files, err = filepath.Glob(filepath.Join(p, "*.pub")); err != nil {
				return nil, bad("%v", err)
			}
			if len(files) == 0 {
				return nil, bad("directory %s holds no *.pub key", p)
			}
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, bad("%v", err)
			}
			k, err := pack.ParsePublicKey(data)
			if err != nil {
				return nil, bad("%s: %v (want the KEYBASE.pub of `forkd pack keygen`)", f, err)
			}
			keys = append(keys, k)
		}
	}
	return keys, nil
}
