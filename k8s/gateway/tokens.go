package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
)

// Role is what a token may do: forkd's roles.
type Role string

// Roles of forkd's token store.
const (
	RoleAdmin  Role = "admin"
	RoleUser   Role = "user"
	RoleReader Role = "reader"
)

// TokenEntry is one token of the store: its SHA-256, never its plaintext.
type TokenEntry struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Role   Role   `json:"role"`
	// Tenant is the namespace the token's sandboxes live in; empty for an
	// admin (the gateway's default namespace).
	Tenant string `json:"tenant"`
}

// Tokens is a token store in forkd's tokens.json format (version 2), read
// once: `forkd token create --token-file FILE` writes it, and a Secret
// carries it to the gateway.
type Tokens struct {
	byHash map[[sha256.Size]byte]TokenEntry
}

// dns1123 is a Kubernetes namespace name.
var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// LoadTokens reads a token store (1 MiB at most).
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gateway token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return nil, fmt.Errorf("gateway token file %s: %w", path, err)
	}
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("gateway token file %s: over 1 MiB", path)
	}
	return ParseTokens(b)
}

// ParseTokens reads a token store. Every entry needs a name, a SHA-256 of
// 64 hex digits, a role, and a tenant that is a namespace name (or none,
// for an admin).
func ParseTokens(b []byte) (*Tokens, error) {
	var doc struct {
		Version int          `json:"version"`
		Tokens  []TokenEntry `json:"tokens"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("gateway token store: %w (want forkd's tokens.json: {\"version\":2,\"tokens\":[...]})", err)
	}
	if doc.Version != 2 {
		return nil, fmt.Errorf("gateway token store: version %d, want 2 (forkd token create writes it)", doc.Version)
	}
	t := &Tokens{byHash: map[[sha256.Size]byte]TokenEntry{}}
	for i, e := range doc.Tokens {
		var h [sha256.Size]byte
		if n, err := hex.Decode(h[:], []byte(e.SHA256)); err != nil || n != sha256.Size || len(e.SHA256) != 2*sha256.Size {
			return nil, fmt.Errorf("gateway token store: token %d (%q): sha256 is not 64 hex digits", i, e.Name)
		}
		switch e.Role {
		case RoleAdmin, RoleUser, RoleReader:
		default:
			return nil, fmt.Errorf("gateway token store: token %q: role %q, want admin, user or reader", e.Name, e.Role)
		}
		if e.Tenant == "" && e.Role != RoleAdmin {
			return nil, fmt.Errorf("gateway token store: token %q: a %s needs a tenant (the namespace of its sandboxes)", e.Name, e.Role)
		}
		if e.Tenant != "" && !dns1123.MatchString(e.Tenant) {
			return nil, fmt.Errorf("gateway token store: token %q: tenant %q is not a namespace name (lower-case letters, digits and -, at most 63)", e.Name, e.Tenant)
		}
		t.byHash[h] = e
	}
	return t, nil
}

// Lookup finds the entry of a plaintext token.
func (t *Tokens) Lookup(token string) (TokenEntry, bool) {
	h := sha256.Sum256([]byte(token))
	e, ok := t.byHash[h]
	if !ok {
		return TokenEntry{}, false
	}
	// The map found it by its hash; compare once more in constant time.
	want, _ := hex.DecodeString(e.SHA256)
	return e, subtle.ConstantTimeCompare(want, h[:]) == 1
}
