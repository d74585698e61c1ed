// Package auth authenticates API clients that reach the daemon over TCP:
// named bearer tokens kept hashed in a 0600 file (Tokens), an HTTP
// middleware that checks them (Middleware), and a TCP/TLS listener that
// refuses to expose plaintext tokens to the network (Listen).
//
// The Unix socket needs none of this: its 0600 mode lets only root in.
//
// Token lifecycle: Create prints a token once (forkd_ followed by 43
// base64url characters, 32 random bytes) and keeps only its SHA-256, with
// the token's role and tenant (principal.go); Verify hashes what a client
// presents and compares it with every stored hash in constant time; Revoke
// removes a token by name. The daemon re-reads the store when the file
// changes, so tokens created or revoked by the CLI, and quotas (quota.go),
// take effect without a restart.
//
// Store versions: version 1 files (before roles) have no role or tenant:
// their tokens load as admins of DefaultTenant, so an upgrade locks nobody
// out, and the next change writes them back explicitly as version 2.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Default file names, in the daemon's data directory (persistent, root-only;
// the run directory is a per-boot tmpfs and would lose them).
const (
	// StoreFile holds the token hashes: DATA_DIR/tokens.json.
	StoreFile = "tokens.json"
	// FirstTokenFile receives the plaintext of the token EnsureFirst
	// creates: DATA_DIR/token. Clients read it; remove it once the token is
	// stored elsewhere.
	FirstTokenFile = "token"
)

// Prefix starts every token, so a leaked one is recognisable (and can be
// found by secret scanners).
const Prefix = "forkd_"

// tokenBytes is the entropy of a token.
const tokenBytes = 32

