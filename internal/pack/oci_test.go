package pack_test

// Snapshots through a registry (internal/oci): the parts of an archive as
// blobs of an in-process OCI registry (go-containerregistry's), on a
// loopback port the test starts.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil/testregistry"
)

var blobPath = regexp.MustCompile(`^/v2/.+/blobs/(sha256:[0-9a-f]{64})$`)

// testRegistry is a registry that counts blob GETs and can alter or cut
// the blob it is told to.
type testRegistry struct {
	host string
	mu   sync.Mutex
	gets []string // digests of blob GETs, in order
	// tamper flips a byte of, and cut aborts half-way, blobs for which
	// they return true.
	tamper, cut func(digest string) bool
}

func startRegistry(t *testing.T) *testRegistry {
	r := &testRegistry{tamper: func(string) bool { return false }, cut: func(string) bool { return false }}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		m := blobPath.FindStringSubmatch(req.URL.Path)
		if m == nil || req.Method != http.MethodGet {
			reg.ServeHTTP(w, req)
			return
		}
		r.mu.Lock()
		r.gets = append(r.gets, m[1])
		tamper, cut := r.tamper(m[1]), r.cut(m[1])
		r.mu.Unlock()
		rec := httptest.NewRecorder()
		reg.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		switch {
		case tamper && len(body) > 0:
			body[len(body)/2] ^= 0xff
		case cut:
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *testRegistry) blobGets() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.gets
	r.gets = nil
	return g
}

func push(t *testing.T, dataDir, tag, ref string, key ed25519.PrivateKey) oci.PushStats {
	t.Helper()
	var buf bytes.Buffer
	if _, err := pack.Pack(context.Background(), dataDir, tag, &buf, pack.PackOptions{SignKey: key}); err != nil {
		t.Fatal(err)
	}
	st, err := oci.Push(context.Background(), &buf, ref, t.TempDir(), oci.Auth{}, nil)
	if err != nil {
		t.Fatalf("push %s: %v", tag, err)
	}
	return st
}

// assertEmpty checks that a failed pull left nothing in dataDir: no
// snapshot, no image, no staging directory.
func assertEmpty(t *testing.T, dataDir string) {
	t.Helper()
	for _, d := range []string{"snapshots", "images"} {
		ents, _ := os.ReadDir(filepath.Join(dataDir, d))
		for _, e := range ents {
			t.Errorf("%s/%s left behind", d, e.Name())
		}
	}
}

// TestOCIPushPullFetchesOnlyMissingParts runs against the in-process
// registry and against Debian's docker-registry (distribution 2.8), the
// registry most self-hosted setups run.
func TestOCIPushPullFetchesOnlyMissingParts(t *testing.T) {
	t.Run("in-process", func(t *testing.T) {
		reg := startRegistry(t)
		pushPullFetchesOnlyMissingParts(t, reg.host, reg.blobGets)
	})
	t.Run("distribution", func(t *testing.T) {
		reg := testregistry.Start(t)
		pushPullFetchesOnlyMissingParts(t, reg.Host, reg.BlobGets)
	})
}