// Entry is one stored token: its name, the hex SHA-256 of its plaintext,
// and what it grants.
type Entry struct {
	Name    string    `json:"name"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
	// Role and Tenant are absent from version 1 stores: such a token is
	// an admin of DefaultTenant (loadLocked fills them in).
	Role   Role   `json:"role,omitempty"`
	Tenant string `json:"tenant,omitempty"`
}

// storeVersion is the layout this forkd writes; it reads 1 and 2.
const storeVersion = 2

// storeFile is the JSON layout of the store.
type storeFile struct {
	Version int     `json:"version"`
	Tokens  []Entry `json:"tokens"`
	// Quotas are per tenant, QuotaDefault for tenants without their own
	// (quota.go). Version 2.
	Quotas map[string]Quota `json:"quotas,omitempty"`
}

// Tokens is a token store backed by one file. It is safe for concurrent
// use; several processes may share the file (mutations take a lock file).
type Tokens struct {
	path string

	// mu guards the fields below.
	mu      sync.RWMutex
	entries []Entry
	quotas  map[string]Quota
	sums    [][]byte  // decoded SHA256 of entries, same order
	stamp   fileStamp // of the file entries were read from
	loadErr error     // the last reload failed: verify nothing
}

// fileStamp identifies a version of the store file: a rename (every
// write), a content change or a chmod all change it.
type fileStamp struct {
	mod   time.Time
	size  int64
	mode  fs.FileMode
	ino   uint64
	valid bool
}

func stampOf(fi fs.FileInfo) fileStamp {
	s := fileStamp{mod: fi.ModTime(), size: fi.Size(), mode: fi.Mode(), valid: true}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Open reads the store at path. A missing file is an empty store; the file
// is created (0600) by the first Create. A file that others may read or
// write is refused.
//
// On that error Open returns the store as well, failed closed: it verifies
// no token (Err says why) until the file is readable again, when the next
// Verify reloads it. A daemon that needs no token to serve (its Unix
// socket) keeps serving with it.
func Open(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t, t.loadLocked()
}

// Path returns the store's file.
func (t *Tokens) Path() string { return t.path }

// loadLocked (re)reads the file.
func (t *Tokens) loadLocked() error {
	f, err := os.Open(t.path)
	if errors.Is(err, fs.ErrNotExist) {
		t.entries, t.quotas, t.sums, t.stamp, t.loadErr = nil, nil, nil, fileStamp{}, nil
		return nil
	}
	if err != nil {
		return t.fail(fmt.Errorf("token store: %w", err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return t.fail(fmt.Errorf("token store: %w", err))
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return t.fail(fmt.Errorf("token store %s has mode %04o; run `chmod 600 %s`: %w", t.path, fi.Mode().Perm(), t.path, errdefs.ErrFailedPrecondition))
	}
	var sf storeFile
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sf); err != nil {
		return t.fail(fmt.Errorf("token store %s: malformed: %v: %w", t.path, err, errdefs.ErrFailedPrecondition))
	}
	if sf.Version > storeVersion {
		return t.fail(fmt.Errorf("token store %s has version %d, this forkd reads up to %d: run the forkd that wrote it, or newer: %w", t.path, sf.Version, storeVersion, errdefs.ErrFailedPrecondition))
	}
	sums := make([][]byte, len(sf.Tokens))
	for i := range sf.Tokens {
		e := &sf.Tokens[i]
		sum, err := hex.DecodeString(e.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return t.fail(fmt.Errorf("token store %s: token %q: bad sha256: %w", t.path, e.Name, errdefs.ErrFailedPrecondition))
		}
		sums[i] = sum
		if err := migrateEntry(e); err != nil {
			return t.fail(fmt.Errorf("token store %s: token %q: %v; fix or revoke it (`forkd token revoke %s`): %w", t.path, e.Name, err, e.Name, errdefs.ErrFailedPrecondition))
		}
	}
	for tenant, q := range sf.Quotas {
		if err := checkQuota(tenant, q); err != nil {
			return t.fail(fmt.Errorf("token store %s: %v: %w", t.path, err, errdefs.ErrFailedPrecondition))
		}
	}
	t.entries, t.quotas, t.sums, t.stamp, t.loadErr = sf.Tokens, sf.Quotas, sums, stampOf(fi), nil
	return nil
}

// migrateEntry fills in what a version 1 entry lacks (it was an admin of
// DefaultTenant, as every token was then) and checks the rest.
func migrateEntry(e *Entry) error {
	if e.Role == "" {
		e.Role = RoleAdmin
	}
	if e.Tenant == "" {
		e.Tenant = DefaultTenant
	}
	if _, err := ParseRole(string(e.Role)); err != nil {
		return err
	}
	return ValidateTenant(e.Tenant)
}

// fail records a load error: the store then verifies no token (fail closed)
// until the file is readable again.
func (t *Tokens) fail(err error) error {
	t.entries, t.quotas, t.sums, t.stamp, t.loadErr = nil, nil, nil, fileStamp{}, err
	return err
}

// refresh re-reads the file when it changed since the last load.
func (t *Tokens) refresh() {
	fi, err := os.Stat(t.path)
	t.mu.RLock()
	cur, lerr := t.stamp, t.loadErr
	t.mu.RUnlock()
	switch {
	case err == nil && lerr == nil && cur.valid && cur == stampOf(fi):
		return
	case errors.Is(err, fs.ErrNotExist) && lerr == nil && !cur.valid:
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.loadLocked()
}

// Verify reports the token whose hash matches presented (its name, role
// and tenant). The presented token is hashed and compared with every
// stored hash, in constant time and without stopping at a match, so timing
// reveals neither which token matched nor how much of a hash did.
func (t *Tokens) Verify(presented string) (entry Entry, ok bool) {
	if presented == "" {
		return Entry{}, false
	}
	t.refresh()
	sum := sha256.Sum256([]byte(presented))
	t.mu.RLock()
	defer t.mu.RUnlock()
	match := -1
	for i, s := range t.sums {
		if constantTimeCompare(sum[:], s) == 1 {
			match = i
		}
	}
	if match < 0 {
		return Entry{}, false
	}
	return t.entries[match], true
}

// constantTimeCompare is subtle.ConstantTimeCompare; a variable so a test
// can check that Verify goes through it for every entry.
var constantTimeCompare = subtle.ConstantTimeCompare

// Err reports why the store could not be read at the last reload (then
// every token is refused), or nil.
func (t *Tokens) Err() error {
	t.refresh()
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.loadErr
}

// List returns the stored tokens (hashes only), sorted by name.
func (t *Tokens) List() []Entry {
	t.refresh()
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := append(make([]Entry, 0, len(t.entries)), t.entries...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Create adds a token named name with role, acting for tenant, and
// returns its plaintext, which is not stored and cannot be shown again. An
// empty tenant is DefaultTenant for an admin and the token's own name for
// the other roles (each such token is a tenant of its own).
func (t *Tokens) Create(name string, role Role, tenant string) (plaintext string, err error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("token name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	if _, err := ParseRole(string(role)); err != nil {
		return "", err
	}
	if tenant == "" {
		tenant = name
		if role == RoleAdmin {
			tenant = DefaultTenant
		}
	}
	if err := ValidateTenant(tenant); err != nil {
		return "", err
	}
	var raw [tokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("token: random source: %w", err)
	}
	plaintext = Prefix + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(plaintext))
	err = t.mutate(func(sf *storeFile) error {
		for _, e := range sf.Tokens {
			if e.Name == name {
				return fmt.Errorf("token %q already exists; revoke it first or choose another name: %w", name, errdefs.ErrAlreadyExists)
			}
		}
		sf.Tokens = append(sf.Tokens, Entry{
			Name: name, SHA256: hex.EncodeToString(sum[:]), Created: time.Now().UTC().Truncate(time.Second),
			Role: role, Tenant: tenant,
		})
		return nil
	})
	if err != nil {
		return "", err
	}
	return plaintext, nil
}

// Revoke removes the token named name.
func (t *Tokens) Revoke(name string) error {
	return t.mutate(func(sf *storeFile) error {
		out := sf.Tokens[:0:0]
		for _, e := range sf.Tokens {
			if e.Name != name {
				out = append(out, e)
			}
		}
		if len(out) == len(sf.Tokens) {
			return fmt.Errorf("no token named %q (see `forkd token list`): %w", name, errdefs.ErrNotFound)
		}
		sf.Tokens = out
		return nil
	})
}

// mutate applies f to the freshly read store under its lock file and
// writes the result atomically, as the current version.
func (t *Tokens) mutate(f func(*storeFile) error) error {
	dir := filepath.Dir(t.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("token store: %w", err)
	}
	lock, err := os.OpenFile(t.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("token store: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("token store: lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.loadLocked(); err != nil {
		return err
	}
	sf := storeFile{Version: storeVersion, Tokens: append([]Entry(nil), t.entries...), Quotas: map[string]Quota{}}
	for k, v := range t.quotas {
		sf.Quotas[k] = v
	}
	if err := f(&sf); err != nil {
		return err
	}
	if err := writeFileAtomic(t.path, sf); err != nil {
		return err
	}
	return t.loadLocked()
}

// writeFileAtomic writes v as JSON to a 0600 temporary file next to path,
// fsyncs it, renames it over path and fsyncs the directory.
func writeFileAtomic(path string, v any) (err error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("token store: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes the file 0600 already; say so explicitly anyway.
	if err = tmp.Chmod(0o600); err == nil {
		_, err = tmp.Write(append(data, '\n'))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("token store: write: %w", err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("token store: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// EnsureFirst makes sure a fresh install can be reached over TCP: when the
// store at path holds no token, it creates one named "default" (an admin
// of DefaultTenant) and writes
// its plaintext (one line) into plaintextOut, a new 0600 file. It never
// overwrites plaintextOut: if that file exists while the store is empty, it
// fails and says what to do. It reports whether a token was created.
//
// Daemon default: path DATA_DIR/tokens.json, plaintextOut DATA_DIR/token.
func EnsureFirst(path, plaintextOut string) (created bool, err error) {
	t, err := Open(path)
	if err != nil {
		return false, err
	}
	if len(t.List()) > 0 {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(plaintextOut), 0o700); err != nil {
		return false, fmt.Errorf("first token: %w", err)
	}
	out, err := os.OpenFile(plaintextOut, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("token store %s is empty but %s exists (a token that is no longer valid?); remove it to get a new first token, or create one with `forkd token create NAME`: %w", path, plaintextOut, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return false, fmt.Errorf("first token: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(plaintextOut)
		}
	}()
	plain, err := t.Create("default", RoleAdmin, DefaultTenant)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			t.Revoke("default")
		}
	}()
	if _, err = out.WriteString(plain + "\n"); err == nil {
		err = out.Sync()
	}
	if err == nil {
		err = out.Close()
	}
	if err != nil {
		return false, fmt.Errorf("first token: write %s: %w", plaintextOut, err)
	}
	if err = syncDir(filepath.Dir(plaintextOut)); err != nil {
		return false, fmt.Errorf("first token: %w", err)
	}
	return true, nil
}

// ReadTokenFile reads a token written by EnsureFirst (or by hand): the
// first line, trimmed. For clients.
func ReadTokenFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(data), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty: %w", path, errdefs.ErrInvalidArgument)
	}
	return tok, nil
}