// pushPullFetchesOnlyMissingParts pushes a chain and a sibling layer to
// the registry at host, pulls both into a clean data dir and checks,
// through blobGets, that each pull fetched only what that dir lacked.
func pushPullFetchesOnlyMissingParts(t *testing.T, host string, blobGets func() []string) {
	src, chain := pack.MakeChainForTest(t, 4<<20) // base ← l1 ← l2
	sib := pack.AddSnapshotForTest(t, src, "l1", "l1b", 3, true)
	ref := host + "/forkd/snap"
	first := push(t, src, "l2", ref+":l2", nil)
	if len(first.Uploaded) != 4 || len(first.Present) != 0 {
		t.Fatalf("first push uploaded %v, found %v; want the image and three snapshots uploaded", first.Uploaded, first.Present)
	}
	second := push(t, src, "l1b", ref+":l1b", nil)
	if len(second.Uploaded) != 1 || len(second.Present) != 3 {
		t.Fatalf("sibling push uploaded %v, found %v; want only its own layer uploaded", second.Uploaded, second.Present)
	}

	dst := t.TempDir()
	blobGets()
	snap, st, err := oci.Pull(context.Background(), dst, ref+":l2", oci.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tag != "l2" || snap.Digest() != chain[2].Digest() {
		t.Fatalf("pulled %s digest %s, want l2 digest %s", snap.Tag, snap.Digest(), chain[2].Digest())
	}
	if got := blobGets(); len(got) != 5 || len(st.Fetched) != 4 || len(st.Local) != 0 {
		t.Fatalf("clean pull: %d blob GETs (want config + 4 parts), fetched %v, local %v", len(got), st.Fetched, st.Local)
	}

	// The sibling shares the image, base and l1: only its layer is fetched.
	snap, st, err = oci.Pull(context.Background(), dst, ref+":l1b", oci.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Digest() != sib.Digest() {
		t.Fatalf("l1b digest %s, want %s", snap.Digest(), sib.Digest())
	}
	got := blobGets()
	if len(got) != 2 || len(st.Fetched) != 1 || st.Fetched[0] != "snapshot/"+sib.ID || len(st.Local) != 3 {
		t.Fatalf("sibling pull: blob GETs %v (want config + its layer), fetched %v, local %v", got, st.Fetched, st.Local)
	}
	if !slices.Equal(st.Unpack.Reused, []string{"base", "l1"}) || !slices.Equal(st.Unpack.Added, []string{"l1b"}) {
		t.Fatalf("reused %v, added %v", st.Unpack.Reused, st.Unpack.Added)
	}

	// A tag taken here is refused before any part is fetched... once the
	// parts are planned, Unpack refuses it: nothing changes.
	if _, _, err := oci.Pull(context.Background(), dst, ref+":l2", oci.PullOptions{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("pull over an existing tag: %v, want AlreadyExists", err)
	}
}

func TestOCIPullRefusesBadInput(t *testing.T) {
	reg := startRegistry(t)
	src, _ := pack.MakeChainForTest(t, 2<<20)
	ref := reg.host + "/forkd/bad"
	push(t, src, "l1", ref+":unsigned", nil)
	_, pubPEM, err := pack.GenerateKeyForTest()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pack.ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("unsigned under a trusted-keys policy", func(t *testing.T) {
		dst := t.TempDir()
		reg.blobGets()
		_, _, err := oci.Pull(context.Background(), dst, ref+":unsigned", oci.PullOptions{Unpack: pack.UnpackOptions{TrustedKeys: []ed25519.PublicKey{pub}}})
		if !errdefs.IsPermissionDenied(err) {
			t.Fatalf("got %v, want PermissionDenied", err)
		}
		if got := reg.blobGets(); len(got) != 1 {
			t.Fatalf("blob GETs %v: want only the config before the policy refuses", got)
		}
		assertEmpty(t, dst)
	})

	t.Run("host cannot restore", func(t *testing.T) {
		dst := t.TempDir()
		reg.blobGets()
		check := func(m *snapshot.Manifest) error {
			return errors.New("snapshot made by VMM " + m.VMM.Kind + " " + m.VMM.Version + ", this host runs firecracker")
		}
		_, _, err := oci.Pull(context.Background(), dst, ref+":unsigned", oci.PullOptions{Check: check})
		if err == nil || !strings.Contains(err.Error(), "VMM qemu test") {
			t.Fatalf("got %v, want the VMM mismatch named", err)
		}
		if got := reg.blobGets(); len(got) != 1 {
			t.Fatalf("blob GETs %v: want only the config", got)
		}
		assertEmpty(t, dst)
	})

	for _, tc := range []struct {
		name string
		set  func(d string) bool
		tamp bool
	}{{"tampered blob", nil, true}, {"interrupted mid-blob", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			dst := t.TempDir()
			n, hitDigest := 0, ""
			hit := func(d string) bool { // the config, the image, then a snapshot
				n++
				if n == 3 {
					hitDigest = d
				}
				return n == 3
			}
			reg.mu.Lock()
			if tc.tamp {
				reg.tamper = hit
			} else {
				reg.cut = hit
			}
			reg.mu.Unlock()
			defer func() {
				reg.mu.Lock()
				reg.tamper, reg.cut = func(string) bool { return false }, func(string) bool { return false }
				reg.mu.Unlock()
			}()
			_, _, err := oci.Pull(context.Background(), dst, ref+":unsigned", oci.PullOptions{})
			if err == nil {
				t.Fatal("pull succeeded")
			}
			// The blob's digest (or Unpack's per-file hashes, whichever
			// sees it first) catches an altered byte.
			if tc.tamp && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want the altered blob refused (InvalidArgument)", err)
			}
			// A cut transfer is the registry's failure, named with the
			// blob it broke off in; not a truncated archive.
			if !tc.tamp && (!errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), reg.host) ||
				!strings.Contains(err.Error(), hitDigest) || strings.Contains(err.Error(), "truncated")) {
				t.Fatalf("got %v, want Unavailable naming the registry %s and blob %s", err, reg.host, hitDigest)
			}
			t.Logf("refused: %v", err)
			assertEmpty(t, dst)
		})
	}
}

func TestOCIPushPullSigned(t *testing.T) {
	reg := startRegistry(t)
	src, chain := pack.MakeChainForTest(t, 2<<20)
	privPEM, pubPEM, err := pack.GenerateKeyForTest()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := pack.ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := pack.ParsePublicKey(pubPEM)
	ref := reg.host + "/forkd/signed:v1"
	if st := push(t, src, "l2", ref, priv); !st.Signed {
		t.Fatal("push does not report the signature")
	}
	dst := t.TempDir()
	snap, st, err := oci.Pull(context.Background(), dst, ref, oci.PullOptions{Unpack: pack.UnpackOptions{TrustedKeys: []ed25519.PublicKey{pub}, Tag: "mine"}})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Unpack.Verified || snap.Tag != "mine" || snap.Parent == nil || snap.Parent.Digest != chain[1].Digest() {
		t.Fatalf("verified %v, tag %s, parent %+v", st.Unpack.Verified, snap.Tag, snap.Parent)
	}
}
